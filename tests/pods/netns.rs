//! A pod's network namespace: its own loopback, as a pod has its own network, so that two
//! replicas on one node both listen on `:8080` as they would in a cluster.
//!
//! The namespace is made with iproute2 (`ip netns add`, as root). The pod reaches the API server
//! through a listener the runner opens inside the namespace on `127.0.0.1:<API server port>`
//! (the address the API server's certificate names), which forwards to the API server on the
//! host's loopback; the runner reaches the pod's ports (probes, a test's scrape) by opening the
//! connection inside the namespace. Both open their socket from a thread that has entered the
//! namespace (setns affects only the calling thread); the socket stays in the namespace it was
//! made in.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// A network namespace, deleted when dropped.
#[derive(Debug)]
pub(crate) struct Netns {
    name: String,
    path: PathBuf,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip (iproute2): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Netns {
    /// A new namespace with its loopback up.
    pub(crate) fn create(name: &str) -> Result<Netns, String> {
        // A namespace of an earlier run that died before cleaning up.
        let _ = ip(&["netns", "delete", name]);
        ip(&["netns", "add", name])?;
        let ns = Netns {
            name: name.to_string(),
            path: Path::new("/run/netns").join(name),
        };
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// The namespace's file (for `nsenter --net=`).
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// A TCP connection to `127.0.0.1:port` inside the namespace.
    pub(crate) async fn connect(
        &self,
        port: u16,
        timeout: Duration,
    ) -> std::io::Result<tokio::net::TcpStream> {
        connect_in(&self.path, port, timeout).await
    }

    /// A TCP listener on `127.0.0.1:port` inside the namespace.
    pub(crate) fn listen(&self, port: u16) -> std::io::Result<tokio::net::TcpListener> {
        let listener = inside(&self.path, move || {
            let l = std::net::TcpListener::bind(SocketAddr::from(([127, 0, 0, 1], port)))?;
            l.set_nonblocking(true)?;
            Ok(l)
        })?;
        tokio::net::TcpListener::from_std(listener)
    }

    /// Forwards connections to `127.0.0.1:<target's port>` inside the namespace to `target` on
    /// the host, until the returned task is aborted.
    pub(crate) fn forward(
        &self,
        target: SocketAddr,
    ) -> std::io::Result<tokio::task::JoinHandle<()>> {
        let listener = self.listen(target.port())?;
        Ok(tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        }))
    }
}

/// Runs `f` on a new thread inside the namespace at `path` (the thread ends with `f`, so nothing
/// else ever runs in the namespace by mistake).
fn inside<T: Send + 'static>(
    path: &Path,
    f: impl FnOnce() -> std::io::Result<T> + Send + 'static,
) -> std::io::Result<T> {
    let path = path.to_path_buf();
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path)?;
        rustix::thread::move_into_link_name_space(
            std::os::fd::AsFd::as_fd(&file),
            Some(rustix::thread::LinkNameSpaceType::Network),
        )?;
        f()
    })
    .join()
    .map_err(|_| std::io::Error::other("the namespace thread panicked"))?
}

/// A TCP connection to `127.0.0.1:port` inside the namespace at `path`. The blocking connect
/// runs on the namespace's own thread, off the runtime's threads.
pub(crate) async fn connect_in(
    path: &Path,
    port: u16,
    timeout: Duration,
) -> std::io::Result<tokio::net::TcpStream> {
    let path = path.to_path_buf();
    let stream = tokio::task::spawn_blocking(move || {
        inside(&path, move || {
            let s = std::net::TcpStream::connect_timeout(
                &SocketAddr::from(([127, 0, 0, 1], port)),
                timeout,
            )?;
            s.set_nonblocking(true)?;
            Ok(s)
        })
    })
    .await
    .map_err(std::io::Error::other)??;
    tokio::net::TcpStream::from_std(stream)
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = ip(&["netns", "delete", &self.name]);
    }
}
