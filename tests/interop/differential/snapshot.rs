//! Normalized snapshots of a scenario's objects and CSI calls, and their
//! field-by-field comparison.
//!
//! A snapshot is a flat map `field path → value`, with every run-specific
//! string (object names, driver names) replaced by a placeholder, so that a
//! Go snapshot and a hub snapshot of the same scenario are equal when the two
//! attachers behaved the same.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use mock_csi_driver::CallRecord;

pub(crate) const PUBLISH: &str = "ControllerPublishVolume";
pub(crate) const UNPUBLISH: &str = "ControllerUnpublishVolume";

/// Replaces run-specific strings by placeholders.
#[derive(Clone, Debug, Default)]
pub(crate) struct Normalizer {
    /// `(actual, placeholder)`, longest `actual` first.
    replacements: Vec<(String, String)>,
}

impl Normalizer {
    /// Adds a replacement; longer strings are replaced first, so a name that
    /// contains another is replaced whole.
    pub(crate) fn with(mut self, actual: &str, placeholder: &str) -> Self {
        self.replacements
            .push((actual.to_string(), placeholder.to_string()));
        self.replacements
            .sort_by_key(|(a, _)| std::cmp::Reverse(a.len()));
        self
    }

    pub(crate) fn apply(&self, s: &str) -> String {
        self.replacements
            .iter()
            .fold(s.to_string(), |acc, (a, p)| acc.replace(a.as_str(), p))
    }
}

/// One normalized observation of a scenario.
#[derive(Clone, Debug, Default)]
pub(crate) struct Snapshot {
    /// Field path → normalized value.
    pub(crate) fields: BTreeMap<String, String>,
    /// Call-entry field path → how many identical consecutive calls it stands for.
    pub(crate) counts: BTreeMap<String, usize>,
    /// Call-entry paths that are ControllerPublishVolume calls answered OK.
    pub(crate) ok_publishes: BTreeSet<String>,
    /// Call-entry paths that are ControllerUnpublishVolume calls answered OK.
    pub(crate) ok_unpublishes: BTreeSet<String>,
    /// One line for the report: the state of each VA.
    pub(crate) summary: String,
}

const NONE: &str = "<none>";

fn json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_else(|e| format!("<{e}>"))
}

impl Snapshot {
    /// Records a VA (by role); `None` when it does not exist.
    pub(crate) fn va(&mut self, role: &str, va: Option<&VolumeAttachment>, n: &Normalizer) {
        let key = |field: &str| format!("va[{role}].{field}");
        let Some(va) = va else {
            self.fields.insert(key("exists"), "false".into());
            self.note(role, "gone");
            return;
        };
        let f = &mut self.fields;
        f.insert(key("exists"), "true".into());
        f.insert(
            key("deleting"),
            va.metadata.deletion_timestamp.is_some().to_string(),
        );
        let finalizers: Vec<String> = va
            .metadata
            .finalizers
            .iter()
            .flatten()
            .map(|s| n.apply(s))
            .collect();
        f.insert(key("finalizers"), json(&finalizers));
        let annotations: BTreeMap<String, String> = va
            .metadata
            .annotations
            .iter()
            .flatten()
            .filter(|(k, _)| !k.starts_with("kubectl.kubernetes.io/"))
            .map(|(k, v)| (k.clone(), n.apply(v)))
            .collect();
        f.insert(key("annotations"), json(&annotations));
        let Some(st) = &va.status else {
            f.insert(key("status"), NONE.into());
            self.note(role, "no status");
            return;
        };
        f.insert(key("status.attached"), st.attached.to_string());
        f.insert(
            key("status.attachmentMetadata"),
            st.attachment_metadata
                .as_ref()
                .map_or(NONE.into(), |m| n.apply(&json(m))),
        );
        let (message, code) = st
            .attach_error
            .as_ref()
            .map_or((NONE.into(), NONE.into()), |e| {
                (
                    e.message.as_deref().map_or(NONE.into(), |m| n.apply(m)),
                    e.error_code.map_or(NONE.into(), |c| c.to_string()),
                )
            });
        f.insert(key("status.attachError.message"), message.clone());
        f.insert(key("status.attachError.errorCode"), code.clone());
        let detach = st.detach_error.as_ref().map_or(NONE.into(), |e| {
            e.message.as_deref().map_or(NONE.into(), |m| n.apply(m))
        });
        f.insert(key("status.detachError.message"), detach.clone());
        let mut state = if st.attached {
            "attached"
        } else {
            "not attached"
        }
        .to_string();
        if message != NONE {
            state = format!("attachError(code {code}) {message:?}");
        }
        if detach != NONE {
            state = format!("{state}; detachError {detach:?}");
        }
        self.note(role, &state);
    }

