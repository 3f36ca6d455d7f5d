//! Differential test: one scenario table, run once
//! with the reference Go csi-attacher v4.13 and once with attacher-hub in
//! sidecar mode, against the real API server and the same Rust mock CSI
//! driver, with the same flags (`--timeout=2s --retry-interval-start=200ms
//! --retry-interval-max=2s`, `--reconcile-sync=2s` for the reconciler batch).
//!
//! For every scenario and every checkpoint in it, the normalized objects and
//! CSI calls must be the same:
//! * each VolumeAttachment: existence, deletionTimestamp set or not,
//!   finalizers, annotations, `status.attached`, `status.attachmentMetadata`,
//!   `status.attachError.message` and `.errorCode`, `status.detachError.message`
//!   (times are not compared);
//! * each PersistentVolume: existence, deletionTimestamp set or not, finalizers;
//! * the ControllerPublishVolume / ControllerUnpublishVolume calls the mock
//!   received for the scenario's volumes and nodes, per volume and node, in
//!   the order they arrived, with readonly, access mode, access type, fsType,
//!   volume context, secrets and the answer. Identical consecutive calls are
//!   collapsed into one entry; how many calls an entry stands for is compared
//!   as follows.
//!
//! **Behaviour, not timing.** How often a call is retried inside a fault
//! window depends on the scheduler and the backoff, not on the attacher's
//! logic, so failed calls are compared as properties: the same kinds of
//! failure, in the same order relative to the successful calls ("at least one
//! call that timed out, then exactly one successful call"), never how many.
//! Calls are ordered by arrival, not by when the mock finished them (a call
//! the attacher gave up on ends whenever the server notices).
//!
//! **The one deliberate difference** (`docs/design.md#own-writes`): the Go
//! attacher may call ControllerPublishVolume a second time because its own VA
//! write comes back through its watch before the `attached` status does;
//! attacher-hub never does. So for every successful ControllerPublishVolume
//! entry the hub's count must be exactly 1 and not above Go's (Go: 1 or 2; a
//! repeat counts towards the first publish even if a Secret changed in
//! between). The same holds for a successful ControllerUnpublishVolume: Go
//! may call it twice when a re-sync reads a stale cache right after the
//! detach (depending on timing only); the hub remembers its finished detach
//! until its cache shows it, and calls it exactly once.
//!
//! **Go's stale re-attach.** The same mechanism can make Go
//! re-run the whole attach of an attached VA after the test moved on: when
//! that repeat fails (the Secret or the PV is gone by then), Go saves an
//! `attachError` the hub never writes. Go's log shows the repeat (an
//! `"Attaching"` line for the VA after its `"Attached"`); for such a VA an
//! `attachError` that only Go shows is reported as allowed, not failed.
//!
//! **The reference can fail too.** On a busy machine either attacher's own
//! API calls can time out, a watch can be cut, the API server can answer
//! 429 or 5xx; what the attacher does next (another ControllerUnpublish, an
//! error in the status) depends on that accident. A scenario whose outcomes
//! differ while either attacher's log (or the test's own API calls) shows
//! such an error (`infra.rs` says which lines count) is run
//! again on both sides, at most twice more; the report quotes the lines and
//! says so. The last run decides: a real difference still fails.
//!
//! Run-specific strings (object names, driver names) are replaced by
//! placeholders before comparing. Batches (scenarios sharing a mock
//! capability set) run concurrently, the Go and hub runs too; the in-tree
//! batches use the fixed name of their migration driver
//! (`pd.csi.storage.gke.io`, `ebs.csi.aws.com`, ...) and so run Go first,
//! then the hub (the batches of different drivers at the same time).
//! Attacher logs are written to
//! `$CARGO_TARGET_TMPDIR/differential/<run tag>.log` (the tag names the
//! implementation and the batch).
//!
//! The scenario table is in `differential/scenarios.rs`; a scenario whose
//! difference is a reported hub bug not yet fixed is marked there with
//! `known_difference` (its mismatches are listed but do not fail the test).

mod runner;
mod scenarios;
mod snapshot;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use runner::{Impl, Outcome, run_batch};
use scenarios::{Batch, DriverName};

