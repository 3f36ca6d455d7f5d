//! One focused test per bug that fault injection against a real API server
//! found (and per promise found untested), each with the smallest setup that
//! shows it. `docs/reliability.md` says what
//! each guards against and how it was fixed.
//!
//! A test that fails on the current code belongs in `kit::known::KNOWN_FAILING`
//! (empty now): `make test` then reports it with a loud `KNOWN FAILURE` line
//! instead of running it, and `make faults` runs it. Tests that need root (a
//! network namespace) are `#[ignore]`d and run by `make faults` only.

use crate::{kit, support};

use std::sync::Arc;
use std::time::{Duration, Instant};

use attacher_hub::config::Settings;
use attacher_hub::csi::Address;
use attacher_hub::hub::Registry;
use attacher_hub::hub::driver::{Driver, Origin};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::Api;
use kube::api::PostParams;

use kit::fhub::{FHub, HubSpec, Timings, metric_sum, processing};
use kit::known;
use kit::netns::NetNs;
use kit::proxy::Proxy;
use kit::world::{Mock, World, api_addr, kubeconfig_via};
use support::{Cluster, sanitize_driver_name, unique_driver_name, unique_name};

/// Bound for work a healthy hub does in well under a second.
const QUICK: Duration = Duration::from_secs(30);

/// The Lease of `driver` in `namespace`.
async fn lease(client: &kube::Client, namespace: &str, driver: &str) -> Lease {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    api.get(&format!(
        "external-attacher-leader-{}",
        sanitize_driver_name(driver)
    ))
    .await
    .expect("get the driver's Lease")
}

/// Replaces the holder of `driver`'s Lease with `holder`, renewed now, as a
/// candidate that took it over would write it.
async fn steal_lease(
    client: &kube::Client,
    namespace: &str,
    driver: &str,
    holder: &str,
    secs: i32,
) {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let mut l = lease(client, namespace, driver).await;
    let spec = l.spec.get_or_insert_with(LeaseSpec::default);
    let now = MicroTime(k8s_openapi::jiff::Timestamp::now());
    spec.holder_identity = Some(holder.to_string());
    spec.acquire_time = Some(now.clone());
    spec.renew_time = Some(now);
    spec.lease_duration_seconds = Some(secs);
    spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
    api.replace(
        l.metadata.name.as_deref().unwrap(),
        &PostParams::default(),
        &l,
    )
    .await
    .expect("steal the Lease");
}

/// A hub in `world` through `kubeconfig`, leader election with `timings`.
fn spec(
    world: &World,
    kubeconfig: &std::path::Path,
    label: &str,
    timings: Option<Timings>,
) -> HubSpec {
    let s = HubSpec::new(label, kubeconfig).config(&world.config);
    match timings {
        Some(t) => s.leader_election(&world.namespace, t),
        None => s,
    }
}

// ---------------------------------------------------------------------------
// Leadership
// ---------------------------------------------------------------------------

/// Leadership ends while ControllerPublish calls run longer than the drain:
/// the aborted workers must not leave their keys "processing", or the VAs
/// never attach after the next election.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leadership_lost_mid_call_does_not_strand_keys() {
    known::gate("leadership_lost_mid_call_does_not_strand_keys", async {
        let cluster = Cluster::get();
        let mock = Mock::in_process(&unique_driver_name("strand"), 10).await;
        let world = World::new(cluster, "strand", vec![mock]).await;
        let driver = world.driver_names()[0].clone();
        let mut hub = FHub::start(
            spec(&world, &cluster.kubeconfig, "strand", Some(Timings::FAST))
                .timeout(Duration::from_secs(60))
                .graceful(Duration::from_secs(1)),
        )
        .await;
        hub.wait_leading(std::slice::from_ref(&driver), QUICK)
            .await
            .unwrap();
        world.mocks[0]
            .set_fault("ControllerPublishVolume", "delay:8s")
            .await;
        let vas = world.create_vas(3, "va").await;
        hub.wait_calls_started("ControllerPublishVolume", 3, QUICK)
            .await
            .unwrap();
        // Another candidate takes the Lease for 4 s: the hub stops leading,
        // drains for 1 s and aborts the 8 s publishes.
        steal_lease(&world.client, &world.namespace, &driver, "thief", 4).await;
        world.mocks[0].clear_faults().await;
        hub.wait_drivers("standby", QUICK, |ds| {
            ds.iter().any(|d| kit::fhub::state_of(d) == "standby")
        })
        .await
        .unwrap();
        hub.wait_leading(std::slice::from_ref(&driver), QUICK)
            .await
            .unwrap();
        let attached = world
            .ledger
            .wait_attached(&vas, Duration::from_secs(20))
            .await;
        let stuck = hub.try_drivers().await.map(|d| processing(&d));
        assert!(
            attached.is_ok(),
            "after leading again: {}; keys still processing: {stuck:?}",
            attached.unwrap_err()
        );
    })
    .await;
}

