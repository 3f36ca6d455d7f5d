//! The engine of Go's `flag` package: the argument loop, `-h`/`--help`, the usage text.
//!
//! attacher-hub is a drop-in replacement for the Go sidecar, so an existing Deployment's argument
//! list must mean the same thing here, including its oddities (`docs/design.md#flag-parsing`):
//!
//! * `-name` and `--name` are the same flag; values go as `-name=value` or `-name value`;
//! * a boolean takes its value only after `=` (`true`, `false`, `1`, `0`, `t`, `f`, `T`, `F`,
//!   `TRUE`, `FALSE`, `True`, `False`); `-x false` makes `false` a positional argument, and the
//!   first positional argument (or `--`) **ends flag parsing**. Go then ignores everything
//!   after it, so a stray word (`attacher-hub stauts`, `-leader-election false`) silently
//!   started an attacher with defaults; here a positional argument is a usage error (exit 2)
//!   that names the nearest subcommand or the `=` a boolean needs, and `help` prints the usage;
//! * integers accept Go's base prefixes and `_` separators (`0x10`, `1_000`), durations use Go
//!   syntax (`300ms`, `1m30s`, `-5s`, bare `0`);
//! * an unknown flag or a bad value prints the error and the usage on stderr and exits **2**;
//!   `-h`, `-help` and `--help` print the usage on stderr (as Go does) and exit **0**.
//!
//! **Why not clap** (the usual choice for a Rust CLI): clap cannot express these semantics.
//! It treats `-name` as a cluster of short options, does not stop at `-x false`, parses booleans
//! and numbers with Rust rules, has no Go durations and exits with its own codes and texts. A
//! reimplementation on top of clap would need a pre-pass that rewrites the arguments, i.e. a Go
//! flag parser anyway. So this module is a small hand-written parser over one declarative table,
//! `FLAGS`, which holds each flag's name, kind, default as shown in the usage text, help text and
//! setter (`docs/design.md#why-not-clap`). What a derive parser would give is kept: the result is
//! validated into a typed [`Args`] (durations as [`Duration`](std::time::Duration)) before
//! anything starts, and failures are a typed [`Error`] carrying the exit code.
//!
//! Deliberate differences from the Go binary, each documented at its flag: the classic klog flags
//! removed in v4.6 (`--logtostderr`, …) are accepted as no-ops with a warning instead of being
//! unknown; negative durations (valid Go syntax) are treated as zero with a warning; the generic
//! kube-apiserver feature gates that the Go binary accepts without effect are unknown here (only
//! the attacher's own gates plus `AllAlpha`/`AllBeta`); hexadecimal floats are not accepted by
//! `--kube-api-qps`; `--vmodule` is validated but not applied. Every number has an upper bound
//! (the `MAX_*` constants of [`rules`](super::rules), shown in the usage): a value Go accepts
//! above it, a zero `--timeout`, `--retry-interval-*` or `--reconcile-sync`, a negative
//! `--max-entries`, and a lease duration under one second with leader election on are
//! configuration errors (exit 1), by the same rules as the fields of `drivers.yaml`.

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
    // The boolean flag just before, given without `=`: a `false` after it is a mistake.
    let mut bare_bool: Option<&str> = None;
    while let Some(arg) = rest.get(i) {
        let (name, inline) = match token(arg) {
            Token::Positional => return positional(&argv0, arg, bare_bool),
            // Nothing may follow `--`.
            Token::End => match rest.get(i + 1) {
                Some(next) => return positional(&argv0, next, None),
                None => break,
            },
            Token::BadSyntax => {
                return Err(usage_error(&argv0, format!("bad flag syntax: {arg}")));
            }
            Token::Flag { name, inline } => (name, inline),
        };
        i += 1;
        let Some(flag) = FLAGS.iter().find(|f| f.name == name) else {
            return unknown_flag(&argv0, name);
        };
        bare_bool = None;
        let value = match (flag.kind, inline) {
            (Kind::Bool, _) => {
                if inline.is_none() {
                    bare_bool = Some(flag.name);
                }
                inline.unwrap_or("true")
            }
            (Kind::Value(_), Some(value)) => value,
            (Kind::Value(_), None) => match rest.get(i) {
                Some(value) => {
                    i += 1;
                    value.as_str()
                }
                None => {
                    let message = format!("flag needs an argument: -{name}");
                    return Err(usage_error(&argv0, message));
                }
            },
        };
        if let Err(err) = (flag.set)(&mut state, value) {
            let message = invalid_value(flag.kind, name, inline, value, &err);
            return Err(usage_error(&argv0, message));
        }
    }
    state.finish(&argv0)
}