/// How often a scenario is run again when its outcomes differ while either
/// side hit an infrastructure error (see `infra.rs`).
const MAX_RERUNS: usize = 2;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn go_and_hub_agree_on_every_scenario() {
    let started = Instant::now();
    let mut table = scenarios::table();
    // `DIFFERENTIAL_BATCHES=faults,trivial` runs only those batches (while
    // working on one area); the default is the whole table.
    if let Ok(only) = std::env::var("DIFFERENTIAL_BATCHES") {
        let only: Vec<&str> = only.split(',').map(str::trim).collect();
        table.retain(|b| only.contains(&b.name));
    }
    // `DIFFERENTIAL_SCENARIOS=detach,detach-timeout` runs only those scenarios.
    if let Ok(only) = std::env::var("DIFFERENTIAL_SCENARIOS") {
        let only: Vec<&str> = only.split(',').map(str::trim).collect();
        for b in &mut table {
            b.scenarios.retain(|s| only.contains(&s.name.as_str()));
        }
        table.retain(|b| !b.scenarios.is_empty());
    }
    let log_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("differential");
    std::fs::create_dir_all(&log_dir).expect("log directory");

    let (mut go, mut hub) = run_pass(&table, None, &log_dir).await;
    let mut reruns: Vec<String> = Vec::new();
    for attempt in 1..=MAX_RERUNS {
        // Differing outcomes with an infrastructure error on either side
        // say nothing about the attachers: run those scenarios again, on
        // both sides, with fresh attachers and mocks.
        let again: BTreeSet<String> = go
            .iter()
            .filter_map(|g| {
                let h = hub.iter().find(|h| h.scenario == g.scenario)?;
                let hit = !g.infra.is_empty() || !h.infra.is_empty();
                (hit && !differences(g, h).is_empty()).then(|| g.scenario.clone())
            })
            .collect();
        if again.is_empty() {
            break;
        }
        for name in &again {
            let lines = [&go, &hub]
                .into_iter()
                .flat_map(|v| v.iter().filter(|o| &o.scenario == name))
                .flat_map(|o| o.infra.iter())
                .map(|l| format!("    {l}"))
                .collect::<Vec<_>>()
                .join("\n");
            reruns.push(format!(
                "{name}: outcomes differed after an infrastructure error; run {} of {}:\n{lines}",
                attempt + 1,
                MAX_RERUNS + 1
            ));
        }
        let (g, h) = run_pass(&table, Some(&again), &log_dir).await;
        for o in g {
            replace(&mut go, o);
        }
        for o in h {
            replace(&mut hub, o);
        }
    }

    let report = Report::build(&table, &go, &hub);
    println!("{}", report.table);
    println!(
        "differential: {} scenarios in {:.1}s; attacher logs in {}",
        go.len(),
        started.elapsed().as_secs_f64(),
        log_dir.display()
    );
    if !reruns.is_empty() {
        println!(
            "run again after an infrastructure error (the final verdict is the last run's):\n{}",
            reruns.join("\n")
        );
    }
    if !report.allowed.is_empty() {
        println!(
            "allowed, explained differences:\n{}",
            report.allowed.join("\n")
        );
    }
    if !report.known.is_empty() {
        println!("known, reported differences:\n{}", report.known.join("\n"));
    }
    assert!(
        report.failures.is_empty(),
        "Go csi-attacher and attacher-hub differ (attacher logs in {}):\n\n{}",
        log_dir.display(),
        report.failures.join("\n\n")
    );
}

/// Replaces the outcome of the same scenario in `all` by `new`.
fn replace(all: &mut [Outcome], new: Outcome) {
    if let Some(slot) = all.iter_mut().find(|o| o.scenario == new.scenario) {
        *slot = new;
    }
}

/// One pass over the table (or over the scenarios named in `only`) with both
/// implementations: every batch of a unique driver name at the same time, Go
/// and hub too; the batches of a fixed (migration) driver name Go first,
/// then the hub, the batches of different names at the same time.
async fn run_pass(
    table: &[Batch],
    only: Option<&BTreeSet<String>>,
    log_dir: &Path,
) -> (Vec<Outcome>, Vec<Outcome>) {
    let (unique, fixed): (Vec<&Batch>, Vec<&Batch>) = table
        .iter()
        .partition(|b| matches!(b.driver, DriverName::Unique));
    let (go, hub, (go_fixed, hub_fixed)) = tokio::join!(
        run_all(Impl::Go, &unique, only, log_dir),
        run_all(Impl::Hub, &unique, only, log_dir),
        async {
            // Same driver name in both runs of a batch: strictly one after
            // the other (run_batch removes every object before it returns).
            // Batches of different fixed names run at the same time.
            let runs = futures::future::join_all(fixed.iter().map(|b| async {
                let g = run_batch(Impl::Go, b, only, log_dir).await;
                let h = run_batch(Impl::Hub, b, only, log_dir).await;
                (g, h)
            }))
            .await;
            let (g, h): (Vec<_>, Vec<_>) = runs.into_iter().unzip();
            (
                g.into_iter().flatten().collect::<Vec<_>>(),
                h.into_iter().flatten().collect::<Vec<_>>(),
            )
        }
    );
    (
        go.into_iter().chain(go_fixed).collect(),
        hub.into_iter().chain(hub_fixed).collect(),
    )
}

