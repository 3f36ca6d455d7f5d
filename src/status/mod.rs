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

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{Parser, ValueEnum};
use http_body_util::{BodyExt, Empty};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::api::{Api, ListParams};
use serde_json::Value;

/// Page size when listing VolumeAttachments.
const LIST_PAGE_SIZE: u32 = 500;

/// Characters of a driver's last error shown in the table (the JSON output
/// carries it whole).
const LAST_ERROR_WIDTH: usize = 100;

/// The command line of `attacher-hub status`.
#[derive(Clone, Debug, Parser)]
#[command(
    name = "attacher-hub status",
    about = "Show the drivers of a running attacher-hub: state, Lease holder, queue depths, \
             attached VolumeAttachments and last error",
    after_help = "Exactly one of --address and --pod. VolumeAttachments are counted per driver \
                  (ATTACHED: attached/total) with --pod, or with --address when --kubeconfig is \
                  given."
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
    /// kubeconfig for --pod and for counting VolumeAttachments (default: $KUBECONFIG,
    /// ~/.kube/config, else the in-cluster configuration; with --address, VolumeAttachments are
    /// counted only when this is given).
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
        Ok(_) => Err(format!("{value:?} must be greater than zero")),
        Err(e) => Err(e.to_string()),
    }
}

// === errors ===