/// What one argument is, to the flag loop.
#[derive(Debug, PartialEq, Eq)]
enum Token<'a> {
    /// A lone `-` or a word not starting with `-`: flags end here.
    Positional,
    /// `--`: the flags end.
    End,
    /// `---x`, `-=x` and the like.
    BadSyntax,
    /// `-name`, `--name`, `-name=value` or `--name=value`.
    Flag {
        /// The flag's name.
        name: &'a str,
        /// The value after `=`, if any.
        inline: Option<&'a str>,
    },
}

/// Reads one argument as Go's `flag` package does: one or two dashes, a name, an optional
/// `=value`.
fn token(arg: &str) -> Token<'_> {
    if arg.len() < 2 || !arg.starts_with('-') {
        return Token::Positional;
    }
    let body = match arg.strip_prefix("--") {
        Some("") => return Token::End,
        Some(body) => body,
        None => &arg[1..],
    };
    if body.is_empty() || body.starts_with('-') || body.starts_with('=') {
        return Token::BadSyntax;
    }
    match body.split_once('=') {
        Some((name, value)) => Token::Flag {
            name,
            inline: Some(value),
        },
        None => Token::Flag {
            name: body,
            inline: None,
        },
    }
}

/// A flag not in [`FLAGS`]: `-h` and `-help` print the usage, any other is a usage error.
fn unknown_flag(argv0: &str, name: &str) -> Result<Parsed, Error> {
    if name == "help" || name == "h" {
        return Ok(Parsed::Exit {
            code: 0,
            stdout: String::new(),
            stderr: usage(argv0),
        });
    }
    Err(usage_error(
        argv0,
        format!("flag provided but not defined: -{name}"),
    ))
}

/// Go's message for a value its flag refused (`inline`: the value came after `=`; a boolean
/// without one was set to `true`).
fn invalid_value(kind: Kind, name: &str, inline: Option<&str>, value: &str, err: &str) -> String {
    match (kind, inline) {
        (Kind::Bool, Some(_)) => format!("invalid boolean value {value:?} for -{name}: {err}"),
        (Kind::Bool, None) => format!("invalid boolean flag {name}: {err}"),
        (Kind::Value(_), _) => format!("invalid value {value:?} for flag -{name}: {err}"),
    }
}

/// The subcommands, as a first argument (`help` is also `--help`).
const SUBCOMMANDS: [&str; 2] = ["status", "help"];

/// The outcome of a positional argument `word`: `help` prints the usage; anything else is a
/// usage error saying what was probably meant.
fn positional(argv0: &str, word: &str, bare_bool: Option<&str>) -> Result<Parsed, Error> {
    if word == "help" {
        return Ok(Parsed::Exit {
            code: 0,
            stdout: String::new(),
            stderr: usage(argv0),
        });
    }
    let message = if let Some(flag) = bare_bool
        && super::values::parse_go_bool(word).is_ok()
    {
        format!(
            "unexpected argument {word:?} after -{flag}: a boolean flag takes its value after \
             '=' (-{flag}={word})"
        )
    } else if word == "status" {
        "the status subcommand must come first: attacher-hub status [flags]".to_owned()
    } else if let Some(near) = nearest_subcommand(word) {
        format!("unknown command {word:?}: did you mean {near:?}? (attacher-hub {near} ...)")
    } else {
        format!(
            "unexpected argument {word:?}: attacher-hub takes flags only, or the status \
             subcommand first (attacher-hub status ...)"
        )
    };
    Err(Error::Usage {
        message,
        usage: format!("Run '{argv0} --help' for usage.\n"),
    })
}

