//! CPU time and memory of a running process, from `/proc/<pid>/{stat,status}`.

use std::sync::OnceLock;

/// Clock ticks per second of `utime`/`stime` (`getconf CLK_TCK`; 100 on Linux).
fn clock_ticks() -> f64 {
    static TICKS: OnceLock<f64> = OnceLock::new();
    *TICKS.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8(o.stdout).ok())
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// CPU seconds (user + system) used so far by process `pid`; 0 if it is gone.
pub(crate) fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The command name is in parentheses and may contain spaces: count fields after it.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    // utime and stime are fields 14 and 15 of stat(5), i.e. 11 and 12 after the name.
    (ticks(11) + ticks(12)) / clock_ticks()
}

/// A memory line of `/proc/<pid>/status` in MiB: `"VmRSS:"` (resident now) or
/// `"VmHWM:"` (peak resident); 0 if the process is gone.
pub(crate) fn status_mib(pid: u32, key: &str) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0)
}

/// One TCP socket of `/proc/<pid>/net/tcp{,6}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TcpSocket {
    /// Local address.
    pub(crate) local: std::net::SocketAddr,
    /// Remote address.
    pub(crate) remote: std::net::SocketAddr,
    /// State (`0x01`: established, `0x0A`: listening).
    pub(crate) state: u8,
    /// Bytes received and not yet read by the socket's owner.
    pub(crate) rx_queue: u64,
    /// Socket inode (matches `/proc/<pid>/fd/*` → `socket:[inode]`).
    pub(crate) inode: u64,
}

/// TCP state "established" in `/proc/net/tcp`.
pub(crate) const TCP_ESTABLISHED: u8 = 0x01;

/// An address of `/proc/net/tcp{,6}` (`0100007F:1F90`): the IP in the kernel's byte order of
/// 32-bit words, the port in hex.
fn proc_net_addr(text: &str) -> Option<std::net::SocketAddr> {
    let (ip, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let ip: std::net::IpAddr = match ip.len() {
        8 => std::net::Ipv4Addr::from(u32::from_str_radix(ip, 16).ok()?.to_ne_bytes()).into(),
        32 => {
            let mut bytes = [0u8; 16];
            for (i, word) in bytes.chunks_mut(4).enumerate() {
                let w = u32::from_str_radix(&ip[i * 8..i * 8 + 8], 16).ok()?;
                word.copy_from_slice(&w.to_ne_bytes());
            }
            std::net::Ipv6Addr::from(bytes).into()
        }
        _ => return None,
    };
    Some(std::net::SocketAddr::new(ip, port))
}

/// Every TCP socket of the network namespace of process `pid` (`/proc/<pid>/net/tcp` and
/// `tcp6`); empty if it is gone.
pub(crate) fn tcp_sockets(pid: u32) -> Vec<TcpSocket> {
    let mut out = Vec::new();
    for file in ["tcp", "tcp6"] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{file}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() < 10 {
                continue;
            }
            let (Some(local), Some(remote)) = (proc_net_addr(f[1]), proc_net_addr(f[2])) else {
                continue;
            };
            let rx_queue = f[4]
                .split_once(':')
                .and_then(|(_, rx)| u64::from_str_radix(rx, 16).ok())
                .unwrap_or(0);
            out.push(TcpSocket {
                local,
                remote,
                state: u8::from_str_radix(f[3], 16).unwrap_or(0),
                rx_queue,
                inode: f[9].parse().unwrap_or(0),
            });
        }
    }
    out
}

/// Inodes of the sockets process `pid` holds open (`/proc/<pid>/fd/*` → `socket:[inode]`).
fn socket_inodes(pid: u32) -> std::collections::HashSet<u64> {
    let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
        return std::collections::HashSet::new();
    };
    fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok())
        .filter_map(|target| {
            target
                .to_str()?
                .strip_prefix("socket:[")?
                .strip_suffix(']')?
                .parse()
                .ok()
        })
        .collect()
}

/// Established TCP connections that process `pid` itself holds to port `port` (the API
/// server's), by matching its socket inodes against its network namespace's TCP table.
pub(crate) fn tcp_connections_to(pid: u32, port: u16) -> usize {
    let inodes = socket_inodes(pid);
    tcp_sockets(pid)
        .iter()
        .filter(|s| s.state == TCP_ESTABLISHED && s.remote.port() == port)
        .filter(|s| inodes.contains(&s.inode))
        .count()
}
