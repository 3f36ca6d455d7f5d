//! Drivers nobody attaches for. Every replica watches all the cluster's VolumeAttachments, so
//! each can tell, for every driver a VolumeAttachment names, whether VolumeAttachments wait for
//! an attacher while none acts: the driver's Lease has no live holder, or VolumeAttachments have
//! gone untouched for minutes. That is the case the other signals miss when only one replica can
//! serve a driver (topology (b): the driver's socket on one node) and that replica's pod is gone:
//! the series that replica made are gone with it, and `AttacherHubAbsent` needs every replica
//! gone. The other replicas report it through `attacher_hub_driver_unserved`
//! (`docs/design.md#unserved`).
//!
//! The decisions are pure ([`tally`], [`LeaseSight`], [`is_unserved`]); [`follow`] reads the
//! cache, reads the Leases it must (one GET per driver with waiting VolumeAttachments that this
//! replica does not lead or see led, each bounded by [`LEASE_GET_TIMEOUT`], at most
//! [`MAX_LEASE_GETS`] per round) and sets the gauges every [`CHECK_INTERVAL`].

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::{context::Context, driver::State};
use crate::k8s::lean::Va;
use crate::leader::LeanLease;
use crate::metrics::UnservedMetrics;

/// How often the check runs. A driver becomes visible at most this long after it meets the
/// rule; the alert's `for` is minutes, so a finer period would only cost Lease reads.
pub const CHECK_INTERVAL: Duration = Duration::from_secs(15);

/// A VolumeAttachment counts as waiting once it has waited this long (since its creation for an
/// attach, since its deletion for a detach). A served driver attaches in about a second; this
/// keeps out the VolumeAttachments of a driver whose attacher elects in another namespace (its
/// Lease is not where this replica looks) and the instant of a hand-over.
pub const WAIT_SETTLE: Duration = Duration::from_secs(30);

/// A VolumeAttachment waiting to be attached that carries neither the driver's finalizer nor an
/// `attachError` after this long was never looked at: an attacher syncs a new VolumeAttachment
/// within seconds and writes one or the other, even when the attach fails. This catches the
/// attacher that holds the Lease but does not work, and a driver whose Lease lives where this
/// replica does not look.
pub const UNTOUCHED_AFTER: Duration = Duration::from_secs(180);

/// Longest wait for one Lease GET; a slower answer leaves the driver's last verdict in place.
pub const LEASE_GET_TIMEOUT: Duration = Duration::from_secs(5);

/// At most this many Lease GETs per round (the drivers with VolumeAttachments waiting); the
/// others keep their last reading until a later round.
pub const MAX_LEASE_GETS: usize = 32;

/// What one driver's VolumeAttachments say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// VolumeAttachments that have waited [`WAIT_SETTLE`] or longer for an attach or a detach.
    pub waiting: usize,
    /// Of those, the ones waiting to be attached that nobody touched (no finalizer of the
    /// driver, no `attachError`) for [`UNTOUCHED_AFTER`] or longer.
    pub untouched: usize,
}

/// Every driver named by `vas` (`spec.attacher`), with what its VolumeAttachments say at `now`.
/// A driver whose VolumeAttachments all wait less than [`WAIT_SETTLE`] (or not at all) is
/// listed with nothing waiting.
pub fn tally<'a>(vas: impl IntoIterator<Item = &'a Va>, now: Timestamp) -> BTreeMap<String, Tally> {
    let mut out: BTreeMap<String, Tally> = BTreeMap::new();
    for va in vas {
        let driver = va.spec.attacher.as_str();
        if driver.is_empty() {
            continue;
        }
        let entry = out.entry(driver.to_string()).or_default();
        let finalized = va
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| *f == crate::names::finalizer_name(driver));
        let (since, attach) = match &va.metadata.deletion_timestamp {
            // Being deleted: waits for a detach while the driver's finalizer is on it.
            Some(deleted) if finalized => (Some(deleted), false),
            Some(_) => continue,
            None if va.status.attached => continue,
            None => (va.metadata.creation_timestamp.as_ref(), true),
        };
        let waited = since.map_or(Duration::ZERO, |t| age(t.0, now));
        if waited < WAIT_SETTLE {
            continue;
        }
        entry.waiting += 1;
        if attach && !finalized && !va.status.has_attach_error && waited >= UNTOUCHED_AFTER {
            entry.untouched += 1;
        }
    }
    out
}

/// How long before `now` `t` was (zero for a time ahead of ours).
fn age(t: Timestamp, now: Timestamp) -> Duration {
    now.duration_since(t).try_into().unwrap_or(Duration::ZERO)
}

