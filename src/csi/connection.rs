//! A gRPC channel to one driver's Unix socket, with connection-loss signals.

use std::{
    fmt, io,
    path::{Path, PathBuf},
    pin::Pin,
    str::FromStr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    task::{Context, Poll},
    time::{Duration, Instant},
};

use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::UnixStream,
    sync::watch,
};
use tonic::transport::{Channel, Endpoint, Uri};

use crate::backoff::{Backoff, Doubling};

/// Delay between connection attempts: 100 ms after the first failure, doubling to 1 s
/// (csi-lib-utils caps at 1 s).
const CONNECT_BACKOFF: Doubling = Doubling::new(Duration::from_millis(100), Duration::from_secs(1));
/// How often a connect that keeps failing is logged.
const STILL_CONNECTING_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// Errors of this module.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The address is not a Unix socket address.
    #[error(
        "invalid CSI address {address:?}: only Unix sockets are supported (/path, unix:///path or unix:/path)"
    )]
    Address {
        /// The address as given.
        address: String,
    },
    /// The socket did not accept a connection in time.
    #[error("failed to connect to CSI driver at {address} within {after:?}: {cause}")]
    Timeout {
        /// The socket path.
        address: Address,
        /// How long we tried.
        after: Duration,
        /// Why the last attempt failed ([`connect_failure`]).
        cause: String,
    },
}

/// Why connecting to the socket at `address` failed, as an operator needs it, on one line: the
/// OS error (found in `error`'s causes; tonic's own text is only "transport error") and what it
/// usually means. A missing socket, one nobody listens on, and one this process may not open
/// (the likeliest in production: the driver's socket owned by root with mode 0755, attacher-hub
/// running as the image's UID 65532) read differently; the last names this process's user,
/// the socket's owner and mode, and the two ways out.
pub fn connect_failure(address: &Address, error: &(dyn std::error::Error + 'static)) -> String {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(error);
    let mut os = None;
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            os = Some(io);
        }
        source = e.source();
    }
    let path = address.path().display();
    let Some(io) = os else {
        return format!(
            "cannot connect to {path}: {}",
            crate::telemetry::error_chain(error)
        );
    };
    let hint = match io.kind() {
        io::ErrorKind::NotFound => {
            "no socket at this path: is the driver running, and its socket directory mounted here?"
                .to_owned()
        }
        io::ErrorKind::ConnectionRefused => {
            "nothing listens on it: a socket file left behind by a driver that stopped?".to_owned()
        }
        io::ErrorKind::PermissionDenied => permission_hint(address.path()),
        _ => String::new(),
    };
    if hint.is_empty() {
        format!("cannot connect to {path}: {io}")
    } else {
        format!("cannot connect to {path}: {io}: {hint}")
    }
}

/// What to do about a socket this process may not connect to: connecting needs write
/// permission on the socket file (and search permission on every directory above it).
fn permission_hint(socket: &Path) -> String {
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
    let me = process_ids();
    match std::fs::metadata(socket) {
        Ok(meta) => format!(
            "this process ({me}) may not write to the socket (owner UID {}, GID {}, mode {:04o}), \
             which connecting needs; run attacher-hub as the socket's owner (for a root-owned \
             socket: securityContext runAsUser: 0 with every capability dropped, as \
             deploy/components/sidecar-swap does), or have the driver create the socket \
             writable by a group of this process (runAsGroup, fsGroup)",
            meta.uid(),
            meta.gid(),
            meta.permissions().mode() & 0o7777,
        ),
        Err(e) => format!(
            "this process ({me}) may not reach the socket ({e}): every directory above it \
             needs search permission for this user, and the socket write permission; run \
             attacher-hub as the socket's owner (for root: securityContext runAsUser: 0 with \
             every capability dropped) or make them accessible to a group of this process \
             (runAsGroup, fsGroup)"
        ),
    }
}

/// `UID u, GID g` of this process, with its supplementary groups when it has any (from
/// `/proc/self/status`; `?` where it cannot be read).
fn process_ids() -> String {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .map(|rest| rest.split_whitespace().collect::<Vec<_>>())
    };
    let first = |key: &str| {
        field(key)
            .and_then(|v| v.first().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "?".to_owned())
    };
    let groups = field("Groups:").unwrap_or_default();
    if groups.is_empty() {
        format!("UID {}, GID {}", first("Uid:"), first("Gid:"))
    } else {
        format!(
            "UID {}, GID {}, groups {}",
            first("Uid:"),
            first("Gid:"),
            groups.join(",")
        )
    }
}

/// The address of a driver socket: an absolute or relative filesystem path.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Address(PathBuf);

