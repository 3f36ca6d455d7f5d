//! Fault injection: what the mock does to a call before (or instead of)
//! answering it, chosen per RPC method.
//!
//! # Grammar
//!
//! A fault rule is `METHOD=FAULT`, where `METHOD` is a short RPC name such as
//! `ControllerPublishVolume` or `*` for every RPC (a rule for the exact method
//! wins over `*`), and `FAULT` is one or more steps joined by `+`:
//!
//! | step               | effect                                                        |
//! |--------------------|---------------------------------------------------------------|
//! | `delay:<duration>` | wait, then go on (`500ms`, `2s`, `1.5s`, `1m`)                |
//! | `code:<Code>`      | answer with this gRPC code (`Unavailable`, `RESOURCE_EXHAUSTED`, `14`) |
//! | `every:<N>:<Code>` | answer the Nth, 2Nth, … matching call with `Code`; others pass |
//! | `hang`             | never answer until the rule is cleared or changed             |
//! | `close`            | stop serving, drop every connection; fires once               |
//! | `close:<duration>` | as `close`, then serve again on the same path after the delay |
//! | `exit:<status>`    | end the process with this exit status                         |
//!
//! Only `delay` combines with another step, and it comes first:
//! `ControllerPublishVolume=delay:2s+code:DeadlineExceeded`.

use std::{fmt, str::FromStr, time::Duration};

use serde::{Deserialize, Serialize};

/// Why a fault rule or one of its parts could not be parsed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Error {
    /// A rule lacks the `=` between the method and the fault.
    #[error("fault rule {0:?} is not METHOD=FAULT")]
    MissingMethod(String),
    /// The fault is empty or names no known step.
    #[error("unknown fault step {0:?} (expected delay:, code:, every:, hang, close, exit:)")]
    UnknownStep(String),
    /// The fault has more than one outcome, or `delay` after the outcome.
    #[error("fault {0:?}: only one delay followed by at most one other step is allowed")]
    BadCombination(String),
    /// A duration could not be read.
    #[error("invalid duration {0:?} (examples: 500ms, 2s, 1.5s, 1m)")]
    Duration(String),
    /// A gRPC code name or number is not known.
    #[error("unknown gRPC code {0:?}")]
    Code(String),
    /// A number (every's N, exit's status) could not be read or is zero where
    /// zero makes no sense.
    #[error("invalid number {0:?}")]
    Number(String),
}

/// Result of parsing fault rules.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What happens to a call after the optional delay.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Answer normally.
    Proceed,
    /// Answer with this code.
    Code(tonic::Code),
    /// Answer every `n`th matching call with `code`; the others normally.
    Every {
        /// Period, at least 1.
        n: u64,
        /// Code returned on the failing calls.
        code: tonic::Code,
    },
    /// Never answer while this rule is in place.
    Hang,
    /// Stop serving and drop connections; serve again after `restart_after`
    /// if given. The rule removes itself when it fires.
    Close {
        /// Delay before serving again on the same path; `None` stays closed.
        restart_after: Option<Duration>,
    },
    /// End the process with this exit status.
    Exit(i32),
}

/// One fault: an optional delay and an outcome. Serialised as its rule text
/// (the part after `METHOD=`), so flags and the control socket share one grammar.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Fault {
    /// Latency added before the outcome.
    pub delay: Option<Duration>,
    /// What happens after the delay.
    pub outcome: Outcome,
}

impl Fault {
    /// A fault that only adds latency.
    pub fn delay(d: Duration) -> Self {
        Self {
            delay: Some(d),
            outcome: Outcome::Proceed,
        }
    }

    /// A fault that answers with `code`.
    pub fn code(code: tonic::Code) -> Self {
        Self {
            delay: None,
            outcome: Outcome::Code(code),
        }
    }

    /// A fault that fails every `n`th call with `code`.
    pub fn every(n: u64, code: tonic::Code) -> Self {
        Self {
            delay: None,
            outcome: Outcome::Every { n: n.max(1), code },
        }
    }

    /// A fault that never answers until cleared.
    pub fn hang() -> Self {
        Self {
            delay: None,
            outcome: Outcome::Hang,
        }
    }

    /// A fault that closes the socket, optionally serving again after a delay.
    pub fn close(restart_after: Option<Duration>) -> Self {
        Self {
            delay: None,
            outcome: Outcome::Close { restart_after },
        }
    }