/// What this replica knows of a driver's Lease holder.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseSight {
    /// Held and renewed (or just vacated, within its duration): someone acts for the driver.
    Held,
    /// Missing, or its record unchanged for longer than its duration by our clock.
    Unheld,
    /// Not read (the GET failed or was not made this round).
    Unknown,
}

/// A driver Lease's record as last read, and when (by our monotonic clock) it was first read
/// with these values: client-go's rule, a Lease whose record has not changed for its duration
/// has no live holder, whatever the clocks of the nodes say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reading {
    /// `holderIdentity`, `renewTime`, `acquireTime` and `leaseTransitions`, as read; `None`:
    /// the Lease does not exist.
    record: Option<(String, String, String, i32)>,
    /// `leaseDurationSeconds` (client-go's default when unset).
    duration: Duration,
    /// When this record was first read.
    since: Instant,
}

impl Reading {
    /// The reading of `lease` (`None`: not found) at `now`, after the `previous` one.
    pub fn new(lease: Option<&LeanLease>, previous: Option<&Reading>, now: Instant) -> Self {
        let spec = lease.and_then(|l| l.0.spec.as_ref());
        let record = lease.map(|_| {
            let spec = spec.cloned().unwrap_or_default();
            (
                spec.holder_identity.unwrap_or_default(),
                spec.renew_time.map(|t| t.0.to_string()).unwrap_or_default(),
                spec.acquire_time
                    .map(|t| t.0.to_string())
                    .unwrap_or_default(),
                spec.lease_transitions.unwrap_or_default(),
            )
        });
        let duration = spec
            .and_then(|s| s.lease_duration_seconds)
            .and_then(|s| u64::try_from(s).ok())
            .map_or(crate::leader::DEFAULT_LEASE_DURATION, Duration::from_secs);
        let since = match previous {
            Some(p) if p.record == record => p.since,
            _ => now,
        };
        Self {
            record,
            duration,
            since,
        }
    }

    /// Whether the Lease has a live holder at `now`: it exists and its record changed within its
    /// duration (a vacated Lease, `leaseDurationSeconds: 1`, is handed over within that second).
    pub fn sight(&self, now: Instant) -> LeaseSight {
        match &self.record {
            None => LeaseSight::Unheld,
            Some(_) if now.saturating_duration_since(self.since) > self.duration => {
                LeaseSight::Unheld
            }
            Some(_) => LeaseSight::Held,
        }
    }
}

/// The rule: a driver is unserved when VolumeAttachments of it have waited [`WAIT_SETTLE`] and
/// either its Lease has no live holder, or some waited [`UNTOUCHED_AFTER`] untouched. `None`:
/// cannot tell (the Lease unread and nothing untouched), the last verdict stands.
pub fn is_unserved(tally: &Tally, lease: &LeaseSight) -> Option<bool> {
    if tally.waiting == 0 {
        return Some(false);
    }
    if tally.untouched > 0 {
        return Some(true);
    }
    match lease {
        LeaseSight::Held => Some(false),
        LeaseSight::Unheld => Some(true),
        LeaseSight::Unknown => None,
    }
}

/// What this replica knows of a driver it serves: the Lease's holder is live (this replica
/// leads, stands by for a live holder, or another namespace's holder blocks it) or unknown.
fn own_sight(hub: &Context, driver: &str) -> Option<LeaseSight> {
    let d = hub.registry.get(driver)?;
    d.settings().leader_election.as_ref()?;
    let own = hub.shared.leader_status.get(driver).map(|s| s.clone());
    let live = match d.state() {
        State::Leading => true,
        _ => d.stands_by_for_live_holder(own.as_ref()),
    };
    live.then_some(LeaseSight::Held)
}

/// The namespace of `driver`'s Lease: its settings where this replica serves it or has an entry
/// for it by name (`named`), else `default`.
fn lease_namespace<'a>(
    hub: &Context,
    named: &'a HashMap<String, String>,
    default: &'a str,
    driver: &str,
) -> String {
    if let Some(d) = hub.registry.get(driver)
        && let Some(le) = &d.settings().leader_election
    {
        return le.namespace.clone();
    }
    named
        .get(driver)
        .map_or(default, String::as_str)
        .to_string()
}