/// With client-go's default timings (lease 15 s, renew deadline 10 s, retry
/// 5 s) one failed renewal must not end leadership: client-go retries until
/// the renew deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_failed_renewal_does_not_end_leadership() {
    known::gate("one_failed_renewal_does_not_end_leadership", async {
        let cluster = Cluster::get();
        let mock = Mock::in_process(&unique_driver_name("renew"), 10).await;
        let world = World::new(cluster, "renew", vec![mock]).await;
        let driver = world.driver_names()[0].clone();
        let dir = tempfile::tempdir().unwrap();
        let proxy = Proxy::start("127.0.0.1:0".parse().unwrap(), api_addr(&cluster.kubeconfig)).await;
        let kc = kubeconfig_via(&cluster.kubeconfig, &format!("https://{}", proxy.addr()), dir.path());
        let mut hub = FHub::start(spec(&world, &kc, "renew", Some(Timings::DEFAULT))).await;
        hub.wait_leading(std::slice::from_ref(&driver), QUICK).await.unwrap();
        // Right after a renewal at T, the API server is unreachable from T+1 s
        // to T+8 s: the renewal at T+5 fails, the one at T+10 succeeds.
        let renew_time = |l: &Lease| l.spec.as_ref().and_then(|s| s.renew_time.clone());
        let first = renew_time(&lease(&world.client, &world.namespace, &driver).await);
        let start = Instant::now();
        while renew_time(&lease(&world.client, &world.namespace, &driver).await) == first {
            assert!(start.elapsed() < Duration::from_secs(15), "the Lease was not renewed");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        proxy.cut_off().await;
        tokio::time::sleep(Duration::from_secs(7)).await;
        proxy.restore().await;
        tokio::time::sleep(Duration::from_secs(10)).await;
        let lost = hub.log_lines("stopped leading");
        assert!(
            lost.is_empty(),
            "one failed renewal ended leadership (client-go retries until the renew deadline): {lost:?}"
        );
    })
    .await;
}

/// A replica of the same group that died a moment ago still has a live presence Lease (as
/// long-lived as a hub with these timings writes it: lease duration minus retry period); the
/// survivor must not leave a free driver Lease untaken for longer than that presence lives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_replicas_presence_does_not_hold_back_fail_over() {
    known::gate(
        "a_dead_replicas_presence_does_not_hold_back_fail_over",
        async {
            let cluster = Cluster::get();
            let mocks = vec![
                Mock::in_process(&unique_driver_name("ghost-a"), 10).await,
                Mock::in_process(&unique_driver_name("ghost-b"), 10).await,
            ];
            let world = World::new(cluster, "ghost", mocks).await;
            // The presence Lease of a replica of the same group (the same sockets) that just
            // died, renewed a moment ago with the duration a hub with these timings gives it.
            let api: Api<Lease> = Api::namespaced(world.client.clone(), &world.namespace);
            let group = attacher_hub::leader::balance::group_key(
                world
                    .mocks
                    .iter()
                    .map(|m| m.socket.to_str().expect("UTF-8 socket path")),
            );
            let timings = Timings::FAST;
            let presence_secs = (timings.lease - timings.retry).as_secs();
            api.create(
                &PostParams::default(),
                &Lease {
                    metadata: ObjectMeta {
                        name: Some(attacher_hub::names::replica_lease_name("ghost")),
                        labels: Some(
                            [
                                (
                                    attacher_hub::names::REPLICA_LABEL.to_string(),
                                    "true".to_string(),
                                ),
                                (
                                    attacher_hub::names::REPLICA_GROUP_LABEL.to_string(),
                                    group.clone(),
                                ),
                            ]
                            .into(),
                        ),
                        ..ObjectMeta::default()
                    },
                    spec: Some(LeaseSpec {
                        holder_identity: Some("ghost".to_string()),
                        lease_duration_seconds: Some(i32::try_from(presence_secs).expect("small")),
                        renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
                        ..LeaseSpec::default()
                    }),
                },
            )
            .await
            .expect("create the ghost's presence Lease");
            let mut hub = FHub::start(
                spec(&world, &cluster.kubeconfig, "survivor", Some(timings))
                    .hostname(&unique_name("survivor")),
            )
            .await;
            // Nobody holds either driver Lease: both must be taken within a few
            // retry periods, as independent Go sidecars would, and stay taken
            // (the first balancing rounds may run before the drivers are counted,
            // so look after a few of them).
            tokio::time::sleep(Duration::from_secs(5)).await;
            let r = hub
                .wait_leading(&world.driver_names(), Duration::from_secs(5))
                .await;
            assert!(
                r.is_ok(),
                "free driver Leases left untaken while a dead replica's presence lingers: {}",
                r.unwrap_err()
            );
            // The ghost was of the survivor's group, so it did count while it lived.
            let survivor_groups: Vec<String> = api
                .list(&kube::api::ListParams::default().labels(attacher_hub::names::REPLICA_LABEL))
                .await
                .expect("list presence Leases")
                .items
                .into_iter()
                .filter(|l| {
                    l.metadata.name.as_deref()
                        != Some(attacher_hub::names::replica_lease_name("ghost").as_str())
                })
                .filter_map(|l| {
                    l.metadata
                        .labels?
                        .remove(attacher_hub::names::REPLICA_GROUP_LABEL)
                })
                .collect();
            assert_eq!(
                survivor_groups,
                vec![group],
                "the survivor's presence and the ghost's group"
            );
        },
    )
    .await;
}

