//! Logging set-up: `tracing` events written as klog writes them, on stderr: klog's text header by
//! default, or Kubernetes' structured JSON (`--logging-format=json`, component-base's
//! `logs/json`: `ts`, `caller`, `msg`, `v`, every key/value pair at the top level, `err`), so
//! that log pipelines built for the Go sidecars read ours alike.
//!
//! ```text
//! I1201 16:51:02.241164       7 driver/workers.rs:212] "attached" driver="pd.csi.storage.gke.io" va="csi-4f2a" node="node-1" pv="pvc-91c3"
//! {"ts":1796143862241.164,"caller":"driver/workers.rs:212","msg":"attached","v":0,"driver":"pd.csi.storage.gke.io","va":"csi-4f2a","node":"node-1","pv":"pvc-91c3"}
//! ```
//!
//! Each line carries the fields of the spans it happened in, outermost first (a field of an inner
//! span replaces one of the same name), then its own; a field named `error` is written `err`, as
//! klog's `ErrorS` does. Errors have no `v` (as in klog); warnings and info lines are `v=0`,
//! debug lines `v=1` and trace lines `v=4`, the lowest `-v` that shows them
//! ([`directive_for_verbosity`]). `RUST_LOG`, when set, overrides `-v`. Errors are written on one
//! line by [`error_chain`].

use std::io::Write;

use serde_json::Value;
use tracing::{Event, Level, Subscriber, field::Field, span};
use tracing_subscriber::{EnvFilter, Layer, layer::Context, prelude::*, registry::LookupSpan};

/// Log output format (`--logging-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// klog's text format (the default).
    #[default]
    Text,
    /// One JSON object per line, with component-base's field names.
    Json,
}

/// Crates whose own logging is noise at ordinary verbosity: kept at `warn` below
/// [`LIBRARY_DEBUG_VERBOSITY`].
const LIBRARY_TARGETS: &[&str] = &[
    "kube",
    "kube_client",
    "kube_runtime",
    "hyper",
    "hyper_util",
    "h2",
    "tonic",
    "tower",
    "rustls",
];

/// From this `-v` on, the libraries in [`LIBRARY_TARGETS`] log at `debug` (klog's `-v=6` is where
/// client-go starts logging its HTTP requests).
const LIBRARY_DEBUG_VERBOSITY: u32 = 6;

/// From this `-v` on, the libraries log at `trace` (klog's `-v=8` logs request and response
/// bodies).
const LIBRARY_TRACE_VERBOSITY: u32 = 8;

/// The `-v` from which debug lines show, and what they say as `v`.
const DEBUG_VERBOSITY: u64 = 1;

/// The `-v` from which trace lines show, and what they say as `v`.
const TRACE_VERBOSITY: u64 = 4;

/// The filter directive for a klog verbosity: `0` → `info`; `1`–`3` → `debug` for this crate;
/// `4` and above → `trace` for this crate. Kubernetes, HTTP and gRPC libraries stay at `warn`
/// below `-v=6`, log at `debug` from 6 and at `trace` from 8.
pub fn directive_for_verbosity(verbosity: u32) -> String {
    let own = match u64::from(verbosity) {
        0 => "info",
        v if v < TRACE_VERBOSITY => "debug",
        _ => "trace",
    };
    let libraries = match verbosity {
        v if v >= LIBRARY_TRACE_VERBOSITY => "trace",
        v if v >= LIBRARY_DEBUG_VERBOSITY => "debug",
        _ => "warn",
    };
    let mut directive = format!("info,attacher_hub={own},mock_csi_driver={own}");
    for target in LIBRARY_TARGETS {
        directive.push_str(&format!(",{target}={libraries}"));
    }
    directive
}

/// Installs the global subscriber for a klog verbosity (see [`directive_for_verbosity`]).
pub fn init_with_verbosity(format: Format, verbosity: u32) {
    init(format, &directive_for_verbosity(verbosity));
}

/// Installs the global subscriber, writing to stderr. `default_directive` applies when
/// `RUST_LOG` is unset (for example `info` or `attacher_hub=debug`).
pub fn init(format: Format, default_directive: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_directive));
    let result = tracing_subscriber::registry()
        .with(filter)
        .with(Klog::new(format, std::io::stderr))
        .try_init();
    // A second init (tests) keeps the first subscriber.
    drop(result);
}

// === the layer ===

/// The fields of a span, in the order recorded.
#[derive(Debug, Default)]
struct Fields(Vec<(String, Value)>);

