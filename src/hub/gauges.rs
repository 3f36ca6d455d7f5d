//! The gauges task: refreshes the queue and driver gauges every second, removes the series of
//! drivers no longer served, and logs a waiting backlog every 30 s.

use std::{collections::HashMap, sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use super::{context::Context, driver::State};

/// How often queue gauges are refreshed.
const GAUGE_REFRESH: Duration = Duration::from_secs(1);

/// How often a waiting backlog is logged (external-attacher #706 asks for 30 s).
const BACKLOG_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// Refreshes queue and driver gauges, and logs any backlog periodically.
pub(crate) async fn gauges(hub: Arc<Context>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(GAUGE_REFRESH);
    let mut last_log = tokio::time::Instant::now();
    // Adds already counted, per (driver, pool): queues count adds
    // themselves; the counter follows them here.
    let mut counted: HashMap<(String, &'static str), u64> = HashMap::new();
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let log_now = last_log.elapsed() >= BACKLOG_LOG_INTERVAL;
        let slots = hub.registry.slots();
        // Drivers whose slot was removed lose their series, unless another slot serves the
        // name. Done here, by the only task that sets the gauges, so none comes back.
        for gone in hub.registry.take_retired() {
            if slots
                .iter()
                .any(|d| d.name().as_deref() == Some(gone.as_str()))
            {
                continue;
            }
            tracing::debug!(driver = %gone, "removing the metrics of a driver no longer served");
            hub.shared.metrics.remove_driver(&gone);
            hub.shared.csi_ops.remove_driver(&gone);
            counted.retain(|(name, _), _| *name != gone);
        }
        let metrics = &hub.shared.metrics;
        for d in slots {
            let Some(name) = d.name() else { continue };
            let up = matches!(
                d.state(),
                State::Standby | State::Leading | State::Blocked { .. }
            );
            metrics
                .driver_up
                .with_label_values(&[name.as_str()])
                .set(if up { 1.0 } else { 0.0 });
            metrics.set_lease_guard(&name, d.lease_guard_view().as_ref());
            for (pool, q) in d.queue_depths() {
                let adds = q.adds();
                let before = counted.insert((name.clone(), pool), adds).unwrap_or(0);
                metrics
                    .queue_adds
                    .with_label_values(&[q.name(), name.as_str()])
                    .inc_by(adds.saturating_sub(before));
                let labels = [q.name(), name.as_str(), pool];
                metrics
                    .queue_depth
                    .with_label_values(&labels)
                    .set(q.len() as f64);
                let oldest = q.oldest_age().map_or(0.0, |a| a.as_secs_f64());
                metrics
                    .queue_oldest_age
                    .with_label_values(&labels)
                    .set(oldest);
                let longest = q.longest_processing().map_or(0.0, |a| a.as_secs_f64());
                metrics
                    .queue_longest_running
                    .with_label_values(&labels)
                    .set(longest);
                if log_now && !q.is_empty() {
                    tracing::info!(driver = %name, queue = pool, depth = q.len(), processing = q.processing_len(), oldest_seconds = oldest, "work queue backlog");
                }
            }
        }
        if log_now {
            last_log = tokio::time::Instant::now();
        }
    }
}
