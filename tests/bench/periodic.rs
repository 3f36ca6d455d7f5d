//! What an attacher asks of the API server while nothing happens: the requests of an idle
//! window, read from the API server's audit log (`scripts/cluster-up.sh` logs the metadata of
//! every request a ServiceAccount makes, and the attachers run as one), so that they are the
//! contender's own and nobody else's (the API server's counters also count the benchmark's own
//! Lease watch and the API server's identity Lease), each with what it was for.
//!
//! The report divides them by the window's minutes and the drivers served: a hub's periodic
//! requests per driver against a Go sidecar's.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::time::SystemTime;

use k8s_openapi::jiff::Timestamp;
use serde_json::Value;

use crate::support::audit_events;

/// The identity both contenders run as (`scripts/cluster-up.sh` signs the attachers' client
/// certificate for it).
const ATTACHER: &str = "system:serviceaccount:default:csi-attacher";

/// Name prefix of the leader-election Leases, one per driver.
const LEADER_LEASE: &str = "external-attacher-leader-";

/// Name prefix of a hub replica's presence Lease (leadership balance).
const PRESENCE_LEASE: &str = "attacher-hub-replica-";

/// The contender's requests received from `since` to `until`, by kind (verb as HTTP says it,
/// resource, for Leases what they are, the scope of a cluster-wide LIST or WATCH, and the code
/// of a refusal).
pub(crate) fn audited(since: SystemTime, until: SystemTime) -> BTreeMap<String, usize> {
    let (since, until) = (stamp(since), stamp(until));
    let mut out = BTreeMap::new();
    // A watch is logged twice (when its response starts and when it ends): one request per
    // audit ID.
    let mut seen = std::collections::HashSet::new();
    for event in audit_events(ATTACHER) {
        let at = event["requestReceivedTimestamp"]
            .as_str()
            .and_then(|t| t.parse::<Timestamp>().ok());
        let id = event["auditID"].as_str().unwrap_or_default().to_string();
        if at.is_some_and(|t| t >= since && t < until) && seen.insert(id) {
            *out.entry(kind(&event)).or_default() += 1;
        }
    }
    out
}

fn stamp(t: SystemTime) -> Timestamp {
    Timestamp::try_from(t).expect("a time after 1970")
}

/// `PUT leases (leader election)`, `WATCH volumeattachments`, `LIST leases, all namespaces`.
fn kind(event: &Value) -> String {
    let verb = match event["verb"].as_str().unwrap_or_default() {
        "get" => "GET",
        "list" => "LIST",
        "watch" => "WATCH",
        "create" => "POST",
        "update" => "PUT",
        "patch" => "PATCH",
        "delete" | "deletecollection" => "DELETE",
        other => other,
    };
    let object = &event["objectRef"];
    let mut resource = object["resource"]
        .as_str()
        .unwrap_or("(no resource)")
        .to_string();
    if let Some(sub) = object["subresource"].as_str() {
        resource = format!("{resource}/{sub}");
    }
    // A LIST with a field selector on the name has the name in the audit record too.
    let name = object["name"].as_str().unwrap_or_default();
    let what = if resource != "leases" {
        ""
    } else if name.starts_with(LEADER_LEASE) {
        " (leader election)"
    } else if name.starts_with(PRESENCE_LEASE) {
        " (replica presence)"
    } else {
        ""
    };
    // Of the attachers' resources only Leases are namespaced.
    let scope = if resource == "leases"
        && object["namespace"].is_null()
        && matches!(verb, "LIST" | "WATCH")
    {
        ", all namespaces"
    } else {
        ""
    };
    let refused = match event["responseStatus"]["code"].as_u64() {
        Some(code) if code >= 400 => format!(", refused {code}"),
        _ => String::new(),
    };
    format!("{verb} {resource}{what}{scope}{refused}")
}

/// `counts` over `seconds` for `drivers` drivers: per minute and per driver.
pub(crate) fn per_driver_minute(
    counts: &BTreeMap<String, usize>,
    seconds: f64,
    drivers: usize,
) -> BTreeMap<String, f64> {
    let per = seconds / 60.0 * drivers as f64;
    counts
        .iter()
        .map(|(k, n)| (k.clone(), if per > 0.0 { *n as f64 / per } else { 0.0 }))
        .collect()
}

/// A table of periodic requests per minute per driver: one row per kind either contender made,
/// the two contenders' rates side by side with their ratio, then the totals. `label` names the
/// shape (drivers, window).
pub(crate) fn table(
    label: &str,
    fleet: &BTreeMap<String, f64>,
    hub: &BTreeMap<String, f64>,
) -> String {
    let mut md = format!(
        "\n{label}\n\n| request | Go sidecars, per driver per minute | attacher-hub, per driver per minute | hub / Go |\n|---|---|---|---|\n"
    );
    let mut kinds: Vec<&String> = fleet.keys().chain(hub.keys()).collect();
    kinds.sort();
    kinds.dedup();
    let row = |md: &mut String, what: &str, f: f64, h: f64| {
        let ratio = if f > 0.0 {
            format!("{:.2}x", h / f)
        } else {
            "—".into()
        };
        let _ = writeln!(md, "| {what} | {f:.3} | {h:.3} | {ratio} |");
    };
    for k in kinds {
        row(
            &mut md,
            k,
            fleet.get(k).copied().unwrap_or(0.0),
            hub.get(k).copied().unwrap_or(0.0),
        );
    }
    row(&mut md, "**all**", fleet.values().sum(), hub.values().sum());
    md
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kinds_name_the_verb_the_resource_and_what_a_lease_is_for() {
        let event = |verb: &str, resource: &str, name: Option<&str>, ns: Option<&str>| json!({"verb": verb, "objectRef": {"resource": resource, "name": name, "namespace": ns}});
        assert_eq!(
            kind(&event(
                "update",
                "leases",
                Some("external-attacher-leader-a"),
                Some("default")
            )),
            "PUT leases (leader election)"
        );
        assert_eq!(
            kind(&event("list", "leases", None, None)),
            "LIST leases, all namespaces"
        );
        let mut guard = event("list", "leases", Some("external-attacher-leader-a"), None);
        guard["responseStatus"] = json!({"code": 403});
        assert_eq!(
            kind(&guard),
            "LIST leases (leader election), all namespaces, refused 403"
        );
        assert_eq!(
            kind(&event(
                "get",
                "leases",
                Some("attacher-hub-replica-x"),
                Some("d")
            )),
            "GET leases (replica presence)"
        );
        assert_eq!(
            kind(&event("watch", "volumeattachments", None, None)),
            "WATCH volumeattachments"
        );
        let status = json!({"verb": "patch", "objectRef": {"resource": "volumeattachments", "subresource": "status"}});
        assert_eq!(kind(&status), "PATCH volumeattachments/status");
    }

    #[test]
    fn rates_are_per_minute_and_per_driver() {
        let counts = BTreeMap::from([("PUT leases (leader election)".to_string(), 1200)]);
        let rates = per_driver_minute(&counts, 600.0, 10);
        assert_eq!(rates["PUT leases (leader election)"], 12.0);
        let md = table("x", &rates, &per_driver_minute(&counts, 600.0, 100));
        assert!(
            md.contains("| PUT leases (leader election) | 12.000 | 1.200 | 0.10x |"),
            "{md}"
        );
        assert!(md.contains("| **all** | 12.000 | 1.200 | 0.10x |"), "{md}");
    }
}
