//! Hub mode's driver list (`--config drivers.yaml`): plain `serde` types for the file, checked
//! into one [`Settings`] per driver, with the command-line flags as defaults.
//!
//! Every error names the file, the line and column, and the field, e.g.
//! `drivers.yaml:7:5: drivers[1].timeout: invalid duration "15": missing unit`.
//! The types below are parser-neutral `serde`; only [`parse`] knows the YAML parser, which it
//! also uses to index where each field sits in the text.
//!
//! Everything is bounded before anything is allocated for it: the file's size
//! ([`MAX_FILE_BYTES`]), its encoding (UTF-8; the first invalid byte is named with its line and
//! column), the YAML structure (nesting, nodes, anchors and alias expansion: the `yaml` module's
//! budget), the number of drivers ([`MAX_DRIVERS`]) and of workers ([`MAX_HUB_WORKERS`]), and
//! every value by the rule of its setting, the one its flag is held to
//! ([`cli::rules`](crate::cli::rules): its bound, and what zero and negative values mean).
//!
//! The parts: [`file`](mod@file) (the serde types), [`validate`] (checks and defaults), [`defaults`] (the
//! flags' settings), [`settings`] (what a validated entry is), [`error`] and `yaml` (positions).

pub mod bounds;
pub mod defaults;
pub mod error;
pub mod file;
pub mod settings;
pub mod validate;
mod yaml;

use std::path::Path;

use crate::csi;

pub use bounds::{MAX_DRIVERS, MAX_FILE_BYTES, MAX_HUB_WORKERS};
pub use defaults::Defaults;
pub use error::{Error, Invalid, Problem};
pub use file::{
    DriverEntry, File, LeaderElection, LeaderElectionSettings, WorkerPools, WorkerThreads,
};
pub use settings::{Config, LeaderSettings, NamedSettings, Settings};

use validate::check_unique;
use yaml::Pos;

