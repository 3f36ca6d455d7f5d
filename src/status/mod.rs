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
use std::time::Instant;

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
    let namespace_of = |client: &kube::Client| {
        args.namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string())
    };
    let (source, counter) = match (&args.address, &args.pod) {
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
            (
                Source::Direct {
                    authority: authority(address)?,
                },
                counter,
            )
        }
        (None, Some(pod)) => {
            let client = kube_client(args.kubeconfig.as_ref()).await?;
            let source = Source::Pod {
                namespace: namespace_of(&client),
                pod: pod.clone(),
                port: args.port,
                client: client.clone(),
            };
            (
                source,
                Some(Counter {
                    client,
                    implicit: false,
                }),
            )
        }
        // clap requires one of the two.
        (None, None) => {
            return Err(Error::Address {
                address: String::new(),
                problem: "give --address or --pod",
            });
        }
    };

    if !args.watch && !args.until_attached {
        let snap = snapshot(&source, counter.as_ref(), &args).await?;
        write_stdout(&render(&snap, args.output));
        return Ok(0);
    }

    let tty = std::io::stdout().is_terminal() && args.output == Output::Table;
    let started = Instant::now();
    let mut last_summary = String::new();
    let mut last: Option<Snapshot> = None;
    loop {
        let tick = Instant::now();
        let result = snapshot(&source, counter.as_ref(), &args).await;
        let line = match &result {
            Ok(snap) => summary(snap),
            Err(e) => format!("not answering: {}", e.one_line()),
        };
        if tty {
            let body = match &result {
                Ok(snap) => render(snap, args.output),
                Err(e) => format!("{}\n", e.one_line()),
            };
            let footer = if args.until_attached {
                "waiting until every driver is ready and every VolumeAttachment is attached ..."
            } else {
                "press Ctrl-C to stop"
            };
            let now = k8s_openapi::jiff::Timestamp::now().strftime("%H:%M:%S UTC");
            write_stdout(&format!(
                "\x1b[H\x1b[Jattacher-hub status of {}   {now}\n\n{body}\n{footer}\n",
                source.describe()
            ));
        } else if line != last_summary {
            eprintln!("status: {line} ({:.1}s)", started.elapsed().as_secs_f64());
        }
        last_summary = line;
        if let Ok(snap) = result {
            let done = args.until_attached && all_attached(&snap);
            last = Some(snap);
            if done {
                if !tty && let Some(snap) = &last {
                    write_stdout(&render(snap, args.output));
                }
                return Ok(0);
            }
        }
        if args.until_attached && started.elapsed() >= args.wait_timeout {
            if !tty && let Some(snap) = &last {
                write_stdout(&render(snap, args.output));
            }
            eprintln!(
                "status: timed out after {:?}: {last_summary}",
                args.wait_timeout
            );
            return Ok(1);
        }
        tokio::time::sleep(args.interval.saturating_sub(tick.elapsed())).await;
    }
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