    /// A fault that ends the process with `status`.
    pub fn exit(status: i32) -> Self {
        Self {
            delay: None,
            outcome: Outcome::Exit(status),
        }
    }
}

impl FromStr for Fault {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let mut delay = None;
        let mut outcome = None;
        for step in s.split('+').map(str::trim) {
            if outcome.is_some() {
                return Err(Error::BadCombination(s.to_string()));
            }
            let (kind, arg) = match step.split_once(':') {
                Some((k, a)) => (k, Some(a)),
                None => (step, None),
            };
            match (kind, arg) {
                ("delay", Some(a)) if delay.is_none() => delay = Some(parse_duration(a)?),
                ("delay", Some(_)) => return Err(Error::BadCombination(s.to_string())),
                ("code", Some(a)) => outcome = Some(Outcome::Code(parse_code(a)?)),
                ("every", Some(a)) => {
                    let (n, code) = a
                        .split_once(':')
                        .ok_or_else(|| Error::UnknownStep(step.to_string()))?;
                    let n: u64 = n.parse().map_err(|_| Error::Number(n.to_string()))?;
                    if n == 0 {
                        return Err(Error::Number("0".to_string()));
                    }
                    outcome = Some(Outcome::Every {
                        n,
                        code: parse_code(code)?,
                    });
                }
                ("hang", None) => outcome = Some(Outcome::Hang),
                ("close", None) => {
                    outcome = Some(Outcome::Close {
                        restart_after: None,
                    })
                }
                ("close", Some(a)) => {
                    outcome = Some(Outcome::Close {
                        restart_after: Some(parse_duration(a)?),
                    })
                }
                ("exit", Some(a)) => {
                    outcome = Some(Outcome::Exit(
                        a.parse().map_err(|_| Error::Number(a.to_string()))?,
                    ))
                }
                _ => return Err(Error::UnknownStep(step.to_string())),
            }
        }
        Ok(Self {
            delay,
            outcome: outcome.unwrap_or(Outcome::Proceed),
        })
    }
}

impl TryFrom<String> for Fault {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        s.parse()
    }
}

impl From<Fault> for String {
    fn from(f: Fault) -> String {
        f.to_string()
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut sep = "";
        if let Some(d) = self.delay {
            write!(f, "delay:{}", format_duration(d))?;
            sep = "+";
        }
        match &self.outcome {
            Outcome::Proceed if self.delay.is_none() => write!(f, "delay:0s"),
            Outcome::Proceed => Ok(()),
            Outcome::Code(c) => write!(f, "{sep}code:{}", code_name(*c)),
            Outcome::Every { n, code } => write!(f, "{sep}every:{n}:{}", code_name(*code)),
            Outcome::Hang => write!(f, "{sep}hang"),
            Outcome::Close {
                restart_after: None,
            } => write!(f, "{sep}close"),
            Outcome::Close {
                restart_after: Some(d),
            } => write!(f, "{sep}close:{}", format_duration(*d)),
            Outcome::Exit(s) => write!(f, "{sep}exit:{s}"),
        }
    }
}

/// A rule as given on the command line: `METHOD=FAULT`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Short RPC method name, or `*`.
    pub method: String,
    /// The fault for that method.
    pub fault: Fault,
}

impl FromStr for Rule {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self> {
        let (method, fault) = s
            .split_once('=')
            .ok_or_else(|| Error::MissingMethod(s.to_string()))?;
        let method = method.trim();
        if method.is_empty() {
            return Err(Error::MissingMethod(s.to_string()));
        }
        Ok(Self {
            method: method.to_string(),
            fault: fault.parse()?,
        })
    }
}

/// Parses `500ms`, `2s`, `1.5s`, `1m`, `1h`; a bare number means seconds.
pub fn parse_duration(s: &str) -> Result<Duration> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let value: f64 = num.parse().map_err(|_| Error::Duration(s.to_string()))?;
    let scale = match unit {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        _ => return Err(Error::Duration(s.to_string())),
    };
    Duration::try_from_secs_f64(value * scale).map_err(|_| Error::Duration(s.to_string()))
}

