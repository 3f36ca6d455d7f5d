//! Opening a connection to the API server: TCP (with a connect timeout, keepalive and a user
//! timeout), then TLS (with a handshake timeout, `h2` then `http/1.1` offered by ALPN), and the
//! protocol the server chose.

use std::{sync::Arc, time::Duration};

use futures::future::BoxFuture;

/// Longest wait for a TCP connection to the API server.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest TLS handshake (client-go's `TLSHandshakeTimeout`).
pub const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A connection idle this long gets TCP keepalive probes: a peer that vanished without a FIN or
/// RST is noticed after [`TCP_KEEPALIVE_IDLE`] + [`TCP_KEEPALIVE_PROBES`] ×
/// [`TCP_KEEPALIVE_INTERVAL`] (25 s) by the kernel, below the HTTP/2 health check. It is what
/// finds a dead peer on the HTTP/1.1 path, which has no PING.
pub const TCP_KEEPALIVE_IDLE: Duration = Duration::from_secs(10);

/// Pause between unanswered keepalive probes.
pub const TCP_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(5);

/// Unanswered probes before the kernel drops the connection.
pub const TCP_KEEPALIVE_PROBES: u32 = 3;

/// Data the API server has not acknowledged for this long ends the connection
/// (`TCP_USER_TIMEOUT`): a request sent into a black hole fails instead of hanging for the
/// kernel's ~15 minutes of retransmissions.
pub const TCP_USER_TIMEOUT: Duration = Duration::from_secs(20);

/// ALPN identifier of HTTP/2.
const ALPN_H2: &[u8] = b"h2";

/// ALPN identifier of HTTP/1.1.
const ALPN_HTTP1: &[u8] = b"http/1.1";

/// A byte stream to the API server.
pub(crate) trait Io:
    tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static
{
}

impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static> Io for T {}

/// What a dial gave.
pub(crate) enum Dialed {
    /// A connection on which the server agreed to speak HTTP/2.
    H2(Box<dyn Io>),
    /// The server speaks HTTP/1.1 only (no `h2` in ALPN, or a plain `http://` URL).
    Http1,
}

impl std::fmt::Debug for Dialed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::H2(_) => "H2",
            Self::Http1 => "Http1",
        })
    }
}

