//! The outcome of parsing a command line: run ([`Parsed::Run`]), print and exit
//! ([`Parsed::Exit`]), or refuse ([`Error`], which carries the exit code).

use super::args::Args;
use super::values::GoDuration;
use crate::leader::timing::{self, TimingError, TimingField};

/// The outcome of a successful parse.
#[derive(Clone, Debug, PartialEq)]
pub enum Parsed {
    /// Run with these arguments; the warnings (ignored legacy flags, …) should be logged once
    /// logging is set up.
    Run(Box<Args>, Vec<String>),
    /// Print and exit without running: `--help` (usage on stderr, code 0) or `--version`
    /// (stdout, code 0).
    Exit {
        /// Process exit code.
        code: i32,
        /// Text for stdout.
        stdout: String,
        /// Text for stderr.
        stderr: String,
    },
}

/// Why the command line was rejected. [`Error::exit_code`] gives the process exit code: 2 for a
/// flag that could not be parsed, 1 for a parsed but invalid configuration (as the Go sidecar).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum Error {
    /// Unknown flag, missing or unparsable value (Go `flag` error, exit 2).
    #[error("{message}")]
    Usage {
        /// The error line, as Go's `flag` package words it.
        message: String,
        /// The usage text printed after it.
        usage: String,
    },
    /// `--logging-format` names no known format.
    #[error("--logging-format: unsupported value {0:?}: supported values: \"json\", \"text\"")]
    LoggingFormat(String),
    /// `--vmodule` together with a format other than text.
    #[error("--vmodule is only supported with --logging-format=text")]
    VmoduleWithoutText,
    /// An alpha logging option was set; it needs the `LoggingAlphaOptions` gate, which cannot be
    /// enabled from the command line.
    #[error("--{0} cannot be used: feature gate LoggingAlphaOptions is disabled")]
    AlphaLoggingOption(&'static str),
    /// `--feature-gates` names an unknown gate.
    #[error("unrecognized feature gate: {0}")]
    UnknownFeatureGate(String),
    /// `--metrics-address` and `--http-endpoint` were both set.
    #[error("Only one of `--metrics-address` and `--http-endpoint` can be set")]
    MetricsAndHttpEndpoint,
    /// `--worker-threads=0`.
    #[error("Option -worker-threads must be greater than zero")]
    ZeroWorkerThreads,
    /// A per-driver duration that is zero (or was negative, read as zero); see
    /// [`rules::Pause`](super::rules::Pause) for each one's reason.
    #[error("--{flag} must be greater than zero, not {value}")]
    NotPositive {
        /// The flag name.
        flag: &'static str,
        /// The value as Go prints it.
        value: String,
    },
    /// A negative API burst or cap (client-go would fail every request with a negative burst),
    /// or a negative `--max-entries` (the CSI spec forbids it); see
    /// [`rules`](super::rules).
    #[error("--{flag} must not be negative, not {value}")]
    Negative {
        /// The flag name.
        flag: &'static str,
        /// The value given.
        value: String,
    },
    /// A number Go accepts but above attacher-hub's bound for it (the `MAX_*` constants of
    /// [`rules`](super::rules)).
    #[error("--{flag} must be at most {max}, not {value}")]
    TooLarge {
        /// The flag name.
        flag: &'static str,
        /// The bound.
        max: String,
        /// The value given (durations as Go prints them).
        value: String,
    },
    /// The leader-election timing is refused (zero durations, a lease that does not outlive the
    /// renew deadline, a renew deadline within the jittered retry period, a lease under 1s).
    #[error("{}", leader_election_text(.0))]
    LeaderElection(TimingError),
}

impl Error {
    /// The process exit code: 2 for a parse error, 1 for an invalid configuration.
    pub fn exit_code(&self) -> i32 {
        match self {
            Self::Usage { .. } => 2,
            _ => 1,
        }
    }

    /// What to print on stderr: the message, followed by the usage for parse errors.
    pub fn stderr_text(&self) -> String {
        match self {
            Self::Usage { message, usage } => format!("{message}\n{usage}"),
            other => format!("{other}\n"),
        }
    }
}

/// The message of a refused leader-election timing, in the flags' words.
fn leader_election_text(e: &TimingError) -> String {
    timing_text(
        e,
        [
            "--leader-election-lease-duration",
            "--leader-election-renew-deadline",
            "--leader-election-retry-period",
        ],
    )
}

/// The message of a refused timing, naming the lease duration, renew deadline and retry period
/// by the place that set each one (`names`): a flag, or a field of `drivers.yaml`.
pub(crate) fn timing_text(e: &TimingError, names: [&str; 3]) -> String {
    match e {
        TimingError::Zero(field) => {
            let name = match field {
                TimingField::LeaseDuration => names[0],
                TimingField::RenewDeadline => names[1],
                TimingField::RetryPeriod => names[2],
            };
            format!("{name} must be greater than zero, not 0s")
        }
        TimingError::LeaseTooShort(d) => format!(
            "{} must be at least 1s, not {}: a Lease holds whole seconds",
            names[0],
            GoDuration(*d)
        ),
        comparison => timing_comparison(comparison, names),
    }
}

/// The message of a refused comparison of two timings, named by `names` as in [`timing_text`].
fn timing_comparison(e: &TimingError, names: [&str; 3]) -> String {
    let [lease, renew, retry] = names;
    match *e {
        TimingError::LeaseNotLongerThanRenewDeadline {
            lease_duration,
            renew_deadline,
        } => format!(
            "{lease} ({}) must be greater than {renew} ({})",
            GoDuration(lease_duration),
            GoDuration(renew_deadline)
        ),
        TimingError::RenewDeadlineNotLongerThanRetry {
            renew_deadline,
            retry_period,
        } => format!(
            "{renew} ({}) must be greater than {} × {retry} ({})",
            GoDuration(renew_deadline),
            timing::JITTER_FACTOR,
            GoDuration(retry_period)
        ),
        other => other.to_string(),
    }
}