    /// Records a PV (by role); `None` when it does not exist.
    pub(crate) fn pv(&mut self, role: &str, pv: Option<&PersistentVolume>, n: &Normalizer) {
        let key = |field: &str| format!("pv[{role}].{field}");
        let Some(pv) = pv else {
            self.fields.insert(key("exists"), "false".into());
            return;
        };
        self.fields.insert(key("exists"), "true".into());
        self.fields.insert(
            key("deleting"),
            pv.metadata.deletion_timestamp.is_some().to_string(),
        );
        let finalizers: Vec<String> = pv
            .metadata
            .finalizers
            .iter()
            .flatten()
            .map(|s| n.apply(s))
            .collect();
        self.fields.insert(key("finalizers"), json(&finalizers));
    }

    /// Records the Controller(Un)Publish calls (already filtered to the
    /// scenario's volumes), grouped per volume and node, with consecutive
    /// identical calls collapsed into one entry and a count.
    ///
    /// Calls are taken in the order they *arrived* at the mock (the order the
    /// attacher made them), not the order they were recorded in: the mock
    /// records a call when it ends, and a call the attacher gave up on may end
    /// at a time that depends on scheduling only.
    pub(crate) fn calls(&mut self, calls: &[CallRecord], n: &Normalizer) {
        let mut calls: Vec<&CallRecord> = calls.iter().collect();
        calls.sort_by_key(|c| c.time_unix_ms);
        let mut groups: BTreeMap<String, Vec<(String, &CallRecord, usize)>> = BTreeMap::new();
        for c in calls.iter().copied() {
            let group = n.apply(&format!("{}@{}", c.volume_id, c.node_id));
            let text = n.apply(&render(c));
            let entries = groups.entry(group).or_default();
            match entries.last_mut() {
                Some((last, _, count)) if *last == text => *count += 1,
                // A successful publish right after a successful publish is a
                // repeat of it (`docs/design.md#own-writes`): it counts towards the first
                // entry even if a Secret changed in between (the Go
                // attacher's repeat may read it after the change).
                Some((_, first, count)) if ok_publish(first) && ok_publish(c) => *count += 1,
                _ => entries.push((text, c, 1)),
            }
        }
        for (group, entries) in groups {
            self.fields
                .insert(format!("calls[{group}].entries"), entries.len().to_string());
            for (i, (text, c, count)) in entries.into_iter().enumerate() {
                let key = format!("calls[{group}][{i}]");
                if c.code.as_deref() == Some("Ok") {
                    if c.method == PUBLISH {
                        self.ok_publishes.insert(key.clone());
                    } else if c.method == UNPUBLISH {
                        self.ok_unpublishes.insert(key.clone());
                    }
                }
                self.counts.insert(key.clone(), count);
                self.fields.insert(key, text);
            }
        }
        if calls.is_empty() {
            self.fields.insert("calls".into(), "none".into());
        }
    }

    fn note(&mut self, role: &str, state: &str) {
        if !self.summary.is_empty() {
            self.summary.push_str("; ");
        }
        self.summary.push_str(&format!("{role}: {state}"));
    }
}

fn ok_publish(c: &CallRecord) -> bool {
    c.method == PUBLISH && c.code.as_deref() == Some("Ok")
}

/// Secret values longer than this are shown by length and hash.
const LONG_VALUE: usize = 64;

