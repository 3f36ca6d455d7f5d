//! What the gRPC services, the control socket and the handle share: the
//! volumes, the call record, the fault rules and readiness; and how one call
//! is run (recorded, its fault applied, logged).

use std::{collections::BTreeMap, time::Duration};

use parking_lot::Mutex;
use tokio::{
    sync::{mpsc, oneshot, watch},
    time::Instant,
};
use tokio_util::sync::CancellationToken;

use crate::{
    config::{Config, ExitMode},
    error::Error,
    fault::{self, Fault, Outcome},
    record::{CallGuard, CallRecord, Recorder},
    state::State,
};
/// A fault rule with its call counter (for `every:`).
#[derive(Debug)]
struct Armed {
    fault: Fault,
    calls: u64,
}

/// Whether Probe says ready.
#[derive(Debug)]
struct Readiness {
    /// Set by the control socket; wins over the start-up delay.
    forced: Option<bool>,
    /// Not ready before this instant (`--not-ready-for`).
    ready_at: Instant,
}

/// Commands for the serving task.
#[derive(Debug)]
pub(crate) enum Command {
    /// Stop serving and drop every connection; serve again after the delay
    /// if one is given.
    Stop {
        restart_after: Option<Duration>,
        ack: Option<oneshot::Sender<()>>,
    },
    /// Serve again (no-op when serving).
    Start {
        ack: Option<oneshot::Sender<Result<(), Error>>>,
    },
}

/// Everything the services, the control socket and the handle share.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: Config,
    pub(crate) state: Mutex<State>,
    pub(crate) recorder: Recorder,
    faults: Mutex<BTreeMap<String, Armed>>,
    /// Bumped on every fault change, so hung calls re-check their rule.
    faults_changed: watch::Sender<u64>,
    readiness: Mutex<Readiness>,
    /// Cancelled when the current server stops; every connection and hung
    /// call of that server ends with it.
    pub(crate) serving: Mutex<CancellationToken>,
    commands: mpsc::UnboundedSender<Command>,
}

impl Shared {
    pub(crate) fn new(config: Config, commands: mpsc::UnboundedSender<Command>) -> Self {
        let mut state = State::new(config.limits());
        state.precreate(config.volumes);
        let faults = config
            .faults
            .iter()
            .map(|r| {
                (
                    r.method.clone(),
                    Armed {
                        fault: r.fault.clone(),
                        calls: 0,
                    },
                )
            })
            .collect();
        let ready_at = Instant::now() + config.not_ready_for.unwrap_or_default();
        Self {
            config,
            state: Mutex::new(state),
            recorder: Recorder::default(),
            faults: Mutex::new(faults),
            faults_changed: watch::Sender::new(0),
            readiness: Mutex::new(Readiness {
                forced: None,
                ready_at,
            }),
            serving: Mutex::new(CancellationToken::new()),
            commands,
        }
    }

    // === faults ===

    /// Sets (replaces) the fault of `method` (`*` for every method).
    pub(crate) fn set_fault(&self, method: &str, fault: Fault) {
        self.faults
            .lock()
            .insert(method.to_string(), Armed { fault, calls: 0 });
        self.faults_changed.send_modify(|g| *g += 1);
    }

    /// Clears the fault of `method`, or every fault.
    pub(crate) fn clear_faults(&self, method: Option<&str>) {
        {
            let mut faults = self.faults.lock();
            match method {
                Some(m) => {
                    faults.remove(m);
                }
                None => faults.clear(),
            }
        }
        self.faults_changed.send_modify(|g| *g += 1);
    }

    /// The fault rules in place, as `METHOD=FAULT` text.
    pub(crate) fn faults(&self) -> Vec<String> {
        self.faults
            .lock()
            .iter()
            .map(|(m, a)| format!("{m}={}", a.fault))
            .collect()
    }

    /// Picks the rule for this call and counts it. `close` rules are
    /// one-shot and removed here.
    fn arm(&self, method: &str) -> Option<(Fault, u64)> {
        let mut faults = self.faults.lock();
        let key = if faults.contains_key(method) {
            method
        } else if faults.contains_key("*") {
            "*"
        } else {
            return None;
        };
        let key = key.to_string();
        let armed = faults.get_mut(&key)?;
        armed.calls += 1;
        let out = (armed.fault.clone(), armed.calls);
        if matches!(out.0.outcome, Outcome::Close { .. }) {
            faults.remove(&key);
        }
        Some(out)
    }

