//! The gauges task: refreshes the queue and driver gauges every second, removes the series of
//! drivers no longer served, and logs a waiting backlog every 30 s.

use std::{collections::HashMap, sync::Arc, time::Duration};

use tokio_util::sync::CancellationToken;

use prometheus::{Gauge, IntCounter};

use super::{
    context::Context,
    driver::{Driver, State},
};
use crate::metrics::hub::HubMetrics;

/// How often queue gauges are refreshed.
const GAUGE_REFRESH: Duration = Duration::from_secs(1);

/// How often a waiting backlog is logged (external-attacher #706 asks for 30 s).
const BACKLOG_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// The series one driver's refresh sets, looked up once (a label lookup hashes every label
/// value: for each driver every second, that was most of an idle hub's work).
struct DriverSeries {
    up: Gauge,
    pools: Vec<PoolSeries>,
}

/// The series of one work queue, and the adds already counted (queues count adds themselves;
/// the counter follows them here).
struct PoolSeries {
    adds: IntCounter,
    counted: u64,
    depth: Gauge,
    oldest: Gauge,
    longest: Gauge,
}

impl DriverSeries {
    fn new(metrics: &HubMetrics, name: &str, driver: &Driver) -> Self {
        let pools = driver
            .queue_depths()
            .into_iter()
            .map(|(pool, q)| {
                let labels = [q.name(), name, pool];
                PoolSeries {
                    adds: metrics.queue_adds.with_label_values(&[q.name(), name]),
                    counted: 0,
                    depth: metrics.queue_depth.with_label_values(&labels),
                    oldest: metrics.queue_oldest_age.with_label_values(&labels),
                    longest: metrics.queue_longest_running.with_label_values(&labels),
                }
            })
            .collect();
        Self {
            up: metrics.driver_up.with_label_values(&[name]),
            pools,
        }
    }
}

/// Refreshes queue and driver gauges, and logs any backlog periodically.
pub(crate) async fn gauges(hub: Arc<Context>, stop: CancellationToken) {
    let mut tick = tokio::time::interval(GAUGE_REFRESH);
    let mut last_log = tokio::time::Instant::now();
    let mut series: HashMap<String, DriverSeries> = HashMap::new();
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
            series.remove(&gone);
        }
        let metrics = &hub.shared.metrics;
        for d in slots {
            let Some(name) = d.name() else { continue };
            let up = matches!(
                d.state(),
                State::Standby | State::Leading | State::Blocked { .. }
            );
            let driver = series
                .entry(name.clone())
                .or_insert_with(|| DriverSeries::new(metrics, &name, &d));
            driver.up.set(if up { 1.0 } else { 0.0 });
            metrics.set_lease_guard(&name, d.lease_guard_view().as_ref());
            for ((pool, q), s) in d.queue_depths().into_iter().zip(&mut driver.pools) {
                let adds = q.adds();
                s.adds.inc_by(adds.saturating_sub(s.counted));
                s.counted = adds;
                s.depth.set(q.len() as f64);
                let oldest = q.oldest_age().map_or(0.0, |a| a.as_secs_f64());
                s.oldest.set(oldest);
                let longest = q.longest_processing().map_or(0.0, |a| a.as_secs_f64());
                s.longest.set(longest);
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
