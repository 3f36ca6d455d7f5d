//! Command line: every external-attacher v4.13 flag, parsed exactly as Go's `flag` package does
//! (see [`goflag`] for the rules, and why this is not clap).
//!
//! The parts: [`args`] (what a command line gives), [`goflag`] (the parser), [`flags`] (the
//! table of flags), [`state`] (one flag, and what its setter records), [`values`] (Go's value
//! syntax), [`rules`] (the rule of each per-driver setting, shared with `drivers.yaml`),
//! [`validate`] (the checks after parsing), [`error`] (outcomes and exit codes).

pub mod args;
pub mod error;
pub mod flags;
pub mod goflag;
pub mod rules;
pub mod state;
pub mod validate;
pub mod values;

pub use args::{Args, FeatureGates, LeaderElection, Logging};
pub use error::{Error, Parsed};
pub use goflag::{parse_env_or_exit, parse_from, usage};
pub use rules::{
    MAX_API_BURST, MAX_API_QPS, MAX_DURATION, MAX_GRPC_LOG_LENGTH, MAX_LIST_ENTRIES, MAX_WORKERS,
    MIN_LEASE_DURATION,
};
pub use values::{DurationError, GoDuration, parse_go_duration};

/// The version `--version` prints and the image's labels carry: Cargo.toml's, with the build
/// metadata `git describe` gives (`0.1.0+5.g1a2b3c4.dirty`), stamped by `build.rs`.
pub const VERSION: &str = env!("ATTACHER_HUB_VERSION");

/// The commit the binary was built from (`git rev-parse HEAD`), or `unknown` without git.
pub const REVISION: &str = env!("ATTACHER_HUB_REVISION");

