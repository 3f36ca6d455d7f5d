//! The fault kit shared by `tests/faults/faults.rs` (the fault matrix) and
//! `tests/faults/regressions.rs` (one focused test per diagnosed bug):
//!
//! * [`proxy`]: a TCP proxy in front of the API server that cuts (RST +
//!   refuse) or stalls the hub's connections;
//! * [`netns`]: a network namespace with a veth link for a real packet drop;
//! * [`fhub`]: the hub process with bounded HTTP helpers;
//! * [`fleet`]: Go external-attacher sidecars (restarted after each exit) and
//!   a ledger of Lease writes, for hub-against-Go comparisons;
//! * [`plane`]: killing and restarting etcd and the API server of the suite's
//!   own control plane;
//! * [`world`]: mock drivers, objects, a VA ledger and the invariants;
//! * [`known`]: the list of tests known to fail and how they are reported.
#![allow(dead_code)]

pub(crate) mod fhub;
pub(crate) mod fleet;
pub(crate) mod known;
pub(crate) mod netns;
pub(crate) mod plane;
pub(crate) mod proxy;
pub(crate) mod world;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fhub::{http_get, state_of};

/// A number unique in this process.
pub(crate) fn next_id() -> u64 {
    static N: AtomicU64 = AtomicU64::new(0);
    N.fetch_add(1, Ordering::Relaxed)
}

/// Seconds with one decimal, for figures.
pub(crate) fn secs(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64())
}

/// The one line a scenario prints, and its verdict.
#[derive(Debug, Default)]
pub(crate) struct Report {
    name: String,
    figures: Vec<(String, String)>,
    violations: Vec<String>,
}

impl Report {
    pub(crate) fn new(name: &str) -> Report {
        Report {
            name: name.to_string(),
            ..Report::default()
        }
    }

    /// Adds a figure (`resume_s=1.2`).
    pub(crate) fn figure(&mut self, key: &str, value: impl std::fmt::Display) {
        self.figures.push((key.to_string(), value.to_string()));
    }

    /// Adds the hub's memory (`rss_mib`, `peak_rss_mib`) if it runs.
    pub(crate) fn memory(&mut self, hub: &fhub::FHub) {
        self.memory_as(hub, "");
    }

    /// [`Report::memory`] with a prefix on the figures' names (`a_rss_mib`).
    pub(crate) fn memory_as(&mut self, hub: &fhub::FHub, prefix: &str) {
        if let Some((rss, hwm)) = hub.memory_kib() {
            self.figure(&format!("{prefix}rss_mib"), rss / 1024);
            self.figure(&format!("{prefix}peak_rss_mib"), hwm / 1024);
        }
    }

    /// Records a violated invariant or a failed expectation.
    pub(crate) fn violation(&mut self, v: impl Into<String>) {
        self.violations.push(v.into());
    }

    pub(crate) fn violations(&mut self, vs: impl IntoIterator<Item = String>) {
        self.violations.extend(vs);
    }

    /// Whether a violation has been recorded.
    pub(crate) fn failed(&self) -> bool {
        !self.violations.is_empty()
    }

    /// Checks `r`, recording its error as a violation; returns the value.
    pub(crate) fn check<T>(&mut self, what: &str, r: Result<T, String>) -> Option<T> {
        match r {
            Ok(v) => Some(v),
            Err(e) => {
                self.violation(format!("{what}: {e}"));
                None
            }
        }
    }

    /// Prints the scenario's line (on the terminal and in
    /// `$ATTACHER_FAULTS_RESULTS` when set) and fails the test if any
    /// invariant was violated.
    pub(crate) fn finish(self) {
        let verdict = if self.violations.is_empty() {
            "PASS"
        } else {
            "FAIL"
        };
        let figures: Vec<String> = self
            .figures
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let line = format!("FAULTS {} {verdict} {}", self.name, figures.join(" "));
        known::loud(&line);
        if let Some(path) = std::env::var_os("ATTACHER_FAULTS_RESULTS") {
            let mut text = format!("{line}\n");
            for v in &self.violations {
                text.push_str(&format!("  violation: {v}\n"));
            }
            if let Ok(mut f) = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
            {
                let _ = f.write_all(text.as_bytes());
            }
        }
        assert!(
            self.violations.is_empty(),
            "scenario {} violated {} invariant(s):\n  {}",
            self.name,
            self.violations.len(),
            self.violations.join("\n  ")
        );
    }
}

/// Samples every hub's `/drivers` a few times a second and records any
/// moment at which two hubs both show the same driver `leading` (acting for
/// it: its workers run).
pub(crate) struct LeaderSampler {
    overlaps: Arc<Mutex<Vec<String>>>,
    samples: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl LeaderSampler {
    pub(crate) fn start(hubs: Vec<(String, SocketAddr)>) -> LeaderSampler {
        let overlaps: Arc<Mutex<Vec<String>>> = Arc::default();
        let samples = Arc::new(AtomicU64::new(0));
        let (o, s) = (overlaps.clone(), samples.clone());
        let task = tokio::spawn(async move {
            let start = std::time::Instant::now();
            loop {
                let mut leaders: BTreeMap<String, Vec<String>> = BTreeMap::new();
                for (label, addr) in &hubs {
                    let Ok((200, body)) = http_get(*addr, "/drivers").await else {
                        continue;
                    };
                    let Ok(ds) = serde_json::from_str::<Vec<serde_json::Value>>(&body) else {
                        continue;
                    };
                    for d in ds {
                        if state_of(&d) == "leading"
                            && let Some(n) = d["name"].as_str()
                        {
                            leaders
                                .entry(n.to_string())
                                .or_default()
                                .push(label.clone());
                        }
                    }
                }
                s.fetch_add(1, Ordering::Relaxed);
                for (driver, hs) in leaders {
                    if hs.len() > 1 {
                        o.lock().unwrap().push(format!(
                            "at {:.1}s driver {driver} led by {hs:?}",
                            start.elapsed().as_secs_f64()
                        ));
                    }
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        });
        LeaderSampler {
            overlaps,
            samples,
            task,
        }
    }

    /// Moments with two leaders (empty: the invariant held), and the number
    /// of samples taken.
    pub(crate) fn stop(self) -> (Vec<String>, u64) {
        self.task.abort();
        let o = self.overlaps.lock().unwrap().clone();
        (o, self.samples.load(Ordering::Relaxed))
    }
}
