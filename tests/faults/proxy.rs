//! A TCP proxy between the hub and the API server that the test controls:
//! forward, cut every connection with a reset and refuse new ones, stall
//! (keep every socket open and move no byte), or freeze (stall every current
//! connection for good, and later let new connections through again: a hung
//! intermediary that lost its connections' state).
//!
//! The hub's kubeconfig names the proxy instead of the API server, so a fault
//! hits only that hub's connections (both of its clients: the main one and
//! the leader-election one); the test's own clients talk to the API server
//! directly and keep working.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Mutex, watch};
use tokio_util::sync::CancellationToken;

/// Size of the buffer of each direction of a forwarded connection.
const BUFFER_BYTES: usize = 64 * 1024;

/// What the proxy does with traffic now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Flow {
    /// Bytes move both ways.
    Forward,
    /// Bytes stay where they are; sockets stay open (no FIN, no RST).
    Stalled,
}

/// A running proxy; dropping it stops it and resets every connection.
#[derive(Debug)]
pub(crate) struct Proxy {
    /// Where clients connect.
    addr: SocketAddr,
    /// Where the proxy connects.
    upstream: SocketAddr,
    /// Cancelled to reset every current connection; replaced after each cut.
    cut: Arc<std::sync::Mutex<CancellationToken>>,
    /// Forward or stalled, observed by every pump.
    flow: watch::Sender<Flow>,
    /// The accept loop, while the port accepts.
    acceptor: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Connections accepted so far.
    accepted: Arc<AtomicU64>,
    /// Handed to each new connection; cancelled: that connection is frozen for good.
    freeze: Arc<std::sync::Mutex<CancellationToken>>,
    /// Every connection accepted: its client's address and its freeze token.
    connections: Arc<std::sync::Mutex<Vec<(SocketAddr, CancellationToken)>>>,
}

impl Proxy {
    /// Listens on `listen` (port 0: any free port) and forwards to `upstream`.
    pub(crate) async fn start(listen: SocketAddr, upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind(listen)
            .await
            .unwrap_or_else(|e| panic!("proxy: cannot listen on {listen}: {e}"));
        let addr = listener.local_addr().expect("proxy local address");
        let (flow, _) = watch::channel(Flow::Forward);
        let proxy = Proxy {
            addr,
            upstream,
            cut: Arc::new(std::sync::Mutex::new(CancellationToken::new())),
            flow,
            acceptor: Mutex::new(None),
            accepted: Arc::new(AtomicU64::new(0)),
            freeze: Arc::new(std::sync::Mutex::new(CancellationToken::new())),
            connections: Arc::default(),
        };
        *proxy.acceptor.lock().await = Some(proxy.spawn_acceptor(listener));
        proxy
    }

    /// The address clients use.
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Connections accepted so far.
    pub(crate) fn accepted(&self) -> u64 {
        self.accepted.load(Ordering::Relaxed)
    }

    fn spawn_acceptor(&self, listener: TcpListener) -> tokio::task::JoinHandle<()> {
        let upstream = self.upstream;
        let cut = self.cut.clone();
        let flow = self.flow.subscribe();
        let accepted = self.accepted.clone();
        let freeze = self.freeze.clone();
        let connections = self.connections.clone();
        tokio::spawn(async move {
            loop {
                let Ok((client, peer)) = listener.accept().await else {
                    continue;
                };
                accepted.fetch_add(1, Ordering::Relaxed);
                let token = cut.lock().unwrap().clone();
                let frozen = freeze.lock().unwrap().clone();
                connections.lock().unwrap().push((peer, frozen.clone()));
                tokio::spawn(forward(client, upstream, token, flow.clone(), frozen));
            }
        })
    }

    /// The visible cut-off: every open connection is reset (RST) and the port
    /// is closed, so new connections are refused, until [`Proxy::restore`].
    pub(crate) async fn cut_off(&self) {
        if let Some(task) = self.acceptor.lock().await.take() {
            task.abort();
            let _ = task.await;
        }
        self.reset_all();
    }

    /// Resets every open connection (RST) but keeps accepting new ones.
    pub(crate) fn reset_all(&self) {
        let mut token = self.cut.lock().unwrap();
        token.cancel();
        *token = CancellationToken::new();
    }

    /// Accepts connections again after [`Proxy::cut_off`], on the same port.
    pub(crate) async fn restore(&self) {
        let mut acceptor = self.acceptor.lock().await;
        if acceptor.is_some() {
            return;
        }
        // The port was ours a moment ago; retry briefly if the kernel still
        // holds it.
        let mut tries = 0;
        let listener = loop {
            match TcpListener::bind(self.addr).await {
                Ok(l) => break l,
                Err(e) if tries < 50 => {
                    tries += 1;
                    eprintln!("proxy: re-binding {} failed ({e}); retrying", self.addr);
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
                Err(e) => panic!("proxy: cannot listen on {} again: {e}", self.addr),
            }
        };
        *acceptor = Some(self.spawn_acceptor(listener));
    }

    /// The proxy-made silent partition: every socket stays open, nothing
    /// moves, until [`Proxy::resume`]. (The fault suite prefers a real packet
    /// drop, see `netns.rs`; this is for setups without one.)
    pub(crate) fn stall(&self) {
        self.flow.send_replace(Flow::Stalled);
    }

    /// Moves bytes again after [`Proxy::stall`].
    pub(crate) fn resume(&self) {
        self.flow.send_replace(Flow::Forward);
    }
}

impl Proxy {
    /// Freezes every open connection for good: its sockets stay open (no FIN, no RST, the
    /// kernel keeps ACKing what the client sends) and no byte moves either way, ever again.
    /// Connections accepted from now on are frozen too, until [`Proxy::thaw_new`].
    pub(crate) fn freeze_all(&self) {
        // The cancelled token stays the current one: new connections are born frozen.
        self.freeze.lock().unwrap().cancel();
    }