/// Leadership balancing hands a driver to another replica: the driver must
/// not go unserved for longer than a moment.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_over_leaves_no_gap() {
    known::gate("a_hand_over_leaves_no_gap", async {
        let cluster = Cluster::get();
        let mocks = vec![
            Mock::in_process(&unique_driver_name("gap-a"), 10).await,
            Mock::in_process(&unique_driver_name("gap-b"), 10).await,
        ];
        let world = World::new(cluster, "gap", mocks).await;
        let names = world.driver_names();
        let host_a = unique_name("a");
        let mut a = FHub::start(
            spec(&world, &cluster.kubeconfig, &host_a, Some(Timings::DEFAULT)).hostname(&host_a),
        )
        .await;
        a.wait_leading(&names, Duration::from_secs(60))
            .await
            .unwrap();
        let a_identity = sanitize_driver_name(&host_a);
        // A holds every Lease now (it leads them all): the last sighting before B comes.
        let mut held_by_a: std::collections::HashMap<String, Instant> = Default::default();
        for n in &names {
            let polled = Instant::now();
            let holder = lease(&world.client, &world.namespace, n)
                .await
                .spec
                .and_then(|s| s.holder_identity)
                .unwrap_or_default();
            assert_eq!(holder, a_identity, "A leads {n} before B starts");
            held_by_a.insert(n.clone(), polled);
        }
        let host_b = unique_name("b");
        let b = FHub::start(
            spec(&world, &cluster.kubeconfig, &host_b, Some(Timings::DEFAULT)).hostname(&host_b),
        )
        .await;
        // Poll both Leases: from the moment one is vacated to the moment B holds it. B's
        // elector, fed by its Lease watch, may take a vacated Lease between two polls; then the
        // gap is measured by the two hubs' own clocks: A's "released the lease" line to B's
        // "successfully acquired lease" line for that driver (one machine, one clock).
        let b_identity = sanitize_driver_name(&host_b);
        let start = Instant::now();
        let mut vacated: std::collections::HashMap<String, Instant> = Default::default();
        let mut seen_a_after_start: std::collections::HashSet<String> = Default::default();
        let gap = 'poll: loop {
            assert!(
                start.elapsed() < Duration::from_secs(60),
                "no hand-over within 60 s"
            );
            for n in &names {
                let polled = Instant::now();
                let holder = lease(&world.client, &world.namespace, n)
                    .await
                    .spec
                    .and_then(|s| s.holder_identity)
                    .unwrap_or_default();
                if holder.is_empty() {
                    vacated.entry(n.clone()).or_insert(polled);
                } else if holder == a_identity {
                    held_by_a.insert(n.clone(), polled);
                    seen_a_after_start.insert(n.clone());
                } else if holder == b_identity {
                    if let Some(v) = vacated.get(n) {
                        break 'poll v.elapsed();
                    }
                    if let Some(gap) = logged_hand_over_gap(&a, &b, n) {
                        break 'poll gap;
                    }
                    if seen_a_after_start.contains(n)
                        && let Some(a) = held_by_a.get(n)
                    {
                        break 'poll a.elapsed();
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert!(
            gap < Duration::from_secs(1),
            "a handed-over driver had no leader for {gap:?}"
        );
    })
    .await;
}

/// The time from `a`'s "released the lease" line to `b`'s "successfully acquired lease" line
/// for `driver`'s Lease, by the klog timestamps of the two hubs (`I1201 20:29:31.778686`).
fn logged_hand_over_gap(a: &FHub, b: &FHub, driver: &str) -> Option<Duration> {
    let at = |hub: &FHub, message: &str| -> Option<f64> {
        let needle = format!("driver=\"{driver}\"");
        let line = hub
            .log_lines(message)
            .into_iter()
            .rfind(|l| l.contains(&needle))?;
        let time = line.split_whitespace().nth(1)?;
        let mut parts = time.split(':');
        let (h, m, s) = (parts.next()?, parts.next()?, parts.next()?);
        Some(
            h.parse::<f64>().ok()? * 3600.0
                + m.parse::<f64>().ok()? * 60.0
                + s.parse::<f64>().ok()?,
        )
    };
    let released = at(a, "\"released the lease\"")?;
    let acquired = at(b, "\"successfully acquired lease\"")?;
    Some(Duration::from_secs_f64((acquired - released).max(0.0)))
}

/// Two replicas serving different drivers in one namespace: each must lead
/// all of its own drivers (none of them has another candidate).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_with_different_driver_sets_do_not_starve() {
    known::gate("replicas_with_different_driver_sets_do_not_starve", async {
        let cluster = Cluster::get();
        let mut mocks = Vec::new();
        for i in 0..4 {
            mocks.push(Mock::in_process(&unique_driver_name(&format!("sets{i}")), 10).await);
        }
        let world = World::new(cluster, "sets", mocks).await;
        let names = world.driver_names();
        let dir = tempfile::tempdir().unwrap();
        let config = |set: &[usize]| {
            let path = dir.path().join(format!("drivers-{}.yaml", set[0]));
            let entries: String = set.iter().map(|i| world.mocks[*i].entry()).collect();
            std::fs::write(&path, format!("drivers:\n{entries}")).unwrap();
            path
        };
        let (ca, cb) = (config(&[0, 1]), config(&[2, 3]));
        let host_a = unique_name("a");
        let host_b = unique_name("b");
        let mut a = FHub::start(
            spec(&world, &cluster.kubeconfig, &host_a, Some(Timings::FAST))
                .config(&ca)
                .hostname(&host_a),
        )
        .await;
        let mut b = FHub::start(
            spec(&world, &cluster.kubeconfig, &host_b, Some(Timings::FAST))
                .config(&cb)
                .hostname(&host_b),
        )
        .await;
        // After a few balancing rounds (retry period 1 s), each still leads
        // both of its drivers.
        tokio::time::sleep(Duration::from_secs(6)).await;
        let ra = a.wait_leading(&names[..2], Duration::from_secs(5)).await;
        let rb = b.wait_leading(&names[2..], Duration::from_secs(5)).await;
        assert!(ra.is_ok() && rb.is_ok(), "drivers starved: {ra:?} {rb:?}");
    })
    .await;
}

// ---------------------------------------------------------------------------
// The network
// ---------------------------------------------------------------------------

/// A hub in a network namespace, its API traffic through a relay on the veth.
async fn namespaced_hub(
    cluster: &Cluster,
    world: &World,
    label: &str,
    timings: Option<Timings>,
    dir: &std::path::Path,
) -> (FHub, Arc<NetNs>, Proxy) {
    let ns = Arc::new(NetNs::create());
    let relay = Proxy::start((ns.host_ip(), 0).into(), api_addr(&cluster.kubeconfig)).await;
    ns.redirect_loopback(relay.addr().port());
    let kc = kubeconfig_via(
        &cluster.kubeconfig,
        &format!("https://127.0.0.1:{}", relay.addr().port()),
        dir,
    );
    let mut hub = FHub::start(
        spec(world, &kc, label, timings)
            .netns(ns.clone())
            .graceful(Duration::from_secs(2)),
    )
    .await;
    hub.wait_leading(&world.driver_names(), QUICK)
        .await
        .unwrap();
    (hub, ns, relay)
}

/// After a silent partition that killed the hub's connections (their packets
/// stay dropped, without FIN or RST; new connections work), the hub must
/// notice and attach a new VA promptly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "make faults: needs root (network namespace, iptables)"]
async fn a_silent_partition_heals() {
    known::gate("a_silent_partition_heals", async {
        let cluster = Cluster::get();
        let world = World::new(
            cluster,
            "heal",
            vec![Mock::in_process(&unique_driver_name("heal"), 10).await],
        )
        .await;
        let dir = tempfile::tempdir().unwrap();
        let (_hub, ns, relay) = namespaced_hub(cluster, &world, "heal", None, dir.path()).await;
        let port = relay.addr().port();
        ns.blackhole(port);
        tokio::time::sleep(Duration::from_secs(20)).await;
        ns.heal_new_connections_only(port);
        let vas = world.create_vas(1, "after").await;
        let r = world
            .ledger
            .wait_attached(&vas, Duration::from_secs(30))
            .await;
        assert!(
            r.is_ok(),
            "after the partition: {} (dropped {} packets)",
            r.unwrap_err(),
            ns.dropped_packets()
        );
    })
    .await;
}

/// SIGTERM while the API server is unreachable without FIN or RST: the hub
/// must still stop within its graceful-shutdown bound (plus the Lease
/// release's renew deadline).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "make faults: needs root (network namespace, iptables)"]
async fn sigterm_during_a_silent_partition_finishes() {
    known::gate("sigterm_during_a_silent_partition_finishes", async {
        let cluster = Cluster::get();
        let world = World::new(
            cluster,
            "term",
            vec![Mock::in_process(&unique_driver_name("term"), 10).await],
        )
        .await;
        let dir = tempfile::tempdir().unwrap();
        let (mut hub, ns, relay) =
            namespaced_hub(cluster, &world, "term", Some(Timings::FAST), dir.path()).await;
        ns.blackhole(relay.addr().port());
        tokio::time::sleep(Duration::from_secs(3)).await;
        // graceful 2 s + release bounded by the renew deadline (3 s) + margin.
        let r = hub.terminate(Duration::from_secs(15)).await;
        assert!(r.is_ok(), "{}", r.unwrap_err());
    })
    .await;
}

/// After a 20 s visible cut-off (connections reset, new ones refused), the
/// first new VA must be attached within a few seconds of the API server
/// being reachable again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_after_a_visible_cut_off_is_prompt() {
    known::gate("recovery_after_a_visible_cut_off_is_prompt", async {
        let cluster = Cluster::get();
        let world = World::new(
            cluster,
            "prompt",
            vec![Mock::in_process(&unique_driver_name("prompt"), 10).await],
        )
        .await;
        let dir = tempfile::tempdir().unwrap();
        let proxy = Proxy::start(
            "127.0.0.1:0".parse().unwrap(),
            api_addr(&cluster.kubeconfig),
        )
        .await;
        let kc = kubeconfig_via(
            &cluster.kubeconfig,
            &format!("https://{}", proxy.addr()),
            dir.path(),
        );
        let mut hub = FHub::start(spec(&world, &kc, "prompt", Some(Timings::DEFAULT))).await;
        hub.wait_leading(&world.driver_names(), QUICK)
            .await
            .unwrap();
        proxy.cut_off().await;
        tokio::time::sleep(Duration::from_secs(20)).await;
        proxy.restore().await;
        let t0 = Instant::now();
        let vas = world.create_vas(1, "after").await;
        let r = world
            .ledger
            .wait_attached(&vas, Duration::from_secs(60))
            .await;
        let took = t0.elapsed();
        assert!(
            r.is_ok() && took < Duration::from_secs(5),
            "first attach {took:?} after the API server came back ({r:?})"
        );
    })
    .await;
}