/// Every [`CHECK_INTERVAL`] until `stop` (the first once the caches are synced and start-up is
/// over): the drivers named by the cached VolumeAttachments and those this replica serves with
/// leader election, their Leases read where needed (in `named`'s namespace for drivers with an
/// entry there, else in `default_namespace`), and `metrics` set; a driver no VolumeAttachment
/// names any more loses its series unless this replica serves it. Logs each change of a
/// driver's verdict.
pub(crate) async fn follow(
    hub: Arc<Context>,
    metrics: UnservedMetrics,
    default_namespace: String,
    named: HashMap<String, String>,
    stop: CancellationToken,
) {
    let mut readings: HashMap<String, Reading> = HashMap::new();
    let mut verdicts: HashMap<String, bool> = HashMap::new();
    // The first check once the caches are synced and the first configuration's drivers have
    // started (or the start-up limit passed): a driver this replica serves then has its series
    // from the first check, not one interval later.
    tokio::select! {
        () = stop.cancelled() => return,
        () = hub.shared.stores.wait_synced() => {}
    }
    if !super::startup::wait_over(&hub, &stop).await {
        return;
    }
    let mut tick = tokio::time::interval(CHECK_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let mut tallies = tally(
            hub.shared.stores.vas.state().iter().map(AsRef::as_ref),
            Timestamp::now(),
        );
        // The drivers this replica serves are shown too, with nothing waiting until a VA names
        // them, so that every served driver has its series.
        hub.registry.each_slot(|d| {
            if let Some(name) = d.name()
                && d.settings().leader_election.is_some()
            {
                tallies.entry(name).or_default();
            }
        });
        let mut gets = 0;
        for (driver, t) in &tallies {
            let sight = if t.waiting == 0 {
                LeaseSight::Unknown
            } else if let Some(own) = own_sight(&hub, driver) {
                own
            } else if gets < MAX_LEASE_GETS {
                gets += 1;
                let ns = lease_namespace(&hub, &named, &default_namespace, driver);
                read_lease(&hub, &ns, driver, &mut readings).await
            } else {
                LeaseSight::Unknown
            };
            let verdict = is_unserved(t, &sight)
                .or_else(|| verdicts.get(driver).copied())
                .unwrap_or(false);
            let before = verdicts.insert(driver.clone(), verdict);
            if before != Some(verdict) && (verdict || before == Some(true)) {
                if verdict {
                    tracing::warn!(driver = %driver, waiting = t.waiting, untouched = t.untouched, lease = ?sight, "VolumeAttachments wait and no attacher acts for the driver");
                } else {
                    tracing::info!(driver = %driver, "the driver is served again");
                }
            }
            metrics.set(driver, verdict, t.waiting);
        }
        verdicts.retain(|d, _| {
            let keep = tallies.contains_key(d);
            if !keep {
                metrics.remove(d);
            }
            keep
        });
        readings.retain(|d, _| tallies.contains_key(d));
    }
}

