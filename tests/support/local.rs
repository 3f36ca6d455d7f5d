//! Local helpers that need no cluster: the repository root, host tools that must be
//! installed (a missing one fails the test, never skips it), and plain HTTP GETs.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The repository root.
pub(crate) fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// `name` on PATH (or in `/usr/sbin`, `/sbin`); panics with `how_to_get` when it is missing.
pub(crate) fn tool(name: &str, how_to_get: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/sbin")])
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("`{name}` is not installed: {how_to_get}"))
}

/// One HTTP/1.0 GET over a fresh connection to `addr`: status code and body.
pub(crate) async fn http_get_at(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    http_request(addr, "GET", path).await
}

/// One bodiless HTTP/1.0 request over a fresh connection to `addr`: status code and body.
/// HTTP/1.0, so that the server closes the connection after the body and never chunks it.
pub(crate) async fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
) -> std::io::Result<(u16, String)> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    request_over(stream, &addr.to_string(), method, path).await
}

/// One bodiless HTTP/1.0 request over `stream` (already connected, to `host`): status code
/// and body.
pub(crate) async fn request_over(
    mut stream: tokio::net::TcpStream,
    host: &str,
    method: &str,
    path: &str,
) -> std::io::Result<(u16, String)> {
    let req = format!("{method} {path} HTTP/1.0\r\nHost: {host}\r\nContent-Length: 0\r\n\r\n");
    stream.write_all(req.as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    let text = String::from_utf8_lossy(&raw);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    Ok((status, body.to_string()))
}

/// [`http_get_at`] 127.0.0.1:`port`.
pub(crate) async fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    http_get_at(SocketAddr::from(([127, 0, 0, 1], port)), path).await
}