impl Fields {
    fn set(&mut self, key: &str, value: Value) {
        let key = match key {
            "message" => "msg",
            "error" => "err",
            other => other,
        };
        match self.0.iter_mut().find(|(k, _)| k == key) {
            Some(slot) => slot.1 = value,
            None => self.0.push((key.to_owned(), value)),
        }
    }
}

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.set(field.name(), Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.set(field.name(), Value::String(value.to_owned()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.set(field.name(), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.set(field.name(), Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.set(field.name(), Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.set(field.name(), Value::from(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.set(field.name(), Value::String(error_chain(value)));
    }
}

/// The layer that writes every event as one klog line (text or JSON) to the writer `make`
/// returns.
pub struct Klog<W> {
    format: Format,
    make: W,
}

impl<W> Klog<W> {
    /// A layer writing in `format` to what `make` returns (stderr in the process, a buffer in
    /// tests).
    pub fn new(format: Format, make: W) -> Self {
        Self { format, make }
    }
}

impl<W> std::fmt::Debug for Klog<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Klog")
            .field("format", &self.format)
            .finish()
    }
}

impl<S, W, O> Layer<S> for Klog<W>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    W: Fn() -> O + 'static,
    O: Write,
{
    fn on_new_span(&self, attrs: &span::Attributes<'_>, id: &span::Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(fields);
        }
    }

    fn on_record(&self, id: &span::Id, values: &span::Record<'_>, ctx: Context<'_, S>) {
        if let Some(span) = ctx.span(id) {
            let mut ext = span.extensions_mut();
            match ext.get_mut::<Fields>() {
                Some(fields) => values.record(fields),
                None => {
                    let mut fields = Fields::default();
                    values.record(&mut fields);
                    ext.insert(fields);
                }
            }
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        if let Some(scope) = ctx.event_scope(event) {
            for span in scope.from_root() {
                if let Some(f) = span.extensions().get::<Fields>() {
                    for (k, v) in &f.0 {
                        fields.set(k, v.clone());
                    }
                }
            }
        }
        let mut own = Fields::default();
        event.record(&mut own);
        for (k, v) in own.0 {
            fields.set(&k, v);
        }
        let line = render(self.format, event.metadata(), fields, Now::current());
        // One write per line, so that lines of concurrent tasks never interleave.
        let _ = (self.make)().write_all(line.as_bytes());
    }
}

/// The instant of a line, read once.
#[derive(Clone, Copy, Debug)]
struct Now {
    at: k8s_openapi::jiff::Timestamp,
}

impl Now {
    fn current() -> Self {
        Now {
            at: k8s_openapi::jiff::Timestamp::now(),
        }
    }
}

/// `file.rs:line` with the file's directory, as zap's short caller (`dir/file.go:line`).
fn caller(meta: &tracing::Metadata<'_>) -> String {
    let file = meta.file().unwrap_or("?");
    let mut parts = file.rsplit(['/', '\\']);
    let name = parts.next().unwrap_or(file);
    let short = match parts.next() {
        Some(dir) => format!("{dir}/{name}"),
        None => name.to_owned(),
    };
    format!("{short}:{}", meta.line().unwrap_or(0))
}

/// What klog says as `v` for a level (`None` for errors, which have none).
fn verbosity(level: Level) -> Option<u64> {
    match level {
        Level::ERROR => None,
        Level::WARN | Level::INFO => Some(0),
        Level::DEBUG => Some(DEBUG_VERBOSITY),
        Level::TRACE => Some(TRACE_VERBOSITY),
    }
}

/// One line, with its newline.
fn render(format: Format, meta: &tracing::Metadata<'_>, mut fields: Fields, now: Now) -> String {
    let msg = match fields.0.iter().position(|(k, _)| k == "msg") {
        Some(i) => fields.0.remove(i).1,
        None => Value::String(String::new()),
    };
    // `err` comes last, as klog's ErrorS writes it.
    if let Some(i) = fields.0.iter().position(|(k, _)| k == "err") {
        let err = fields.0.remove(i);
        fields.0.push(err);
    }
    match format {
        Format::Json => {
            // In zap's order: ts, caller, msg, v, then the pairs as logged (serde_json's map
            // would sort them).
            let millis = now.at.as_microsecond() as f64 / 1000.0;
            let mut pairs: Vec<(String, Value)> = vec![
                ("ts".into(), Value::from(millis)),
                ("caller".into(), Value::String(caller(meta))),
                ("msg".into(), msg),
            ];
            if let Some(v) = verbosity(*meta.level()) {
                pairs.push(("v".into(), Value::from(v)));
            }
            for (k, v) in fields.0 {
                if !pairs.iter().any(|(have, _)| *have == k) {
                    pairs.push((k, v));
                }
            }
            let mut line = String::from("{");
            for (i, (k, v)) in pairs.iter().enumerate() {
                if i > 0 {
                    line.push(',');
                }
                line.push_str(&Value::String(k.clone()).to_string());
                line.push(':');
                line.push_str(&v.to_string());
            }
            line.push_str("}\n");
            line
        }
        Format::Text => {
            let level = match *meta.level() {
                Level::ERROR => 'E',
                Level::WARN => 'W',
                _ => 'I',
            };
            let stamp = now.at.strftime("%m%d %H:%M:%S%.6f");
            let mut line = format!(
                "{level}{stamp} {:>7} {}] {}",
                std::process::id(),
                caller(meta),
                quoted(&msg)
            );
            for (k, v) in fields.0 {
                line.push(' ');
                line.push_str(&k);
                line.push('=');
                line.push_str(&quoted(&v));
            }
            line.push('\n');
            line
        }
    }
}

/// A value as klog's text format writes it: strings quoted (and escaped), the rest as they are.
fn quoted(v: &Value) -> String {
    v.to_string()
}

/// An error and its causes on one line, `: `-separated, each once, an API server's answer as
/// `<code> <reason>: <message>` ([`crate::api_error::one_line`]): how the process prints a
/// fatal error, logs a failure and how `attacher-hub status` prints a failed read.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    crate::api_error::one_line(error, None)
}

/// Which of a run of repeated failures deserve a warning: the first, then at most one per
/// period, each counting the failures since the previous warning; the others go to the debug
/// level. A success ends the run. Keeps a log readable while something stays broken (an API
/// server away for an hour is a few warnings a minute, not one per retry).
#[derive(Debug)]
pub struct Throttle {
    /// At most one warning this often.
    every: std::time::Duration,
    /// Failures of the current run.
    failures: u64,
    /// Failures not counted in a warning yet.
    unreported: u64,
    /// When the last warning was due.
    warned: Option<tokio::time::Instant>,
}

impl Throttle {
    /// At most one warning per `every`.
    pub fn new(every: std::time::Duration) -> Self {
        Self {
            every,
            failures: 0,
            unreported: 0,
            warned: None,
        }
    }

    /// Another failure: `Some(n)` when it deserves a warning, `n` being the failures since the
    /// last one (this one included); `None` for the debug level.
    pub fn failed(&mut self) -> Option<u64> {
        self.failures += 1;
        self.unreported += 1;
        let now = tokio::time::Instant::now();
        if self.warned.is_none_or(|at| now >= at + self.every) {
            self.warned = Some(now);
            Some(std::mem::take(&mut self.unreported))
        } else {
            None
        }
    }

    /// Failures of the current run so far.
    pub fn failures(&self) -> u64 {
        self.failures
    }

    /// A success: the run is over; returns how many failures it had (0: there was none).
    pub fn succeeded(&mut self) -> u64 {
        let failures = self.failures;
        *self = Self::new(self.every);
        failures
    }
}

/// The message a panic was raised with (`"panic"` when it carried no text).
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "panic".to_string())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn verbosity_maps_to_levels() {
        assert!(directive_for_verbosity(0).starts_with("info,attacher_hub=info,"));
        assert!(directive_for_verbosity(2).contains("attacher_hub=debug"));
        assert!(directive_for_verbosity(5).contains("attacher_hub=trace"));
        assert!(directive_for_verbosity(5).contains("kube=warn"));
        assert!(directive_for_verbosity(5).contains("tonic=warn"));
        assert!(directive_for_verbosity(6).contains("hyper=debug"));
        assert!(directive_for_verbosity(10).contains("kube=trace"));
    }

    /// Lines written by a subscriber with the layer, into a buffer.
    fn lines(format: Format, emit: impl FnOnce()) -> Vec<String> {
        let buffer = std::sync::Arc::new(parking_lot::Mutex::new(Vec::<u8>::new()));
        let sink = buffer.clone();
        let layer = Klog::new(format, move || Sink(sink.clone()));
        let subscriber = tracing_subscriber::registry()
            .with(EnvFilter::new("trace"))
            .with(layer);
        tracing::subscriber::with_default(subscriber, emit);
        let text = String::from_utf8(buffer.lock().clone()).expect("UTF-8");
        text.lines().map(str::to_owned).collect()
    }

    struct Sink(std::sync::Arc<parking_lot::Mutex<Vec<u8>>>);

    impl Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn emit_one() {
        let driver = tracing::info_span!(
            "driver",
            driver = "pd.csi.storage.gke.io",
            socket = "unix:///csi/a.sock"
        );
        let _d = driver.enter();
        let sync = tracing::info_span!("sync_va", va = "va-1", node = "n-1");
        let _s = sync.enter();
        tracing::info!(attempt = 2, "attached");
        let e = std::io::Error::other("refused");
        tracing::error!(error = %e, "sync failed");
        tracing::debug!(driver = "override", "detail");
    }

    /// JSON lines carry component-base's field names: `ts` (epoch milliseconds), `caller`,
    /// `msg`, `v` (none for errors), the span and event fields at the top level, `err` last.
    #[test]
    fn json_lines_use_the_field_names_of_kubernetes_structured_logs() {
        let lines = lines(Format::Json, emit_one);
        assert_eq!(lines.len(), 3, "{lines:?}");
        let first: Value = serde_json::from_str(&lines[0]).expect("JSON");
        let keys: Vec<String> = lines[0]
            .trim_matches(['{', '}'])
            .split(',')
            .filter_map(|pair| {
                pair.split_once("\":")
                    .map(|(k, _)| k.trim_matches('"').to_owned())
            })
            .collect();
        assert_eq!(
            keys,
            [
                "ts", "caller", "msg", "v", "driver", "socket", "va", "node", "attempt"
            ]
        );
        assert!(first["ts"].as_f64().is_some_and(|t| t > 1.7e12), "{first}");
        assert!(
            first["caller"]
                .as_str()
                .is_some_and(|c| c.starts_with("src/telemetry.rs:")),
            "{first}"
        );
        assert_eq!(
            (&first["msg"], &first["v"], &first["attempt"]),
            (&json!("attached"), &json!(0), &json!(2))
        );
        let error: Value = serde_json::from_str(&lines[1]).expect("JSON");
        assert!(error.get("v").is_none(), "an error has no v: {error}");
        assert_eq!(error["err"], "refused");
        assert!(lines[1].ends_with(r#","err":"refused"}"#), "{}", lines[1]);
        let debug: Value = serde_json::from_str(&lines[2]).expect("JSON");
        assert_eq!(
            (&debug["v"], &debug["driver"]),
            (&json!(1), &json!("override")),
            "an inner field wins"
        );
        assert!(
            !lines
                .iter()
                .any(|l| l.contains("\"fields\"") || l.contains("\"message\""))
        );
    }

    /// Text lines have klog's header and its key="value" pairs.
    #[test]
    fn text_lines_have_the_klog_header_and_key_value_pairs() {
        let lines = lines(Format::Text, emit_one);
        let header = |l: &str| -> bool {
            let b = l.as_bytes();
            matches!(b[0], b'I' | b'W' | b'E')
                && b[1..5].iter().all(u8::is_ascii_digit)
                && b[5] == b' '
                && l.contains("] ")
        };
        assert!(lines.iter().all(|l| header(l)), "{lines:#?}");
        assert!(
            lines[0].contains(r#" src/telemetry.rs:"#)
                && lines[0].ends_with(r#"] "attached" driver="pd.csi.storage.gke.io" socket="unix:///csi/a.sock" va="va-1" node="n-1" attempt=2"#),
            "{}",
            lines[0]
        );
        assert!(
            lines[1].starts_with('E') && lines[1].ends_with(r#" err="refused""#),
            "{}",
            lines[1]
        );
    }

    #[test]
    fn every_directive_is_a_valid_filter() {
        for v in [0, 1, 4, 6, 8, u32::MAX] {
            let directive = directive_for_verbosity(v);
            assert!(EnvFilter::try_new(&directive).is_ok(), "{directive}");
        }
    }

    #[derive(Debug, thiserror::Error)]
    #[error("{0}")]
    struct Layer(&'static str, #[source] Option<Box<Layer>>);

    #[test]
    fn chains_name_every_cause_once() {
        let e = Layer(
            "cannot update Lease",
            Some(Box::new(Layer(
                "ApiError: conflict",
                Some(Box::new(Layer("conflict", None))),
            ))),
        );
        assert_eq!(error_chain(&e), "cannot update Lease: ApiError: conflict");
        let alone = Layer("alone", None);
        assert_eq!(error_chain(&alone), "alone");
    }

    /// kube's `Display` of an API error carries a `Debug` dump of the server's `Status`; the
    /// chain says the code, the reason and the message.
    #[test]
    fn an_api_error_in_a_chain_is_one_line_without_a_debug_dump() {
        let e = Layer("cannot list", None);
        let api = kube::Error::Api(
            kube::core::Status::failure("leases is forbidden", "Forbidden")
                .with_code(403)
                .boxed(),
        );
        assert!(
            api.to_string().contains("Status {"),
            "kube's own text: {api}"
        );
        assert_eq!(error_chain(&api), "403 Forbidden: leases is forbidden");
        assert_eq!(error_chain(&e), "cannot list");
    }
}