    /// Applies the fault rule of `method` to one call: sleeps, fails, hangs,
    /// closes the socket or exits. `Ok` means "answer normally".
    async fn apply_fault(
        &self,
        method: &str,
        serving: &CancellationToken,
    ) -> Result<(), tonic::Status> {
        loop {
            let mut changed = self.faults_changed.subscribe();
            let Some((fault, count)) = self.arm(method) else {
                return Ok(());
            };
            if let Some(d) = fault.delay {
                tokio::select! {
                    () = tokio::time::sleep(d) => {}
                    () = serving.cancelled() => return Err(closed()),
                }
            }
            return match fault.outcome {
                Outcome::Proceed => Ok(()),
                Outcome::Code(code) => Err(injected(code)),
                Outcome::Every { n, code } if count % n == 0 => Err(injected(code)),
                Outcome::Every { .. } => Ok(()),
                Outcome::Hang => {
                    tracing::info!(method, "injected fault: hanging until the fault is cleared");
                    tokio::select! {
                        _ = changed.changed() => continue,
                        () = serving.cancelled() => Err(closed()),
                    }
                }
                Outcome::Close { restart_after } => {
                    tracing::info!(method, ?restart_after, "injected fault: closing the socket");
                    // A send error means the handle is gone and the server with it.
                    let _ = self.commands.send(Command::Stop {
                        restart_after,
                        ack: None,
                    });
                    serving.cancelled().await;
                    Err(closed())
                }
                Outcome::Exit(status) => match self.config.exit {
                    ExitMode::Process => {
                        tracing::warn!(method, status, "injected fault: exiting");
                        std::process::exit(status)
                    }
                    ExitMode::StopServing => {
                        tracing::warn!(
                            method,
                            status,
                            "injected fault: exit (in process: stop serving)"
                        );
                        let _ = self.commands.send(Command::Stop {
                            restart_after: None,
                            ack: None,
                        });
                        serving.cancelled().await;
                        Err(closed())
                    }
                },
            };
        }
    }

    // === readiness ===

    /// Forces Probe's answer.
    pub(crate) fn set_ready(&self, ready: bool) {
        self.readiness.lock().forced = Some(ready);
    }

    /// Probe's answer now.
    pub(crate) fn ready(&self) -> bool {
        let r = self.readiness.lock();
        r.forced.unwrap_or_else(|| Instant::now() >= r.ready_at)
    }

    // === calls ===

    /// Runs one RPC: records it, applies its fault, runs `body` and logs one
    /// line with the method, volume, node and code (never secrets).
    pub(crate) async fn call<T>(
        &self,
        rec: CallRecord,
        body: impl FnOnce(&Self) -> Result<T, tonic::Status>,
    ) -> Result<tonic::Response<T>, tonic::Status> {
        let serving = self.serving.lock().clone();
        let mut guard = CallGuard::new(self.recorder.clone(), rec);
        let result = match self.apply_fault(method_of(&guard), &serving).await {
            Ok(()) => body(self),
            Err(e) => Err(e),
        };
        let code = result
            .as_ref()
            .map_or_else(tonic::Status::code, |_| tonic::Code::Ok);
        guard.finish(code);
        if let Some(rec) = guard.record() {
            let message = result
                .as_ref()
                .err()
                .map(tonic::Status::message)
                .unwrap_or("");
            tracing::info!(
                method = %rec.method,
                volume = %rec.volume_id,
                node = %rec.node_id,
                code = fault::code_name(code),
                message,
                "csi call"
            );
        }
        result.map(tonic::Response::new)
    }
}

fn method_of(guard: &CallGuard) -> &str {
    guard.record().map_or("", |r| r.method.as_str())
}

fn injected(code: tonic::Code) -> tonic::Status {
    tonic::Status::new(code, "injected fault")
}

fn closed() -> tonic::Status {
    tonic::Status::unavailable("mock closed the socket")
}