// ---------------------------------------------------------------------------
// Configuration
// ---------------------------------------------------------------------------

/// Runs the hub on `content` (no cluster needed for a file it must refuse)
/// and returns its exit status and stderr, killing it after `bound`.
async fn hub_on_file(
    content: &[u8],
    extra: &[&str],
    bound: Duration,
) -> (
    Option<std::process::ExitStatus>,
    String,
    std::path::PathBuf,
    tempfile::TempDir,
) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("drivers.yaml");
    std::fs::write(&path, content).unwrap();
    let mut child = tokio::process::Command::new("prlimit")
        .arg("--as=4294967296")
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_attacher-hub"))
        .arg(format!("--config={}", path.display()))
        .arg("--http-endpoint=127.0.0.1:0")
        .args(extra)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start the hub");
    let mut stderr = child.stderr.take().unwrap();
    let read = tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s).await;
        s
    });
    let status = match tokio::time::timeout(bound, child.wait()).await {
        Ok(s) => s.ok(),
        Err(_) => {
            let _ = child.start_kill();
            let _ = child.wait().await;
            None
        }
    };
    let err = tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .ok()
        .and_then(Result::ok)
        .unwrap_or_default();
    (status, err, path, dir)
}

/// `workerThreads: 1000000000` must be refused like any other bad value:
/// exit 2 naming file, line and field (the hub used to abort on an
/// allocation failure once it started the workers).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_threads_out_of_range_exits_2_with_position() {
    known::gate("worker_threads_out_of_range_exits_2_with_position", async {
        let cluster = Cluster::get();
        let mock = Mock::in_process(&unique_driver_name("workers"), 1).await;
        let content = format!(
            "drivers:\n  - address: unix://{}\n    workerThreads: 1000000000\n",
            mock.socket.display()
        );
        let kc = format!("--kubeconfig={}", cluster.kubeconfig.display());
        let (status, err, path, _dir) =
            hub_on_file(content.as_bytes(), &[&kc], Duration::from_secs(30)).await;
        let want = format!("{}:3:", path.display());
        assert!(
            status.and_then(|s| s.code()) == Some(2)
                && err.contains(&want)
                && err.contains("workerThreads"),
            "expected exit 2 naming {want} and workerThreads; got {status:?}; stderr tail: {}",
            err.lines().rev().take(3).collect::<Vec<_>>().join(" | ")
        );
    })
    .await;
}

