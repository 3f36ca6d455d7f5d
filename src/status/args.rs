//! The command line of `attacher-hub status` (ordinary clap flags).

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, ValueEnum};

/// The command line of `attacher-hub status`.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "attacher-hub status",
    about = "Show the drivers of a running attacher-hub: state, Lease holder, queue depths, \
             attached VolumeAttachments and last error",
    after_help = "Exactly one of --address and --pod. VolumeAttachments are counted per driver \
                  (ATTACHED: attached/total) whenever a Kubernetes configuration is found \
                  (--kubeconfig, $KUBECONFIG, ~/.kube/config or the pod's service account)."
)]
pub struct Args {
    /// The hub's HTTP endpoint (--http-endpoint): http://host:port, host:port or :port
    /// (this machine).
    #[arg(long, conflicts_with = "pod", required_unless_present = "pod")]
    pub address: Option<String>,
    /// A hub pod, read through the API server's pod proxy (needs `get` on pods/proxy).
    #[arg(long)]
    pub pod: Option<String>,
    /// Namespace of --pod (default: the kubeconfig context's, else "default").
    #[arg(short, long)]
    pub namespace: Option<String>,
    /// The pod's HTTP port (--http-endpoint).
    #[arg(long, default_value_t = 8080)]
    pub port: u16,
    /// kubeconfig for --pod and for counting VolumeAttachments (default, as kubectl:
    /// $KUBECONFIG, ~/.kube/config, else the in-cluster configuration; with --address and none
    /// of them, VolumeAttachments are not counted).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Count only VolumeAttachments with these labels (a label selector, as kubectl's -l).
    #[arg(short = 'l', long)]
    pub selector: Option<String>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Table)]
    pub output: Output,
    /// Refresh every --interval until interrupted (on a terminal the table is redrawn in place;
    /// otherwise a line goes to stderr whenever the counts change).
    #[arg(short, long)]
    pub watch: bool,
    /// Refresh until every driver is ready (leading, or standby behind a Lease holder) and every
    /// counted VolumeAttachment is attached, then print the table and exit 0; exit 1 after
    /// --wait-timeout.
    #[arg(long)]
    pub until_attached: bool,
    /// Refresh period of --watch and --until-attached (Go duration: 500ms, 2s, 1m).
    #[arg(long, default_value = "1s", value_parser = parse_duration)]
    pub interval: Duration,
    /// How long --until-attached waits.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub wait_timeout: Duration,
    /// Deadline of each request to the hub or the API server.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub request_timeout: Duration,
}

/// `-o`: how the drivers are printed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// One row per driver.
    Table,
    /// The `/drivers` document, each entry with its `volumeAttachments` counts.
    Json,
}

fn parse_duration(value: &str) -> Result<Duration, String> {
    match crate::cli::parse_go_duration(value) {
        Ok(ns) if ns > 0 => Ok(Duration::from_nanos(ns.unsigned_abs())),
        Ok(_) => Err(format!("must be greater than zero, not {value}")),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_and_need_exactly_one_source() {
        let parse =
            |a: &[&str]| Args::try_parse_from(std::iter::once("status").chain(a.iter().copied()));
        let a = parse(&["--address", ":8080", "-o", "json", "--interval", "500ms"]).unwrap();
        assert_eq!(a.output, Output::Json);
        assert_eq!(a.interval, Duration::from_millis(500));
        assert_eq!(a.port, 8080);
        let a = parse(&["--pod", "hub-0", "-n", "storage", "-l", "a=b"]).unwrap();
        assert_eq!(
            (a.pod.as_deref(), a.namespace.as_deref()),
            (Some("hub-0"), Some("storage"))
        );
        for bad in [
            &[][..],
            &["--address", ":1", "--pod", "p"][..],
            &["--address", ":1", "-o", "yaml"][..],
            &["--address", ":1", "--interval", "5"][..],
            &["--address", ":1", "--wait-timeout", "0"][..],
        ] {
            let e = parse(bad).expect_err(&format!("{bad:?}"));
            assert_eq!(e.exit_code(), 2, "{bad:?}: {e}");
        }
    }
}
