//! `attacher-hub status`: the drivers of a running attacher-hub as a table
//! (or JSON), read from its `/drivers` endpoint directly (`--address`) or
//! through the API server's pod proxy (`--pod`), with each driver's
//! VolumeAttachments counted when the API server is at hand.
//!
//! ```text
//! attacher-hub status --address http://127.0.0.1:8080 --kubeconfig ~/.kube/config
//! attacher-hub status -n attacher-hub --pod attacher-hub-5d9c7-x2x8q -o json
//! attacher-hub status --address :8080 --watch
//! ```
//!
//! The subcommand is dispatched before the sidecar's Go-style flag parser
//! ([`crate::cli`]): a first argument `status` selects it. Its own flags are
//! ordinary (clap) flags. Exit codes: 0 success, 1 the hub or the API server
//! could not be read (or `--until-attached` timed out), 2 bad usage.
//!
//! The parts: [`args`] (flags), [`fetch`] (reading the hub and the API server), [`table`]
//! (the model and its renderings), [`error`].

pub mod args;
pub mod error;
pub mod fetch;
pub mod table;

use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use clap::Parser;

pub use args::{Args, Output};
pub use error::Error;
pub use fetch::pod_proxy_path;
pub use table::{Counts, Row, count, render_json, render_table, rows};

use fetch::{Counter, Snapshot, Source, authority, kube_client, snapshot};

fn render(snapshot: &Snapshot, output: Output) -> String {
    match output {
        Output::Table => {
            let mut text = render_table(&rows(&snapshot.drivers, snapshot.counts.as_ref()));
            if let Some(note) = snapshot.config.as_ref().and_then(table::reload_note) {
                text.push_str(&note);
            }
            if let Some(why) = &snapshot.uncounted {
                text.push_str(&format!(
                    "\nVolumeAttachments not counted (the Kubernetes configuration found by \
                     default does not answer; give --kubeconfig): {why}\n"
                ));
            }
            text
        }
        Output::Json => render_json(&snapshot.drivers, snapshot.counts.as_ref()),
    }
}

/// Every driver ready and every counted VolumeAttachment attached.
fn all_attached(snapshot: &Snapshot) -> bool {
    let rows: Vec<Row> = rows(&snapshot.drivers, snapshot.counts.as_ref())
        .into_iter()
        .filter(Row::is_driver)
        .collect();
    !rows.is_empty()
        && rows.iter().all(Row::ready)
        && rows
            .iter()
            .filter_map(|r| r.attachments)
            .all(|c| c.attached == c.total)
}

/// A one-line summary for progress lines.
fn summary(snapshot: &Snapshot) -> String {
    let rows: Vec<Row> = rows(&snapshot.drivers, snapshot.counts.as_ref())
        .into_iter()
        .filter(Row::is_driver)
        .collect();
    let ready = rows.iter().filter(|r| r.ready()).count();
    let mut text = format!("{ready}/{} drivers ready", rows.len());
    if snapshot.counts.is_some() {
        let (a, t) = rows
            .iter()
            .filter_map(|r| r.attachments)
            .fold((0, 0), |(a, t), c| (a + c.attached, t + c.total));
        text.push_str(&format!(", {a}/{t} VolumeAttachments attached"));
    }
    text
}

fn write_stdout(text: &str) {
    let mut out = std::io::stdout().lock();
    // A closed stdout (`| head`) is not worth a panic.
    let _ = out.write_all(text.as_bytes());
    let _ = out.flush();
}

async fn run(args: Args) -> Result<u8, Error> {
    let (source, counter) = connect(&args).await?;
    if !args.watch && !args.until_attached {
        let snap = snapshot(&source, counter.as_ref(), &args).await?;
        write_stdout(&render(&snap, args.output));
        return Ok(0);
    }
    watch(&args, &source, counter.as_ref()).await
}