/// Why the drivers could not be shown. Every variant is a failure to read
/// (exit code 1): the caller retries in `--watch` mode.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// `--address` is not an HTTP endpoint.
    #[error("--address {address:?}: {problem}")]
    Address {
        /// As given.
        address: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// Connecting to, or talking HTTP with, the hub failed.
    #[error("reading {url}")]
    Http {
        /// The URL.
        url: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The hub answered with a status other than 200.
    #[error("{url} answered {status}: {body}")]
    Status {
        /// The URL.
        url: String,
        /// The HTTP status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// No answer within `--request-timeout`.
    #[error("{what}: no answer within {timeout:?}")]
    Timeout {
        /// What was asked.
        what: String,
        /// The deadline.
        timeout: Duration,
    },
    /// `/drivers` is not the expected JSON document.
    #[error("{url} did not return a list of drivers")]
    Document {
        /// The URL.
        url: String,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
    /// No usable kubeconfig.
    #[error("loading the kubeconfig")]
    KubeConfig(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// Reading `/drivers` through the pod proxy failed.
    #[error("reading /drivers of pod {namespace}/{pod} through the API server's pod proxy")]
    Proxy {
        /// The pod's namespace.
        namespace: String,
        /// The pod.
        pod: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// Listing VolumeAttachments failed.
    #[error("listing VolumeAttachments")]
    ListVolumeAttachments(#[source] kube::Error),
}

/// `error: cause: cause ...` on one line.
fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

// === the model ===

/// VolumeAttachments of one driver (`spec.attacher`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// `status.attached: true`.
    pub attached: usize,
    /// All of them.
    pub total: usize,
    /// With `status.attachError` set.
    pub failing: usize,
}

/// One row of the table, taken from a `/drivers` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Row {
    /// The driver's name, or its socket while the name is not known yet.
    pub driver: String,
    /// `connecting`, `notReady`, `standby`, `leading`, `failed`, ...
    pub state: String,
    /// Why, for a failed driver.
    pub reason: Option<String>,
    /// The Lease holder, if any.
    pub lease_holder: Option<String>,
    /// Whether the driver runs under leader election.
    pub leader_election: bool,
    /// Depths of the attach, detach and PV queues.
    pub queues: [Option<u64>; 3],
    /// The VolumeAttachments, when counted.
    pub attachments: Option<Counts>,
    /// The driver's last error.
    pub last_error: Option<String>,
}

impl Row {
    /// Ready to act: leading, or standing by while a Lease holder acts.
    pub fn ready(&self) -> bool {
        match self.state.as_str() {
            "leading" => true,
            "standby" => self.lease_holder.is_some() || !self.leader_election,
            _ => false,
        }
    }
}

/// The rows of a `/drivers` document, with the VolumeAttachment counts per
/// driver name when known. Missing fields show as unknown, never fail.
pub fn rows(drivers: &[Value], counts: Option<&BTreeMap<String, Counts>>) -> Vec<Row> {
    let text = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(str::to_string);
    drivers
        .iter()
        .map(|d| {
            let name = text(&d["name"]);
            let queues = ["attach", "detach", "pv"].map(|q| d["queues"][q]["depth"].as_u64());
            Row {
                driver: name
                    .clone()
                    .or_else(|| text(&d["socket"]))
                    .unwrap_or_else(|| "?".to_string()),
                state: text(&d["state"]["state"]).unwrap_or_else(|| "?".to_string()),
                reason: text(&d["state"]["reason"]),
                lease_holder: text(&d["leaseHolder"]),
                leader_election: d["leaderElection"].as_bool().unwrap_or(false),
                queues,
                attachments: counts.map(|c| {
                    name.as_ref()
                        .and_then(|n| c.get(n))
                        .copied()
                        .unwrap_or_default()
                }),
                last_error: text(&d["lastError"]),
            }
        })
        .collect()
}

/// The table: a header, one row per driver, then notes (reasons of failed
/// drivers, VolumeAttachments with attach errors) and, when counted, the
/// total of attached VolumeAttachments. Cells other than the last never
/// contain spaces, so rows split on whitespace.
pub fn render_table(rows: &[Row]) -> String {
    const HEADER: [&str; 6] = [
        "DRIVER",
        "STATE",
        "LEASE HOLDER",
        "QUEUES A/D/PV",
        "ATTACHED",
        "LAST ERROR",
    ];
    let dash = || "-".to_string();
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            let queues = r
                .queues
                .iter()
                .map(|q| q.map_or_else(|| "?".to_string(), |d| d.to_string()))
                .collect::<Vec<_>>()
                .join("/");
            let attached = r
                .attachments
                .map_or_else(dash, |c| format!("{}/{}", c.attached, c.total));
            let last_error = r.last_error.as_deref().map_or_else(dash, |e| {
                let one_line = e.split_whitespace().collect::<Vec<_>>().join(" ");
                truncate(&one_line, LAST_ERROR_WIDTH)
            });
            [
                r.driver.clone(),
                r.state.clone(),
                r.lease_holder.clone().unwrap_or_else(dash),
                queues,
                attached,
                last_error,
            ]
        })
        .collect();
    let mut widths = HEADER.map(|h| h.chars().count());
    for row in &cells {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |row: [&str; 6]| {
        let mut out = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            out.push_str(cell);
            if i + 1 < row.len() {
                out.push_str(&" ".repeat(w - cell.chars().count() + 2));
            }
        }
        out.trim_end().to_string() + "\n"
    };
    let mut out = line(HEADER);
    for row in &cells {
        out.push_str(&line(row.each_ref().map(String::as_str)));
    }
    if rows.is_empty() {
        out.push_str("(no drivers)\n");
    }
    let mut notes = Vec::new();
    for r in rows {
        if let Some(reason) = &r.reason {
            notes.push(format!("{}: {}: {reason}", r.driver, r.state));
        }
        if let Some(c) = r.attachments.filter(|c| c.failing > 0) {
            notes.push(format!(
                "{}: {} VolumeAttachment(s) with an attach error",
                r.driver, c.failing
            ));
        }
    }
    if !notes.is_empty() {
        out.push('\n');
        for n in notes {
            out.push_str(&format!("note: {n}\n"));
        }
    }
    if rows.iter().all(|r| r.attachments.is_some()) && !rows.is_empty() {
        let (attached, total) = rows
            .iter()
            .filter_map(|r| r.attachments)
            .fold((0, 0), |(a, t), c| (a + c.attached, t + c.total));
        out.push_str(&format!(
            "\nattached: {attached}/{total} VolumeAttachments\n"
        ));
    }
    out
}

fn truncate(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let mut cut: String = text.chars().take(width.saturating_sub(1)).collect();
    cut.push('…');
    cut
}

/// `-o json`: the `/drivers` entries, each with `volumeAttachments`
/// (`attached`, `total`, `withAttachError`) when counted.
pub fn render_json(drivers: &[Value], counts: Option<&BTreeMap<String, Counts>>) -> String {
    let out: Vec<Value> = drivers
        .iter()
        .map(|d| {
            let mut d = d.clone();
            if let (Some(counts), Some(obj)) = (counts, d.as_object_mut()) {
                let c = obj
                    .get("name")
                    .and_then(Value::as_str)
                    .and_then(|n| counts.get(n))
                    .copied()
                    .unwrap_or_default();
                obj.insert(
                    "volumeAttachments".to_string(),
                    serde_json::json!({
                        "attached": c.attached,
                        "total": c.total,
                        "withAttachError": c.failing,
                    }),
                );
            }
            d
        })
        .collect();
    serde_json::to_string_pretty(&out).unwrap_or_default() + "\n"
}

/// Counts VolumeAttachments per `spec.attacher`.
pub fn count(vas: &[VolumeAttachment]) -> BTreeMap<String, Counts> {
    let mut counts: BTreeMap<String, Counts> = BTreeMap::new();
    for va in vas {
        let c = counts.entry(va.spec.attacher.clone()).or_default();
        c.total += 1;
        if let Some(status) = &va.status {
            c.attached += usize::from(status.attached);
            c.failing += usize::from(status.attach_error.is_some());
        }
    }
    counts
}

// === reading ===

/// Where `/drivers` comes from.
enum Source {
    /// Straight from the hub.
    Direct {
        /// `host:port`.
        authority: String,
    },
    /// Through the API server's pod proxy.
    Pod {
        /// The API client.
        client: kube::Client,
        /// The pod's namespace.
        namespace: String,
        /// The pod.
        pod: String,
        /// Its HTTP port.
        port: u16,
    },
}

impl Source {
    fn describe(&self) -> String {
        match self {
            Source::Direct { authority } => format!("http://{authority}/drivers"),
            Source::Pod {
                namespace,
                pod,
                port,
                ..
            } => format!("pod {namespace}/{pod}:{port}/drivers (API server proxy)"),
        }
    }
}

/// `host:port` of an `--address`.
fn authority(address: &str) -> Result<String, Error> {
    let bad = |problem| Error::Address {
        address: address.to_string(),
        problem,
    };
    if address.starts_with("https://") {
        return Err(bad(
            "the hub serves plain HTTP; use http:// (or the pod proxy)",
        ));
    }
    let rest = address.strip_prefix("http://").unwrap_or(address);
    let rest = rest.trim_end_matches('/');
    if rest.contains('/') || rest.contains("://") {
        return Err(bad("expected http://host:port, host:port or :port"));
    }
    let (host, port) = rest
        .rsplit_once(':')
        .ok_or_else(|| bad("no port: expected http://host:port, host:port or :port"))?;
    if port.parse::<u16>().map_or(true, |p| p == 0) {
        return Err(bad("the port is not a number from 1 to 65535"));
    }
    let host = if host.is_empty() { "127.0.0.1" } else { host };
    Ok(format!("{host}:{port}"))
}

/// The API server path of `/drivers` of a pod, through the pod proxy.
pub fn pod_proxy_path(namespace: &str, pod: &str, port: u16) -> String {
    format!("/api/v1/namespaces/{namespace}/pods/{pod}:{port}/proxy/drivers")
}

async fn kube_client(kubeconfig: Option<&PathBuf>) -> Result<kube::Client, Error> {
    let boxed = |e: Box<dyn std::error::Error + Send + Sync>| Error::KubeConfig(e);
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| boxed(e.into()))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| boxed(e.into()))?
        }
        None => kube::Config::infer().await.map_err(|e| boxed(e.into()))?,
    };
    kube::Client::try_from(config).map_err(|e| boxed(e.into()))
}