/// A drivers.yaml that is not UTF-8 gets an error with a position.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_utf8_drivers_yaml_error_names_a_position() {
    known::gate("non_utf8_drivers_yaml_error_names_a_position", async {
        let (status, err, path, _dir) = hub_on_file(
            b"drivers:\n  - address: /a.sock\n    name: caf\xe9\n",
            &[],
            Duration::from_secs(10),
        )
        .await;
        let want = format!("{}:3:", path.display());
        assert!(
            status.and_then(|s| s.code()) == Some(2) && err.contains(&want),
            "expected exit 2 naming {want}; got {status:?}: {}",
            err.trim()
        );
    })
    .await;
}

// ---------------------------------------------------------------------------
// The registry
// ---------------------------------------------------------------------------

fn settings(path: &str) -> Settings {
    Settings {
        address: path.parse::<Address>().expect("address"),
        expected_name: None,
        timeout: Duration::from_secs(15),
        attach_workers: 1,
        detach_workers: 1,
        csi_calls: 1,
        retry_interval_start: Duration::from_secs(1),
        retry_interval_max: Duration::from_secs(300),
        reconcile_sync: Duration::from_secs(60),
        max_entries: 0,
        default_fstype: String::new(),
        api_budget: attacher_hub::k8s::budget::Limit::client_go(5.0, 10),
        leader_election: None,
        exit_on_connection_loss: false,
        save_error_code: false,
        drain_timeout: Duration::from_secs(10),
    }
}

