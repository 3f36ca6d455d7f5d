//! One watch per kind on the API server, whatever the number of drivers: the
//! API server's own `apiserver_longrunning_requests{verb="WATCH"}` rises by
//! exactly one per kind (VolumeAttachments, PersistentVolumes, CSINodes) when
//! a hub starts, with one driver as with five.
//!
//! Other clients of the shared API server may open or close watches at the
//! same time, so a measurement is kept only when the count is stable before,
//! during and after the hub's life and returns to its starting value once the
//! hub stops; otherwise it is repeated.

use crate::hub;
use crate::support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use hub::{Hub, HubOptions, RustMock, driver_entry, drivers_yaml, state_of};
use support::{Cluster, unique_driver_name};

/// The kinds the hub watches, as the API server's `resource` label names them.
const KINDS: [&str; 3] = ["volumeattachments", "persistentvolumes", "csinodes"];

/// Current WATCH requests per kind, summed over scopes.
async fn watches(client: &kube::Client) -> BTreeMap<String, i64> {
    let text = client
        .request_text(http::Request::get("/metrics").body(vec![]).unwrap())
        .await
        .expect("GET /metrics from the API server");
    let mut out: BTreeMap<String, i64> = KINDS.iter().map(|k| (k.to_string(), 0)).collect();
    for line in text.lines() {
        if !line.starts_with("apiserver_longrunning_requests{") || !line.contains("verb=\"WATCH\"")
        {
            continue;
        }
        for kind in KINDS {
            if line.contains(&format!("resource=\"{kind}\"")) {
                let v: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
                *out.get_mut(kind).unwrap() += v as i64;
            }
        }
    }
    out
}

/// A value that held for three samples in a row, 300 ms apart (at most 15 s).
async fn stable_watches(client: &kube::Client) -> Option<BTreeMap<String, i64>> {
    let start = Instant::now();
    let mut last = watches(client).await;
    let mut same = 1;
    while start.elapsed() < Duration::from_secs(15) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let now = watches(client).await;
        if now == last {
            same += 1;
            if same >= 3 {
                return Some(now);
            }
        } else {
            last = now;
            same = 1;
        }
    }
    None
}

/// Starts a hub with `n` Rust mock drivers and returns the rise in WATCH
/// requests per kind it caused (a clean measurement, retried up to 5 times).
async fn watch_delta(cluster: &Cluster, client: &kube::Client, n: usize) -> BTreeMap<String, i64> {
    let mut mocks = Vec::new();
    for i in 0..n {
        mocks.push(RustMock::start(&unique_driver_name(&format!("watch{n}-{i}")), 1).await);
    }
    let yaml: Vec<String> = mocks
        .iter()
        .map(|m| driver_entry(&m.socket, &m.name))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("drivers.yaml");
    std::fs::write(&cfg, drivers_yaml(&yaml)).unwrap();

    for attempt in 1..=5 {
        let Some(before) = stable_watches(client).await else {
            println!("watches: {n} driver(s), attempt {attempt}: no stable baseline; retrying");
            continue;
        };
        let mut hub = Hub::start(
            cluster,
            &format!("hub-{n}"),
            HubOptions {
                config: Some(cfg.clone()),
                ..HubOptions::default()
            },
        )
        .await;
        hub.wait_drivers(
            &format!("{n} drivers leading"),
            Duration::from_secs(30),
            |ds| ds.len() == n && ds.iter().all(|d| state_of(d) == "leading"),
        )
        .await;
        // Ready means the caches are synced: every watch is open by then.
        let ready_since = Instant::now();
        while hub.get("/readyz").await.0 != 200 {
            assert!(
                ready_since.elapsed() < Duration::from_secs(60),
                "the hub did not become ready"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let during = stable_watches(client).await;
        hub.process.stop().await;
        let after = stable_watches(client).await;
        println!(
            "watches: {n} driver(s), attempt {attempt}: before {before:?} with the hub {during:?} after {after:?}"
        );
        match (during, after) {
            (Some(during), Some(after)) if after == before => {
                return KINDS
                    .iter()
                    .map(|k| (k.to_string(), during[*k] - before[*k]))
                    .collect();
            }
            _ => {
                println!("watches: other clients changed their watches meanwhile; measuring again")
            }
        }
    }
    panic!("no clean measurement of the watches of a hub with {n} driver(s) in 5 attempts");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_watch_per_kind_for_one_driver_and_for_five() {
    let cluster = Cluster::get();
    let client = cluster.client().await;
    let one = watch_delta(cluster, &client, 1).await;
    println!("watches: a hub with 1 driver adds {one:?}");
    let five = watch_delta(cluster, &client, 5).await;
    println!("watches: a hub with 5 drivers adds {five:?}");
    for kind in KINDS {
        assert_eq!(
            one[kind], 1,
            "WATCH requests on {kind} of a hub with 1 driver"
        );
        assert_eq!(
            five[kind], 1,
            "WATCH requests on {kind} of a hub with 5 drivers"
        );
    }
}