/// The secrets of a call, long values abbreviated (still compared exactly).
fn secrets(c: &CallRecord) -> String {
    use std::hash::{Hash, Hasher};
    let shown: BTreeMap<&str, String> = c
        .secrets
        .iter()
        .map(|(k, v)| {
            let v = if v.len() > LONG_VALUE {
                let mut h = std::hash::DefaultHasher::new();
                v.hash(&mut h);
                format!("<{} bytes, hash {:016x}>", v.len(), h.finish())
            } else {
                v.clone()
            };
            (k.as_str(), v)
        })
        .collect();
    json(&shown)
}

/// One call as a line: everything the attacher chose, and the answer.
fn render(c: &CallRecord) -> String {
    let answer = c.code.as_deref().unwrap_or("no answer (caller gave up)");
    if c.method == PUBLISH {
        format!(
            "{} readonly={} mode={} type={} fs={:?} context={} secrets={} -> {answer}",
            c.method,
            c.readonly,
            c.access_mode,
            c.access_type,
            c.fs_type,
            json(&c.volume_context),
            secrets(c),
        )
    } else {
        format!("{} secrets={} -> {answer}", c.method, secrets(c))
    }
}

/// Differences between two snapshots, as readable lines.
#[derive(Debug, Default)]
pub(crate) struct Differences {
    /// Fields (objects, call entries, unpublish counts) that differ.
    pub(crate) fields: Vec<String>,
    /// Successful publishes the hub repeated: none may exist, the hub never
    /// publishes twice because of its own writes (`docs/design.md#own-writes`).
    pub(crate) duplicate_publishes: Vec<String>,
    /// Differences explained by the Go attacher's stale re-attach
    /// (`docs/design.md#own-writes`), which the hub never makes: reported,
    /// never failed.
    pub(crate) allowed: Vec<String>,
}

impl Differences {
    pub(crate) fn is_empty(&self) -> bool {
        self.fields.is_empty() && self.duplicate_publishes.is_empty()
    }
}

/// Most successful ControllerUnpublishVolume calls in a row for one detach by
/// the Go attacher.
///
/// One is the rule. Go may make a second from a re-sync that reads the VA
/// from a cache that does not show the removed finalizer yet (an event of its
/// own earlier write, queued while it detached, read right after the detach),
/// depending on timing only. The hub remembers its finished detach until the
/// cache shows it (`docs/design.md#own-writes`), so it makes exactly one.
const MAX_GO_OK_UNPUBLISHES: usize = 2;

/// Every difference between the Go snapshot and the hub snapshot of one
/// checkpoint; empty when they agree.
///
/// Counts of collapsed entries are compared only where they mean something:
/// * a ControllerPublishVolume answered OK: the hub may call it *fewer*
///   times than Go (no duplicate publish caused by its own writes,
///   `docs/design.md#own-writes`)
///   and must call it exactly once;
/// * a ControllerUnpublishVolume answered OK: exactly once by the hub, and
///   never more often than Go, which may make it twice (see
///   [`MAX_GO_OK_UNPUBLISHES`]);
/// * failed calls are retries whose number depends on timing: not compared.
///
/// `go_reattached` names the VA roles the Go attacher re-attached from a
/// stale cache after attaching them (`docs/design.md#own-writes`, found in
/// its log). Such a
/// re-attach runs the whole attach again, after the test may have moved on
/// (deleted the Secret, the PV, the CSINode): when it fails, Go saves an
/// `attachError` the hub, which never re-attaches an attached VA, cannot
/// have. So for those VAs an `attachError` that only Go shows is listed as
/// allowed; the hub showing one that Go does not is still a difference.
pub(crate) fn compare(
    go: &Snapshot,
    hub: &Snapshot,
    go_reattached: &BTreeSet<String>,
) -> Differences {
    let mut out = Differences::default();
    let keys: BTreeSet<&String> = go.fields.keys().chain(hub.fields.keys()).collect();
    for k in keys {
        let g = go.fields.get(k).map_or("<absent>", String::as_str);
        let h = hub.fields.get(k).map_or("<absent>", String::as_str);
        if g == h {
            continue;
        }
        let line = format!("{k}:\n      Go:  {g}\n      hub: {h}");
        if h == NONE && stale_reattach_error(k, go_reattached) {
            out.allowed.push(format!(
                "{line}\n      (Go re-attached this attached VA from a stale cache, and the repeat failed)"
            ));
        } else {
            out.fields.push(line);
        }
    }
    for k in &hub.ok_publishes {
        if go.fields.get(k) != hub.fields.get(k) {
            continue; // already reported above
        }
        let g = go.counts.get(k).copied().unwrap_or(0);
        let h = hub.counts.get(k).copied().unwrap_or(0);
        if h != 1 || h > g {
            out.duplicate_publishes.push(format!(
                "{k}: successful ControllerPublishVolume made {h} time(s) in a row by the hub (Go: {g}); the hub must publish exactly once per attach and never more often than Go"
            ));
        }
    }
    for k in &hub.ok_unpublishes {
        if go.fields.get(k) != hub.fields.get(k) {
            continue;
        }
        let g = go.counts.get(k).copied().unwrap_or(0);
        let h = hub.counts.get(k).copied().unwrap_or(0);
        if h != 1 || !(1..=MAX_GO_OK_UNPUBLISHES).contains(&g) {
            out.fields.push(format!(
                "{k}: successful ControllerUnpublishVolume made {h} time(s) in a row by the hub, {g} by Go (the hub: exactly once per detach; Go: once, or twice after a stale re-sync)"
            ));
        }
    }
    out
}