/// Two sockets reporting the same driver name at the same moment: exactly
/// one may register.
#[test]
fn registry_refuses_a_name_claimed_twice_at_once() {
    futures::executor::block_on(known::gate(
        "registry_refuses_a_name_claimed_twice_at_once",
        async {
            let a = Driver::new(settings("/run/a.sock"), Origin::Discovered);
            let b = Driver::new(settings("/run/b.sock"), Origin::Discovered);
            let mut both = 0;
            const ROUNDS: usize = 20_000;
            for _ in 0..ROUNDS {
                let registry = Arc::new(Registry::default());
                let barrier = Arc::new(std::sync::Barrier::new(2));
                let claim = |d: Arc<Driver>| {
                    let (r, bar) = (registry.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        bar.wait();
                        r.register("same.csi.example.com", &d).is_ok()
                    })
                };
                let (ta, tb) = (claim(a.clone()), claim(b.clone()));
                if ta.join().unwrap() && tb.join().unwrap() {
                    both += 1;
                }
            }
            assert_eq!(
                both, 0,
                "both sockets registered the same name in {both} of {ROUNDS} races"
            );
        },
    ));
}

// ---------------------------------------------------------------------------
// Metrics
// ---------------------------------------------------------------------------

/// `attacher_hub_attach_duration_seconds` observes each attach once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_duration_counts_one_observation_per_attach() {
    known::gate("attach_duration_counts_one_observation_per_attach", async {
        let cluster = Cluster::get();
        let world = World::new(
            cluster,
            "e2e",
            vec![Mock::in_process(&unique_driver_name("e2e"), 20).await],
        )
        .await;
        let driver = world.driver_names()[0].clone();
        let mut hub = FHub::start(spec(&world, &cluster.kubeconfig, "e2e", None)).await;
        hub.wait_leading(std::slice::from_ref(&driver), QUICK)
            .await
            .unwrap();
        let vas = world.create_vas(10, "va").await;
        world.ledger.wait_attached(&vas, QUICK).await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        let label = format!("driver_name=\"{driver}\"");
        let n = metric_sum(
            &hub.metrics().await,
            "attacher_hub_attach_duration_seconds_count",
            &[&label],
        );
        assert_eq!(n, Some(10.0), "10 attaches, observed {n:?} times");
    })
    .await;
}