/// The subcommand `word` is probably a typo of: at most two edits away (a swap of two
/// neighbours counts as one), or its beginning.
fn nearest_subcommand(word: &str) -> Option<&'static str> {
    let word = word.to_ascii_lowercase();
    SUBCOMMANDS
        .iter()
        .map(|c| (edit_distance(&word, c), *c))
        .filter(|(d, c)| *d <= 2 || (word.len() >= 2 && c.starts_with(word.as_str())))
        .min()
        .map(|(_, c)| c)
}

/// Optimal string alignment distance: insertions, deletions, substitutions and swaps of
/// neighbours, each one edit.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b): (Vec<char>, Vec<char>) = (a.chars().collect(), b.chars().collect());
    let mut d = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for (i, row) in d.iter_mut().enumerate() {
        row[0] = i;
    }
    for (j, cell) in d[0].iter_mut().enumerate() {
        *cell = j;
    }
    for i in 1..=a.len() {
        for j in 1..=b.len() {
            let cost = usize::from(a[i - 1] != b[j - 1]);
            let mut best = (d[i - 1][j] + 1)
                .min(d[i][j - 1] + 1)
                .min(d[i - 1][j - 1] + cost);
            if i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] {
                best = best.min(d[i - 2][j - 2] + 1);
            }
            d[i][j] = best;
        }
    }
    d[a.len()][b.len()]
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