impl Address {
    /// The socket path.
    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl FromStr for Address {
    type Err = Error;

    /// Accepts `/path`, `unix:///path` and `unix:/path` (external-attacher
    /// turns an absolute path into `unix://` + path; gRPC accepts both URL
    /// forms). Anything else, TCP addresses included, is refused.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let path = if let Some(rest) = s.strip_prefix("unix://") {
            rest
        } else if let Some(rest) = s.strip_prefix("unix:") {
            rest
        } else if s.starts_with('/') {
            s
        } else {
            ""
        };
        if !path.starts_with('/') || path.len() < 2 {
            return Err(Error::Address { address: s.into() });
        }
        Ok(Self(PathBuf::from(path)))
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "unix://{}", self.0.display())
    }
}

/// A gRPC channel to one driver. Cheap to clone.
///
/// The channel re-dials by itself after the connection breaks. Every loss of an
/// established connection (the driver closed the socket, exited, or the
/// stream failed) bumps the counter behind [`Connection::losses`], so the owner
/// can re-probe the driver and re-detect its capabilities.
#[derive(Clone, Debug)]
pub struct Connection {
    /// Where the driver listens.
    address: Address,
    /// The multiplexed HTTP/2 channel every client of this driver shares.
    channel: Channel,
    /// Count of lost connections so far.
    losses: watch::Receiver<u64>,
}

impl Connection {
    /// Connects to `address`, retrying with backoff (100 ms doubling to 1 s)
    /// until the socket accepts a connection or `give_up_after` has passed
    /// (`None`: never give up).
    pub async fn connect(address: Address, give_up_after: Option<Duration>) -> Result<Self, Error> {
        Self::connect_reporting(address, give_up_after, |_| {}).await
    }

    /// As [`Connection::connect`], telling `failed` why each attempt failed
    /// ([`connect_failure`]); the first failure and then one every
    /// [`STILL_CONNECTING_LOG_INTERVAL`] are logged.
    pub async fn connect_reporting(
        address: Address,
        give_up_after: Option<Duration>,
        mut failed: impl FnMut(&str),
    ) -> Result<Self, Error> {
        let (tx, losses) = watch::channel(0u64);
        let tx = Arc::new(tx);
        let path = address.0.clone();
        let connector = tower::service_fn(move |_: Uri| {
            let path = path.clone();
            let tx = tx.clone();
            async move {
                let stream = UnixStream::connect(&path).await?;
                Ok::<_, io::Error>(TokioIo::new(Monitored::new(stream, tx)))
            }
        });
        // The authority is never looked at by a Unix-socket server; grpc-go
        // clients send "localhost" too.
        let endpoint = Endpoint::from_static("http://localhost");

        let started = Instant::now();
        let mut backoff = Backoff::new(CONNECT_BACKOFF);
        let mut last_log: Option<Instant> = None;
        loop {
            match endpoint.connect_with_connector(connector.clone()).await {
                Ok(channel) => {
                    tracing::debug!(%address, "connected to CSI driver");
                    return Ok(Self {
                        address,
                        channel,
                        losses,
                    });
                }
                Err(source) => {
                    let cause = connect_failure(&address, &source);
                    failed(&cause);
                    if give_up_after.is_some_and(|limit| started.elapsed() >= limit) {
                        return Err(Error::Timeout {
                            address,
                            after: started.elapsed(),
                            cause,
                        });
                    }
                    if last_log.is_none_or(|t| t.elapsed() >= STILL_CONNECTING_LOG_INTERVAL) {
                        tracing::warn!(
                            error = %cause,
                            "cannot connect to the CSI driver; retrying every second"
                        );
                        last_log = Some(Instant::now());
                    }
                    tokio::time::sleep(backoff.fail()).await;
                }
            }
        }
    }

    /// The driver's address.
    pub fn address(&self) -> &Address {
        &self.address
    }

    /// The gRPC channel.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// A receiver whose value counts lost connections; `changed()` resolves on
    /// each loss.
    pub fn losses(&self) -> watch::Receiver<u64> {
        self.losses.clone()
    }
}

/// A Unix stream that reports the end of the connection once.
struct Monitored {
    inner: UnixStream,
    losses: Arc<watch::Sender<u64>>,
    reported: AtomicBool,
}

impl Monitored {
    fn new(inner: UnixStream, losses: Arc<watch::Sender<u64>>) -> Self {
        Self {
            inner,
            losses,
            reported: AtomicBool::new(false),
        }
    }

    fn report(&self) {
        if !self.reported.swap(true, Ordering::AcqRel) {
            self.losses.send_modify(|n| *n += 1);
        }
    }
}