/// Where the drivers are read (`--address` or `--pod`) and who counts the VolumeAttachments.
async fn connect(args: &Args) -> Result<(Source, Option<Counter>), Error> {
    match (&args.address, &args.pod) {
        (Some(address), _) => {
            // As kubectl: --kubeconfig, else $KUBECONFIG or ~/.kube/config (or the pod's
            // service account); without any, the table has no ATTACHED counts.
            let counter = match &args.kubeconfig {
                Some(path) => Some(Counter {
                    client: kube_client(Some(path)).await?,
                    implicit: false,
                }),
                None => kube_client(None).await.ok().map(|client| Counter {
                    client,
                    implicit: true,
                }),
            };
            let source = Source::Direct {
                authority: authority(address)?,
            };
            Ok((source, counter))
        }
        (None, Some(pod)) => {
            let client = kube_client(args.kubeconfig.as_ref()).await?;
            let source = Source::Pod {
                namespace: args
                    .namespace
                    .clone()
                    .unwrap_or_else(|| client.default_namespace().to_string()),
                pod: pod.clone(),
                port: args.port,
                client: client.clone(),
            };
            let counter = Counter {
                client,
                implicit: false,
            };
            Ok((source, Some(counter)))
        }
        // clap requires one of the two.
        (None, None) => Err(Error::Address {
            address: String::new(),
            problem: "give --address or --pod",
        }),
    }
}

/// `--watch` and `--until-attached`: a look every `--interval`, shown on a terminal as the
/// table redrawn in place, elsewhere as a progress line on stderr whenever it changes.
async fn watch(args: &Args, source: &Source, counter: Option<&Counter>) -> Result<u8, Error> {
    let tty = std::io::stdout().is_terminal() && args.output == Output::Table;
    let started = Instant::now();
    let mut last_summary = String::new();
    let mut last: Option<Snapshot> = None;
    loop {
        let tick = Instant::now();
        let result = snapshot(source, counter, args).await;
        let line = progress_line(&result);
        if tty {
            let now = k8s_openapi::jiff::Timestamp::now().strftime("%H:%M:%S UTC");
            let body = body(&result, args.output);
            let screen = screen(
                &source.describe(),
                &now.to_string(),
                &body,
                args.until_attached,
            );
            write_stdout(&screen);
        } else if line != last_summary {
            eprintln!("status: {line} ({:.1}s)", started.elapsed().as_secs_f64());
        }
        last_summary = line;
        let attached = result
            .as_ref()
            .is_ok_and(|snap| args.until_attached && all_attached(snap));
        if let Ok(snap) = result {
            last = Some(snap);
        }
        let next = next_step(
            attached,
            args.until_attached,
            started.elapsed(),
            args.wait_timeout,
        );
        if next != Next::Refresh
            && !tty
            && let Some(snap) = &last
        {
            write_stdout(&render(snap, args.output));
        }
        match next {
            Next::Refresh => {
                tokio::time::sleep(args.interval.saturating_sub(tick.elapsed())).await;
            }
            Next::Done => return Ok(0),
            Next::TimedOut => {
                eprintln!(
                    "status: timed out after {:?}: {last_summary}",
                    args.wait_timeout
                );
                return Ok(1);
            }
        }
    }
}

/// What follows one look of `--watch` or `--until-attached`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Next {
    /// Look again after `--interval`.
    Refresh,
    /// Everything is attached: print the table and exit 0.
    Done,
    /// `--wait-timeout` has passed: print the last table and exit 1.
    TimedOut,
}

/// The decision after a look: `attached` says that the look answered and every driver is ready
/// with every VolumeAttachment attached (only asked with `--until-attached`); `elapsed` is the
/// time since the first look. A successful look wins over a timeout reached at the same time.
fn next_step(
    attached: bool,
    until_attached: bool,
    elapsed: Duration,
    wait_timeout: Duration,
) -> Next {
    if attached {
        Next::Done
    } else if until_attached && elapsed >= wait_timeout {
        Next::TimedOut
    } else {
        Next::Refresh
    }
}

/// The progress line of a look.
fn progress_line(result: &Result<Snapshot, Error>) -> String {
    match result {
        Ok(snap) => summary(snap),
        Err(e) => format!("not answering: {}", e.one_line()),
    }
}

/// What a look shows on the terminal: its rendering, or why the hub did not answer.
fn body(result: &Result<Snapshot, Error>, output: Output) -> String {
    match result {
        Ok(snap) => render(snap, output),
        Err(e) => format!("{}\n", e.one_line()),
    }
}

/// The terminal's whole screen (cleared first): where the drivers are read and when, the body,
/// and how the refreshing ends.
fn screen(source: &str, now: &str, body: &str, until_attached: bool) -> String {
    let footer = if until_attached {
        "waiting until every driver is ready and every VolumeAttachment is attached ..."
    } else {
        "press Ctrl-C to stop"
    };
    format!("\x1b[H\x1b[Jattacher-hub status of {source}   {now}\n\n{body}\n{footer}\n")
}

