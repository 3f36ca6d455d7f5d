//! Logging set-up: `tracing` with a plain-text or JSON formatter on stderr.
//!
//! klog's `-v` verbosity maps to `tracing` levels with [`directive_for_verbosity`]; `RUST_LOG`,
//! when set, overrides it. Errors are written on one line by [`error_chain`] (every cause) or
//! [`error_with_root_cause`] (the innermost one, for kube's API errors).

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// Log output format (`--logging-format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// Human-readable text (the default, like klog's text format).
    #[default]
    Text,
    /// One JSON object per line.
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

/// The filter directive for a klog verbosity: `0` → `info`; `1`–`3` → `debug` for this crate;
/// `4` and above → `trace` for this crate. Kubernetes, HTTP and gRPC libraries stay at `warn`
/// below `-v=6`, log at `debug` from 6 and at `trace` from 8.
pub fn directive_for_verbosity(verbosity: u32) -> String {
    let own = match verbosity {
        0 => "info",
        1..=3 => "debug",
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

/// Installs the global subscriber. `default_directive` applies when `RUST_LOG`
/// is unset (for example `info` or `attacher_hub=debug`).
pub fn init(format: Format, default_directive: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_directive));
    let registry = tracing_subscriber::registry().with(filter);
    let result = match format {
        Format::Text => registry
            .with(
                fmt::layer()
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
                    .with_writer(std::io::stderr),
            )
            .try_init(),
        Format::Json => registry
            .with(fmt::layer().json().with_writer(std::io::stderr))
            .try_init(),
    };
    // A second init (tests) keeps the first subscriber.
    drop(result);
}

/// An error and its causes on one line, `: `-separated: how the process prints a fatal error and
/// how `attacher-hub status` prints a failed read.
pub fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// `error: root cause` on one line, for logs of API errors: only the innermost cause is appended,
/// because kube's `Error::Api` already repeats its `Status` in its own message.
pub fn error_with_root_cause(error: &dyn std::error::Error) -> String {
    let mut root = None;
    let mut source = error.source();
    while let Some(cause) = source {
        root = Some(cause);
        source = cause.source();
    }
    match root {
        Some(cause) => format!("{error}: {cause}"),
        None => error.to_string(),
    }
}
#[cfg(test)]
mod tests {
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
    fn chains_name_every_cause_or_only_the_root() {
        let e = Layer(
            "cannot update Lease",
            Some(Box::new(Layer(
                "ApiError: conflict",
                Some(Box::new(Layer("conflict", None))),
            ))),
        );
        assert_eq!(
            error_chain(&e),
            "cannot update Lease: ApiError: conflict: conflict"
        );
        assert_eq!(error_with_root_cause(&e), "cannot update Lease: conflict");
        let alone = Layer("alone", None);
        assert_eq!(error_chain(&alone), "alone");
        assert_eq!(error_with_root_cause(&alone), "alone");
    }
}