/// GETs `driver`'s Lease in `namespace` (bounded by [`LEASE_GET_TIMEOUT`]) and updates its
/// reading; [`LeaseSight::Unknown`] when the read fails.
async fn read_lease(
    hub: &Context,
    namespace: &str,
    driver: &str,
    readings: &mut HashMap<String, Reading>,
) -> LeaseSight {
    let api: kube::Api<LeanLease> =
        kube::Api::namespaced(hub.shared.leader_client.clone(), namespace);
    let name = crate::names::lease_name(driver);
    let lease = match tokio::time::timeout(LEASE_GET_TIMEOUT, api.get_opt(&name)).await {
        Ok(Ok(lease)) => lease,
        Ok(Err(error)) => {
            tracing::debug!(driver, namespace, error = %crate::api_error::one_line(&error, None), "reading the driver's Lease failed");
            return LeaseSight::Unknown;
        }
        Err(_) => {
            tracing::debug!(driver, namespace, "reading the driver's Lease timed out");
            return LeaseSight::Unknown;
        }
    };
    let now = Instant::now();
    let reading = Reading::new(lease.as_ref(), readings.get(driver), now);
    let sight = reading.sight(now);
    readings.insert(driver.to_string(), reading);
    sight
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};

    const NOW: i64 = 1_800_000_000;

    fn at(seconds_ago: u64) -> Time {
        Time(Timestamp::from_second(NOW - seconds_ago as i64).unwrap())
    }

    fn now() -> Timestamp {
        Timestamp::from_second(NOW).unwrap()
    }

    /// A VA of `driver` created `age` seconds ago.
    fn va(driver: &str, age: u64) -> Va {
        let mut va = Va::default();
        va.metadata.name = Some(format!("va-{driver}-{age}"));
        va.spec.attacher = driver.to_string();
        va.metadata.creation_timestamp = Some(at(age));
        va
    }

    fn finalized(mut va: Va) -> Va {
        va.metadata.finalizers = Some(vec![crate::names::finalizer_name(&va.spec.attacher)].into());
        va
    }

    fn tally_of(vas: &[Va]) -> BTreeMap<String, Tally> {
        tally(vas, now())
    }

    #[test]
    fn a_va_waits_once_it_has_waited_the_settling_time_for_an_attach_or_a_detach() {
        let mut attached = va("d", 600);
        attached.status.attached = true;
        let mut deleted_ours = finalized(va("d", 600));
        deleted_ours.status.attached = true;
        deleted_ours.metadata.deletion_timestamp = Some(at(40));
        let mut deleted_recently = finalized(va("d", 600));
        deleted_recently.metadata.deletion_timestamp = Some(at(5));
        let mut deleted_detached = va("d", 600);
        deleted_detached.metadata.deletion_timestamp = Some(at(600));
        let vas = [
            attached,
            va("d", 10),
            va("d", 40),
            deleted_ours,
            deleted_recently,
            deleted_detached,
        ];
        assert_eq!(
            tally_of(&vas)["d"],
            Tally {
                waiting: 2,
                untouched: 0
            }
        );
    }

    #[test]
    fn every_driver_named_by_a_va_is_listed_even_with_nothing_waiting() {
        let mut attached = va("a", 600);
        attached.status.attached = true;
        let got = tally_of(&[attached, va("b", 1)]);
        assert_eq!(got.keys().collect::<Vec<_>>(), ["a", "b"]);
        assert!(got.values().all(|t| t.waiting == 0));
    }

    #[test]
    fn a_va_with_neither_finalizer_nor_error_for_minutes_is_untouched() {
        let mut errored = va("d", 600);
        errored.status.has_attach_error = true;
        let mut other_finalizer = va("d", 600);
        other_finalizer.metadata.finalizers = Some(vec!["external-attacher/e".to_string()].into());
        let vas = [
            va("d", 600),
            va("d", 100),
            finalized(va("d", 600)),
            errored,
            other_finalizer,
        ];
        assert_eq!(
            tally_of(&vas)["d"],
            Tally {
                waiting: 5,
                untouched: 2
            }
        );
    }

    #[test]
    fn the_finalizer_is_the_sanitized_drivers() {
        let driver = "pd.csi.storage.gke.io";
        let mut v = finalized(va(driver, 600));
        assert_eq!(tally_of(std::slice::from_ref(&v))[driver].untouched, 0);
        v.metadata.finalizers = Some(vec![format!("external-attacher/{driver}")].into());
        assert_eq!(tally_of(&[v])[driver].untouched, 1);
    }

    #[test]
    fn a_va_created_ahead_of_our_clock_has_not_waited() {
        let mut v = va("d", 0);
        v.metadata.creation_timestamp = Some(Time(Timestamp::from_second(NOW + 3600).unwrap()));
        assert_eq!(tally_of(&[v])["d"].waiting, 0);
    }

    fn lease(holder: &str, renewed: i64, duration: i32) -> LeanLease {
        LeanLease(Lease {
            spec: Some(LeaseSpec {
                holder_identity: Some(holder.to_string()),
                lease_duration_seconds: Some(duration),
                renew_time: Some(MicroTime(Timestamp::from_second(renewed).unwrap())),
                ..LeaseSpec::default()
            }),
            ..Lease::default()
        })
    }

    #[tokio::test(start_paused = true)]
    async fn a_lease_is_unheld_when_missing_or_unchanged_for_its_duration_by_our_clock() {
        let t0 = Instant::now();
        assert_eq!(Reading::new(None, None, t0).sight(t0), LeaseSight::Unheld);
        // Its renew time is long past by the wall clock: only our clock counts.
        let first = Reading::new(Some(&lease("a", 0, 15)), None, t0);
        assert_eq!(first.sight(t0), LeaseSight::Held);
        let t1 = t0 + Duration::from_secs(15);
        let same = Reading::new(Some(&lease("a", 0, 15)), Some(&first), t1);
        assert_eq!(same.sight(t1), LeaseSight::Held);
        let t2 = t0 + Duration::from_secs(16);
        let same = Reading::new(Some(&lease("a", 0, 15)), Some(&same), t2);
        assert_eq!(same.sight(t2), LeaseSight::Unheld);
        // Renewed: live again.
        let renewed = Reading::new(Some(&lease("a", 5, 15)), Some(&same), t2);
        assert_eq!(renewed.sight(t2), LeaseSight::Held);
        // Vacated (empty holder, 1 s): handed over within its second, else unheld.
        let vacated = Reading::new(Some(&lease("", 6, 1)), Some(&renewed), t2);
        assert_eq!(vacated.sight(t2), LeaseSight::Held);
        let t3 = t2 + Duration::from_secs(2);
        let still = Reading::new(Some(&lease("", 6, 1)), Some(&vacated), t3);
        assert_eq!(still.sight(t3), LeaseSight::Unheld);
        // Deleted after being held.
        assert_eq!(
            Reading::new(None, Some(&renewed), t3).sight(t3),
            LeaseSight::Unheld
        );
    }

    /// The whole check on a fake API server: a driver with a VA waiting and no Lease shows 1
    /// (with one Lease GET, in the driver's namespace), a Lease renewed by another replica makes
    /// it 0, and once no VA names it its series go.
    #[tokio::test(start_paused = true)]
    async fn the_check_reads_the_lease_of_a_driver_with_waiting_vas_and_sets_its_series() {
        use crate::fake_api::FakeApi;
        use crate::hub::context::tests::context;
        use crate::k8s::stores::TestStores;
        use k8s_openapi::api::storage::v1::{VolumeAttachment, VolumeAttachmentSpec};

        let api = FakeApi::default();
        let mut caches = TestStores::new();
        let hub = context(&api, caches.stores.clone());
        let registry = prometheus::Registry::new();
        let metrics = UnservedMetrics::register(&registry).unwrap();
        let waiting = VolumeAttachment {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some("va-1".into()),
                creation_timestamp: Some(Time(
                    Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(60),
                )),
                ..Default::default()
            },
            spec: VolumeAttachmentSpec {
                attacher: "d.csi.example.com".into(),
                node_name: "n".into(),
                ..Default::default()
            },
            status: None,
        };
        caches.apply_va(&waiting);
        let named = HashMap::from([("d.csi.example.com".to_string(), "vendor".to_string())]);
        let stop = CancellationToken::new();
        let task = tokio::spawn(follow(
            hub.clone(),
            metrics.clone(),
            "hub".into(),
            named,
            stop.clone(),
        ));
        let value = || {
            let text = crate::metrics::csi::tests::render(&registry);
            text.lines().find_map(|l| {
                l.strip_prefix(r#"attacher_hub_driver_unserved{driver_name="d.csi.example.com"} "#)
                    .map(str::to_string)
            })
        };
        // Before start-up is over (the first configuration not yet applied), no check runs.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(value(), None, "checked before start-up was over");
        hub.first_reconcile.cancel();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(value().as_deref(), Some("1"), "no Lease at all");
        let gets = |ns: &str| {
            api.log()
                .iter()
                .filter(|l| l.path.contains(&format!("namespaces/{ns}/leases")))
                .count()
        };
        assert_eq!((gets("vendor"), gets("hub")), (1, 0), "{:?}", api.log());

        // Another replica leads it in that namespace, and renews.
        let mut renewed = lease("other-replica", 100, 15);
        renewed.0.metadata.name = Some(crate::names::lease_name("d.csi.example.com"));
        renewed.0.metadata.namespace = Some("vendor".into());
        api.put(&renewed.0);
        tokio::time::sleep(CHECK_INTERVAL).await;
        assert_eq!(value().as_deref(), Some("0"), "held");

        // No VA names it any more: no series.
        caches.delete_va(&waiting);
        tokio::time::sleep(CHECK_INTERVAL).await;
        assert_eq!(value(), None);
        stop.cancel();
        task.await.unwrap();
    }

    #[test]
    fn a_driver_is_unserved_when_vas_wait_and_its_lease_is_unheld_or_vas_go_untouched() {
        let idle = Tally::default();
        let waiting = Tally {
            waiting: 2,
            untouched: 0,
        };
        let untouched = Tally {
            waiting: 2,
            untouched: 1,
        };
        let cases = [
            (&idle, LeaseSight::Unheld, Some(false)),
            (&idle, LeaseSight::Unknown, Some(false)),
            (&waiting, LeaseSight::Held, Some(false)),
            (&waiting, LeaseSight::Unheld, Some(true)),
            (&waiting, LeaseSight::Unknown, None),
            (&untouched, LeaseSight::Held, Some(true)),
            (&untouched, LeaseSight::Unknown, Some(true)),
        ];
        for (tally, lease, want) in cases {
            assert_eq!(is_unserved(tally, &lease), want, "{tally:?} {lease:?}");
        }
    }
}