/// GET `http://<authority>/drivers` with hyper's HTTP/1 client.
async fn get_direct(authority: &str) -> Result<Bytes, Error> {
    let url = format!("http://{authority}/drivers");
    let http = |e: Box<dyn std::error::Error + Send + Sync>| Error::Http {
        url: url.clone(),
        source: e,
    };
    let stream = tokio::net::TcpStream::connect(authority)
        .await
        .map_err(|e| http(e.into()))?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| http(e.into()))?;
    let connection = tokio::spawn(async move {
        // Ends with the response (the request asks to close); its error, if
        // any, is the request's too.
        let _ = conn.await;
    });
    let request = http::Request::get("/drivers")
        .header(http::header::HOST, authority)
        .header(http::header::CONNECTION, "close")
        .body(Empty::<Bytes>::new())
        .map_err(|e| http(e.into()))?;
    let response = sender
        .send_request(request)
        .await
        .map_err(|e| http(e.into()))?;
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| http(e.into()))?
        .to_bytes();
    connection.abort();
    if status != http::StatusCode::OK {
        return Err(Error::Status {
            url,
            status: status.as_u16(),
            body: truncate(String::from_utf8_lossy(&body).trim(), 200),
        });
    }
    Ok(body)
}

async fn get_drivers(source: &Source) -> Result<Vec<Value>, Error> {
    let (url, body) = match source {
        Source::Direct { authority } => (source.describe(), get_direct(authority).await?),
        Source::Pod {
            client,
            namespace,
            pod,
            port,
        } => {
            let request = http::Request::get(pod_proxy_path(namespace, pod, *port))
                .body(Vec::new())
                .map_err(|e| Error::Http {
                    url: source.describe(),
                    source: e.into(),
                })?;
            let text = client
                .request_text(request)
                .await
                .map_err(|e| Error::Proxy {
                    namespace: namespace.clone(),
                    pod: pod.clone(),
                    source: e,
                })?;
            (source.describe(), Bytes::from(text))
        }
    };
    serde_json::from_slice(&body).map_err(|e| Error::Document { url, source: e })
}