/// Why a dial failed. Every variant may be retried: the transport dials again with backoff when
/// a request needs a connection.
#[derive(Debug, thiserror::Error)]
pub enum DialError {
    /// The host name did not resolve, or resolved to nothing.
    #[error("resolving {server} failed: {source}")]
    Resolve {
        /// `host:port`.
        server: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// No TCP connection within [`CONNECT_TIMEOUT`], or it was refused.
    #[error("connecting to {server} failed: {source}")]
    Connect {
        /// `host:port`.
        server: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The TLS handshake failed or took longer than [`TLS_HANDSHAKE_TIMEOUT`].
    #[error("TLS handshake with {server} failed: {source}")]
    Tls {
        /// `host:port`.
        server: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The HTTP/2 handshake failed.
    #[error("HTTP/2 handshake with {server} failed: {source}")]
    H2 {
        /// `host:port`.
        server: String,
        /// The cause.
        #[source]
        source: h2::Error,
    },
}

/// Opens connections to one server.
pub(crate) trait Dial: Send + Sync + 'static {
    /// One attempt, bounded in time.
    fn dial(&self) -> BoxFuture<'static, Result<Dialed, DialError>>;

    /// `host:port`, for logs and errors.
    fn server(&self) -> &str;
}

/// The production dialer: TCP, then TLS unless the URL is `http://`.
pub(crate) struct TcpDialer {
    /// Host name or IP address (without brackets).
    host: String,
    /// TCP port.
    port: u16,
    /// `host:port`.
    server: String,
    /// TLS, with the name the server's certificate must carry; `None` for `http://`.
    tls: Option<(
        tokio_rustls::TlsConnector,
        rustls::pki_types::ServerName<'static>,
    )>,
}

impl TcpDialer {
    /// A dialer for `config.cluster_url`, with kube's TLS settings (CA, client identity,
    /// `tls_server_name`) and ALPN `h2`, `http/1.1`.
    pub(crate) fn new(config: &kube::Config) -> kube::Result<Self> {
        use kube::client::ConfigExt;

        let uri = &config.cluster_url;
        let https = uri.scheme_str() != Some("http");
        let host = uri
            .host()
            .ok_or_else(|| {
                kube::Error::Service(format!("the cluster URL {uri} has no host").into())
            })?
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let server = if host.contains(':') {
            format!("[{host}]:{port}")
        } else {
            format!("{host}:{port}")
        };
        let tls = if https {
            let mut rustls_config = config.rustls_client_config()?;
            rustls_config.alpn_protocols = vec![ALPN_H2.to_vec(), ALPN_HTTP1.to_vec()];
            let name = config
                .tls_server_name
                .clone()
                .unwrap_or_else(|| host.clone());
            let name = rustls::pki_types::ServerName::try_from(name).map_err(|e| {
                kube::Error::RustlsTls(kube::client::RustlsTlsError::InvalidServerName(e))
            })?;
            Some((
                tokio_rustls::TlsConnector::from(Arc::new(rustls_config)),
                name,
            ))
        } else {
            None
        };
        Ok(Self {
            host,
            port,
            server,
            tls,
        })
    }
}

impl Dial for TcpDialer {
    fn dial(&self) -> BoxFuture<'static, Result<Dialed, DialError>> {
        let host = self.host.clone();
        let port = self.port;
        let server = self.server.clone();
        let tls = self.tls.clone();
        Box::pin(async move {
            let Some((connector, name)) = tls else {
                // `http://`: HTTP/1.1, as client-go speaks to a plain-text server.
                return Ok(Dialed::Http1);
            };
            let tcp = connect(&host, port, &server).await?;
            let tls = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, connector.connect(name, tcp))
                .await
                .unwrap_or_else(|_| {
                    Err(std::io::Error::new(
                        std::io::ErrorKind::TimedOut,
                        format!("no handshake within {TLS_HANDSHAKE_TIMEOUT:?}"),
                    ))
                })
                .map_err(|source| DialError::Tls {
                    server: server.clone(),
                    source,
                })?;
            if tls.get_ref().1.alpn_protocol() == Some(ALPN_H2) {
                Ok(Dialed::H2(Box::new(tls)))
            } else {
                Ok(Dialed::Http1)
            }
        })
    }

    fn server(&self) -> &str {
        &self.server
    }
}

/// A TCP connection to the first address of `host` that answers, within [`CONNECT_TIMEOUT`]
/// for all of them, with keepalive and a user timeout.
async fn connect(host: &str, port: u16, server: &str) -> Result<tokio::net::TcpStream, DialError> {
    let attempt = async {
        let addrs: Vec<std::net::SocketAddr> = tokio::net::lookup_host((host, port))
            .await
            .map_err(|source| DialError::Resolve {
                server: server.to_owned(),
                source,
            })?
            .collect();
        let mut last = std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "the name resolved to no address",
        );
        for addr in addrs {
            match tokio::net::TcpStream::connect(addr).await {
                Ok(stream) => return Ok(stream),
                Err(e) => last = e,
            }
        }
        Err(DialError::Connect {
            server: server.to_owned(),
            source: last,
        })
    };
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, attempt)
        .await
        .unwrap_or_else(|_| {
            Err(DialError::Connect {
                server: server.to_owned(),
                source: std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no connection within {CONNECT_TIMEOUT:?}"),
                ),
            })
        })?;
    // Best effort: a socket without these options still works.
    let socket = socket2::SockRef::from(&stream);
    let _ = socket.set_tcp_nodelay(true);
    let _ = socket.set_tcp_keepalive(
        &socket2::TcpKeepalive::new()
            .with_time(TCP_KEEPALIVE_IDLE)
            .with_interval(TCP_KEEPALIVE_INTERVAL)
            .with_retries(TCP_KEEPALIVE_PROBES),
    );
    #[cfg(target_os = "linux")]
    let _ = socket.set_tcp_user_timeout(Some(TCP_USER_TIMEOUT));
    Ok(stream)
}
