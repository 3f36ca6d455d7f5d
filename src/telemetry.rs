//! Logging set-up: `tracing` with a plain-text or JSON formatter on stderr.

use tracing_subscriber::{EnvFilter, fmt, prelude::*};

/// Log output format.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Format {
    /// Human-readable text (the default, like klog's text format).
    #[default]
    Text,
    /// One JSON object per line.
    Json,
}

/// Installs the global subscriber. `default_directive` applies when `RUST_LOG`
/// is unset (for example `info` or `attacher_hub=debug`).
pub fn init(format: Format, default_directive: &str) {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_directive));
    let registry = tracing_subscriber::registry().with(filter);
    let result = match format {
        Format::Text => registry
            .with(fmt::layer().with_writer(std::io::stderr))
            .try_init(),
        Format::Json => registry
            .with(fmt::layer().json().with_writer(std::io::stderr))
            .try_init(),
    };
    // A second init (tests) keeps the first subscriber.
    drop(result);
}
