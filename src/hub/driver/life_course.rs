//! The course of a driver's life as pure decisions: how long it pauses before it starts over,
//! whether the driver it reached is the one configured and one to serve, and how long a
//! connection waits before it stands for the Lease again. The life's loop (`life`) performs
//! what these say.

use std::{fmt::Display, time::Duration};

use super::Origin;
use crate::{
    backoff::{Backoff, Doubling},
    csi::{CallError, Capabilities},
};

/// First pause after a failed start-up step of a driver.
const RESTART_BACKOFF_START: Duration = Duration::from_secs(1);

/// Longest pause between start-up attempts of a failing driver.
const RESTART_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// The pauses between a driver's lives: the first pause after the first life, doubling with
/// every life that ends early, up to the longest pause. A life that lasted as long as the
/// longest pause starts the count over: a socket that accepts and drops connections at once,
/// or a step that keeps failing, is retried ever more slowly, never in a hot loop, and a
/// driver that served a while restarts quickly.
///
/// A lost connection is the exception, once per count: the next life starts at once. Losing
/// the connection is what a rolling update of the driver's controller does (its old Pod goes,
/// a new one binds the same socket a moment later), and the connect loop already waits for
/// the socket (100 ms doubling to 1 s); a pause on top of it would only leave the driver
/// without its attacher while the rollout moves on to the next replica. A second loss before
/// the longest pause has passed earns the doubling pauses as any early end does.
#[derive(Clone, Debug)]
pub(super) struct Restarts {
    pauses: Backoff,
    /// Whether the next lost connection may be followed at once.
    at_once: bool,
}

/// How a driver's life ended, as far as the pause before the next one goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Ending {
    /// The connection to the driver was lost.
    Lost,
    /// A step failed (or the life ended for another reason).
    Failed,
}

impl Restarts {
    /// A driver that has not lived yet.
    pub(super) fn new() -> Self {
        Self {
            pauses: Backoff::new(Doubling::new(RESTART_BACKOFF_START, RESTART_BACKOFF_MAX)),
            at_once: true,
        }
    }

    /// The pause before the next life, after one that `lasted` so long and ended so.
    pub(super) fn after_life(&mut self, lasted: Duration, ending: Ending) -> Duration {
        if lasted >= RESTART_BACKOFF_MAX {
            self.pauses.reset();
            self.at_once = true;
        }
        if ending == Ending::Lost && self.at_once {
            self.at_once = false;
            return Duration::ZERO;
        }
        self.pauses.fail()
    }
}

/// Why the driver that answered at `address` as `name` is not the one the configuration
/// expects, if it names one.
pub(super) fn wrong_name(
    expected: Option<&str>,
    name: &str,
    address: &impl Display,
) -> Option<String> {
    expected.filter(|e| *e != name).map(|expected| {
        format!(
            "driver at {address} reports name {name:?}, but the configuration expects {expected:?}"
        )
    })
}

/// What the driver's answer to the capability calls makes of it.
#[derive(Debug)]
pub(super) enum Capable {
    /// Its capabilities.
    Known(Capabilities),
    /// A discovered node plugin that offers the controller service without serving it
    /// (discovery tells these apart before it serves a socket; this is the driver changing its
    /// answers since): recorded as a node plugin.
    Unserved(CallError),
    /// The calls failed: the life fails so.
    Failed(String),
}

/// Reads the answer of a driver of `origin` to the capability calls.
pub(super) fn capable(origin: Origin, answer: Result<Capabilities, CallError>) -> Capable {
    match answer {
        Ok(caps) => Capable::Known(caps),
        Err(e) if origin == Origin::Discovered && e.code() == tonic::Code::Unimplemented => {
            Capable::Unserved(e)
        }
        Err(e) => Capable::Failed(format!("capability detection failed: {e}")),
    }
}

/// Whether a driver of `origin` with `caps` is a node plugin, recorded but not served: a
/// discovered socket without the controller service. A configured driver is served whatever
/// it offers.
pub(super) fn is_node_plugin(origin: Origin, caps: &Capabilities) -> bool {
    origin == Origin::Discovered && !caps.controller_service
}

/// How long a replica that handed the driver over waits before it stands again: a retry
/// period (the others' time to pick the Lease up); nothing without leader election.
pub(super) fn hand_over_pause(retry_period: Option<Duration>) -> Duration {
    retry_period.unwrap_or(Duration::ZERO)
}