async fn count_attachments(
    client: &kube::Client,
    selector: Option<&str>,
) -> Result<BTreeMap<String, Counts>, Error> {
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    let mut all = Vec::new();
    let mut params = ListParams::default().limit(LIST_PAGE_SIZE);
    if let Some(s) = selector {
        params = params.labels(s);
    }
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(Error::ListVolumeAttachments)?;
        let next = page.metadata.continue_.clone().filter(|c| !c.is_empty());
        all.extend(page.items);
        match next {
            Some(token) => params = params.continue_token(&token),
            None => break,
        }
    }
    Ok(count(&all))
}

/// One look at the hub.
struct Snapshot {
    drivers: Vec<Value>,
    counts: Option<BTreeMap<String, Counts>>,
}

async fn snapshot(
    source: &Source,
    counter: Option<&kube::Client>,
    args: &Args,
) -> Result<Snapshot, Error> {
    let timeout = args.request_timeout;
    let within = |what: String| Error::Timeout { what, timeout };
    let drivers = tokio::time::timeout(timeout, get_drivers(source))
        .await
        .map_err(|_| within(source.describe()))??;
    let counts = match counter {
        Some(client) => Some(
            tokio::time::timeout(timeout, count_attachments(client, args.selector.as_deref()))
                .await
                .map_err(|_| within("listing VolumeAttachments".to_string()))??,
        ),
        None => None,
    };
    Ok(Snapshot { drivers, counts })
}

fn render(snapshot: &Snapshot, output: Output) -> String {
    match output {
        Output::Table => render_table(&rows(&snapshot.drivers, snapshot.counts.as_ref())),
        Output::Json => render_json(&snapshot.drivers, snapshot.counts.as_ref()),
    }
}

/// Every driver ready and every counted VolumeAttachment attached.
fn all_attached(snapshot: &Snapshot) -> bool {
    let rows = rows(&snapshot.drivers, snapshot.counts.as_ref());
    !rows.is_empty()
        && rows.iter().all(Row::ready)
        && rows
            .iter()
            .filter_map(|r| r.attachments)
            .all(|c| c.attached == c.total)
}