/// All batches of one implementation, concurrently; outcomes in table order.
async fn run_all(
    which: Impl,
    batches: &[&Batch],
    only: Option<&BTreeSet<String>>,
    log_dir: &Path,
) -> Vec<Outcome> {
    futures::future::join_all(batches.iter().map(|b| run_batch(which, b, only, log_dir)))
        .await
        .into_iter()
        .flatten()
        .collect()
}

/// The comparison of both runs.
struct Report {
    /// One line per scenario, for humans.
    table: String,
    /// Differences that fail the test.
    failures: Vec<String>,
    /// Differences of scenarios marked `known_difference`.
    known: Vec<String>,
    /// Differences explained by the reference's stale re-attach
    /// (`docs/design.md#own-writes`).
    allowed: Vec<String>,
}

impl Report {
    fn build(table: &[Batch], go: &[Outcome], hub: &[Outcome]) -> Report {
        let mut out = Report {
            table: format!(
                "{:<18} {:<28} {:>6} {:>6}  {:<10} outcome (Go)\n",
                "batch", "scenario", "go s", "hub s", "verdict"
            ),
            failures: Vec::new(),
            known: Vec::new(),
            allowed: Vec::new(),
        };
        for scenario in table.iter().flat_map(|b| &b.scenarios) {
            let find = |v: &'_ [Outcome]| -> Option<usize> {
                v.iter().position(|o| o.scenario == scenario.name)
            };
            let (Some(gi), Some(hi)) = (find(go), find(hub)) else {
                out.failures.push(format!(
                    "{}: no outcome from one of the runs",
                    scenario.name
                ));
                continue;
            };
            let (g, h) = (&go[gi], &hub[hi]);
            let diffs = differences(g, h);
            // A duplicate publish can hit any attach; while the hub is known
            // to do it, such lines are listed as known rather than failed.
            let known_dup = scenarios::KNOWN_DUPLICATE_PUBLISH;
            let failing_dups = known_dup.is_none() && !diffs.duplicate_publishes.is_empty();
            let failing =
                (!diffs.fields.is_empty() && scenario.known_difference.is_none()) || failing_dups;
            let verdict = match (diffs.is_empty(), failing) {
                (true, _) => "same",
                (false, true) => "DIFFERENT",
                (false, false) => "KNOWN",
            };
            let summary = g.checkpoints.last().map_or("-".to_string(), |(label, s)| {
                format!("[{label}] {}", s.summary)
            });
            out.table.push_str(&format!(
                "{:<18} {:<28} {:>6.1} {:>6.1}  {:<10} {}\n",
                g.batch,
                scenario.name,
                g.elapsed.as_secs_f64(),
                h.elapsed.as_secs_f64(),
                verdict,
                summary
            ));
            let heading = format!("scenario {} ({}):", scenario.name, scenario.intent);
            if !diffs.allowed.is_empty() {
                out.allowed
                    .push(format!("{heading}\n  {}", diffs.allowed.join("\n  ")));
            }
            if !diffs.fields.is_empty() {
                let text = format!("{heading}\n  {}", diffs.fields.join("\n  "));
                match scenario.known_difference {
                    Some(note) => out.known.push(format!("{text}\n  known: {note}")),
                    None => out.failures.push(text),
                }
            }
            if !diffs.duplicate_publishes.is_empty() {
                let text = format!("{heading}\n  {}", diffs.duplicate_publishes.join("\n  "));
                match known_dup {
                    Some(note) => out.known.push(format!("{text}\n  known: {note}")),
                    None => out.failures.push(text),
                }
            }
        }
        out
    }
}

/// Differences between the Go and hub outcomes of one scenario.
fn differences(go: &Outcome, hub: &Outcome) -> snapshot::Differences {
    let mut out = snapshot::Differences::default();
    if let Some(f) = &go.failure {
        out.fields.push(format!(
            "the Go run did not complete (test or environment problem): {f}"
        ));
    }
    if let Some(f) = &hub.failure {
        out.fields
            .push(format!("the hub run did not complete: {f}"));
    }
    let labels =
        |o: &Outcome| -> Vec<String> { o.checkpoints.iter().map(|c| c.0.clone()).collect() };
    if labels(go) != labels(hub) {
        out.fields.push(format!(
            "checkpoints differ: Go {:?}, hub {:?}",
            labels(go),
            labels(hub)
        ));
    }
    for ((label, g), (_, h)) in go.checkpoints.iter().zip(&hub.checkpoints) {
        let d = snapshot::compare(g, h, &go.stale_reattached);
        out.fields
            .extend(d.fields.into_iter().map(|x| format!("[{label}] {x}")));
        out.duplicate_publishes.extend(
            d.duplicate_publishes
                .into_iter()
                .map(|x| format!("[{label}] {x}")),
        );
        out.allowed
            .extend(d.allowed.into_iter().map(|x| format!("[{label}] {x}")));
    }
    out
}