/// How long a replica that stepped down for a holder in another namespace waits before it
/// stands again: one to two lease durations, by `r` in [0, 1). Two guarded hubs that started
/// leading at once in two namespaces step down together; the random pause lets one of them
/// lead first, which the other's guard then sees.
pub(super) fn step_down_pause(lease_duration: Duration, r: f64) -> Duration {
    lease_duration.mul_f64(1.0 + r)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Duration = Duration::from_secs(1);

    #[test]
    fn lives_that_end_early_earn_doubling_pauses_up_to_the_longest() {
        let mut restarts = Restarts::new();
        let pauses: Vec<_> = (0..8)
            .map(|_| restarts.after_life(S / 10, Ending::Failed))
            .collect();
        assert_eq!(pauses, [1, 2, 4, 8, 16, 30, 30, 30].map(|s| s * S));
    }

    #[test]
    fn a_life_that_lasted_the_longest_pause_starts_the_pauses_over() {
        let mut restarts = Restarts::new();
        assert_eq!(restarts.after_life(S, Ending::Failed), S);
        assert_eq!(restarts.after_life(S, Ending::Failed), 2 * S);
        assert_eq!(restarts.after_life(S, Ending::Failed), 4 * S);
        assert_eq!(
            restarts.after_life(30 * S - S / 10, Ending::Failed),
            8 * S,
            "just short of it"
        );
        assert_eq!(
            restarts.after_life(30 * S, Ending::Failed),
            S,
            "lasted: the first pause again"
        );
        assert_eq!(restarts.after_life(Duration::ZERO, Ending::Failed), 2 * S);
        assert_eq!(restarts.after_life(3600 * S, Ending::Failed), S);
    }

    #[test]
    fn the_first_life_earns_the_first_pause_however_long_it_lasted() {
        assert_eq!(
            Restarts::new().after_life(Duration::ZERO, Ending::Failed),
            S
        );
        assert_eq!(Restarts::new().after_life(60 * S, Ending::Failed), S);
    }

    #[test]
    fn a_lost_connection_is_followed_at_once_then_by_the_pauses_of_an_early_end() {
        let mut restarts = Restarts::new();
        // The driver's controller replaced: reconnect at once (the connect loop waits for
        // the socket).
        assert_eq!(restarts.after_life(10 * S, Ending::Lost), Duration::ZERO);
        // Lost again soon after: a socket that drops connections earns the doubling pauses.
        let again: Vec<_> = (0..4)
            .map(|_| restarts.after_life(S / 10, Ending::Lost))
            .collect();
        assert_eq!(again, [1, 2, 4, 8].map(|s| s * S));
        // A life as long as the longest pause earns the immediate start again.
        assert_eq!(restarts.after_life(30 * S, Ending::Lost), Duration::ZERO);
        assert_eq!(restarts.after_life(S, Ending::Lost), S);
    }

    #[test]
    fn a_failed_step_never_restarts_at_once() {
        let mut restarts = Restarts::new();
        assert_eq!(restarts.after_life(3600 * S, Ending::Failed), S);
        // Nor does it use up the immediate start a lost connection earns.
        assert_eq!(restarts.after_life(S, Ending::Lost), Duration::ZERO);
        assert_eq!(restarts.after_life(S, Ending::Failed), 2 * S);
    }

    #[test]
    fn a_driver_answering_another_name_than_the_configured_one_is_refused() {
        let address = "/run/csi.sock";
        assert_eq!(wrong_name(None, "a.csi", &address), None);
        assert_eq!(wrong_name(Some("a.csi"), "a.csi", &address), None);
        assert_eq!(
            wrong_name(Some("a.csi"), "b.csi", &address).as_deref(),
            Some(
                "driver at /run/csi.sock reports name \"b.csi\", but the configuration expects \"a.csi\""
            )
        );
    }

    fn failed(code: tonic::Code) -> CallError {
        CallError {
            method: "/csi.v1.Identity/GetPluginCapabilities",
            status: tonic::Status::new(code, "no"),
        }
    }

    #[test]
    fn only_a_discovered_socket_refusing_the_controller_calls_is_unserved() {
        let caps = Capabilities::default();
        for origin in [Origin::Configured, Origin::Discovered] {
            assert!(matches!(capable(origin, Ok(caps)), Capable::Known(c) if c == caps));
            assert!(matches!(
                capable(origin, Err(failed(tonic::Code::Unavailable))),
                Capable::Failed(reason) if reason.starts_with("capability detection failed: ")
            ));
        }
        assert!(matches!(
            capable(Origin::Discovered, Err(failed(tonic::Code::Unimplemented))),
            Capable::Unserved(e) if e.code() == tonic::Code::Unimplemented
        ));
        assert!(matches!(
            capable(Origin::Configured, Err(failed(tonic::Code::Unimplemented))),
            Capable::Failed(_)
        ));
    }

    #[test]
    fn a_discovered_socket_without_the_controller_service_is_a_node_plugin() {
        let node = Capabilities::default();
        let controller = Capabilities {
            controller_service: true,
            ..Capabilities::default()
        };
        assert!(is_node_plugin(Origin::Discovered, &node));
        assert!(!is_node_plugin(Origin::Discovered, &controller));
        assert!(!is_node_plugin(Origin::Configured, &node));
        assert!(!is_node_plugin(Origin::Configured, &controller));
    }

    #[test]
    fn a_replica_stands_again_a_retry_period_after_a_hand_over() {
        assert_eq!(hand_over_pause(Some(2 * S)), 2 * S);
        assert_eq!(hand_over_pause(None), Duration::ZERO);
    }

    #[test]
    fn a_replica_stands_again_one_to_two_lease_durations_after_a_step_down() {
        assert_eq!(step_down_pause(4 * S, 0.0), 4 * S);
        assert_eq!(step_down_pause(4 * S, 0.5), 6 * S);
        let longest = step_down_pause(4 * S, 0.999_999);
        assert!(longest < 8 * S && longest > 7 * S, "{longest:?}");
    }
}