/// Whether field path `key` is the `attachError` of a VA role in `reattached`.
fn stale_reattach_error(key: &str, reattached: &BTreeSet<String>) -> bool {
    key.strip_prefix("va[")
        .and_then(|rest| rest.split_once(']'))
        .is_some_and(|(role, field)| {
            field.starts_with(".status.attachError.") && reattached.contains(role)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn none() -> BTreeSet<String> {
        BTreeSet::new()
    }

    fn call(method: &str, code: &str) -> CallRecord {
        CallRecord {
            method: method.into(),
            volume_id: "vol-0".into(),
            node_id: "nid".into(),
            code: Some(code.into()),
            ..CallRecord::default()
        }
    }

    #[test]
    fn duplicates_collapse_and_counts_follow_the_rules() {
        let n = Normalizer::default();
        let mut go = Snapshot::default();
        go.calls(
            &[
                call(PUBLISH, "FailedPrecondition"),
                call(PUBLISH, "FailedPrecondition"),
                call(PUBLISH, "Ok"),
                call(PUBLISH, "Ok"),
            ],
            &n,
        );
        let mut hub = Snapshot::default();
        hub.calls(
            &[call(PUBLISH, "FailedPrecondition"), call(PUBLISH, "Ok")],
            &n,
        );
        assert!(
            compare(&go, &hub, &none()).is_empty(),
            "{:?}",
            compare(&go, &hub, &none())
        );
        // The hub publishing more often than Go is a difference.
        assert!(!compare(&hub, &go, &none()).is_empty());
    }

    #[test]
    fn calls_are_compared_in_arrival_order_as_properties() {
        let n = Normalizer::default();
        let at = |mut c: CallRecord, ms: u64| {
            c.time_unix_ms = ms;
            c
        };
        let timed_out = |ms| {
            let mut c = call(PUBLISH, "Ok");
            c.code = None;
            at(c, ms)
        };
        // Go: three calls timed out, one of them recorded after the
        // successful retry (it ended late), then the publish, repeated.
        let mut go = Snapshot::default();
        go.calls(
            &[
                timed_out(1),
                timed_out(3),
                at(call(PUBLISH, "Ok"), 7),
                timed_out(5),
                at(call(PUBLISH, "Ok"), 8),
            ],
            &n,
        );
        // The hub: two timeouts, one publish.
        let mut hub = Snapshot::default();
        hub.calls(
            &[timed_out(2), timed_out(4), at(call(PUBLISH, "Ok"), 6)],
            &n,
        );
        assert!(
            compare(&go, &hub, &none()).is_empty(),
            "{:?}",
            compare(&go, &hub, &none())
        );

        // A repeated publish may carry a Secret changed in between.
        let mut changed = call(PUBLISH, "Ok");
        changed.secrets.insert("password".into(), "v2".into());
        let mut go = Snapshot::default();
        go.calls(&[at(call(PUBLISH, "Ok"), 1), at(changed.clone(), 2)], &n);
        let mut hub = Snapshot::default();
        hub.calls(&[at(call(PUBLISH, "Ok"), 1)], &n);
        assert!(
            compare(&go, &hub, &none()).is_empty(),
            "{:?}",
            compare(&go, &hub, &none())
        );
        // ... but the hub may not repeat it.
        let mut hub = Snapshot::default();
        hub.calls(&[at(call(PUBLISH, "Ok"), 1), at(changed, 2)], &n);
        assert!(!compare(&go, &hub, &none()).duplicate_publishes.is_empty());

        // No successful call at all, or none before the failures: different.
        let mut hub = Snapshot::default();
        hub.calls(&[timed_out(2), timed_out(4)], &n);
        assert!(!compare(&go, &hub, &none()).is_empty());
        let mut hub = Snapshot::default();
        hub.calls(&[at(call(PUBLISH, "Ok"), 1), timed_out(2)], &n);
        assert!(!compare(&go, &hub, &none()).is_empty());
    }

    #[test]
    fn a_detach_unpublishes_once_in_the_hub_and_once_or_twice_in_go() {
        let n = Normalizer::default();
        let unpublishes = |k: usize| {
            let mut s = Snapshot::default();
            s.calls(&vec![call(UNPUBLISH, "Ok"); k], &n);
            s
        };
        // compare(go, hub)
        assert!(compare(&unpublishes(1), &unpublishes(1), &none()).is_empty());
        assert!(compare(&unpublishes(2), &unpublishes(1), &none()).is_empty());
        assert!(!compare(&unpublishes(1), &unpublishes(2), &none()).is_empty());
        assert!(!compare(&unpublishes(2), &unpublishes(2), &none()).is_empty());
        assert!(!compare(&unpublishes(1), &unpublishes(3), &none()).is_empty());
        assert!(!compare(&unpublishes(3), &unpublishes(1), &none()).is_empty());
        assert!(!compare(&unpublishes(1), &unpublishes(0), &none()).is_empty());
    }

    #[test]
    fn long_secret_values_are_abbreviated_but_still_compared() {
        let n = Normalizer::default();
        let with = |v: String| {
            let mut c = call(PUBLISH, "Ok");
            c.secrets.insert("big".into(), v);
            let mut s = Snapshot::default();
            s.calls(&[c], &n);
            s
        };
        let a = with("a".repeat(1000));
        assert!(a.fields.values().any(|f| f.contains("<1000 bytes, hash ")));
        assert!(compare(&a, &with("a".repeat(1000)), &none()).is_empty());
        assert!(!compare(&a, &with(format!("{}b", "a".repeat(999))), &none()).is_empty());
    }

    #[test]
    fn an_attach_error_only_go_shows_is_allowed_after_its_stale_reattach() {
        let n = Normalizer::default();
        let attached = |error: Option<&str>| {
            let mut va = VolumeAttachment::default();
            va.metadata.name = Some("x".into());
            va.status = Some(k8s_openapi::api::storage::v1::VolumeAttachmentStatus {
                attached: true,
                attach_error: error.map(|m| k8s_openapi::api::storage::v1::VolumeError {
                    message: Some(m.into()),
                    ..Default::default()
                }),
                ..Default::default()
            });
            let mut s = Snapshot::default();
            s.va("va", Some(&va), &n);
            s
        };
        let go = attached(Some("failed to load secret"));
        let hub = attached(None);
        let reattached = BTreeSet::from(["va".to_string()]);
        let d = compare(&go, &hub, &reattached);
        assert!(d.is_empty() && d.allowed.len() == 1, "{d:?}");
        // Without the re-attach in Go's log it is a difference ...
        assert!(!compare(&go, &hub, &none()).is_empty());
        // ... and the hub showing an error Go does not is one in any case.
        assert!(!compare(&hub, &go, &reattached).is_empty());
    }

    #[test]
    fn normalizer_replaces_longest_first() {
        let n = Normalizer::default()
            .with("run-1", "<run>")
            .with("run-12", "<run12>");
        assert_eq!(n.apply("run-12-pv run-1-pv"), "<run12>-pv <run>-pv");
    }
}