impl AsyncRead for Monitored {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let poll = Pin::new(&mut self.inner).poll_read(cx, buf);
        match &poll {
            Poll::Ready(Ok(())) if buf.filled().len() == before && buf.remaining() > 0 => {
                self.report()
            }
            Poll::Ready(Err(_)) => self.report(),
            _ => {}
        }
        poll
    }
}

impl AsyncWrite for Monitored {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let poll = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Err(_)) = &poll {
            self.report();
        }
        poll
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_in_the_three_unix_forms_are_accepted() {
        for a in [
            "/csi/csi.sock",
            "unix:///csi/csi.sock",
            "unix:/csi/csi.sock",
        ] {
            let addr: Address = a.parse().unwrap();
            assert_eq!(addr.path(), Path::new("/csi/csi.sock"), "{a}");
            assert_eq!(addr.to_string(), "unix:///csi/csi.sock");
        }
    }

    #[test]
    fn other_addresses_are_refused_with_a_message_naming_them() {
        for a in [
            "",
            "csi.sock",
            "tcp://127.0.0.1:10000",
            "127.0.0.1:10000",
            "unix://",
            "dns:///x",
        ] {
            let err = a.parse::<Address>().unwrap_err();
            assert!(err.to_string().contains(&format!("{a:?}")), "{err}");
        }
    }

    #[test]
    fn connect_attempts_wait_100_ms_doubling_to_1_s() {
        let mut backoff = Backoff::new(CONNECT_BACKOFF);
        let pauses: Vec<_> = (0..7).map(|_| backoff.fail().as_millis()).collect();
        assert_eq!(pauses, [100, 200, 400, 800, 1000, 1000, 1000]);
    }

    #[tokio::test]
    async fn connect_gives_up_after_the_limit_when_nobody_listens() {
        let dir = tempfile::tempdir().unwrap();
        let addr: Address = dir
            .path()
            .join("none.sock")
            .to_str()
            .unwrap()
            .parse()
            .unwrap();
        let err = Connection::connect(addr, Some(Duration::from_millis(300)))
            .await
            .unwrap_err();
        assert!(matches!(err, Error::Timeout { .. }), "{err}");
    }

    /// A missing socket, one nobody listens on, and one this process may not open read
    /// differently, each with the path and the OS error.
    #[tokio::test]
    async fn a_failed_connect_names_the_path_and_the_os_cause() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cause = async |path: &Path| {
            let address: Address = path.to_str().expect("UTF-8").parse().expect("a path");
            let mut seen = Vec::new();
            let err =
                Connection::connect_reporting(address, Some(Duration::from_millis(50)), |c| {
                    seen.push(c.to_owned())
                })
                .await
                .expect_err("nobody listens");
            assert!(!seen.is_empty());
            assert!(
                err.to_string().contains(seen.last().expect("a failure")),
                "{err}"
            );
            seen.pop().expect("a failure")
        };
        let missing = dir.path().join("missing.sock");
        let text = cause(&missing).await;
        assert!(
            text.starts_with(&format!("cannot connect to {}: No such file or directory (os error 2): no socket at this path", missing.display())),
            "{text}"
        );
        // A socket file whose listener is gone.
        let stale = dir.path().join("stale.sock");
        drop(std::os::unix::net::UnixListener::bind(&stale).expect("bind"));
        let text = cause(&stale).await;
        assert!(
            text.contains("Connection refused (os error 111): nothing listens on it"),
            "{text}"
        );
        // Permission denied cannot be made as root (tests/deploy/topologies.rs runs the binary as UID
        // 65532 for it); the text for a socket that exists: one line with the path, this
        // process's user, the socket's owner and mode, and both fixes.
        let denied = io::Error::from(io::ErrorKind::PermissionDenied);
        let socket = dir.path().join("root.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&socket, std::fs::Permissions::from_mode(0o755))
                .expect("chmod");
        }
        let address: Address = socket.to_str().expect("UTF-8").parse().expect("a path");
        let text = connect_failure(&address, &denied);
        let uid = process_ids();
        let head = format!(
            "cannot connect to {}: permission denied: ",
            socket.display()
        );
        let who = format!("this process ({uid}) may not write to the socket");
        for part in [
            head.as_str(),
            who.as_str(),
            "mode 0755",
            "runAsUser: 0 with every capability dropped",
            "writable by a group of this process (runAsGroup, fsGroup)",
        ] {
            assert!(text.contains(part), "{part:?} not in {text}");
        }
        assert!(!text.contains('\n'), "one line: {text}");
        // A socket behind a directory this process may not search: no owner to name.
        let text = connect_failure(
            &"/nonexistent/dir/csi.sock".parse().expect("a path"),
            &denied,
        );
        assert!(
            text.contains("may not reach the socket") && text.contains("search permission"),
            "{text}"
        );
    }
}
