//! The scheduler side of the pod runner: which emulated node a pending pod goes to. It follows
//! the parts of kube-scheduler the shipped manifests use: `nodeSelector`, required node
//! affinity (label expressions and the `metadata.name` field a DaemonSet's pods carry),
//! required pod anti-affinity, free host ports (a `hostNetwork` pod's container ports are host
//! ports), and, among the nodes left, preferred pod anti-affinity and then the fewest pods of
//! the same namespace. No resources or taints are considered (the emulated nodes have none to
//! run out of).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{NodeSelectorRequirement, Pod, PodAffinityTerm};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;

/// A node as the scheduler sees it.
#[derive(Clone, Debug)]
pub(crate) struct NodeView {
    pub(crate) name: String,
    pub(crate) labels: BTreeMap<String, String>,
}

/// A pod already placed: its node, namespace, labels and the host ports it holds.
#[derive(Clone, Debug)]
pub(crate) struct Placed {
    pub(crate) node: String,
    pub(crate) namespace: String,
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) host_ports: Vec<i32>,
}

/// The host ports `pod` needs on its node: each container port's `hostPort`, and with
/// `hostNetwork` every container port (its `hostPort` is its `containerPort`).
pub(crate) fn host_ports(pod: &Pod) -> Vec<i32> {
    let Some(spec) = pod.spec.as_ref() else {
        return Vec::new();
    };
    let host_network = spec.host_network == Some(true);
    spec.containers
        .iter()
        .flat_map(|c| c.ports.iter().flatten())
        .filter_map(|p| {
            p.host_port
                .or(host_network.then_some(p.container_port))
                .filter(|port| *port > 0)
        })
        .collect()
}

fn requirement(r: &NodeSelectorRequirement, value: Option<&String>) -> bool {
    let values = r.values.clone().unwrap_or_default();
    match r.operator.as_str() {
        "In" => value.is_some_and(|v| values.contains(v)),
        "NotIn" => value.is_none_or(|v| !values.contains(v)),
        "Exists" => value.is_some(),
        "DoesNotExist" => value.is_none(),
        "Gt" | "Lt" => {
            let (Some(v), Some(bound)) = (
                value.and_then(|v| v.parse::<i64>().ok()),
                values.first().and_then(|b| b.parse::<i64>().ok()),
            ) else {
                return false;
            };
            if r.operator == "Gt" {
                v > bound
            } else {
                v < bound
            }
        }
        _ => false,
    }
}

/// Whether `labels` match `selector` (an empty selector matches everything).
pub(crate) fn selects(selector: &LabelSelector, labels: &BTreeMap<String, String>) -> bool {
    let by_labels = selector
        .match_labels
        .iter()
        .flatten()
        .all(|(k, v)| labels.get(k) == Some(v));
    let by_expressions = selector.match_expressions.iter().flatten().all(|e| {
        let value = labels.get(&e.key);
        let values = e.values.clone().unwrap_or_default();
        match e.operator.as_str() {
            "In" => value.is_some_and(|v| values.contains(v)),
            "NotIn" => value.is_none_or(|v| !values.contains(v)),
            "Exists" => value.is_some(),
            "DoesNotExist" => value.is_none(),
            _ => false,
        }
    });
    by_labels && by_expressions
}

/// Pods of `placed` that `term` of `pod` counts on `node`'s topology domain.
fn matching(
    term: &PodAffinityTerm,
    pod: &Pod,
    node: &NodeView,
    nodes: &[NodeView],
    placed: &[Placed],
) -> usize {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let namespaces = term
        .namespaces
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| vec![ns]);
    let domain = node.labels.get(&term.topology_key);
    placed
        .iter()
        .filter(|p| namespaces.contains(&p.namespace))
        .filter(|p| {
            let other = nodes.iter().find(|n| n.name == p.node);
            domain.is_some() && other.and_then(|n| n.labels.get(&term.topology_key)) == domain
        })
        .filter(|p| {
            term.label_selector
                .as_ref()
                .is_some_and(|s| selects(s, &p.labels))
        })
        .count()
}