/// A one-line summary for progress lines.
fn summary(snapshot: &Snapshot) -> String {
    let rows = rows(&snapshot.drivers, snapshot.counts.as_ref());
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
            let counter = match &args.kubeconfig {
                Some(path) => Some(kube_client(Some(path)).await?),
                None => None,
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
            (source, Some(client))
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
            Err(e) => format!("not answering: {}", chain(e)),
        };
        if tty {
            let body = match &result {
                Ok(snap) => render(snap, args.output),
                Err(e) => format!("{}\n", chain(e)),
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
            eprintln!("attacher-hub status: {}", chain(&error));
            std::process::ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn entry(name: &str, state: &str, holder: Option<&str>, depths: [u64; 3]) -> Value {
        json!({
            "socket": format!("unix:///csi/{name}.sock"),
            "name": name,
            "state": {"state": state},
            "lease": format!("external-attacher-leader-{name}"),
            "leaseHolder": holder,
            "leaderElection": true,
            "discovered": false,
            "queues": {
                "attach": {"depth": depths[0], "processing": 0, "oldestSeconds": null},
                "detach": {"depth": depths[1], "processing": 0, "oldestSeconds": null},
                "pv": {"depth": depths[2], "processing": 0, "oldestSeconds": null},
            },
            "lastError": null,
        })
    }

    fn va(attacher: &str, attached: bool, error: bool) -> VolumeAttachment {
        serde_json::from_value(json!({
            "metadata": {"name": "x"},
            "spec": {"attacher": attacher, "nodeName": "n", "source": {"persistentVolumeName": "pv"}},
            "status": {
                "attached": attached,
                "attachError": if error { json!({"message": "boom"}) } else { Value::Null },
            },
        }))
        .expect("a VolumeAttachment")
    }

    #[test]
    fn table_has_one_row_per_driver_with_state_holder_queues_and_attached_counts() {
        let drivers = vec![
            entry(
                "fast.csi.example.com",
                "leading",
                Some("hub-0_1a2b"),
                [3, 0, 1],
            ),
            entry(
                "nfs.csi.example.com",
                "standby",
                Some("hub-1_9f8e"),
                [0, 0, 0],
            ),
        ];
        let counts = count(&[
            va("fast.csi.example.com", true, false),
            va("fast.csi.example.com", false, true),
            va("nfs.csi.example.com", true, false),
            va("other.csi.example.com", true, false),
        ]);
        let table = render_table(&rows(&drivers, Some(&counts)));
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(
            lines[0],
            "DRIVER                STATE    LEASE HOLDER  QUEUES A/D/PV  ATTACHED  LAST ERROR"
        );
        let cells = |l: &str| l.split_whitespace().map(str::to_string).collect::<Vec<_>>();
        assert_eq!(
            cells(lines[1]),
            [
                "fast.csi.example.com",
                "leading",
                "hub-0_1a2b",
                "3/0/1",
                "1/2",
                "-"
            ]
        );
        assert_eq!(
            cells(lines[2]),
            [
                "nfs.csi.example.com",
                "standby",
                "hub-1_9f8e",
                "0/0/0",
                "1/1",
                "-"
            ]
        );
        // Columns line up: every row's second cell starts under STATE.
        let col = lines[0].find("STATE").expect("STATE");
        assert!(lines[1..3].iter().all(|l| l[col..].starts_with(['l', 's'])));
        assert!(
            table.contains(
                "note: fast.csi.example.com: 1 VolumeAttachment(s) with an attach error\n"
            )
        );
        // Only the listed drivers' VolumeAttachments count in the total.
        assert!(
            table.ends_with("\nattached: 2/3 VolumeAttachments\n"),
            "{table}"
        );
    }

    #[test]
    fn table_without_counts_shows_dashes_and_no_total() {
        let mut failed = entry("bad.csi.example.com", "failed", None, [0, 0, 0]);
        failed["state"]["reason"] = json!("GetPluginInfo: deadline exceeded");
        failed["lastError"] = json!("probe failed:\n  connection refused");
        let mut connecting = entry("x", "connecting", None, [0, 0, 0]);
        connecting["name"] = Value::Null;
        let table = render_table(&rows(&[failed, connecting], None));
        let lines: Vec<&str> = table.lines().collect();
        let cells: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(
            cells,
            [
                "bad.csi.example.com",
                "failed",
                "-",
                "0/0/0",
                "-",
                "probe",
                "failed:",
                "connection",
                "refused"
            ]
        );
        // A driver without a name yet shows its socket.
        assert_eq!(
            lines[2].split_whitespace().take(3).collect::<Vec<_>>(),
            ["unix:///csi/x.sock", "connecting", "-"]
        );
        assert!(
            table.contains("note: bad.csi.example.com: failed: GetPluginInfo: deadline exceeded\n")
        );
        assert!(!table.contains("attached:"));
    }

    #[test]
    fn table_of_no_drivers_says_so_and_long_errors_are_cut() {
        assert_eq!(
            render_table(&[]),
            "DRIVER  STATE  LEASE HOLDER  QUEUES A/D/PV  ATTACHED  LAST ERROR\n(no drivers)\n"
        );
        let mut d = entry("d", "leading", Some("h"), [0, 0, 0]);
        d["lastError"] = json!("x".repeat(300));
        let table = render_table(&rows(&[d], None));
        let error = table
            .lines()
            .nth(1)
            .expect("row")
            .split_whitespace()
            .last()
            .expect("cell");
        assert_eq!(error.chars().count(), LAST_ERROR_WIDTH);
        assert!(error.ends_with('…'));
    }

    #[test]
    fn json_output_adds_volume_attachment_counts_to_each_entry() {
        let drivers = vec![entry("a", "leading", Some("h"), [0, 0, 0])];
        let counts = count(&[va("a", true, false), va("a", false, false)]);
        let out: Value = serde_json::from_str(&render_json(&drivers, Some(&counts))).expect("JSON");
        assert_eq!(
            out[0]["volumeAttachments"],
            json!({"attached": 1, "total": 2, "withAttachError": 0})
        );
        assert_eq!(out[0]["leaseHolder"], "h");
        let out: Value = serde_json::from_str(&render_json(&drivers, None)).expect("JSON");
        assert_eq!(out, Value::Array(drivers));
    }

    #[test]
    fn ready_means_leading_or_standby_behind_a_holder() {
        let row = |state: &str, holder: Option<&str>, le: bool| Row {
            driver: "d".into(),
            state: state.into(),
            reason: None,
            lease_holder: holder.map(str::to_string),
            leader_election: le,
            queues: [Some(0); 3],
            attachments: None,
            last_error: None,
        };
        assert!(row("leading", None, true).ready());
        assert!(row("standby", Some("other"), true).ready());
        assert!(!row("standby", None, true).ready());
        assert!(row("standby", None, false).ready());
        for state in ["connecting", "notReady", "failed", "stopped", "?"] {
            assert!(!row(state, Some("h"), true).ready(), "{state}");
        }
    }

    #[test]
    fn addresses_are_http_endpoints() {
        assert_eq!(authority("http://10.0.0.1:8080/").unwrap(), "10.0.0.1:8080");
        assert_eq!(authority("hub.local:9000").unwrap(), "hub.local:9000");
        assert_eq!(authority(":8080").unwrap(), "127.0.0.1:8080");
        for bad in [
            "https://h:1",
            "h",
            "h:0",
            "h:x",
            "http://h:1/drivers",
            "unix:///s",
        ] {
            let e = authority(bad).expect_err(bad).to_string();
            assert!(e.starts_with(&format!("--address {bad:?}: ")), "{e}");
        }
        assert_eq!(
            pod_proxy_path("ns", "hub-0", 8080),
            "/api/v1/namespaces/ns/pods/hub-0:8080/proxy/drivers"
        );
    }

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