/// What the usage says before the flags: the three modes and the `status` subcommand.
const USAGE_HEAD: &str = "
  attacher-hub [flags]            the attacher, in one of three modes:
    sidecar     --csi-address=/csi/csi.sock    one driver, next to it (the external-attacher
                                               image's flags, parsed as Go parses them)
    hub         --config=drivers.yaml          the drivers the file lists; re-read on SIGHUP
                                               and when the file changes
    discovery   --driver-sockets='/var/lib/kubelet/plugins/*/csi.sock'
                --kubelet-registration-dir=/var/lib/kubelet/plugins_registry
                                               the drivers whose sockets appear on this node
  attacher-hub status [flags]     the drivers of a running hub: state, Lease holder, queues,
                                  attachments, last error (attacher-hub status --help)

Flags: -name and --name are the same; a value goes as -name=value or -name value, a boolean's
only as -name=false.
";

/// The groups of the usage, in order: a title and the flags in it (every flag is in one group;
/// a unit test checks it).
const GROUPS: &[(&str, &[&str])] = &[
    (
        "Drivers and modes",
        &[
            "csi-address",
            "config",
            "driver-sockets",
            "kubelet-registration-dir",
            "exit-on-connection-loss",
        ],
    ),
    (
        "Attaching and detaching (defaults of every driver)",
        &[
            "timeout",
            "worker-threads",
            "retry-interval-start",
            "retry-interval-max",
            "resync",
            "reconcile-sync",
            "max-entries",
            "default-fstype",
            "feature-gates",
            "graceful-shutdown-timeout",
        ],
    ),
    (
        "Kubernetes API",
        &[
            "kubeconfig",
            "kube-api-qps",
            "kube-api-burst",
            "hub-kube-api-qps",
            "hub-kube-api-burst",
        ],
    ),
    (
        "Leader election",
        &[
            "leader-election",
            "leader-election-namespace",
            "leader-election-lease-duration",
            "leader-election-renew-deadline",
            "leader-election-retry-period",
            "leader-election-labels",
        ],
    ),
    (
        "HTTP: metrics, health, /drivers",
        &["http-endpoint", "metrics-address", "metrics-path"],
    ),
    (
        "Logging",
        &[
            "v",
            "vmodule",
            "logging-format",
            "log-flush-frequency",
            "log-text-split-stream",
            "log-text-info-buffer-size",
            "log-json-split-stream",
            "log-json-info-buffer-size",
            "max-grpc-log-length",
        ],
    ),
    ("Other", &["version"]),
    (
        "Accepted and ignored (flags of older external-attacher versions, so that old \
         manifests keep working; each logs a warning)",
        &[
            "automaxprocs",
            "logtostderr",
            "alsologtostderr",
            "log_dir",
            "log_file",
            "log_file_max_size",
            "stderrthreshold",
            "skip_headers",
            "skip_log_headers",
            "add_dir_header",
            "log_backtrace_at",
            "one_output",
        ],
    ),
];

/// The usage text: the modes and the `status` subcommand, then the flags by group, each in the
/// layout of Go's `flag.PrintDefaults` (value type, help, non-zero default).
pub fn usage(argv0: &str) -> String {
    let mut out = format!("Usage of {argv0}:\n{USAGE_HEAD}");
    for (title, names) in GROUPS {
        out.push_str(&format!("\n{title}:\n"));
        for name in *names {
            if let Some(flag) = FLAGS.iter().find(|f| f.name == *name) {
                out.push_str(&flag_usage(flag));
            }
        }
    }
    out
}

/// One flag's lines of the usage.
fn flag_usage(flag: &Flag) -> String {
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
    line.push('\n');
    line
}

fn usage_error(argv0: &str, message: String) -> Error {
    Error::Usage {
        message,
        usage: usage(argv0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_flag_is_in_exactly_one_group_of_the_usage() {
        for flag in FLAGS {
            let groups = GROUPS
                .iter()
                .filter(|(_, names)| names.contains(&flag.name))
                .count();
            assert_eq!(groups, 1, "-{} is in {groups} groups", flag.name);
        }
        for (title, names) in GROUPS {
            for name in *names {
                assert!(
                    FLAGS.iter().any(|f| f.name == *name),
                    "{title}: no flag -{name}"
                );
            }
        }
    }

    #[test]
    fn the_usage_starts_with_the_modes_and_the_status_subcommand() {
        let text = usage("attacher-hub");
        let modes = text.find("sidecar").expect("modes");
        let status = text.find("attacher-hub status").expect("status");
        let first_flag = text.find("\n  -").expect("flags");
        assert!(modes < first_flag && status < first_flag, "{text}");
        let ignored = text.find("Accepted and ignored").expect("ignored group");
        assert!(text[ignored..].contains("-logtostderr"), "{text}");
        assert!(!text[..ignored].contains("-logtostderr"), "{text}");
    }

    #[test]
    fn arguments_read_as_go_reads_them() {
        let flag = |name, inline| Token::Flag { name, inline };
        assert_eq!(token("-v"), flag("v", None));
        assert_eq!(token("--timeout=15s"), flag("timeout", Some("15s")));
        assert_eq!(token("-labels=a=b"), flag("labels", Some("a=b")));
        assert_eq!(token("-x="), flag("x", Some("")));
        assert_eq!(token("--"), Token::End);
        for word in ["-", "status", "", "false"] {
            assert_eq!(token(word), Token::Positional, "{word:?}");
        }
        for bad in ["---x", "-=x", "--=x"] {
            assert_eq!(token(bad), Token::BadSyntax, "{bad:?}");
        }
    }

    #[test]
    fn a_refused_value_is_worded_as_go_words_it() {
        let err = "parse error";
        assert_eq!(
            invalid_value(Kind::Bool, "leader-election", Some("yes"), "yes", err),
            "invalid boolean value \"yes\" for -leader-election: parse error"
        );
        assert_eq!(
            invalid_value(Kind::Bool, "leader-election", None, "true", err),
            "invalid boolean flag leader-election: parse error"
        );
        assert_eq!(
            invalid_value(Kind::Value("duration"), "timeout", None, "5", err),
            "invalid value \"5\" for flag -timeout: parse error"
        );
        assert!(matches!(
            unknown_flag("a", "help"),
            Ok(Parsed::Exit { code: 0, .. })
        ));
        let Err(Error::Usage { message, .. }) = unknown_flag("a", "nope") else {
            panic!("a usage error");
        };
        assert_eq!(message, "flag provided but not defined: -nope");
    }

    #[test]
    fn typos_of_a_subcommand_are_recognised() {
        for (word, near) in [
            ("stauts", Some("status")),
            ("statsu", Some("status")),
            ("Status", Some("status")),
            ("stat", Some("status")),
            ("hepl", Some("help")),
            ("attach", None),
            ("x", None),
        ] {
            assert_eq!(nearest_subcommand(word), near, "{word}");
        }
    }
}
