//! The series of the connection to the API server: dials, health PINGs, connections declared
//! dead, connections open.

use prometheus::{IntCounterVec, IntGauge, Opts, Registry};

/// The connection series (`attacher_hub_api_connection*`). Cheap to clone; unregistered ones
/// (tests, the `status` subcommand) count for no one.
#[derive(Clone, Debug)]
pub struct ConnectionMetrics {
    /// `attacher_hub_api_connection_dials_total{result}`: dial attempts by outcome (`h2`,
    /// `http1`, `error`); attempts that lost to a parallel one are not counted.
    pub dials: IntCounterVec,
    /// `attacher_hub_api_connection_pings_total{reason, result}`: health PINGs by why they were
    /// sent (`idle`, `stalled`, `peer`: the other connection stalled) and how they ended
    /// (`answered`, `unanswered`).
    pub pings: IntCounterVec,
    /// `attacher_hub_api_connections_dead_total{reason}`: connections closed because a PING
    /// went unanswered, by the PING's reason.
    pub dead: IntCounterVec,
    /// `attacher_hub_api_connections_open`: HTTP/2 connections open now (two, the requests' and
    /// the watches', unless an old one still finishes its streams after a GOAWAY).
    pub open: IntGauge,
}

impl ConnectionMetrics {
    /// New series, registered nowhere.
    pub fn new() -> Self {
        // The names, help texts and labels are constants: these constructors cannot fail.
        let counter = |name: &str, help: &str, labels: &[&str]| {
            IntCounterVec::new(Opts::new(name, help), labels)
                .expect("constant metric options are valid; please report this as a bug")
        };
        Self {
            dials: counter(
                "attacher_hub_api_connection_dials_total",
                "Connection attempts to the API server, by outcome (h2, http1, error)",
                &["result"],
            ),
            pings: counter(
                "attacher_hub_api_connection_pings_total",
                "HTTP/2 health PINGs sent to the API server, by reason (idle, stalled, peer) and result (answered, unanswered)",
                &["reason", "result"],
            ),
            dead: counter(
                "attacher_hub_api_connections_dead_total",
                "Connections to the API server closed because a health PING went unanswered, by the PING's reason",
                &["reason"],
            ),
            open: IntGauge::new(
                "attacher_hub_api_connections_open",
                "HTTP/2 connections to the API server open now",
            )
            .expect("constant metric options are valid; please report this as a bug"),
        }
    }

    /// Registers the series on `registry`.
    pub fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.dials.clone()))?;
        registry.register(Box::new(self.pings.clone()))?;
        registry.register(Box::new(self.dead.clone()))?;
        registry.register(Box::new(self.open.clone()))?;
        Ok(())
    }
}

impl Default for ConnectionMetrics {
    fn default() -> Self {
        Self::new()
    }
}