/// Result of this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Reads, parses and validates the driver list at `path`. `discovery`: see [`File::validate`].
/// Reads at most one byte more than [`MAX_FILE_BYTES`].
pub fn load(path: &Path, defaults: &Defaults, discovery: bool) -> Result<Config> {
    use std::io::Read as _;
    let read_error = |source| Error::Read {
        path: path.to_owned(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    parse_bytes(&bytes, &path.display().to_string(), defaults, discovery)
}

/// Checks that `bytes` are UTF-8, then [`parse`]s them; the first invalid byte is named with its
/// line and column.
pub fn parse_bytes(
    bytes: &[u8],
    file_label: &str,
    defaults: &Defaults,
    discovery: bool,
) -> Result<Config> {
    check_size(bytes, file_label)?;
    let text = std::str::from_utf8(bytes).map_err(|e| {
        let at = e.valid_up_to();
        invalid_text(file_label, bytes, at, Problem::NotUtf8 { byte: bytes[at] })
    })?;
    parse(text, file_label, defaults, discovery)
}

/// Refuses more than [`MAX_FILE_BYTES`], at the position of the first byte too many.
fn check_size(bytes: &[u8], file_label: &str) -> Result<()> {
    if bytes.len() > MAX_FILE_BYTES {
        let problem = Problem::TooLong {
            max: MAX_FILE_BYTES,
        };
        return Err(invalid_text(file_label, bytes, MAX_FILE_BYTES, problem));
    }
    Ok(())
}

/// An error at byte `offset` of `bytes`, placed by [`position_of`].
fn invalid_text(file_label: &str, bytes: &[u8], offset: usize, problem: Problem) -> Error {
    let (line, column) = position_of(bytes, offset);
    Error::Invalid {
        file: file_label.to_owned(),
        line,
        column,
        field: None,
        problem: Box::new(problem),
    }
}

/// The 1-based line and column of byte `offset`: lines end at `\n`, `\r\n` or a lone `\r`
/// (as in YAML), and columns count characters (as the YAML parser's positions do), the bytes
/// before `offset` read as UTF-8 (an invalid sequence counts as one character).
fn position_of(bytes: &[u8], offset: usize) -> Pos {
    let offset = offset.min(bytes.len());
    let mut line: u64 = 1;
    let mut line_start = 0;
    for (i, &b) in bytes[..offset].iter().enumerate() {
        let ends_line = b == b'\n' || (b == b'\r' && bytes.get(i + 1) != Some(&b'\n'));
        if ends_line {
            line += 1;
            line_start = i + 1;
        }
    }
    let column = String::from_utf8_lossy(&bytes[line_start..offset])
        .chars()
        .count() as u64
        + 1;
    (line, column)
}

/// Parses and validates a driver list; `file_label` names the file in errors.
pub fn parse(text: &str, file_label: &str, defaults: &Defaults, discovery: bool) -> Result<Config> {
    let error = |(line, column): Pos, field: Option<String>, problem: Problem| Error::Invalid {
        file: file_label.to_owned(),
        line,
        column,
        field,
        problem: Box::new(problem),
    };
    check_size(text.as_bytes(), file_label)?;
    // Syntax first, on a schema-free tree: it also tells where every field is.
    let index =
        yaml::index(text).map_err(|(pos, message)| error(pos, None, Problem::Syntax(message)))?;
    let file: File = serde_saphyr::from_str_with_options(text, yaml::options()).map_err(|e| {
        let (pos, field) = index.locate_error(&e);
        error(pos, field, Problem::Syntax(yaml::message(&e)))
    })?;
    let place =
        |Invalid { field, problem }: Invalid| error(index.position(&field), Some(field), *problem);
    let config = file.validate(defaults, discovery).map_err(place)?;
    // Every entry in file order, so that an index is the entry's place in the file.
    let (mut addressed, mut named) = (config.drivers.iter(), config.discovered.iter());
    let entries: Vec<(Option<&csi::Address>, &Settings)> = file
        .drivers
        .iter()
        .filter_map(|entry| match entry.address {
            Some(_) => addressed.next().map(|s| (Some(&s.address), s)),
            None => named.next().map(|n| (None, n.settings())),
        })
        .collect();
    check_unique(&entries).map_err(|(mut bad, other)| {
        let other_line = index.position(&format!("drivers[{other}]")).0;
        match bad.problem.as_mut() {
            Problem::DuplicateAddress { other_line: l, .. }
            | Problem::DuplicateName { other_line: l, .. }
            | Problem::SanitizedNameCollision { other_line: l, .. } => *l = other_line,
            _ => {}
        }
        place(bad)
    })?;
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::Args;
    use crate::k8s::budget::Limit;
    use std::time::Duration;

    fn defaults() -> Defaults {
        Defaults::with_identity(&Args::default(), "test-host".to_owned())
    }

    fn parse_ok(text: &str) -> Vec<Settings> {
        parse_config(text).drivers
    }

    fn parse_config(text: &str) -> Config {
        match parse(text, "drivers.yaml", &defaults(), false) {
            Ok(c) => c,
            Err(e) => panic!("{text:?} should load, got: {e}"),
        }
    }

    fn parse_err(text: &str) -> String {
        match parse(text, "drivers.yaml", &defaults(), false) {
            Ok(s) => panic!("{text:?} should be refused, got {s:?}"),
            Err(e) => e.to_string(),
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn an_entry_without_overrides_gets_the_sidecar_settings_of_the_flags() {
        let got = parse_ok("drivers:\n  - address: unix:///csi/a.sock\n");
        let want = defaults().settings_for("/csi/a.sock".parse().expect("valid address"));
        assert_eq!(got, vec![want]);
    }

    #[test]
    fn every_override_lands_in_the_settings() {
        let got = parse_ok(
            "drivers:
  - address: /csi/a.sock
    name: a.example.com
    timeout: 30s
    workerThreads: {attach: 4, detach: 2}
    retryIntervalStart: 500ms
    retryIntervalMax: 1m
    reconcileSync: 2m
    maxEntries: 100
    defaultFstype: xfs
    kubeApiQps: 2.5
    kubeApiBurst: 7
    leaderElection:
      namespace: storage
      leaseDuration: 30s
      renewDeadline: 20s
      retryPeriod: 4s
      labels: {team: storage}
  - address: unix:/csi/b.sock
    workerThreads: 3
    kubeApiQps: 1
    leaderElection: true
",
        );
        let a = &got[0];
        assert_eq!(a.expected_name.as_deref(), Some("a.example.com"));
        assert_eq!(a.timeout, secs(30));
        assert_eq!((a.attach_workers, a.detach_workers), (4, 2));
        assert_eq!(a.retry_interval_start, Duration::from_millis(500));
        assert_eq!(a.retry_interval_max, secs(60));
        assert_eq!(a.reconcile_sync, secs(120));
        assert_eq!(a.max_entries, 100);
        assert_eq!(a.default_fstype, "xfs");
        assert_eq!(a.api_budget, Limit::Rate { qps: 2.5, burst: 7 });
        let le = a.leader_election.as_ref().expect("leader election on");
        assert_eq!(le.namespace, "storage");
        assert_eq!(le.identity, "test-host");
        assert_eq!(
            (le.lease_duration, le.renew_deadline, le.retry_period),
            (secs(30), secs(20), secs(4))
        );
        assert_eq!(le.labels.get("team").map(String::as_str), Some("storage"));
        let b = &got[1];
        assert_eq!((b.attach_workers, b.detach_workers), (3, 3));
        // The burst a driver leaves out is the flag's.
        assert_eq!(
            b.api_budget,
            Limit::Rate {
                qps: 1.0,
                burst: 10
            }
        );
        let le = b.leader_election.as_ref().expect("leader election on");
        assert_eq!(
            (le.lease_duration, le.renew_deadline, le.retry_period),
            (secs(15), secs(10), secs(5))
        );
    }

    #[test]
    fn every_driver_has_its_own_budget_and_the_hub_cap_is_optional() {
        let c = parse_config("drivers:\n- address: /a\n- address: /b\n  kubeApiQps: -1\n");
        // Each driver gets what its sidecar had, not a share of one budget.
        assert_eq!(c.drivers[0].api_budget, Limit::client_go(5.0, 10));
        assert_eq!(c.drivers[1].api_budget, Limit::Unlimited);
        assert_eq!(c.hub_api_cap, Limit::Unlimited);

        let c = parse_config("hubKubeApiQps: 50\ndrivers:\n- address: /a\n");
        assert_eq!(
            c.hub_api_cap,
            Limit::Rate {
                qps: 50.0,
                burst: 100
            }
        );
        let c = parse_config("hubKubeApiQps: 50\nhubKubeApiBurst: 60\ndrivers:\n- address: /a\n");
        assert_eq!(
            c.hub_api_cap,
            Limit::Rate {
                qps: 50.0,
                burst: 60
            }
        );
        // The file's 0 turns off a cap the flags set.
        let args = Args {
            hub_kube_api_qps: 20.0,
            hub_kube_api_burst: 30,
            ..Args::default()
        };
        let d = Defaults::with_identity(&args, "h".to_owned());
        let with_flags = |text: &str| parse(text, "f", &d, false).expect("valid").hub_api_cap;
        assert_eq!(
            with_flags("drivers:\n- address: /a\n"),
            Limit::Rate {
                qps: 20.0,
                burst: 30
            }
        );
        assert_eq!(
            with_flags("hubKubeApiQps: 0\ndrivers:\n- address: /a\n"),
            Limit::Unlimited
        );
        // Only the burst written: the flag's QPS with that burst.
        assert_eq!(
            with_flags("hubKubeApiBurst: 5\ndrivers:\n- address: /a\n"),
            Limit::Rate {
                qps: 20.0,
                burst: 5
            }
        );
    }

    #[test]
    fn leader_election_can_be_turned_off_per_driver() {
        let mut args = Args::default();
        args.leader_election.enabled = true;
        let d = Defaults::with_identity(&args, "h".to_owned());
        let text = "drivers:\n- address: /a\n- address: /b\n  leaderElection: false\n- address: /c\n  leaderElection: {enabled: false}\n";
        let got = parse(text, "f", &d, false).expect("valid").drivers;
        assert!(got[0].leader_election.is_some());
        assert!(got[1].leader_election.is_none());
        assert!(got[2].leader_election.is_none());
    }

    #[test]
    fn an_empty_list_is_fine_only_with_discovery() {
        assert_eq!(
            parse_err("drivers: []\n"),
            "drivers.yaml:1:1: drivers: at least one driver is required"
        );
        assert_eq!(
            parse_err(""),
            "drivers.yaml:1:1: drivers: at least one driver is required"
        );
        let got = parse("drivers: []\n", "f", &defaults(), true).expect("valid with discovery");
        assert!(got.drivers.is_empty());
    }

    /// With discovery, an entry with a name and no address gives its settings to the discovered
    /// driver of that name: its Lease namespace first of all (a sidecar's, when a hub in
    /// discovery mode takes over from it).
    #[test]
    fn with_discovery_an_entry_without_address_gives_settings_to_a_driver_by_name() {
        let mut args = Args::default();
        args.leader_election.enabled = true;
        let d = Defaults::with_identity(&args, "h".to_owned());
        let text = "drivers:
- name: pd.csi.storage.gke.io
  timeout: 30s
  leaderElection:
    namespace: kube-system
- address: /csi/nfs.sock
  name: nfs.csi.example.com
";
        let c = parse(text, "drivers.yaml", &d, true).expect("valid with discovery");
        assert_eq!(c.drivers.len(), 1);
        assert_eq!(
            c.drivers[0].expected_name.as_deref(),
            Some("nfs.csi.example.com")
        );
        assert_eq!(c.discovered.len(), 1);
        let pd = &c.discovered[0];
        assert_eq!(pd.name(), "pd.csi.storage.gke.io");
        let at: crate::csi::Address = "/plugins/pd/csi.sock".parse().expect("a path");
        let s = pd.at(at.clone());
        assert_eq!(s.address, at);
        assert_eq!(s.expected_name.as_deref(), Some("pd.csi.storage.gke.io"));
        assert_eq!(s.timeout, secs(30));
        let le = s.leader_election.expect("leader election on");
        assert_eq!(le.namespace, "kube-system");
        // Only names: an empty list of drivers to serve is fine with discovery.
        let c = parse("drivers:\n- name: a.io\n", "f", &d, true).expect("valid");
        assert!(c.drivers.is_empty());

        // One name twice, with or without an address, is refused.
        let twice = "drivers:\n- name: a.io\n- address: /a\n  name: a.io\n";
        assert_eq!(
            parse(twice, "drivers.yaml", &d, true)
                .expect_err("one name twice")
                .to_string(),
            "drivers.yaml:4:3: drivers[1].name: driver name \"a.io\" is already configured for drivers[0] (line 2)"
        );
        let alike = "drivers:\n- name: a.io\n- name: a-io\n";
        assert!(
            parse(alike, "drivers.yaml", &d, true)
                .expect_err("one finalizer")
                .to_string()
                .starts_with(
                    "drivers.yaml:3:3: drivers[1].name: driver names \"a-io\" and \"a.io\""
                )
        );
        // Neither an address nor a name.
        assert_eq!(
            parse("drivers:\n- timeout: 5s\n", "drivers.yaml", &d, true)
                .expect_err("nothing to identify the driver")
                .to_string(),
            "drivers.yaml:2:3: drivers[0]: missing field `address`: write the driver's socket, or (with --driver-sockets or --kubelet-registration-dir) only its `name` to give settings to the discovered driver of that name"
        );
        // Bad values are refused as in any entry.
        assert_eq!(
            parse(
                "drivers:\n- name: a.io\n  leaderElection: {namespace: \"\"}\n",
                "drivers.yaml",
                &d,
                true
            )
            .expect_err("empty namespace")
            .to_string(),
            "drivers.yaml:3:20: drivers[0].leaderElection.namespace: must not be empty"
        );
    }

    /// `--retry-interval-start=10s --retry-interval-max=1s` used to make every entry that set
    /// neither field fail, blamed on the entry. One rule now: accepted from the flags, from a
    /// file entry and for a discovered driver's entry alike.
    #[test]
    fn the_flags_retry_pair_is_accepted_for_every_entry_as_it_is_for_the_flags() {
        let args = Args {
            retry_interval_start: secs(10),
            retry_interval_max: secs(1),
            ..Args::default()
        };
        let d = Defaults::with_identity(&args, "h".to_owned());
        let text = "drivers:\n- address: /a\n- name: b.io\n- address: /c\n  retryIntervalMax: 2s\n";
        let c = parse(text, "drivers.yaml", &d, true).expect("one rule for every source");
        let pair = |s: &Settings| (s.retry_interval_start, s.retry_interval_max);
        assert_eq!(pair(&c.drivers[0]), (secs(10), secs(1)));
        assert_eq!(pair(&c.drivers[1]), (secs(10), secs(2)));
        let at = "/plugins/b/csi.sock".parse().expect("a path");
        assert_eq!(pair(&c.discovered[0].at(at)), (secs(10), secs(1)));
        // A discovered driver without an entry gets the flags' settings as they are.
        let at = "/plugins/x/csi.sock".parse().expect("a path");
        assert_eq!(pair(&d.settings_for(at)), (secs(10), secs(1)));
    }

    /// A value the flags set is named by its flag where a file entry brings it into use, at the
    /// position of the field that did.
    #[test]
    fn a_refused_value_of_the_flags_is_named_by_its_flag_at_the_field_that_used_it() {
        let mut args = Args::default();
        args.leader_election.lease_duration = secs(8);
        let d = Defaults::with_identity(&args, "h".to_owned());
        let text = "drivers:\n- address: /a\n  leaderElection: true\n";
        let e = parse(text, "drivers.yaml", &d, false).expect_err("the flags' timing");
        assert_eq!(
            e.to_string(),
            "drivers.yaml:3:3: drivers[0].leaderElection: --leader-election-lease-duration (8s) must be greater than --leader-election-renew-deadline (10s)"
        );
        let text = "drivers:\n- address: /a\n  leaderElection:\n    renewDeadline: 7s\n";
        let c = parse(text, "drivers.yaml", &d, false).expect("8s > 7s > 1.2 × 5s");
        let le = c.drivers[0].leader_election.as_ref().expect("on");
        assert_eq!((le.lease_duration, le.renew_deadline), (secs(8), secs(7)));
    }

    #[test]
    fn each_bad_input_is_refused_naming_file_line_and_field() {
        let cases: &[(&str, &str)] = &[
            (
                "drivers:\n  - address: [/a\n",
                "drivers.yaml:2:14: unclosed bracket '['",
            ),
            (
                "drivers:\n  - address: /a\n    timeout: 15\n",
                "drivers.yaml:3:5: drivers[0].timeout: invalid duration \"15\": missing unit",
            ),
            (
                "drivers:\n  - address: /a\n  - address: /b\n    timeout: 15\n",
                "drivers.yaml:4:5: drivers[1].timeout: invalid duration \"15\": missing unit",
            ),
            (
                "drivers:\n- address: /a\n  reconcileSync: 5x\n",
                "drivers.yaml:3:3: drivers[0].reconcileSync: invalid duration \"5x\": unknown unit \"x\"",
            ),
            (
                "drivers:\n- address: /a\n  retryIntervalStart: soon\n",
                "drivers.yaml:3:3: drivers[0].retryIntervalStart: invalid duration \"soon\"",
            ),
            (
                "drivers:\n- address: /a\n  timeout: -1s\n",
                "drivers.yaml:3:3: drivers[0].timeout: must be greater than zero, not -1s",
            ),
            (
                "drivers:\n- address: /a\n  timeout: 0s\n",
                "drivers.yaml:3:3: drivers[0].timeout: must be greater than zero, not 0s",
            ),
            (
                "drivers:\n- address: /a\n  retryIntervalMax: 0s\n",
                "drivers.yaml:3:3: drivers[0].retryIntervalMax: must be greater than zero, not 0s",
            ),
            (
                "drivers:\n  - address: /a\n  - timeout: 5s\n",
                "drivers.yaml:3:5: drivers[1]: missing field `address`: write the driver's socket, or (with --driver-sockets or --kubelet-registration-dir) only its `name` to give settings to the discovered driver of that name",
            ),
            (
                "drivers:\n  - address: /a\n  - name: b.csi.io\n    leaderElection: {namespace: storage}\n",
                "drivers.yaml:3:5: drivers[1]: missing field `address`: an entry without an address gives settings to a discovered driver, which needs --driver-sockets or --kubelet-registration-dir",
            ),
            (
                "drivers:\n  - address: csi.sock\n",
                "drivers.yaml:2:5: drivers[0].address: invalid address \"csi.sock\": must be unix:///absolute/path or /absolute/path",
            ),
            (
                "drivers:\n  - address: unix://csi.sock\n",
                "drivers.yaml:2:5: drivers[0].address: invalid address \"unix://csi.sock\": must be unix:///absolute/path or /absolute/path",
            ),
            (
                "drivers:\n  - address: tcp://10.0.0.1:9000\n",
                "drivers.yaml:2:5: drivers[0].address: invalid address \"tcp://10.0.0.1:9000\": must be unix:///absolute/path or /absolute/path",
            ),
            (
                "drivers:\n  - address: /a\n    bogus: 1\n",
                "drivers.yaml:3:5: drivers[0].bogus: unknown field `bogus`, expected one of address, name, timeout, workerThreads, retryIntervalStart, retryIntervalMax, reconcileSync, maxEntries, defaultFstype, kubeApiQps, kubeApiBurst, leaderElection",
            ),
            (
                "driver:\n  - address: /a\n",
                "drivers.yaml:1:1: driver: unknown field `driver`, expected one of drivers, hubKubeApiQps, hubKubeApiBurst",
            ),
            (
                "drivers:\n- address: /a\n  workerThreads: 0\n",
                "drivers.yaml:3:3: drivers[0].workerThreads: must be greater than zero, not 0",
            ),
            (
                "drivers:\n- address: /a\n  workerThreads:\n    attach: 2\n    detach: -1\n",
                "drivers.yaml:5:5: drivers[0].workerThreads.detach: must be greater than zero, not -1",
            ),
            (
                "drivers:\n- address: /a\n  workerThreads:\n    attach: 2\n    detach: 2\n    pv: 1\n",
                "drivers.yaml:6:5: drivers[0].workerThreads.pv: unknown field `pv`, expected one of attach, detach",
            ),
            (
                "drivers:\n- address: /a\n  workerThreads: many\n",
                "drivers.yaml:3:3: drivers[0].workerThreads: invalid type: string \"many\", expected a number of workers, or {attach: N, detach: M}",
            ),
            (
                "drivers:\n- address: /a\n  maxEntries: -1\n",
                "drivers.yaml:3:3: drivers[0].maxEntries: must not be negative, not -1",
            ),
            (
                "drivers:\n- address: /a\nhubKubeApiQps: -1\n",
                "drivers.yaml:3:1: hubKubeApiQps: must not be negative, not -1",
            ),
            (
                "drivers:\n- address: /a\nhubKubeApiQps: 10\nhubKubeApiBurst: -5\n",
                "drivers.yaml:4:1: hubKubeApiBurst: must not be negative, not -5",
            ),
            (
                "drivers:\n- address: /a\n  kubeApiBurst: -1\n",
                "drivers.yaml:3:3: drivers[0].kubeApiBurst: must not be negative, not -1",
            ),
            (
                "drivers:\n- address: /a\n  name: \"\"\n",
                "drivers.yaml:3:3: drivers[0].name: must not be empty",
            ),
            (
                "drivers:\n- address: /a\n  leaderElection:\n    leaseDuration: 10s\n",
                "drivers.yaml:4:5: drivers[0].leaderElection.leaseDuration: leaseDuration (10s) must be greater than --leader-election-renew-deadline (10s)",
            ),
            (
                "drivers:\n- address: /a\n  leaderElection:\n    retryPeriod: 9s\n",
                "drivers.yaml:4:5: drivers[0].leaderElection.retryPeriod: --leader-election-renew-deadline (10s) must be greater than 1.2 × retryPeriod (9s)",
            ),
            (
                "drivers:\n- address: /a\n  leaderElection:\n    renewDeadline: 0s\n",
                "drivers.yaml:4:5: drivers[0].leaderElection.renewDeadline: must be greater than zero, not 0s",
            ),
            (
                "drivers:\n- address: /a\n  leaderElection: yes please\n",
                "drivers.yaml:3:3: drivers[0].leaderElection: invalid type: string \"yes please\", expected true, false, or {enabled, namespace, leaseDuration, renewDeadline, retryPeriod, labels}",
            ),
            (
                "drivers:\n- address: /a\n  leaderElection: {leaseDuration: 20s, renew: 5s}\n",
                "drivers.yaml:3:40: drivers[0].leaderElection.renew: unknown field `renew`, expected one of enabled, namespace, leaseDuration, renewDeadline, retryPeriod, labels",
            ),
            (
                "drivers:\n- address: /a\n- address: unix:///a\n",
                "drivers.yaml:3:3: drivers[1].address: socket unix:///a is already the address of drivers[0] (line 2)",
            ),
            (
                "drivers:\n- address: /a\n  name: x.io\n\n- address: /b\n  name: x.io\n",
                "drivers.yaml:6:3: drivers[1].name: driver name \"x.io\" is already configured for drivers[0] (line 2)",
            ),
            (
                "drivers:\n- address: /a\n  name: a.b\n- address: /b\n  name: a-b\n",
                "drivers.yaml:5:3: drivers[1].name: driver names \"a-b\" and \"a.b\" (drivers[0], line 2) both use the finalizer \"external-attacher/a-b\"",
            ),
            (
                "drivers:\n- address: /a\n  timeout: 1s\n  timeout: 2s\n",
                "drivers.yaml:4:3: duplicate mapping key `timeout` is not allowed here",
            ),
            // Bounds: the same as the flags'.
            (
                "drivers:\n- address: /a\n  workerThreads: 1000000000\n",
                "drivers.yaml:3:3: drivers[0].workerThreads: must be at most 10000, not 1000000000",
            ),
            (
                "drivers:\n- address: /a\n  workerThreads: {attach: 10001, detach: 1}\n",
                "drivers.yaml:3:19: drivers[0].workerThreads.attach: must be at most 10000, not 10001",
            ),
            (
                "drivers:\n- address: /a\n  workerThreads:\n    attach: 1\n    detach: 20000\n",
                "drivers.yaml:5:5: drivers[0].workerThreads.detach: must be at most 10000, not 20000",
            ),
            (
                "drivers:\n- address: /a\n  workerThreads: 18446744073709551615\n",
                "drivers.yaml:3:3: drivers[0].workerThreads: invalid value: integer `18446744073709551615`, expected a number of workers, or {attach: N, detach: M}",
            ),
            (
                "drivers:\n- address: /a\n  timeout: 25h\n",
                "drivers.yaml:3:3: drivers[0].timeout: must be at most 24h0m0s, not 25h",
            ),
            (
                "drivers:\n- address: /a\n  retryIntervalMax: 24h0m1s\n",
                "drivers.yaml:3:3: drivers[0].retryIntervalMax: must be at most 24h0m0s, not 24h0m1s",
            ),
            (
                "drivers:\n- address: /a\n  reconcileSync: 2562047h\n",
                "drivers.yaml:3:3: drivers[0].reconcileSync: must be at most 24h0m0s, not 2562047h",
            ),
            (
                "drivers:\n- address: /a\n  leaderElection: {leaseDuration: 48h}\n",
                "drivers.yaml:3:20: drivers[0].leaderElection.leaseDuration: must be at most 24h0m0s, not 48h",
            ),
            (
                "drivers:\n- address: /a\n  leaderElection: {leaseDuration: 900ms, renewDeadline: 800ms, retryPeriod: 100ms}\n",
                "drivers.yaml:3:20: drivers[0].leaderElection.leaseDuration: must be at least 1s, not 900ms: a Lease holds whole seconds",
            ),
            (
                "drivers:\n- address: /a\n  maxEntries: 2147483648\n",
                "drivers.yaml:3:3: drivers[0].maxEntries: must be at most 2147483647, not 2147483648",
            ),
            (
                "drivers:\n- address: /a\n  kubeApiQps: 1e7\n",
                "drivers.yaml:3:3: drivers[0].kubeApiQps: must be at most 1000000, not 10000000",
            ),
            (
                "drivers:\n- address: /a\n  kubeApiQps: .inf\n",
                "drivers.yaml:3:3: drivers[0].kubeApiQps: must be at most 1000000, not inf",
            ),
            (
                "drivers:\n- address: /a\n  kubeApiQps: .nan\n",
                "drivers.yaml:3:3: drivers[0].kubeApiQps: must be at most 1000000, not NaN",
            ),
            (
                "drivers:\n- address: /a\n  kubeApiBurst: 2000001\n",
                "drivers.yaml:3:3: drivers[0].kubeApiBurst: must be at most 2000000, not 2000001",
            ),
            (
                "hubKubeApiQps: .inf\ndrivers:\n- address: /a\n",
                "drivers.yaml:1:1: hubKubeApiQps: must be at most 1000000, not inf",
            ),
            (
                "hubKubeApiBurst: 2000001\ndrivers:\n- address: /a\n",
                "drivers.yaml:1:1: hubKubeApiBurst: must be at most 2000000, not 2000001",
            ),
            // Characters YAML does not allow, wherever they are.
            (
                "drivers:\n- address: /a\0b\n",
                "drivers.yaml:2:14: unexpected character: `\\u{0}'",
            ),
            (
                "drivers:\n\u{feff}- address: /a\n",
                "drivers.yaml:2:1: a BOM must not appear inside a document",
            ),
            (
                "drivers:\n- address: /a\n  \"time\\nout\": 5s\n",
                "drivers.yaml:3:3: drivers[0].time\\nout: unknown field `time out`, expected one of address, name, timeout, workerThreads, retryIntervalStart, retryIntervalMax, reconcileSync, maxEntries, defaultFstype, kubeApiQps, kubeApiBurst, leaderElection",
            ),
            (
                "drivers:\n- address: /a\n---\ndrivers: []\n",
                "drivers.yaml:4:1: only single YAML document expected but multiple found",
            ),
        ];
        let mut failures = Vec::new();
        for (text, want) in cases {
            let got = parse_err(text);
            if got != *want {
                failures.push(format!("input {text:?}\n  want {want}\n  got  {got}"));
            }
        }
        assert!(failures.is_empty(), "\n{}", failures.join("\n"));
    }

    #[test]
    fn a_file_that_is_not_utf8_is_refused_at_its_first_invalid_byte() {
        let err = |bytes: &[u8]| match parse_bytes(bytes, "drivers.yaml", &defaults(), false) {
            Ok(c) => panic!("{bytes:?} should be refused, got {c:?}"),
            Err(e) => e.to_string(),
        };
        assert_eq!(
            err(b"\xff"),
            "drivers.yaml:1:1: not UTF-8: invalid byte 0xff"
        );
        // Columns count characters: `- address: /é` is 13.
        assert_eq!(
            err(b"drivers:\n- address: /\xc3\xa9\xfe\n"),
            "drivers.yaml:2:14: not UTF-8: invalid byte 0xfe"
        );
        // A sequence cut short at the end of the file; CR LF and a lone CR end lines.
        assert_eq!(
            err(b"drivers:\r\n- name: x\r- address: /\xe6\x97"),
            "drivers.yaml:3:13: not UTF-8: invalid byte 0xe6"
        );
        // Latin-1 instead of UTF-8.
        assert_eq!(
            err(b"drivers:\n- address: /a\n  name: caf\xe9\n"),
            "drivers.yaml:3:12: not UTF-8: invalid byte 0xe9"
        );
        let ok = "drivers:\n- address: /a\n  name: caf\u{e9}\n";
        assert!(parse_bytes(ok.as_bytes(), "f", &defaults(), false).is_ok());
        // A BOM before the document is fine.
        let bom = "\u{feff}drivers:\n- address: /a\n";
        assert!(parse_bytes(bom.as_bytes(), "f", &defaults(), false).is_ok());
    }

    #[test]
    fn a_file_longer_than_the_bound_is_refused_where_it_passes_it() {
        let line = "# a comment line of sixty-four bytes, padded to that length....\n";
        assert_eq!(line.len(), 64);
        let mut text = format!(
            "drivers:\n- address: /a\n{}",
            line.repeat(MAX_FILE_BYTES / 64)
        );
        text.truncate(MAX_FILE_BYTES);
        assert!(
            parse(&text, "f", &defaults(), false).is_ok(),
            "exactly the bound"
        );
        text.push('x');
        // 2 lines, then 65,535 full comment lines and 41 bytes of the next: the byte past the
        // bound is the last one, at column 42 of line 65,538.
        assert_eq!(
            parse_err(&text),
            "drivers.yaml:65538:42: the file is longer than 4194304 bytes, the most a driver list may have"
        );
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = dir.path().join("drivers.yaml");
        std::fs::write(&path, text.repeat(4)).expect("writing");
        let e = load(&path, &defaults(), false).expect_err("too long");
        assert!(
            e.to_string().ends_with(
                ":65538:42: the file is longer than 4194304 bytes, the most a driver list may have"
            ),
            "{e}"
        );
    }

    #[test]
    fn yaml_bombs_and_deep_nesting_stop_at_the_budget_with_a_position() {
        // Ten levels of ten aliases each: 10^10 nodes if expanded.
        let mut bomb =
            String::from("drivers:\n- address: /a\n  labels:\n    l0: &l0 [x,x,x,x,x,x,x,x,x,x]\n");
        for i in 1..10 {
            let p = i - 1;
            bomb.push_str(&format!(
                "    l{i}: &l{i} [*l{p},*l{p},*l{p},*l{p},*l{p},*l{p},*l{p},*l{p},*l{p},*l{p}]\n"
            ));
        }
        let e = parse_err(&bomb);
        assert!(e.starts_with("drivers.yaml:"), "{e}");
        assert!(e.contains("YAML document too large or too complex"), "{e}");
        // It stops where the replayed events pass the budget: in the fourth level (line 7),
        // after ten thousand of them, not after the ten billion the document asks for.
        assert!(e.starts_with("drivers.yaml:7:"), "{e}");

        let deep = format!("drivers: {}{}\n", "[".repeat(17), "]".repeat(17));
        let e = parse_err(&deep);
        assert!(e.starts_with("drivers.yaml:1:"), "{e}");
        let deep = format!("drivers: {}1{}\n", "[".repeat(100_000), "]".repeat(100_000));
        assert!(parse_err(&deep).starts_with("drivers.yaml:1:"));
        let mut block = String::from("drivers:\n");
        for i in 1..40 {
            block.push_str(&format!("{}- \n", " ".repeat(i)));
        }
        assert!(parse_err(&block).starts_with("drivers.yaml:"));
        // A real file's depth (labels inside leaderElection inside an entry) is well within it.
        parse_ok("drivers:\n- address: /a\n  leaderElection:\n    labels: {a: b}\n");
    }

    #[test]
    fn the_number_of_drivers_and_of_all_their_workers_is_bounded() {
        let entries = |n: usize, extra: &str| {
            let mut text = String::from("drivers:\n");
            for i in 0..n {
                text.push_str(&format!("- address: /d{i}\n{extra}"));
            }
            text
        };
        assert_eq!(parse_ok(&entries(MAX_DRIVERS, "")).len(), MAX_DRIVERS);
        assert_eq!(
            parse_err(&entries(MAX_DRIVERS + 1, "")),
            "drivers.yaml:1002:3: drivers[1000]: more than 1000 drivers"
        );
        // Three drivers with 10,000 workers per pool run 90,000 workers; a fourth is too many.
        let big = "  workerThreads: 10000\n";
        assert_eq!(parse_ok(&entries(3, big)).len(), 3);
        assert_eq!(
            parse_err(&entries(4, big)),
            "drivers.yaml:9:3: drivers[3].workerThreads: the drivers up to this one run 120000 workers in all (attach, detach and PersistentVolume pools), more than 100000"
        );
    }

    #[test]
    fn an_unreadable_file_is_named() {
        let err = load(Path::new("/nonexistent/drivers.yaml"), &defaults(), false)
            .expect_err("no such file");
        assert_eq!(err.to_string(), "/nonexistent/drivers.yaml: cannot be read");
        assert!(std::error::Error::source(&err).is_some());
    }

    #[test]
    fn the_example_file_loads() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("drivers.example.yaml");
        let config = load(&path, &defaults(), false).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            config.hub_api_cap,
            Limit::Rate {
                qps: 200.0,
                burst: 400
            }
        );
        let got = config.drivers;
        assert_eq!(got.len(), 2);
        assert_eq!(
            got[0].expected_name.as_deref(),
            Some("fast-disk.csi.example.com")
        );
        assert_eq!((got[0].attach_workers, got[0].detach_workers), (20, 5));
        assert_eq!(
            got[0].api_budget,
            Limit::Rate {
                qps: 10.0,
                burst: 20
            }
        );
        // The other driver has the flags' budget, as its sidecar had.
        assert_eq!(got[1].api_budget, Limit::client_go(5.0, 10));
        assert_eq!((got[1].attach_workers, got[1].detach_workers), (4, 4));
        assert!(got[1].leader_election.is_some());
    }
}
