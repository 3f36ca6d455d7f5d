//! A network namespace for one hub, joined to the host by a veth pair, so
//! that the hub's packets to the API server can really be dropped (no FIN, no
//! RST: the kernel retransmits into the void, as on a broken network).
//!
//! Layout (`N` is a per-namespace number):
//!
//! ```text
//!   host                                     namespace ahf-<pid>-<n>
//!   relay proxy on 10.213.N.1:P  <── veth ──>  10.213.N.2
//!   (forwards to the API server              hub: kubeconfig server https://127.0.0.1:P,
//!    on 127.0.0.1)                             DNAT 127.0.0.1:P -> 10.213.N.1:P
//! ```
//!
//! The hub keeps the kubeconfig address `127.0.0.1`, which the API server's
//! certificate names, while its packets leave through the veth (`iptables`
//! DNAT + SNAT inside the namespace, `route_localnet` on). The black-hole is
//! two `iptables DROP` rules inside the namespace (outgoing and incoming
//! packets of every connection to the relay); the hub's HTTP listener on `10.213.N.2` stays
//! reachable from the host. Needs root (`ip netns`, `iptables`).

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Per-process counter of namespaces, part of names and subnets.
static NEXT: AtomicU32 = AtomicU32::new(0);

/// A network namespace with a veth link to the host; deleted on drop.
#[derive(Debug)]
pub(crate) struct NetNs {
    /// `ip netns` name.
    name: String,
    /// The host end of the veth pair.
    host_if: String,
    /// The namespace end.
    ns_if: String,
    /// Address of the host end.
    host_ip: Ipv4Addr,
    /// Address of the namespace end.
    ns_ip: Ipv4Addr,
}

