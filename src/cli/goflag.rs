//! The engine of Go's `flag` package: the argument loop, `-h`/`--help`, the usage text.
//!
//! attacher-hub is a drop-in replacement for the Go sidecar, so an existing Deployment's argument
//! list must mean the same thing here, including its oddities (spec §1.1):
//!
//! * `-name` and `--name` are the same flag; values go as `-name=value` or `-name value`;
//! * a boolean takes its value only after `=` (`true`, `false`, `1`, `0`, `t`, `f`, `T`, `F`,
//!   `TRUE`, `FALSE`, `True`, `False`); `-x false` makes `false` a positional argument, and the
//!   first positional argument (or `--`) **ends flag parsing**: everything after it is ignored;
//! * integers accept Go's base prefixes and `_` separators (`0x10`, `1_000`), durations use Go
//!   syntax (`300ms`, `1m30s`, `-5s`, bare `0`);
//! * an unknown flag or a bad value prints the error and the usage on stderr and exits **2**;
//!   `-h`, `-help` and `--help` print the usage on stderr (as Go does) and exit **0**.
//!
//! **Why not clap** (STYLE rule 11 asks for clap derive): clap cannot express these semantics.
//! It treats `-name` as a cluster of short options, does not stop at `-x false`, parses booleans
//! and numbers with Rust rules, has no Go durations and exits with its own codes and texts. A
//! reimplementation on top of clap would need a pre-pass that rewrites the arguments, i.e. a Go
//! flag parser anyway. So this module is a small hand-written parser over one declarative table,
//! `FLAGS`, which holds each flag's name, kind, default as shown in the usage text, help text and
//! setter; the rest of rule 11 holds: the result is validated into a typed [`Args`] (durations as
//! [`Duration`](std::time::Duration)) before anything starts, and failures are a typed [`Error`] carrying the exit code.
//!
//! Deliberate differences from the Go binary, each documented at its flag: the classic klog flags
//! removed in v4.6 (`--logtostderr`, …) are accepted as no-ops with a warning instead of being
//! unknown; negative durations (valid Go syntax) are treated as zero with a warning; the generic
//! kube-apiserver feature gates that the Go binary accepts without effect are unknown here (only
//! the attacher's own gates plus `AllAlpha`/`AllBeta`); hexadecimal floats are not accepted by
//! `--kube-api-qps`; `--vmodule` is validated but not applied. Every number has an upper bound
//! (the `MAX_*` constants below, shown in the usage): a value Go accepts above it, a negative
//! `--max-entries`, and a lease duration under one second with leader election on are
//! configuration errors (exit 1).

use super::args::Args;
use super::error::{Error, Parsed};
use super::flags::FLAGS;
use super::state::{Flag, Kind, State};

/// The program name used when the argument list is empty.
const DEFAULT_ARGV0: &str = "attacher-hub";

/// Parses and validates a full argument list (`argv[0]` first).
///
/// Validation follows the Go sidecar's start-up order, so that the same mistake gives the same
/// message: flags, logging options, feature gates, `--version`, the HTTP address exclusion,
/// `--worker-threads`, leader-election timing.
pub fn parse_from<I: IntoIterator<Item = String>>(argv: I) -> Result<Parsed, Error> {
    let mut argv = argv.into_iter();
    let argv0 = argv.next().unwrap_or_else(|| DEFAULT_ARGV0.to_owned());
    let rest: Vec<String> = argv.collect();

    let mut state = State::default();
    let mut i = 0;
    while let Some(arg) = rest.get(i) {
        // A lone `-` or anything not starting with `-` is a positional argument: stop.
        if arg.len() < 2 || !arg.starts_with('-') {
            break;
        }
        let body = match arg.strip_prefix("--") {
            Some("") => break, // `--` ends the flags
            Some(body) => body,
            None => &arg[1..],
        };
        if body.is_empty() || body.starts_with('-') || body.starts_with('=') {
            return Err(usage_error(&argv0, format!("bad flag syntax: {arg}")));
        }
        i += 1;
        let (name, inline) = match body.split_once('=') {
            Some((name, value)) => (name, Some(value)),
            None => (body, None),
        };
        let Some(flag) = FLAGS.iter().find(|f| f.name == name) else {
            if name == "help" || name == "h" {
                return Ok(Parsed::Exit {
                    code: 0,
                    stdout: String::new(),
                    stderr: usage(&argv0),
                });
            }
            return Err(usage_error(
                &argv0,
                format!("flag provided but not defined: -{name}"),
            ));
        };
        match flag.kind {
            Kind::Bool => {
                let value = inline.unwrap_or("true");
                if let Err(err) = (flag.set)(&mut state, value) {
                    let message = match inline {
                        Some(_) => format!("invalid boolean value {value:?} for -{name}: {err}"),
                        None => format!("invalid boolean flag {name}: {err}"),
                    };
                    return Err(usage_error(&argv0, message));
                }
            }
            Kind::Value(_) => {
                let value = match inline {
                    Some(value) => value,
                    None => match rest.get(i) {
                        Some(value) => {
                            i += 1;
                            value.as_str()
                        }
                        None => {
                            return Err(usage_error(
                                &argv0,
                                format!("flag needs an argument: -{name}"),
                            ));
                        }
                    },
                };
                if let Err(err) = (flag.set)(&mut state, value) {
                    return Err(usage_error(
                        &argv0,
                        format!("invalid value {value:?} for flag -{name}: {err}"),
                    ));
                }
            }
        }
    }
    state.finish(&argv0)
}

/// Parses the process's arguments; prints and exits on `--help`, `--version` and errors.
/// Returns the arguments and the warnings to log once logging is set up.
pub fn parse_env_or_exit() -> (Args, Vec<String>) {
    let argv = std::env::args_os().map(|a| a.to_string_lossy().into_owned());
    match parse_from(argv) {
        Ok(Parsed::Run(args, warnings)) => (*args, warnings),
        Ok(Parsed::Exit {
            code,
            stdout,
            stderr,
        }) => {
            emit(&stdout, &stderr);
            std::process::exit(code)
        }
        Err(err) => {
            emit("", &err.stderr_text());
            std::process::exit(err.exit_code())
        }
    }
}

/// Writes the texts; a closed stdout or stderr (`--help | head`) is not an error worth a panic.
fn emit(stdout: &str, stderr: &str) {
    use std::io::Write as _;
    let _ = std::io::stdout().write_all(stdout.as_bytes());
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().write_all(stderr.as_bytes());
}

/// The usage text, in the layout of Go's `flag.PrintDefaults`: flags sorted by name, each with
/// its value type, help and non-zero default.
pub fn usage(argv0: &str) -> String {
    let mut flags: Vec<&Flag> = FLAGS.iter().collect();
    flags.sort_by_key(|f| f.name);
    let mut out = format!("Usage of {argv0}:\n");
    for flag in flags {
        let mut line = format!("  -{}", flag.name);
        if let Kind::Value(type_name) = flag.kind {
            line.push(' ');
            line.push_str(type_name);
        }
        // Go puts a short flag's help on the same line.
        line.push_str(if line.len() <= 4 { "\t" } else { "\n    \t" });
        line.push_str(&flag.help.replace('\n', "\n    \t"));
        if !matches!(flag.default, "" | "0" | "false" | "0s") {
            match flag.kind {
                Kind::Value("string") => line.push_str(&format!(" (default {:?})", flag.default)),
                _ => line.push_str(&format!(" (default {})", flag.default)),
            }
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

fn usage_error(argv0: &str, message: String) -> Error {
    Error::Usage {
        message,
        usage: usage(argv0),
    }
}