/// A driver removed from drivers.yaml leaves no series behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_driver_leaves_no_series() {
    known::gate("a_removed_driver_leaves_no_series", async {
        let cluster = Cluster::get();
        let mocks = vec![
            Mock::in_process(&unique_driver_name("keep"), 10).await,
            Mock::in_process(&unique_driver_name("gone"), 10).await,
        ];
        let world = World::new(cluster, "series", mocks).await;
        let names = world.driver_names();
        let mut hub = FHub::start(spec(&world, &cluster.kubeconfig, "series", None)).await;
        hub.wait_leading(&names, QUICK).await.unwrap();
        let vas = world.create_vas(2, "va").await;
        world.ledger.wait_attached(&vas, QUICK).await.unwrap();
        world.delete_vas(&vas[1..]).await;
        world.ledger.wait_gone(&vas[1..], QUICK).await.unwrap();
        world.write_config(&[0]);
        hub.signal("HUP");
        let gone = names[1].clone();
        hub.wait_drivers("the removed driver gone", QUICK, |ds| {
            ds.iter().all(|d| d["name"] != gone.as_str())
        })
        .await
        .unwrap();
        tokio::time::sleep(Duration::from_secs(3)).await;
        let label = format!("driver_name=\"{gone}\"");
        let left: Vec<String> = hub
            .metrics()
            .await
            .lines()
            .filter(|l| l.contains(&label))
            .map(str::to_string)
            .collect();
        assert!(
            left.is_empty(),
            "{} series of the removed driver remain, e.g. {:?}",
            left.len(),
            &left[..left.len().min(3)]
        );
    })
    .await;
}

// ---------------------------------------------------------------------------
// Promises nobody had tested
// ---------------------------------------------------------------------------

/// SIGTERM with a 3 s ControllerPublish in flight and a 10 s graceful bound:
/// the call finishes, the VA is marked attached, the hub exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_stop_finishes_a_slow_publish() {
    known::gate("graceful_stop_finishes_a_slow_publish", async {
        let cluster = Cluster::get();
        let world = World::new(
            cluster,
            "drain",
            vec![Mock::in_process(&unique_driver_name("drain"), 10).await],
        )
        .await;
        let mut hub = FHub::start(
            spec(&world, &cluster.kubeconfig, "drain", None).graceful(Duration::from_secs(10)),
        )
        .await;
        hub.wait_leading(&world.driver_names(), QUICK)
            .await
            .unwrap();
        world.mocks[0]
            .set_fault("ControllerPublishVolume", "delay:3s")
            .await;
        let vas = world.create_vas(1, "va").await;
        hub.wait_calls_started("ControllerPublishVolume", 1, QUICK)
            .await
            .unwrap();
        let (status, took) = hub.terminate(Duration::from_secs(15)).await.unwrap();
        assert!(status.success(), "exit {status}");
        assert!(took < Duration::from_secs(10), "stopping took {took:?}");
        let api: Api<VolumeAttachment> = Api::all(world.client.clone());
        let va = api.get(&vas[0]).await.unwrap();
        assert!(
            va.status.is_some_and(|s| s.attached),
            "the publish in flight finished but the VA was not marked attached before the exit"
        );
    })
    .await;
}

/// SIGTERM with a 60 s ControllerPublish in flight and a 2 s graceful bound:
/// the hub aborts the call and exits 0 soon after the bound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_stop_aborts_a_publish_past_the_bound() {
    known::gate("graceful_stop_aborts_a_publish_past_the_bound", async {
        let cluster = Cluster::get();
        let world = World::new(
            cluster,
            "abort",
            vec![Mock::in_process(&unique_driver_name("abort"), 10).await],
        )
        .await;
        let mut hub = FHub::start(
            spec(&world, &cluster.kubeconfig, "abort", None)
                .graceful(Duration::from_secs(2))
                .timeout(Duration::from_secs(120)),
        )
        .await;
        hub.wait_leading(&world.driver_names(), QUICK)
            .await
            .unwrap();
        world.mocks[0]
            .set_fault("ControllerPublishVolume", "delay:60s")
            .await;
        world.create_vas(1, "va").await;
        hub.wait_calls_started("ControllerPublishVolume", 1, QUICK)
            .await
            .unwrap();
        let (status, took) = hub.terminate(Duration::from_secs(20)).await.unwrap();
        assert!(status.success(), "exit {status}");
        assert!(
            took < Duration::from_secs(6),
            "stopping took {took:?} with a 2 s bound"
        );
    })
    .await;
}

