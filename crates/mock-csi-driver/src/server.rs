//! The task that binds, closes and re-binds the mock's socket, and the
//! connections it serves, which die at once when the server stops.

use std::{
    io,
    path::{Path, PathBuf},
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use attacher_hub::csi::proto::{
    controller_server::ControllerServer, identity_server::IdentityServer, node_server::NodeServer,
};
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::{UnixListener, UnixStream},
    sync::{mpsc, oneshot},
};
use tokio_stream::StreamExt as _;
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

use crate::{
    error::Error,
    service::Service,
    shared::{Command, Shared},
};

/// How long a stopping server may take to let its connections go before its
/// task is aborted. Connections are killed at once, so this is only a guard.
const STOP_GRACE: Duration = Duration::from_secs(2);

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
            *shared.serving.lock() = stop.clone();
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
