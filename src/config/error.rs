//! Why a driver list was refused: [`Error`] names the file, line, column and field; [`Problem`]
//! says what is wrong; [`Invalid`] is a problem at a field path before it is placed in the text.

use std::path::PathBuf;

use crate::cli::{DurationError, error::timing_text};
use crate::csi::Address;
use crate::leader::timing::TimingError;

/// Why the driver list was refused.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The file could not be read.
    #[error("{}: cannot be read", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid YAML, does not match the schema, or holds an invalid value.
    #[error("{file}:{line}:{column}: {}{problem}", field_prefix(.field.as_deref()))]
    Invalid {
        /// The file, as given on the command line.
        file: String,
        /// 1-based line of the offending key, entry or token.
        line: u64,
        /// 1-based column.
        column: u64,
        /// The field path (`drivers[1].timeout`); `None` for syntax errors.
        field: Option<String>,
        /// What is wrong (boxed: keeps `Result`s small).
        problem: Box<Problem>,
    },
}

fn field_prefix(field: Option<&str>) -> String {
    field.map(|f| format!("{f}: ")).unwrap_or_default()
}

/// What is wrong with a field (the part of an [`Error::Invalid`] after the field path).
#[derive(Debug, PartialEq, thiserror::Error)]
pub enum Problem {
    /// Not YAML, or not the expected shape (the parser's own words).
    #[error("{0}")]
    Syntax(String),
    /// Longer than [`MAX_FILE_BYTES`](super::MAX_FILE_BYTES); the position is where the limit was passed.
    #[error("the file is longer than {max} bytes, the most a driver list may have")]
    TooLong {
        /// [`MAX_FILE_BYTES`](super::MAX_FILE_BYTES).
        max: usize,
    },
    /// Not UTF-8; the position is that of the first invalid byte.
    #[error("not UTF-8: invalid byte 0x{byte:02x}")]
    NotUtf8 {
        /// The first invalid byte.
        byte: u8,
    },
    /// More entries than [`MAX_DRIVERS`](super::MAX_DRIVERS); the position is the first one too many.
    #[error("more than {max} drivers")]
    TooManyDrivers {
        /// [`MAX_DRIVERS`](super::MAX_DRIVERS).
        max: usize,
    },
    /// The drivers up to this one run more workers than [`MAX_HUB_WORKERS`](super::MAX_HUB_WORKERS).
    #[error(
        "the drivers up to this one run {total} workers in all (attach, detach and PersistentVolume pools), more than {max}"
    )]
    TooManyWorkers {
        /// Workers of the drivers up to and including this one.
        total: u64,
        /// [`MAX_HUB_WORKERS`](super::MAX_HUB_WORKERS).
        max: u64,
    },
    /// No `drivers`, or an empty list, without discovery.
    #[error("at least one driver is required")]
    NoDrivers,
    /// An entry with neither `address` nor `name`.
    #[error(
        "missing field `address`: write the driver's socket, or (with --driver-sockets or --kubelet-registration-dir) only its `name` to give settings to the discovered driver of that name"
    )]
    NoAddressNorName,
    /// An entry with `name` but no `address`, without discovery to find the socket.
    #[error(
        "missing field `address`: an entry without an address gives settings to a discovered driver, which needs --driver-sockets or --kubelet-registration-dir"
    )]
    NameWithoutDiscovery,
    /// Not a Unix socket address with an absolute path.
    #[error("invalid address {0:?}: must be unix:///absolute/path or /absolute/path")]
    Address(String),
    /// An empty string where a value is needed.
    #[error("must not be empty")]
    Empty,
    /// Not a Go duration.
    #[error("invalid duration {value:?}{}", duration_reason(reason))]
    Duration {
        /// The value as written.
        value: String,
        /// Why it is not a duration.
        reason: DurationError,
    },
    /// Zero or negative where only positive values make sense.
    #[error("must be greater than zero, not {0}")]
    NotPositive(String),
    /// Negative where zero means "off".
    #[error("must not be negative, not {0}")]
    Negative(String),
    /// A number above the bound of the setting (see the `MAX_*` constants of [`crate::cli`]).
    #[error("must be at most {max}, not {value}")]
    TooLarge {
        /// The value (durations as written, numbers as read).
        value: String,
        /// The bound.
        max: String,
    },
    /// A lease duration under [`crate::cli::MIN_LEASE_DURATION`].
    #[error("must be at least 1s, not {0}: a Lease holds whole seconds")]
    LeaseTooShort(String),
    /// The leader-election timing is refused: the lease does not outlive the renew deadline,
    /// the renew deadline is within the jittered retry period, or a value the entry took from
    /// the flags is zero or a lease under one second.
    #[error("{}", timing_message(.refused, .names))]
    Timing {
        /// What is wrong.
        refused: TimingError,
        /// Where the lease duration, renew deadline and retry period were set: the entry's
        /// field (`leaseDuration`) or the flag (`--leader-election-lease-duration`).
        names: [String; 3],
    },
    /// Two entries for one socket.
    #[error("socket {address} is already the address of {other} (line {other_line})")]
    DuplicateAddress {
        /// The socket.
        address: Address,
        /// The earlier entry (`drivers[0]`).
        other: String,
        /// Its line.
        other_line: u64,
    },
    /// Two entries expecting the same driver name.
    #[error("driver name {name:?} is already configured for {other} (line {other_line})")]
    DuplicateName {
        /// The name.
        name: String,
        /// The earlier entry.
        other: String,
        /// Its line.
        other_line: u64,
    },
    /// Two different names that sanitize alike, so the drivers would share finalizer and Lease.
    #[error(
        "driver names {name:?} and {other_name:?} ({other}, line {other_line}) both use the finalizer {finalizer:?}"
    )]
    SanitizedNameCollision {
        /// This entry's name.
        name: String,
        /// The earlier entry's name.
        other_name: String,
        /// The earlier entry.
        other: String,
        /// Its line.
        other_line: u64,
        /// The shared finalizer.
        finalizer: String,
    },
}

/// [`timing_text`] with the names of [`Problem::Timing`].
fn timing_message(refused: &TimingError, names: &[String; 3]) -> String {
    timing_text(refused, [&names[0], &names[1], &names[2]])
}

fn duration_reason(reason: &DurationError) -> String {
    match reason {
        DurationError::Invalid(_) => String::new(),
        DurationError::MissingUnit(_) => ": missing unit".to_owned(),
        DurationError::UnknownUnit { unit, .. } => format!(": unknown unit {unit:?}"),
    }
}

/// A problem at a field path, before it is placed in the text ([`File::validate`](super::File::validate)'s error).
#[derive(Debug, PartialEq)]
pub struct Invalid {
    /// The field path, e.g. `drivers[1].timeout`; the location of the nearest written
    /// ancestor is used when the field itself is absent from the file.
    pub field: String,
    /// What is wrong (boxed: keeps `Result`s small).
    pub problem: Box<Problem>,
}