/// Entry point of `attacher-hub status <args>` (`args` without the program
/// name and `status`); returns the process exit code.
pub fn main(args: impl IntoIterator<Item = OsString>) -> std::process::ExitCode {
    let argv = std::iter::once(OsString::from("attacher-hub status")).chain(args);
    let args = match Args::try_parse_from(argv) {
        Ok(a) => a,
        Err(e) => {
            // --help and --version go to stdout with 0, usage errors to stderr with 2.
            let _ = e.print();
            return std::process::ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(error) => {
            eprintln!("attacher-hub status: starting the async runtime failed: {error}");
            return std::process::ExitCode::from(1);
        }
    };
    match runtime.block_on(run(args)) {
        Ok(code) => std::process::ExitCode::from(code),
        Err(error) => {
            eprintln!("attacher-hub status: {}", error.one_line());
            std::process::ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn snapshot_of(states: &[&str], counts: Option<Counts>) -> Snapshot {
        let drivers: Vec<serde_json::Value> = states
            .iter()
            .enumerate()
            .map(|(i, state)| json!({"name": format!("d{i}"), "state": {"state": state}}))
            .collect();
        let counts = counts.map(|c| (0..states.len()).map(|i| (format!("d{i}"), c)).collect());
        Snapshot {
            drivers,
            counts,
            config: None,
            uncounted: None,
        }
    }

    #[test]
    fn a_look_with_everything_attached_ends_the_wait_even_at_the_timeout() {
        let (second, minute) = (Duration::from_secs(1), Duration::from_secs(60));
        assert_eq!(next_step(true, true, minute, minute), Next::Done);
        assert_eq!(next_step(false, true, second, minute), Next::Refresh);
        assert_eq!(next_step(false, true, minute, minute), Next::TimedOut);
        // --watch alone never times out.
        assert_eq!(next_step(false, false, 2 * minute, minute), Next::Refresh);
    }

    #[test]
    fn the_progress_line_counts_ready_drivers_and_attached_volume_attachments() {
        let counts = Counts {
            attached: 1,
            total: 2,
            failing: 0,
        };
        let snap = snapshot_of(&["leading", "connecting", "staleSocket"], Some(counts));
        assert_eq!(
            progress_line(&Ok(snap)),
            "1/2 drivers ready, 2/4 VolumeAttachments attached"
        );
        let snap = snapshot_of(&["leading"], None);
        assert_eq!(progress_line(&Ok(snap)), "1/1 drivers ready");
        let e = Error::Timeout {
            what: "GET /drivers".into(),
            timeout: Duration::from_secs(10),
        };
        let line = progress_line(&Err(e));
        assert!(
            line.starts_with("not answering: GET /drivers: no answer within 10s"),
            "{line}"
        );
    }

    #[test]
    fn until_attached_needs_a_ready_driver_and_every_volume_attachment_attached() {
        let all = Counts {
            attached: 2,
            total: 2,
            failing: 0,
        };
        let some = Counts { attached: 1, ..all };
        assert!(all_attached(&snapshot_of(&["leading"], Some(all))));
        assert!(!all_attached(&snapshot_of(&["leading"], Some(some))));
        assert!(!all_attached(&snapshot_of(
            &["leading", "failed"],
            Some(all)
        )));
        // Nothing served is nothing ready.
        assert!(!all_attached(&snapshot_of(&["staleSocket"], None)));
        assert!(!all_attached(&snapshot_of(&[], None)));
    }

    #[test]
    fn the_screen_is_redrawn_from_the_top_with_the_source_time_and_footer() {
        assert_eq!(
            screen("http://h:8080", "12:00:00 UTC", "TABLE\n", false),
            "\x1b[H\x1b[Jattacher-hub status of http://h:8080   12:00:00 UTC\n\nTABLE\n\npress Ctrl-C to stop\n"
        );
        assert!(screen("s", "t", "b", true).ends_with(
            "\nwaiting until every driver is ready and every VolumeAttachment is attached ...\n"
        ));
        let e = Error::Address {
            address: ":x".into(),
            problem: "not an HTTP endpoint",
        };
        assert_eq!(
            body(&Err(e), Output::Table),
            "--address \":x\": not an HTTP endpoint\n"
        );
    }
}