fn run(args: &[&str]) -> Result<(), String> {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|e| format!("cannot run {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`{}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl NetNs {
    /// Creates the namespace and the link. Panics with the failing command
    /// (not root, no `ip`/`iptables`, no veth support) otherwise.
    pub(crate) fn create() -> NetNs {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        // Subnet octet from pid and counter; /30 per namespace.
        let octet = u8::try_from((pid.wrapping_mul(7).wrapping_add(n * 13)) % 250 + 1).unwrap();
        let tag = format!("{}{}", pid % 100_000, n);
        let ns = NetNs {
            name: format!("ahf-{pid}-{n}"),
            host_if: format!("ahf{tag}h"),
            ns_if: format!("ahf{tag}n"),
            host_ip: Ipv4Addr::new(10, 213, octet, 1),
            ns_ip: Ipv4Addr::new(10, 213, octet, 2),
        };
        ns.setup().unwrap_or_else(|e| {
            panic!(
                "cannot build a network namespace for the black-hole fault (needs root, iproute2, \
                 iptables and veth support; scripts/install-deps.sh installs the tools): {e}"
            )
        });
        ns
    }

    fn setup(&self) -> Result<(), String> {
        let host_cidr = format!("{}/30", self.host_ip);
        let ns_cidr = format!("{}/30", self.ns_ip);
        run(&["ip", "netns", "add", &self.name])?;
        run(&[
            "ip",
            "link",
            "add",
            &self.host_if,
            "type",
            "veth",
            "peer",
            "name",
            &self.ns_if,
        ])?;
        run(&["ip", "link", "set", &self.ns_if, "netns", &self.name])?;
        run(&["ip", "addr", "add", &host_cidr, "dev", &self.host_if])?;
        run(&["ip", "link", "set", &self.host_if, "up"])?;
        self.exec(&["ip", "addr", "add", &ns_cidr, "dev", &self.ns_if])?;
        self.exec(&["ip", "link", "set", &self.ns_if, "up"])?;
        self.exec(&["ip", "link", "set", "lo", "up"])?;
        self.exec(&["sysctl", "-qw", "net.ipv4.conf.all.route_localnet=1"])?;
        self.exec(&[
            "iptables",
            "-t",
            "nat",
            "-A",
            "POSTROUTING",
            "-o",
            &self.ns_if,
            "-j",
            "SNAT",
            "--to-source",
            &self.ns_ip.to_string(),
        ])?;
        Ok(())
    }

    /// Runs a command inside the namespace.
    fn exec(&self, args: &[&str]) -> Result<(), String> {
        let mut full = vec!["ip", "netns", "exec", &self.name];
        full.extend_from_slice(args);
        run(&full)
    }

    /// The command prefix that runs a program inside the namespace
    /// (`ip netns exec` execs, so the PID is the program's).
    pub(crate) fn prefix(&self) -> Vec<String> {
        vec![
            "ip".to_string(),
            "netns".to_string(),
            "exec".to_string(),
            self.name.clone(),
        ]
    }

    /// The host end's address (where a relay for the namespace listens).
    pub(crate) fn host_ip(&self) -> Ipv4Addr {
        self.host_ip
    }

    /// The namespace end's address (where the hub's HTTP listener binds).
    pub(crate) fn ns_ip(&self) -> Ipv4Addr {
        self.ns_ip
    }

    /// Makes `127.0.0.1:port` inside the namespace lead to `host_ip:port` on
    /// the host (where a relay listens).
    pub(crate) fn redirect_loopback(&self, port: u16) {
        let to = SocketAddr::V4(SocketAddrV4::new(self.host_ip, port)).to_string();
        self.exec(&[
            "iptables",
            "-t",
            "nat",
            "-A",
            "OUTPUT",
            "-d",
            "127.0.0.1",
            "-p",
            "tcp",
            "--dport",
            &port.to_string(),
            "-j",
            "DNAT",
            "--to-destination",
            &to,
        ])
        .unwrap_or_else(|e| panic!("redirecting port {port} out of the namespace: {e}"));
    }

    /// The two DROP rules: every packet of a connection first addressed to
    /// `127.0.0.1:port` (so, after the DNAT, to the relay), out and in.
    /// Matching on the connection's original destination catches the
    /// replies too, whose addresses the NAT rewrites on the way in.
    fn drop_rules(&self, op: &str, port: u16) -> Result<(), String> {
        let port = port.to_string();
        for chain in ["OUTPUT", "INPUT"] {
            self.exec(&[
                "iptables",
                op,
                chain,
                "-p",
                "tcp",
                "-m",
                "conntrack",
                "--ctorigdst",
                "127.0.0.1",
                "--ctorigdstport",
                &port,
                "-j",
                "DROP",
            ])?;
        }
        Ok(())
    }

    /// Drops every packet between the namespace and the host's `port`, both
    /// ways, from now on (existing connections included).
    pub(crate) fn blackhole(&self, port: u16) {
        self.drop_rules("-I", port)
            .unwrap_or_else(|e| panic!("installing the black-hole: {e}"));
    }

    /// Ends the black-hole for new connections only: every connection that
    /// existed before this call stays black-holed for good, as when a
    /// middlebox (NAT, load balancer, firewall) loses its state and silently
    /// drops the packets of flows it no longer knows. Connections opened from
    /// now on are marked and pass.
    pub(crate) fn heal_new_connections_only(&self, port: u16) {
        let port_s = port.to_string();
        let unmarked = |chain: &'static str| {
            vec![
                "iptables",
                "-I",
                chain,
                "-p",
                "tcp",
                "-m",
                "connmark",
                "!",
                "--mark",
                "0x7a",
                "-m",
                "conntrack",
                "--ctorigdst",
                "127.0.0.1",
                "--ctorigdstport",
                &port_s,
                "-j",
                "DROP",
            ]
        };
        let result = self
            .exec(&unmarked("OUTPUT"))
            .and_then(|()| self.exec(&unmarked("INPUT")))
            .and_then(|()| {
                // Before the DROP in OUTPUT: mark each new connection.
                self.exec(&[
                    "iptables",
                    "-I",
                    "OUTPUT",
                    "-p",
                    "tcp",
                    "-m",
                    "conntrack",
                    "--ctstate",
                    "NEW",
                    "-j",
                    "CONNMARK",
                    "--set-mark",
                    "0x7a",
                ])
            })
            .and_then(|()| self.drop_rules("-D", port));
        result.unwrap_or_else(|e| panic!("healing new connections only: {e}"));
    }

    /// Packets the black-hole rules have dropped so far (both chains), so a
    /// scenario can show that the fault really happened.
    pub(crate) fn dropped_packets(&self) -> u64 {
        let mut total = 0;
        for chain in ["OUTPUT", "INPUT"] {
            let out = Command::new("ip")
                .args([
                    "netns", "exec", &self.name, "iptables", "-L", chain, "-n", "-v", "-x",
                ])
                .output()
                .expect("run iptables");
            for line in String::from_utf8_lossy(&out.stdout).lines() {
                if line.contains("DROP") && line.contains("ctorigdst") {
                    total += line
                        .split_whitespace()
                        .next()
                        .and_then(|n| n.parse::<u64>().ok())
                        .unwrap_or(0);
                }
            }
        }
        total
    }

    /// Removes the black-hole of [`NetNs::blackhole`].
    pub(crate) fn heal(&self, port: u16) {
        self.drop_rules("-D", port)
            .unwrap_or_else(|e| panic!("removing the black-hole: {e}"));
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Deleting the namespace also deletes the veth pair.
        if let Err(e) = run(&["ip", "netns", "del", &self.name]) {
            eprintln!("cleaning up: {e}");
        }
        let _ = run(&["ip", "link", "del", &self.host_if]);
    }
}