/// The node for `pod`, or why none fits (the pod then stays pending, as it would).
pub(crate) fn pick(pod: &Pod, nodes: &[NodeView], placed: &[Placed]) -> Result<String, String> {
    let spec = pod.spec.as_ref().ok_or("pod without spec")?;
    let affinity = spec.affinity.clone().unwrap_or_default();
    let fits = |node: &NodeView| -> bool {
        let by_selector = spec
            .node_selector
            .iter()
            .flatten()
            .all(|(k, v)| node.labels.get(k) == Some(v));
        let by_affinity =
            affinity
                .node_affinity
                .as_ref()
                .and_then(|a| {
                    a.required_during_scheduling_ignored_during_execution
                        .as_ref()
                })
                .is_none_or(|required| {
                    required.node_selector_terms.iter().any(|term| {
                        term.match_expressions
                            .iter()
                            .flatten()
                            .all(|r| requirement(r, node.labels.get(&r.key)))
                            && term.match_fields.iter().flatten().all(|r| {
                                r.key == "metadata.name" && requirement(r, Some(&node.name))
                            })
                    })
                });
        let by_anti_affinity = affinity
            .pod_anti_affinity
            .as_ref()
            .and_then(|a| {
                a.required_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .is_none_or(|terms| {
                terms
                    .iter()
                    .all(|t| matching(t, pod, node, nodes, placed) == 0)
            });
        let wanted = host_ports(pod);
        let by_ports = placed
            .iter()
            .filter(|p| p.node == node.name)
            .all(|p| !p.host_ports.iter().any(|port| wanted.contains(port)));
        by_selector && by_affinity && by_anti_affinity && by_ports
    };
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let score = |node: &NodeView| -> (i64, usize) {
        let preferred: i64 = affinity
            .pod_anti_affinity
            .as_ref()
            .and_then(|a| {
                a.preferred_during_scheduling_ignored_during_execution
                    .as_ref()
            })
            .map(|terms| {
                terms
                    .iter()
                    .map(|w| {
                        i64::from(w.weight)
                            * i64::try_from(matching(
                                &w.pod_affinity_term,
                                pod,
                                node,
                                nodes,
                                placed,
                            ))
                            .unwrap_or(0)
                    })
                    .sum()
            })
            .unwrap_or(0);
        let crowd = placed
            .iter()
            .filter(|p| p.node == node.name && p.namespace == ns)
            .count();
        (preferred, crowd)
    };
    nodes
        .iter()
        .filter(|n| fits(n))
        .min_by_key(|n| score(n))
        .map(|n| n.name.clone())
        .ok_or_else(|| {
            format!(
                "0/{} nodes are available for pod {}: node selector, node affinity, pod \
                 anti-affinity or host ports rule out every node",
                nodes.len(),
                pod.metadata.name.as_deref().unwrap_or_default()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn nodes() -> Vec<NodeView> {
        ["a", "b"]
            .iter()
            .map(|n| NodeView {
                name: n.to_string(),
                labels: BTreeMap::from([
                    ("kubernetes.io/hostname".to_string(), n.to_string()),
                    (
                        "pool".to_string(),
                        if *n == "b" { "controllers" } else { "work" }.to_string(),
                    ),
                ]),
            })
            .collect()
    }

    fn pod(spec: serde_json::Value) -> Pod {
        let mut object =
            json!({"metadata": {"name": "p", "namespace": "ns", "labels": {"app": "x"}}});
        object["spec"] = spec;
        serde_json::from_value(object).expect("pod")
    }

    fn placed(node: &str) -> Placed {
        Placed {
            node: node.into(),
            namespace: "ns".into(),
            labels: BTreeMap::from([("app".to_string(), "x".to_string())]),
            host_ports: Vec::new(),
        }
    }

    #[test]
    fn selectors_and_the_daemonset_field_pin_a_node() {
        let p = pod(json!({"containers": [], "nodeSelector": {"pool": "controllers"}}));
        assert_eq!(pick(&p, &nodes(), &[]), Ok("b".into()));
        let p = pod(
            json!({"containers": [], "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution":
            {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["a"]}]}]}}}}),
        );
        assert_eq!(
            pick(&p, &nodes(), &[placed("a"), placed("a")]),
            Ok("a".into())
        );
        let p = pod(json!({"containers": [], "nodeSelector": {"pool": "gpu"}}));
        assert!(pick(&p, &nodes(), &[]).is_err());
    }

    #[test]
    fn anti_affinity_spreads_replicas_or_leaves_them_pending() {
        let term = json!({"topologyKey": "kubernetes.io/hostname", "labelSelector": {"matchLabels": {"app": "x"}}});
        let required = pod(
            json!({"containers": [], "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [term]}}}),
        );
        assert_eq!(pick(&required, &nodes(), &[placed("a")]), Ok("b".into()));
        assert!(pick(&required, &nodes(), &[placed("a"), placed("b")]).is_err());
        let preferred = pod(
            json!({"containers": [], "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [{"weight": 100, "podAffinityTerm": term}]}}}),
        );
        assert_eq!(pick(&preferred, &nodes(), &[placed("b")]), Ok("a".into()));
        assert_eq!(
            pick(&preferred, &nodes(), &[placed("a"), placed("b")]),
            Ok("a".into())
        );
    }

    #[test]
    fn host_network_pods_take_their_ports_on_the_node() {
        let p = pod(json!({"hostNetwork": true, "containers": [
            {"name": "c", "ports": [{"containerPort": 22012}]}]}));
        assert_eq!(host_ports(&p), [22012]);
        let holder = Placed {
            host_ports: vec![22012],
            ..placed("a")
        };
        assert_eq!(
            pick(&p, &nodes(), std::slice::from_ref(&holder)),
            Ok("b".into())
        );
        let other = Placed {
            host_ports: vec![22012],
            ..placed("b")
        };
        assert!(pick(&p, &nodes(), &[holder, other]).is_err());
        let own_network = pod(json!({"containers": [
            {"name": "c", "ports": [{"containerPort": 22012}]}]}));
        assert!(host_ports(&own_network).is_empty());
    }
}
