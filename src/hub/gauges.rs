//! The driver and queue gauges: brought up to date when they are read (each scrape of the
//! metrics path), not on a timer, so that an idle hub does no work for them between scrapes;
//! a task retires the series of drivers no longer served and logs a waiting backlog every 30 s.

use std::{collections::HashMap, sync::Arc, time::Duration};

use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;

use prometheus::{Gauge, IntCounter};

use super::{
    context::Context,
    driver::{Driver, State},
};
use crate::leader::guard::{Verdict, View};
use crate::metrics::hub::{GuardGauge, HubMetrics};

/// How often a waiting backlog is logged (external-attacher #706 asks for 30 s); the gauges are
/// refreshed then too.
const BACKLOG_LOG_INTERVAL: Duration = Duration::from_secs(30);

/// The series one driver's refresh sets, looked up once (a label lookup hashes every label
/// value: for each driver every second, that was most of an idle hub's work).
struct DriverSeries {
    up: Gauge,
    /// `attacher_hub_lease_held_by_other`, with leader election only.
    held_by_other: Option<Gauge>,
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
            held_by_other: driver
                .settings()
                .leader_election
                .is_some()
                .then(|| metrics.lease_held_by_other.with_label_values(&[name])),
            pools,
        }
    }
}

/// The driver and queue gauges of a hub, and the series already looked up.
pub(crate) struct Gauges {
    hub: Arc<Context>,
    series: Mutex<HashMap<String, DriverSeries>>,
}

impl Gauges {
    pub(crate) fn new(hub: Arc<Context>) -> Arc<Self> {
        Arc::new(Self {
            hub,
            series: Mutex::new(HashMap::new()),
        })
    }

    /// Brings every driver's gauges up to date, after removing the series of drivers no longer
    /// served; with `log_backlog`, logs each work queue that has items waiting.
    pub(crate) fn refresh(&self, log_backlog: bool) {
        // One refresh at a time: a retired driver's series, once removed, never comes back.
        let mut series = self.series.lock();
        let hub = &self.hub;
        let slots = hub.registry.slots();
        // Drivers whose slot was removed lose their series, unless another slot serves the
        // name.
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
            let state = d.state();
            // A node plugin is recorded, not served: it is neither up nor down.
            if state == State::NoControllerService {
                continue;
            }
            let up = matches!(
                state,
                State::Standby | State::Leading | State::Blocked { .. }
            );
            let driver = series
                .entry(name.clone())
                .or_insert_with(|| DriverSeries::new(metrics, &name, &d));
            driver.up.set(if up { 1.0 } else { 0.0 });
            if let Some(held) = &driver.held_by_other {
                let own = hub.shared.leader_status.get(&name).map(|s| s.clone());
                let stands_by = d.stands_by_for_live_holder(own.as_ref());
                held.set(if stands_by { 1.0 } else { 0.0 });
            }
            metrics.set_lease_guard(&name, d.lease_guard_view().as_ref().map(guard_gauge));
            for ((pool, q), s) in d.queue_depths().into_iter().zip(&mut driver.pools) {
                let adds = q.adds();
                s.adds.inc_by(adds.saturating_sub(s.counted));
                s.counted = adds;
                s.depth.set(q.len() as f64);
                let oldest = q.oldest_age().map_or(0.0, |a| a.as_secs_f64());
                s.oldest.set(oldest);
                let longest = q.longest_processing().map_or(0.0, |a| a.as_secs_f64());
                s.longest.set(longest);
                if log_backlog && !q.is_empty() {
                    tracing::info!(driver = %name, queue = pool, depth = q.len(), processing = q.processing_len(), oldest_seconds = oldest, "work queue backlog");
                }
            }
        }
    }
}

/// Every 30 s: retires the series of drivers no longer served, refreshes the gauges and logs
/// any backlog. Scrapes refresh them in between.
pub(crate) async fn retire_and_log(gauges: Arc<Gauges>, stop: CancellationToken) {
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + BACKLOG_LOG_INTERVAL,
        BACKLOG_LOG_INTERVAL,
    );
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => gauges.refresh(true),
        }
    }
}

/// The gauges' reading of a Lease guard's view: which other Lease blocks the driver, and
/// whether the guard could look at all.
fn guard_gauge(view: &View) -> GuardGauge<'_> {
    GuardGauge {
        blocked_by: view
            .blocked_by()
            .map(|h| (h.namespace.as_str(), h.holder.as_str())),
        available: !matches!(view.verdict, Verdict::Unavailable { .. }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::leader::guard::Holder;

    fn view(verdict: Verdict) -> View {
        View {
            verdict,
            renewing: None,
        }
    }

    #[test]
    fn the_gauges_show_the_blocking_lease_and_whether_the_guard_can_look() {
        assert_eq!(
            guard_gauge(&view(Verdict::Clear)),
            GuardGauge {
                blocked_by: None,
                available: true
            }
        );
        let blocked = view(Verdict::Blocked {
            holder: Holder {
                namespace: "kube-system".into(),
                holder: "go-1".into(),
            },
        });
        assert_eq!(
            guard_gauge(&blocked),
            GuardGauge {
                blocked_by: Some(("kube-system", "go-1")),
                available: true
            }
        );
        let unavailable = view(Verdict::Unavailable {
            reason: "forbidden".into(),
        });
        assert_eq!(
            guard_gauge(&unavailable),
            GuardGauge {
                blocked_by: None,
                available: false
            }
        );
    }
}