/// Formats a duration so that [`parse_duration`] reads it back.
pub fn format_duration(d: Duration) -> String {
    if d.subsec_millis() == 0 && d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else {
        format!("{}ms", d.as_millis())
    }
}

/// Every gRPC code with its canonical CamelCase name.
const CODES: [(tonic::Code, &str); 17] = [
    (tonic::Code::Ok, "Ok"),
    (tonic::Code::Cancelled, "Cancelled"),
    (tonic::Code::Unknown, "Unknown"),
    (tonic::Code::InvalidArgument, "InvalidArgument"),
    (tonic::Code::DeadlineExceeded, "DeadlineExceeded"),
    (tonic::Code::NotFound, "NotFound"),
    (tonic::Code::AlreadyExists, "AlreadyExists"),
    (tonic::Code::PermissionDenied, "PermissionDenied"),
    (tonic::Code::ResourceExhausted, "ResourceExhausted"),
    (tonic::Code::FailedPrecondition, "FailedPrecondition"),
    (tonic::Code::Aborted, "Aborted"),
    (tonic::Code::OutOfRange, "OutOfRange"),
    (tonic::Code::Unimplemented, "Unimplemented"),
    (tonic::Code::Internal, "Internal"),
    (tonic::Code::Unavailable, "Unavailable"),
    (tonic::Code::DataLoss, "DataLoss"),
    (tonic::Code::Unauthenticated, "Unauthenticated"),
];

/// Reads a gRPC code by name in any case, with or without underscores
/// (`ResourceExhausted`, `RESOURCE_EXHAUSTED`), or by number.
pub fn parse_code(s: &str) -> Result<tonic::Code> {
    let s = s.trim();
    if let Ok(n) = s.parse::<i32>() {
        return CODES
            .iter()
            .find(|(c, _)| *c as i32 == n)
            .map(|(c, _)| *c)
            .ok_or_else(|| Error::Code(s.to_string()));
    }
    let wanted: String = s
        .chars()
        .filter(|c| *c != '_')
        .map(|c| c.to_ascii_lowercase())
        .collect();
    CODES
        .iter()
        .find(|(_, name)| name.to_ascii_lowercase() == wanted)
        .map(|(c, _)| *c)
        .ok_or_else(|| Error::Code(s.to_string()))
}

/// The CamelCase name of a gRPC code (`ResourceExhausted`).
pub fn code_name(code: tonic::Code) -> &'static str {
    CODES
        .iter()
        .find(|(c, _)| *c == code)
        .map_or("Unknown", |(_, n)| n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_parse_and_print_back() {
        for text in [
            "delay:2s",
            "code:ResourceExhausted",
            "every:3:Unavailable",
            "hang",
            "close",
            "close:500ms",
            "exit:3",
            "delay:1500ms+code:DeadlineExceeded",
        ] {
            let f: Fault = text.parse().unwrap();
            assert_eq!(f.to_string(), text);
        }
    }

    #[test]
    fn codes_are_read_in_any_spelling() {
        assert_eq!(
            parse_code("RESOURCE_EXHAUSTED").unwrap(),
            tonic::Code::ResourceExhausted
        );
        assert_eq!(parse_code("unavailable").unwrap(), tonic::Code::Unavailable);
        assert_eq!(parse_code("14").unwrap(), tonic::Code::Unavailable);
        assert!(parse_code("Nope").is_err());
    }

    #[test]
    fn a_rule_names_its_method() {
        let r: Rule = "ControllerPublishVolume=code:Aborted".parse().unwrap();
        assert_eq!(r.method, "ControllerPublishVolume");
        assert_eq!(r.fault, Fault::code(tonic::Code::Aborted));
        assert!("code:Aborted".parse::<Rule>().is_err());
    }

    #[test]
    fn bad_combinations_are_refused() {
        assert!("hang+code:Aborted".parse::<Fault>().is_err());
        assert!("code:Aborted+delay:1s".parse::<Fault>().is_err());
        assert!("every:0:Aborted".parse::<Fault>().is_err());
        assert!("sleep:1s".parse::<Fault>().is_err());
    }

    #[test]
    fn durations_accept_common_units() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("1.5s").unwrap(), Duration::from_millis(1500));
        assert_eq!(parse_duration("1m").unwrap(), Duration::from_secs(60));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("3 days").is_err());
    }
}
