//! The running mock: shared state behind the gRPC services, fault application,
//! readiness, and the task that binds, closes and re-binds the socket.

use std::{
    collections::BTreeMap,
    io,
    path::{Path, PathBuf},
    pin::Pin,
    sync::{Arc, Mutex, MutexGuard, PoisonError},
    task::{Context, Poll},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{UnixListener, UnixStream},
    sync::{mpsc, oneshot, watch},
    time::Instant,
};
use tokio_stream::StreamExt as _;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use super::{
    Config, Error, ExitMode,
    fault::{Fault, Outcome},
    record::{CallGuard, CallRecord, Recorder},
    service::Service,
    state::State,
};
use crate::csi::proto::{
    controller_server::ControllerServer, identity_server::IdentityServer, node_server::NodeServer,
};

/// How long a stopping server may take to let its connections go before its
/// task is aborted. Connections are killed at once, so this is only a guard.
const STOP_GRACE: Duration = Duration::from_secs(2);

/// Locks a mutex, ignoring poisoning: every critical section leaves the data
/// consistent, so a panic elsewhere does not make it unusable.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

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
    serving: Mutex<CancellationToken>,
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
        lock(&self.faults).insert(method.to_string(), Armed { fault, calls: 0 });
        self.faults_changed.send_modify(|g| *g += 1);
    }

    /// Clears the fault of `method`, or every fault.
    pub(crate) fn clear_faults(&self, method: Option<&str>) {
        {
            let mut faults = lock(&self.faults);
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
        lock(&self.faults)
            .iter()
            .map(|(m, a)| format!("{m}={}", a.fault))
            .collect()
    }

    /// Picks the rule for this call and counts it. `close` rules are
    /// one-shot and removed here.
    fn arm(&self, method: &str) -> Option<(Fault, u64)> {
        let mut faults = lock(&self.faults);
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
        lock(&self.readiness).forced = Some(ready);
    }

    /// Probe's answer now.
    pub(crate) fn ready(&self) -> bool {
        let r = lock(&self.readiness);
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
        let serving = lock(&self.serving).clone();
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
                code = super::fault::code_name(code),
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

// === serving ===

/// Binds the endpoint, replacing a stale socket file.
pub(crate) fn bind(path: &Path) -> Result<UnixListener, Error> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(source) => {
            return Err(Error::Bind {
                path: path.to_path_buf(),
                source,
            });
        }
    }
    UnixListener::bind(path).map_err(|source| Error::Bind {
        path: path.to_path_buf(),
        source,
    })
}

/// Serves gRPC on `listener` until `stop` is cancelled.
async fn serve_grpc(listener: UnixListener, stop: CancellationToken, shared: Arc<Shared>) {
    let svc = Service(shared);
    let conn_stop = stop.clone();
    let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener)
        .map(move |r| r.map(|io| Conn::new(io, &conn_stop)));
    let result = tonic::transport::Server::builder()
        .add_service(IdentityServer::new(svc.clone()))
        .add_service(ControllerServer::new(svc.clone()))
        .add_service(NodeServer::new(svc))
        .serve_with_incoming_shutdown(incoming, stop.cancelled_owned())
        .await;
    if let Err(error) = result {
        tracing::warn!(%error, "mock gRPC server ended with an error");
    }
}

/// The serving task: owns the socket path and obeys [`Command`]s until
/// `shutdown` is cancelled.
pub(crate) async fn supervise(
    shared: Arc<Shared>,
    path: PathBuf,
    first: UnixListener,
    mut commands: mpsc::UnboundedReceiver<Command>,
    shutdown: CancellationToken,
) {
    let mut listener = Some(first);
    loop {
        if let Some(l) = listener.take() {
            let stop = CancellationToken::new();
            *lock(&shared.serving) = stop.clone();
            let mut server = tokio::spawn(serve_grpc(l, stop.clone(), shared.clone()));
            tracing::debug!(path = %path.display(), "mock serving");
            let cmd = tokio::select! {
                cmd = commands.recv() => cmd,
                () = shutdown.cancelled() => None,
            };
            stop.cancel();
            if tokio::time::timeout(STOP_GRACE, &mut server).await.is_err() {
                server.abort();
            }
            let _ = std::fs::remove_file(&path);
            tracing::debug!(path = %path.display(), "mock stopped serving");
            match cmd {
                None => return,
                // Was serving: serve again right away.
                Some(Command::Start { ack }) => listener = start(&path, ack),
                Some(Command::Stop { restart_after, ack }) => {
                    if let Some(ack) = ack {
                        let _ = ack.send(());
                    }
                    if let Some(d) = restart_after {
                        tokio::select! {
                            () = tokio::time::sleep(d) => {}
                            () = shutdown.cancelled() => return,
                        }
                        match bind(&path) {
                            Ok(l) => listener = Some(l),
                            Err(error) => tracing::warn!(%error, "mock could not serve again"),
                        }
                    }
                }
            }
        } else {
            let cmd = tokio::select! {
                cmd = commands.recv() => cmd,
                () = shutdown.cancelled() => None,
            };
            match cmd {
                None => return,
                Some(Command::Start { ack }) => listener = start(&path, ack),
                Some(Command::Stop { ack, .. }) => {
                    if let Some(ack) = ack {
                        let _ = ack.send(());
                    }
                }
            }
        }
    }
}

/// Binds again and tells the requester how it went.
fn start(path: &Path, ack: Option<oneshot::Sender<Result<(), Error>>>) -> Option<UnixListener> {
    match bind(path) {
        Ok(l) => {
            if let Some(ack) = ack {
                let _ = ack.send(Ok(()));
            }
            Some(l)
        }
        Err(error) => {
            match ack {
                Some(ack) => {
                    let _ = ack.send(Err(error));
                }
                None => tracing::warn!(%error, "mock could not serve again"),
            }
            None
        }
    }
}

// === connections ===

/// A served connection that dies (reads and writes fail) as soon as the
/// server's stop token is cancelled, so "close the socket" drops every client
/// at once instead of waiting for a graceful drain.
struct Conn {
    io: UnixStream,
    stop: Pin<Box<WaitForCancellationFutureOwned>>,
    dead: bool,
}

impl Conn {
    fn new(io: UnixStream, stop: &CancellationToken) -> Self {
        Self {
            io,
            stop: Box::pin(stop.clone().cancelled_owned()),
            dead: false,
        }
    }

    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if !self.dead && self.stop.as_mut().poll(cx).is_ready() {
            self.dead = true;
        }
        if self.dead {
            Err(io::Error::new(
                io::ErrorKind::ConnectionAborted,
                "mock closed the socket",
            ))
        } else {
            Ok(())
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        Pin::new(&mut this.io).poll_shutdown(cx)
    }
}

impl tonic::transport::server::Connected for Conn {
    type ConnectInfo = ();

    fn connect_info(&self) -> Self::ConnectInfo {}
}