    /// Connections accepted from now on forward again; the frozen ones stay frozen.
    pub(crate) fn thaw_new(&self) {
        *self.freeze.lock().unwrap() = CancellationToken::new();
    }

    /// The client addresses of the frozen connections.
    pub(crate) fn frozen_clients(&self) -> Vec<SocketAddr> {
        self.connections
            .lock()
            .unwrap()
            .iter()
            .filter(|(_, frozen)| frozen.is_cancelled())
            .map(|(peer, _)| *peer)
            .collect()
    }

    /// What the clients have sent into frozen connections that sits unread in the proxy's
    /// sockets (their receive queues, from `/proc/self/net/tcp`): per frozen connection, its
    /// client's address, the bytes of data, and whether the client has closed it (its FIN
    /// counts one in the receive queue, not a byte of data).
    pub(crate) fn frozen_unread(&self) -> Vec<(SocketAddr, u64, bool)> {
        /// `/proc/net/tcp` states after the peer's FIN: close-wait, last-ack, closing.
        const PEER_CLOSED: [u8; 3] = [0x08, 0x09, 0x0B];
        let frozen = self.frozen_clients();
        let sockets = crate::support::tcp_sockets(std::process::id());
        frozen
            .into_iter()
            .filter_map(|peer| {
                let s = sockets
                    .iter()
                    .find(|s| s.local == self.addr && s.remote == peer)?;
                let closed = PEER_CLOSED.contains(&s.state);
                Some((
                    peer,
                    s.rx_queue - u64::from(closed && s.rx_queue > 0),
                    closed,
                ))
            })
            .collect()
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        if let Ok(mut a) = self.acceptor.try_lock()
            && let Some(task) = a.take()
        {
            task.abort();
        }
        self.cut.lock().unwrap().cancel();
    }
}

/// Forwards one connection until either side closes or `cut` fires; on a cut
/// both sockets are closed with a reset.
async fn forward(
    client: TcpStream,
    upstream: SocketAddr,
    cut: CancellationToken,
    flow: watch::Receiver<Flow>,
    frozen: CancellationToken,
) {
    let server = tokio::select! {
        () = cut.cancelled() => {
            let _ = client.set_zero_linger();
            return;
        }
        s = TcpStream::connect(upstream) => match s {
            Ok(s) => s,
            Err(_) => {
                let _ = client.set_zero_linger();
                return;
            }
        },
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    // Zero linger on both sockets: whenever a connection ends because of a
    // cut (the pumps are dropped), the kernel sends RST, as it does for a
    // crashed or firewalled peer. (At an orderly end both FINs have already
    // passed, so the reset changes nothing for the peers.)
    let _ = client.set_zero_linger();
    let _ = server.set_zero_linger();
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let up = pump(cr, sw, flow.clone(), frozen.clone());
    let down = pump(sr, cw, flow, frozen);
    tokio::pin!(up, down);
    tokio::select! {
        () = cut.cancelled() => {}
        () = async {
            // An orderly end of one direction waits for the other; an error
            // (a reset) ends both.
            tokio::select! {
                r = &mut up => if r.is_ok() { let _ = (&mut down).await; },
                r = &mut down => if r.is_ok() { let _ = (&mut up).await; },
            }
        } => {}
    }
}

/// Copies `from` to `to` while the flow allows; passes an orderly end (FIN) on.
/// Once `frozen` is cancelled it reads and writes nothing, ever (what arrives
/// stays in the socket's receive queue).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut flow: watch::Receiver<Flow>,
    frozen: CancellationToken,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; BUFFER_BYTES];
    loop {
        wait_forward(&mut flow, &frozen).await;
        let n = tokio::select! {
            biased;
            () = frozen.cancelled() => return std::future::pending().await,
            n = from.read(&mut buf) => n?,
        };
        if n == 0 {
            // Orderly end from this side: pass the FIN on.
            let _ = to.shutdown().await;
            return Ok(());
        }
        wait_forward(&mut flow, &frozen).await;
        tokio::select! {
            biased;
            () = frozen.cancelled() => return std::future::pending().await,
            r = to.write_all(&buf[..n]) => r?,
        }
    }
}

/// Returns once the flow is forward; never once `frozen` is cancelled.
async fn wait_forward(flow: &mut watch::Receiver<Flow>, frozen: &CancellationToken) {
    tokio::select! {
        biased;
        () = frozen.cancelled() => std::future::pending().await,
        () = async {
            let _ = flow.wait_for(|f| *f == Flow::Forward).await;
        } => {}
    }
}