/// The tests of the whole command line: what a list of arguments gives.
#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::cli::flags::FLAGS;
    use crate::cli::values::quantity_is_zero;
    use crate::leader::timing::{TimingError, TimingField};
    use crate::telemetry;
    use std::collections::BTreeMap;
    use std::path::PathBuf;
    use std::time::Duration;

    pub(crate) fn parse(args: &[&str]) -> Result<Parsed, Error> {
        parse_from(
            std::iter::once("attacher-hub")
                .chain(args.iter().copied())
                .map(str::to_owned),
        )
    }

    pub(crate) fn run(args: &[&str]) -> (Args, Vec<String>) {
        match parse(args) {
            Ok(Parsed::Run(a, w)) => (*a, w),
            other => panic!("{args:?} should parse to Run, got {other:?}"),
        }
    }

    pub(crate) fn args(list: &[&str]) -> Args {
        run(list).0
    }

    pub(crate) fn err(args: &[&str]) -> Error {
        match parse(args) {
            Err(e) => e,
            other => panic!("{args:?} should fail, got {other:?}"),
        }
    }

    pub(crate) fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn no_arguments_give_the_external_attacher_defaults() {
        assert_eq!(run(&[]), (Args::default(), vec![]));
        assert_eq!(parse_from(Vec::new()), parse(&[]));
    }

    #[test]
    fn single_and_double_dash_and_both_value_forms_are_equivalent() {
        for list in [
            &["-timeout=30s"][..],
            &["--timeout=30s"],
            &["-timeout", "30s"],
            &["--timeout", "30s"],
        ] {
            assert_eq!(args(list).timeout, secs(30), "{list:?}");
        }
    }

    #[test]
    fn a_space_separated_value_may_start_with_a_dash() {
        assert_eq!(
            args(&["--csi-address", "-weird"]).csi_address,
            "-weird".to_owned()
        );
        assert_eq!(
            args(&["--max-grpc-log-length", "-5"]).max_grpc_log_length,
            -5
        );
    }

    #[test]
    fn the_last_occurrence_of_a_flag_wins() {
        assert_eq!(args(&["-timeout=1s", "--timeout=2s"]).timeout, secs(2));
    }

    #[test]
    fn booleans_take_go_parse_bool_values_after_equals_only() {
        for (value, expected) in [
            ("true", true),
            ("True", true),
            ("TRUE", true),
            ("t", true),
            ("T", true),
            ("1", true),
            ("false", false),
            ("False", false),
            ("FALSE", false),
            ("f", false),
            ("F", false),
            ("0", false),
        ] {
            let flag = format!("--leader-election={value}");
            assert_eq!(args(&[&flag]).leader_election.enabled, expected, "{flag}");
        }
        assert!(args(&["-leader-election"]).leader_election.enabled);
        let e = err(&["--leader-election=yes"]);
        assert_eq!(e.exit_code(), 2);
        assert_eq!(
            e.to_string(),
            "invalid boolean value \"yes\" for -leader-election: parse error"
        );
        assert_eq!(err(&["--leader-election=tRue"]).exit_code(), 2);
        assert_eq!(err(&["--leader-election="]).exit_code(), 2);
    }

    #[test]
    fn a_boolean_followed_by_false_is_a_usage_error_that_shows_the_equals_sign() {
        let e = err(&["--leader-election", "false", "--timeout=1s"]);
        assert_eq!(e.exit_code(), 2);
        assert_eq!(
            e.to_string(),
            "unexpected argument \"false\" after -leader-election: a boolean flag takes its \
             value after '=' (-leader-election=false)"
        );
    }

    #[test]
    fn a_positional_argument_is_a_usage_error_that_suggests_the_nearest_subcommand() {
        for (list, message) in [
            (
                &["stauts", "--address=:8080"][..],
                "unknown command \"stauts\": did you mean \"status\"? (attacher-hub status ...)",
            ),
            (
                &["--timeout=1s", "x", "--timeout=2s"],
                "unexpected argument \"x\": attacher-hub takes flags only, or the status \
                 subcommand first (attacher-hub status ...)",
            ),
            (&["-", "--timeout=1s"], "unexpected argument \"-\""),
            (&["--", "--bogus"], "unexpected argument \"--bogus\""),
            (
                &["--v=2", "status"],
                "the status subcommand must come first: attacher-hub status [flags]",
            ),
        ] {
            let e = err(list);
            assert_eq!(e.exit_code(), 2, "{list:?}");
            assert!(e.to_string().starts_with(message), "{list:?}: {e}");
            // A short pointer to the usage, not the whole of it under the message.
            assert_eq!(
                e.stderr_text(),
                format!("{e}\nRun 'attacher-hub --help' for usage.\n"),
                "{list:?}"
            );
        }
        // `--` alone ends the flags and is fine; `help` is `--help`.
        assert_eq!(args(&["--timeout=3s", "--"]).timeout, secs(3));
        assert!(matches!(
            parse(&["help"]),
            Ok(Parsed::Exit { code: 0, ref stderr, .. }) if stderr.starts_with("Usage of attacher-hub:")
        ));
    }

    #[test]
    fn flag_syntax_errors_exit_2_with_go_messages() {
        for (list, message) in [
            (&["--bogus"][..], "flag provided but not defined: -bogus"),
            (&["-bogus=1"], "flag provided but not defined: -bogus"),
            (&["---timeout=1s"], "bad flag syntax: ---timeout=1s"),
            (&["-=x"], "bad flag syntax: -=x"),
            (&["--timeout"], "flag needs an argument: -timeout"),
            (
                &["--timeout=10"],
                "invalid value \"10\" for flag -timeout: parse error",
            ),
            (
                &["--worker-threads=-1"],
                "invalid value \"-1\" for flag -worker-threads: parse error",
            ),
            (
                &["--kube-api-burst=99999999999999999999"],
                "invalid value \"99999999999999999999\" for flag -kube-api-burst: value out of range",
            ),
        ] {
            let e = err(list);
            assert_eq!(e.exit_code(), 2, "{list:?}");
            assert_eq!(e.to_string(), message, "{list:?}");
            assert!(
                e.stderr_text().contains("Usage of attacher-hub:"),
                "{list:?}"
            );
        }
    }

    #[test]
    fn help_prints_usage_on_stderr_and_exits_0_but_earlier_errors_win() {
        for flag in ["-h", "--h", "-help", "--help"] {
            match parse(&["--timeout=1s", flag, "--bogus"]) {
                Ok(Parsed::Exit {
                    code: 0,
                    stdout,
                    stderr,
                }) => {
                    assert!(stdout.is_empty());
                    assert!(stderr.starts_with("Usage of attacher-hub:\n"));
                    assert!(stderr.contains("  -csi-address string\n    \tAddress"));
                    assert!(stderr.contains("(default \"/run/csi/socket\")"));
                    assert!(stderr.contains("(default 10m0s)"));
                    assert!(stderr.contains("  -v Level\n"));
                }
                other => panic!("{flag}: {other:?}"),
            }
        }
        assert_eq!(err(&["--bogus", "--help"]).exit_code(), 2);
    }

    #[test]
    fn the_version_is_cargo_tomls_with_gits_build_metadata() {
        let (package, metadata) = VERSION
            .split_once('+')
            .map_or((VERSION, None), |(p, m)| (p, Some(m)));
        assert_eq!(package, env!("CARGO_PKG_VERSION"));
        // Past a release tag or without one, the abbreviated commit is in the metadata, and the
        // revision is the full hash it abbreviates (none on the tag itself, or without git).
        let hash = metadata.and_then(|m| m.split('.').find_map(|m| m.strip_prefix('g')));
        if let Some(hash) = hash {
            assert_eq!(REVISION.len(), 40, "{REVISION}");
            assert!(REVISION.starts_with(hash), "{REVISION} {hash}");
        }
        assert!(
            REVISION == "unknown" || REVISION.chars().all(|c| c.is_ascii_hexdigit()),
            "{REVISION}"
        );
    }

    #[test]
    fn gits_description_becomes_semver_build_metadata() {
        // build.rs's `with_metadata`, checked here through its output format: a SemVer build
        // metadata part of dot-separated alphanumeric identifiers.
        if let Some((_, metadata)) = VERSION.split_once('+') {
            assert!(
                metadata.split('.').all(|part| !part.is_empty()
                    && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')),
                "{VERSION}"
            );
        }
    }

    #[test]
    fn version_prints_argv0_and_version() {
        let expected = Parsed::Exit {
            code: 0,
            stdout: format!("/attacher-hub v{VERSION}\n"),
            stderr: String::new(),
        };
        for flag in ["--version", "-version", "--version=true"] {
            let argv = ["/attacher-hub", flag].map(str::to_owned);
            assert_eq!(parse_from(argv), Ok(expected.clone()), "{flag}");
        }
        assert!(matches!(parse(&["--version=false"]), Ok(Parsed::Run(..))));
        // Parse errors come first; validation after `--version` does not run.
        assert_eq!(err(&["--version", "--bogus"]).exit_code(), 2);
        assert!(matches!(
            parse(&["--version", "--worker-threads=0"]),
            Ok(Parsed::Exit { code: 0, .. })
        ));
    }

    #[test]
    fn duration_flags_accept_go_syntax_and_clamp_negatives_with_a_warning() {
        let a = args(&[
            "--resync=1m30s",
            "--retry-interval-start=500ms",
            "--retry-interval-max=1h",
            "--reconcile-sync=2h",
            "--graceful-shutdown-timeout=1.5s",
        ]);
        assert_eq!(a.resync, secs(90));
        assert_eq!(a.retry_interval_start, Duration::from_millis(500));
        assert_eq!(a.retry_interval_max, secs(3600));
        assert_eq!(a.reconcile_sync, secs(7200));
        assert_eq!(a.graceful_shutdown_timeout, Duration::from_millis(1500));
        let (a, warnings) = run(&["--resync=-5s"]);
        assert_eq!(a.resync, Duration::ZERO);
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("-resync"));
    }

    /// The rules of `rules.rs`, as a `drivers.yaml` entry is held to them: a per-driver pause
    /// of zero is refused naming the flag, and a retry maximum below the start is accepted
    /// (external-attacher accepts it; every retry then waits the maximum).
    #[test]
    fn per_driver_pauses_must_be_positive_and_the_retry_maximum_may_be_below_the_start() {
        for flag in [
            "timeout",
            "retry-interval-start",
            "retry-interval-max",
            "reconcile-sync",
        ] {
            for value in ["0", "0s", "-1s"] {
                let e = err(&[&format!("--{flag}={value}")]);
                assert_eq!(e.exit_code(), 1, "--{flag}={value}");
                assert_eq!(
                    e.to_string(),
                    format!("--{flag} must be greater than zero, not 0s"),
                    "--{flag}={value}"
                );
            }
        }
        let a = args(&["--retry-interval-start=10s", "--retry-interval-max=1s"]);
        assert_eq!(
            (a.retry_interval_start, a.retry_interval_max),
            (secs(10), secs(1))
        );
        // client-go's reading of zero for a driver's budget, as in `drivers.yaml`.
        let a = args(&["--kube-api-qps=0", "--kube-api-burst=0"]);
        assert_eq!((a.kube_api_qps, a.kube_api_burst), (0.0, 0));
    }

    #[test]
    fn numeric_flags() {
        let a = args(&[
            "--worker-threads=20",
            "--max-entries=100",
            "--max-grpc-log-length=0",
            "--kube-api-qps=50.5",
            "--kube-api-burst=100",
            "-v=5",
        ]);
        assert_eq!(a.worker_threads, 20);
        assert_eq!(a.max_entries, 100);
        assert_eq!(a.max_grpc_log_length, 0);
        assert_eq!(a.kube_api_qps, 50.5);
        assert_eq!(a.kube_api_burst, 100);
        assert_eq!(a.logging.verbosity, 5);
        assert_eq!(err(&["-v=-1"]).exit_code(), 2);
        assert_eq!(err(&["-v=x"]).exit_code(), 2);
    }

    #[test]
    fn worker_threads_zero_is_a_start_up_error() {
        let e = err(&["--worker-threads=0"]);
        assert_eq!(e, Error::ZeroWorkerThreads);
        assert_eq!(e.exit_code(), 1);
        assert_eq!(
            e.to_string(),
            "Option -worker-threads must be greater than zero"
        );
    }

    #[test]
    fn every_number_is_accepted_at_its_bound_and_refused_above_it() {
        // (flag, the largest value accepted, the smallest refused, the bound as the usage
        // and the error show it)
        let cases: &[(&str, &str, &str, &str)] = &[
            ("worker-threads", "10000", "10001", "10000"),
            ("worker-threads", "10000", "1000000000", "10000"),
            ("max-entries", "2147483647", "2147483648", "2147483647"),
            (
                "max-grpc-log-length",
                "4294967295",
                "4294967296",
                "4294967295",
            ),
            ("kube-api-qps", "1e6", "1000000.5", "1000000"),
            ("kube-api-qps", "1e6", "+Inf", "1000000"),
            ("kube-api-qps", "1e6", "NaN", "1000000"),
            ("hub-kube-api-qps", "1000000", "1e7", "1000000"),
            ("kube-api-burst", "2000000", "2000001", "2000000"),
            ("hub-kube-api-burst", "2000000", "2000001", "2000000"),
            ("timeout", "24h", "24h0m0.000000001s", "24h"),
            ("resync", "24h", "25h", "24h"),
            ("retry-interval-start", "1440m", "2562047h", "24h"),
            ("retry-interval-max", "24h", "25h", "24h"),
            ("reconcile-sync", "24h", "25h", "24h"),
            ("graceful-shutdown-timeout", "24h", "25h", "24h"),
            ("log-flush-frequency", "24h", "25h", "24h"),
            ("leader-election-lease-duration", "24h", "25h", "24h"),
            ("leader-election-renew-deadline", "24h", "25h", "24h"),
            ("leader-election-retry-period", "24h", "25h", "24h"),
        ];
        assert_eq!(GoDuration(MAX_DURATION).to_string(), "24h0m0s");
        for &(flag, ok, bad, bound) in cases {
            let help = FLAGS
                .iter()
                .find(|f| f.name == flag)
                .map(|f| f.help)
                .expect("a known flag");
            assert!(
                help.contains(bound),
                "-{flag}: the usage shows the bound: {help}"
            );
            // Leader election off: only the bound applies, not the timing rules.
            assert!(
                matches!(parse(&[&format!("--{flag}={ok}")]), Ok(Parsed::Run(..))),
                "--{flag}={ok}"
            );
            let e = err(&[&format!("--{flag}={bad}")]);
            assert_eq!(e.exit_code(), 1, "--{flag}={bad}: {e}");
            assert!(
                matches!(e, Error::TooLarge { flag: f, .. } if f == flag),
                "--{flag}={bad}: {e:?}"
            );
        }
        assert_eq!(
            err(&["--worker-threads=1000000000"]).to_string(),
            "--worker-threads must be at most 10000, not 1000000000"
        );
        assert_eq!(
            err(&["--timeout=25h"]).to_string(),
            "--timeout must be at most 24h0m0s, not 25h0m0s"
        );
        assert_eq!(
            err(&["--kube-api-qps=Inf"]).to_string(),
            "--kube-api-qps must be at most 1000000, not inf"
        );
        // Go's own range errors keep exit 2.
        assert_eq!(
            err(&["--worker-threads=18446744073709551616"]).exit_code(),
            2
        );
        assert_eq!(err(&["--timeout=2562048h"]).exit_code(), 2);
        // Negative QPS (no limit) and negative log length (no cap) keep their meaning.
        assert_eq!(
            args(&["--kube-api-qps=-Inf"]).kube_api_qps,
            f64::NEG_INFINITY
        );
        assert_eq!(
            args(&["--max-grpc-log-length=-9223372036854775808"]).max_grpc_log_length,
            i64::MIN
        );
        let e = err(&["--max-entries=-1"]);
        assert_eq!(e.exit_code(), 1);
        assert_eq!(e.to_string(), "--max-entries must not be negative, not -1");
    }

    #[test]
    fn a_lease_under_one_second_is_refused_when_leader_election_is_on() {
        let short = [
            "--leader-election-lease-duration=900ms",
            "--leader-election-renew-deadline=800ms",
            "--leader-election-retry-period=100ms",
        ];
        assert!(matches!(parse(&short), Ok(Parsed::Run(..))));
        let with: Vec<&str> = short.iter().copied().chain(["--leader-election"]).collect();
        let e = err(&with);
        assert_eq!(
            e,
            Error::LeaderElection(TimingError::LeaseTooShort(Duration::from_millis(900)))
        );
        assert_eq!(e.exit_code(), 1);
        assert_eq!(
            e.to_string(),
            "--leader-election-lease-duration must be at least 1s, not 900ms: a Lease holds whole seconds"
        );
        assert!(
            args(&[
                "--leader-election",
                "--leader-election-lease-duration=1s",
                "--leader-election-renew-deadline=800ms",
                "--leader-election-retry-period=100ms",
            ])
            .leader_election
            .enabled
        );
    }

    #[test]
    fn the_hub_cap_is_off_by_default_and_negative_limits_are_refused() {
        let a = args(&[]);
        assert_eq!((a.hub_kube_api_qps, a.hub_kube_api_burst), (0.0, 0));
        let a = args(&["--hub-kube-api-qps=50", "--hub-kube-api-burst=100"]);
        assert_eq!((a.hub_kube_api_qps, a.hub_kube_api_burst), (50.0, 100));
        // A negative QPS keeps client-go's meaning: no limit.
        assert_eq!(args(&["--kube-api-qps=-1"]).kube_api_qps, -1.0);
        for (list, text) in [
            (
                &["--kube-api-burst=-1"][..],
                "--kube-api-burst must not be negative, not -1",
            ),
            (
                &["--hub-kube-api-qps=-2.5"][..],
                "--hub-kube-api-qps must not be negative, not -2.5",
            ),
            (
                &["--hub-kube-api-burst=-3"][..],
                "--hub-kube-api-burst must not be negative, not -3",
            ),
        ] {
            let e = err(list);
            assert_eq!(e.exit_code(), 1, "{list:?}");
            assert_eq!(e.to_string(), text);
        }
    }

    #[test]
    fn metrics_address_excludes_http_endpoint() {
        let e = err(&["--metrics-address=:8080", "--http-endpoint=:8081"]);
        assert_eq!(e.exit_code(), 1);
        assert_eq!(
            e.to_string(),
            "Only one of `--metrics-address` and `--http-endpoint` can be set"
        );
    }

    #[test]
    fn feature_gates() {
        let a = args(&["--feature-gates=ReleaseLeaderElectionOnExit=true"]);
        assert!(a.feature_gates.release_leader_election_on_exit);
        assert!(a.feature_gates.mutable_csi_node_allocatable_count);
        let a = args(&[
            "--feature-gates= ReleaseLeaderElectionOnExit = t ,MutableCSINodeAllocatableCount=false",
        ]);
        assert!(a.feature_gates.release_leader_election_on_exit);
        assert!(!a.feature_gates.mutable_csi_node_allocatable_count);
        // Repeated flags merge.
        let a = args(&[
            "--feature-gates=MutableCSINodeAllocatableCount=false",
            "--feature-gates=ReleaseLeaderElectionOnExit=true",
        ]);
        assert_eq!(
            a.feature_gates,
            FeatureGates {
                release_leader_election_on_exit: true,
                mutable_csi_node_allocatable_count: false,
            }
        );
        assert!(
            args(&["--feature-gates=AllAlpha=true"])
                .feature_gates
                .release_leader_election_on_exit
        );
        assert!(
            !args(&["--feature-gates=AllAlpha=true,ReleaseLeaderElectionOnExit=false"])
                .feature_gates
                .release_leader_election_on_exit
        );
        assert_eq!(
            args(&["--feature-gates=AllBeta=true"]).feature_gates,
            FeatureGates::default()
        );
        assert_eq!(
            args(&["--feature-gates="]).feature_gates,
            FeatureGates::default()
        );

        let e = err(&["--feature-gates=Bogus=true"]);
        assert_eq!(e, Error::UnknownFeatureGate("Bogus".to_owned()));
        assert_eq!(e.exit_code(), 1);
        assert_eq!(
            err(&["--feature-gates=ReleaseLeaderElectionOnExit"]).exit_code(),
            2
        );
        assert_eq!(
            err(&["--feature-gates=ReleaseLeaderElectionOnExit=maybe"]).exit_code(),
            2
        );
    }

    /// The gates external-attacher v4.13.0 defines (`pkg/features`), each set both ways, with the
    /// reference's defaults when unset; `AllAlpha` reaches the alpha gate only. The generic
    /// kube-apiserver gates the Go binary also accepts (without effect) are refused here.
    #[test]
    fn every_gate_of_the_reference_is_accepted_with_its_default_and_stage() {
        for value in [false, true] {
            let a = args(&[&format!(
                "--feature-gates=ReleaseLeaderElectionOnExit={value}"
            )]);
            assert_eq!(a.feature_gates.release_leader_election_on_exit, value);
            assert!(a.feature_gates.mutable_csi_node_allocatable_count);
            let a = args(&[&format!(
                "--feature-gates=MutableCSINodeAllocatableCount={value}"
            )]);
            assert_eq!(a.feature_gates.mutable_csi_node_allocatable_count, value);
            assert!(!a.feature_gates.release_leader_election_on_exit);
        }
        let a = args(&["--feature-gates=AllAlpha=false,AllBeta=false"]);
        assert_eq!(a.feature_gates, FeatureGates::default());
        // A GA gate is not an alpha one.
        let a = args(&["--feature-gates=AllAlpha=true,MutableCSINodeAllocatableCount=false"]);
        assert!(a.feature_gates.release_leader_election_on_exit);
        assert!(!a.feature_gates.mutable_csi_node_allocatable_count);
        let e = err(&["--feature-gates=APIResponseCompression=true"]);
        assert_eq!(
            e,
            Error::UnknownFeatureGate("APIResponseCompression".to_owned())
        );
        assert_eq!(e.exit_code(), 1);
    }

    #[test]
    fn leader_election_labels_need_exactly_one_colon_per_item() {
        let a = args(&["--leader-election-labels=app:attacher,tier:storage"]);
        assert_eq!(
            a.leader_election.labels,
            BTreeMap::from([
                ("app".to_owned(), "attacher".to_owned()),
                ("tier".to_owned(), "storage".to_owned()),
            ])
        );
        for bad in ["a", "a:b:c", "a:b,", "a=b"] {
            let flag = format!("--leader-election-labels={bad}");
            assert_eq!(err(&[&flag]).exit_code(), 2, "{bad}");
        }
    }

    #[test]
    fn leader_election_timing_is_validated_only_when_enabled() {
        let ok = args(&[
            "--leader-election",
            "--leader-election-namespace=kube-system",
        ]);
        assert_eq!(ok.leader_election.namespace.as_deref(), Some("kube-system"));
        assert_eq!(ok.leader_election.lease_duration, secs(15));
        for (list, expected) in [
            (
                &["--leader-election-lease-duration=10s"][..],
                Error::LeaderElection(TimingError::LeaseNotLongerThanRenewDeadline {
                    lease_duration: secs(10),
                    renew_deadline: secs(10),
                }),
            ),
            (
                &["--leader-election-retry-period=9s"],
                Error::LeaderElection(TimingError::RenewDeadlineNotLongerThanRetry {
                    renew_deadline: secs(10),
                    retry_period: secs(9),
                }),
            ),
            (
                &["--leader-election-retry-period=-1s"],
                Error::LeaderElection(TimingError::Zero(TimingField::RetryPeriod)),
            ),
            (
                &[
                    "--leader-election-lease-duration=0",
                    "--leader-election-renew-deadline=0",
                ],
                Error::LeaderElection(TimingError::LeaseNotLongerThanRenewDeadline {
                    lease_duration: Duration::ZERO,
                    renew_deadline: Duration::ZERO,
                }),
            ),
        ] {
            let with: Vec<&str> = list.iter().copied().chain(["--leader-election"]).collect();
            let e = err(&with);
            assert_eq!(e.exit_code(), 1);
            assert_eq!(e, expected, "{list:?}");
            assert!(matches!(parse(list), Ok(Parsed::Run(..))), "{list:?}");
        }
        // 10s > 1.2 × 8s = 9.6s
        assert!(
            args(&["--leader-election", "--leader-election-retry-period=8s"])
                .leader_election
                .enabled
        );
        assert_eq!(
            Error::LeaderElection(TimingError::LeaseNotLongerThanRenewDeadline {
                lease_duration: secs(10),
                renew_deadline: secs(90),
            })
            .to_string(),
            "--leader-election-lease-duration (10s) must be greater than --leader-election-renew-deadline (1m30s)"
        );
        assert_eq!(
            Error::LeaderElection(TimingError::RenewDeadlineNotLongerThanRetry {
                renew_deadline: secs(10),
                retry_period: secs(9),
            })
            .to_string(),
            "--leader-election-renew-deadline (10s) must be greater than 1.2 × --leader-election-retry-period (9s)"
        );
        assert_eq!(
            Error::LeaderElection(TimingError::Zero(TimingField::RetryPeriod)).to_string(),
            "--leader-election-retry-period must be greater than zero, not 0s"
        );
    }

    #[test]
    fn logging_flags() {
        let a = args(&[
            "--logging-format=json",
            "--log-flush-frequency=1s",
            "-v",
            "3",
        ]);
        assert_eq!(a.logging.format, telemetry::Format::Json);
        assert_eq!(a.logging.flush_frequency, secs(1));
        assert_eq!(a.logging.verbosity, 3);
        let (a, warnings) = run(&["--vmodule=controller*=5,,csi_handler=4"]);
        assert_eq!(
            a.logging.vmodule,
            vec![("controller*".to_owned(), 5), ("csi_handler".to_owned(), 4)]
        );
        assert_eq!(warnings.len(), 1);
        assert_eq!(err(&["--vmodule=x"]).exit_code(), 2);
        assert_eq!(err(&["--vmodule==3"]).exit_code(), 2);

        let e = err(&["--logging-format=xml"]);
        assert_eq!(e, Error::LoggingFormat("xml".to_owned()));
        assert_eq!(e.exit_code(), 1);
        let e = err(&["--logging-format=json", "--vmodule=a=1"]);
        assert_eq!(e, Error::VmoduleWithoutText);
        assert_eq!(e.exit_code(), 1);
    }

    #[test]
    fn alpha_logging_options_parse_then_fail_validation_unless_default() {
        for flag in [
            "--log-text-split-stream",
            "--log-json-split-stream=true",
            "--log-text-info-buffer-size=64Ki",
            "--log-json-info-buffer-size=1M",
        ] {
            let e = err(&[flag]);
            assert_eq!(e.exit_code(), 1, "{flag}");
            assert!(matches!(e, Error::AlphaLoggingOption(_)), "{flag}");
        }
        for flag in [
            "--log-text-split-stream=false",
            "--log-text-info-buffer-size=0",
            "--log-json-info-buffer-size=0Mi",
        ] {
            assert!(matches!(parse(&[flag]), Ok(Parsed::Run(..))), "{flag}");
        }
        for bad in [
            "--log-text-info-buffer-size=lots",
            "--log-json-split-stream=yes",
        ] {
            assert_eq!(err(&[bad]).exit_code(), 2, "{bad}");
        }
        assert_eq!(quantity_is_zero("1e3"), Ok(false));
        assert_eq!(quantity_is_zero("-0.0"), Ok(true));
        assert!(quantity_is_zero("1Xi").is_err());
    }

    #[test]
    fn legacy_klog_flags_are_accepted_with_one_warning_each() {
        let (a, warnings) = run(&[
            "--logtostderr",
            "--alsologtostderr=false",
            "--log_dir=/tmp",
            "--log_file",
            "/tmp/x.log",
            "--log_file_max_size=1800",
            "--stderrthreshold=INFO",
            "--skip_headers=true",
            "--skip_log_headers",
            "--add_dir_header",
            "--log_backtrace_at",
            "main.go:10",
            "--one_output",
            "--logtostderr=true",
            "--timeout=20s",
        ]);
        assert_eq!(a.timeout, secs(20));
        assert_eq!(warnings.len(), 11);
        assert!(warnings[0].contains("-logtostderr"));
        assert_eq!(err(&["--log_dir"]).exit_code(), 2);
    }

    #[test]
    fn hub_flags() {
        let a = args(&[
            "--config=/etc/hub/drivers.yaml",
            "--driver-sockets=/var/lib/kubelet/plugins/*/csi.sock",
            "--exit-on-connection-loss",
            "--graceful-shutdown-timeout=30s",
        ]);
        assert_eq!(a.config, Some(PathBuf::from("/etc/hub/drivers.yaml")));
        assert_eq!(
            a.driver_sockets.as_deref(),
            Some("/var/lib/kubelet/plugins/*/csi.sock")
        );
        assert!(a.exit_on_connection_loss);
        assert_eq!(a.graceful_shutdown_timeout, secs(30));
        assert!(!Args::default().exit_on_connection_loss);
    }

    #[test]
    fn automaxprocs_is_accepted_bare_or_with_a_value() {
        assert!(args(&["-automaxprocs"]).automaxprocs);
        assert!(!args(&["-automaxprocs=false"]).automaxprocs);
        assert!(args(&["-automaxprocs=anything"]).automaxprocs);
    }

    #[test]
    fn external_attacher_example_deployment_arguments_parse() {
        let a = args(&[
            "--v=5",
            "--csi-address=/var/lib/csi/sockets/pluginproxy/csi.sock",
            "--leader-election",
            "--http-endpoint=:8080",
        ]);
        assert_eq!(a.logging.verbosity, 5);
        assert_eq!(a.csi_address, "/var/lib/csi/sockets/pluginproxy/csi.sock");
        assert!(a.leader_election.enabled);
        assert_eq!(a.http_endpoint.as_deref(), Some(":8080"));
    }

    #[test]
    fn old_manifest_arguments_parse_with_a_klog_warning() {
        let (a, warnings) = run(&[
            "--v=5",
            "--csi-address=/csi/csi.sock",
            "--leader-election=true",
            "--retry-interval-start=500ms",
            "--logtostderr",
        ]);
        assert_eq!(a.logging.verbosity, 5);
        assert_eq!(a.csi_address, "/csi/csi.sock");
        assert!(a.leader_election.enabled);
        assert_eq!(a.retry_interval_start, Duration::from_millis(500));
        assert_eq!(warnings.len(), 1);
    }

    #[test]
    fn v4_12_manifest_arguments_parse() {
        let (a, warnings) = run(&[
            "-v=2",
            "-csi-address=/csi/csi.sock",
            "-leader-election",
            "-leader-election-namespace=kube-system",
            "-http-endpoint=:8080",
            "-timeout=60s",
            "-worker-threads=20",
            "-kube-api-qps=50",
            "-kube-api-burst=100",
            "-feature-gates=ReleaseLeaderElectionOnExit=true",
            "-automaxprocs",
        ]);
        assert!(warnings.is_empty());
        assert_eq!(a.logging.verbosity, 2);
        assert_eq!(a.csi_address, "/csi/csi.sock");
        assert!(a.leader_election.enabled);
        assert_eq!(a.leader_election.namespace.as_deref(), Some("kube-system"));
        assert_eq!(a.http_endpoint.as_deref(), Some(":8080"));
        assert_eq!(a.timeout, secs(60));
        assert_eq!(a.worker_threads, 20);
        assert_eq!(a.kube_api_qps, 50.0);
        assert_eq!(a.kube_api_burst, 100);
        assert!(a.feature_gates.release_leader_election_on_exit);
        assert!(a.automaxprocs);
    }
}
