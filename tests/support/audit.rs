//! The API server's audit log: every request a ServiceAccount made (scripts/cluster-up.sh logs
//! the metadata of those and of nothing else), read back by tests that check what a workload
//! asked for and what it was refused.

use serde_json::Value;

use super::Cluster;

/// The audit events of `user` (for example `system:serviceaccount:<ns>:<name>`), oldest first.
pub(crate) fn audit_events(user: &str) -> Vec<Value> {
    let cluster = Cluster::get();
    let log = cluster
        .kubeconfig
        .parent()
        .expect("cluster directory")
        .join("audit.log");
    let text = std::fs::read_to_string(&log).unwrap_or_else(|e| {
        panic!(
            "the API server's audit log {} cannot be read ({e}): scripts/cluster-up.sh starts \
             the API server with it; restart the control plane (make cluster-down)",
            log.display()
        )
    });
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|e| e["user"]["username"] == user)
        .collect()
}

/// One line per request of `user` the API server refused as forbidden (403) at or after
/// `since`: verb, resource, namespace. (The log outlives a test, and a ServiceAccount name may
/// come back in a later test.)
pub(crate) fn forbidden(user: &str, since: std::time::SystemTime) -> Vec<String> {
    let since = k8s_openapi::jiff::Timestamp::try_from(since).expect("a time after 1970");
    let mut out: Vec<String> = audit_events(user)
        .iter()
        .filter(|e| {
            e["requestReceivedTimestamp"]
                .as_str()
                .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok())
                .is_some_and(|t| t >= since)
        })
        .filter(|e| e["responseStatus"]["code"] == 403)
        .map(|e| {
            let o = &e["objectRef"];
            let resource = match o["subresource"].as_str() {
                Some(sub) => format!("{}/{sub}", o["resource"].as_str().unwrap_or_default()),
                None => o["resource"].as_str().unwrap_or_default().to_string(),
            };
            format!(
                "{} {} in {}",
                e["verb"].as_str().unwrap_or_default(),
                resource,
                o["namespace"]
                    .as_str()
                    .unwrap_or("all namespaces or the cluster")
            )
        })
        .collect();
    out.sort();
    out.dedup();
    out
}