/// A driver that comes back without PUBLISH_UNPUBLISH_VOLUME (and later with
/// it again) is served by the matching handler after each reconnect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_change_across_a_driver_reconnect() {
    known::gate("capabilities_change_across_a_driver_reconnect", async {
        let cluster = Cluster::get();
        let mock = Mock::process(&unique_driver_name("caps"), 10, &[]).await;
        let world = World::new(cluster, "caps", vec![mock]).await;
        let mut hub = FHub::start(spec(&world, &cluster.kubeconfig, "caps", None)).await;
        hub.wait_leading(&world.driver_names(), QUICK)
            .await
            .unwrap();
        let publishes = |calls: &[mock_csi_driver::CallRecord]| {
            calls
                .iter()
                .filter(|c| c.method == "ControllerPublishVolume")
                .count()
        };
        let one = world.create_vas(1, "with").await;
        world.ledger.wait_attached(&one, QUICK).await.unwrap();
        assert_eq!(publishes(&world.mocks[0].calls().await), 1);

        // Back without the capability: attached without a publish (trivial handler).
        let mut world = world;
        world.mocks[0].kill().await;
        world.mocks[0].start_process(&["--no-publish"]).await;
        hub.wait_drivers("capabilities without publish", QUICK, |ds| {
            ds.iter().any(|d| {
                d["capabilities"]["publishUnpublish"] == false
                    && kit::fhub::state_of(d) == "leading"
            })
        })
        .await
        .unwrap();
        let two = world.create_vas(1, "without").await;
        world.ledger.wait_attached(&two, QUICK).await.unwrap();
        assert_eq!(
            publishes(&world.mocks[0].calls().await),
            0,
            "a driver without PUBLISH_UNPUBLISH_VOLUME got a publish"
        );

        // And back with it: publishes again.
        world.mocks[0].kill().await;
        world.mocks[0].start_process(&[]).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        hub.wait_leading(&world.driver_names(), QUICK)
            .await
            .unwrap();
        let three = world.create_vas(1, "again").await;
        world.ledger.wait_attached(&three, QUICK).await.unwrap();
        assert!(
            publishes(&world.mocks[0].calls().await) >= 1,
            "the restored capability was not used"
        );
    })
    .await;
}

/// 40 detaches of 2 s each queued at once: attaches keep flowing through
/// their own pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_detach_storm_leaves_attaches_flowing() {
    known::gate("a_detach_storm_leaves_attaches_flowing", async {
        let cluster = Cluster::get();
        let world = World::new(
            cluster,
            "storm",
            vec![Mock::in_process(&unique_driver_name("storm"), 60).await],
        )
        .await;
        let mut hub =
            FHub::start(spec(&world, &cluster.kubeconfig, "storm", None).arg("--worker-threads=4"))
                .await;
        hub.wait_leading(&world.driver_names(), QUICK)
            .await
            .unwrap();
        let old = world.create_vas(40, "old").await;
        world
            .ledger
            .wait_attached(&old, Duration::from_secs(60))
            .await
            .unwrap();
        world.mocks[0]
            .set_fault("ControllerUnpublishVolume", "delay:2s")
            .await;
        world.delete_vas(&old).await;
        hub.wait_drivers("detaches queued", QUICK, |ds| {
            ds.iter()
                .any(|d| d["queues"]["detach"]["depth"].as_u64().unwrap_or(0) >= 10)
        })
        .await
        .unwrap();
        let t0 = Instant::now();
        let new = world.create_vas(3, "new").await;
        world
            .ledger
            .wait_attached(&new, Duration::from_secs(30))
            .await
            .unwrap();
        let took = t0.elapsed();
        let backlog = hub
            .try_drivers()
            .await
            .map(|ds| ds[0]["queues"]["detach"]["depth"].clone());
        assert!(
            took < Duration::from_secs(4),
            "attaches took {took:?} behind the detach storm (detach backlog then: {backlog:?})"
        );
    })
    .await;
}
