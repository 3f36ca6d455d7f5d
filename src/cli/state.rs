//! One flag of the table (`Flag`: name, kind, default, help, setter) and what the setters
//! record while the command line is parsed (`State`).

use std::collections::BTreeMap;
use std::time::Duration;

use super::args::Args;
use super::values::{PARSE_ERROR, parse_go_duration};

/// How a flag takes its value.
#[derive(Clone, Copy)]
pub(super) enum Kind {
    /// Bare means `true`; a value only after `=`.
    Bool,
    /// Takes a value after `=` or as the next argument; the type name shown in the usage.
    Value(&'static str),
}

/// Stores a flag's value; the error text follows Go's (`parse error`, `value out of range`, …).
pub(super) type Setter = fn(&mut State, &str) -> Result<(), String>;

/// One command-line flag.
pub(super) struct Flag {
    pub(super) name: &'static str,
    pub(super) kind: Kind,
    /// The default as Go's usage shows it; equal to the matching field of `Args::default()`.
    pub(super) default: &'static str,
    pub(super) help: &'static str,
    pub(super) set: Setter,
}

/// Everything the setters record; [`State::finish`] turns it into [`Args`].
#[derive(Default)]
pub(super) struct State {
    pub(super) args: Args,
    pub(super) warnings: Vec<String>,
    /// `--feature-gates` entries in order; later ones win.
    pub(super) gates: BTreeMap<String, bool>,
    /// `--version` was given.
    pub(super) version: bool,
    /// `--logging-format` as given (validated in `finish`).
    pub(super) logging_format: Option<String>,
    /// Alpha logging options set to a non-default value, by flag name.
    pub(super) alpha_logging: Vec<&'static str>,
}

impl State {
    pub(super) fn warn_once(&mut self, warning: String) {
        if !self.warnings.contains(&warning) {
            self.warnings.push(warning);
        }
    }

    /// Parses a Go duration for flag `name`; negative values become zero with a warning.
    pub(super) fn duration(&mut self, name: &str, value: &str) -> Result<Duration, String> {
        let nanos = parse_go_duration(value).map_err(|_| PARSE_ERROR.to_owned())?;
        match u64::try_from(nanos) {
            Ok(nanos) => Ok(Duration::from_nanos(nanos)),
            Err(_) => {
                self.warn_once(format!(
                    "flag -{name}: negative duration {value:?} is treated as 0s"
                ));
                Ok(Duration::ZERO)
            }
        }
    }

    pub(super) fn legacy_klog(&mut self, name: &str) {
        self.warn_once(format!(
            "flag -{name} is a klog flag that external-attacher removed in v4.6; it is accepted and ignored"
        ));
    }
}
