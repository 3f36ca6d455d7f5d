//! The CSI node ID of a VA's node (external-attacher's `getNodeID`, `docs/design.md#node-id`):
//! from the node's CSINode, else (detach and reconcile only) from the VA's node-ID annotation.

use crate::k8s::lean::{CsiNode, Va};
use crate::names::NODE_ID_ANNOTATION;

/// Why no CSI node ID could be found (`docs/design.md#node-id`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NodeIdError {
    /// No CSINode object exists for the node (and the VA carries no node-ID annotation).
    #[error("csinode.storage.k8s.io \"{node}\" not found")]
    CsiNodeNotFound {
        /// The node name from `va.spec.nodeName`.
        node: String,
    },
    /// The CSINode exists but the driver is not registered on it (node plugin not running).
    #[error("CSINode {node} does not contain driver {driver}")]
    DriverNotOnNode {
        /// The node name from `va.spec.nodeName`.
        node: String,
        /// The driver looked for.
        driver: String,
    },
}

/// Resolves the CSI node ID of `driver` on `node_name` (external-attacher's `getNodeID`).
///
/// `csinode` is the CSINode named `node_name` from the cache, if any. The VA's
/// [`NODE_ID_ANNOTATION`] is used only when the CSINode cannot answer and a VA is given: detach
/// and reconcile pass it, attach passes `None` and so requires a current CSINode entry.
pub fn node_id(
    driver: &str,
    node_name: &str,
    csinode: Option<&CsiNode>,
    va: Option<&Va>,
) -> Result<String, NodeIdError> {
    let err = match csinode {
        Some(csinode) => {
            if let Some(id) = csinode.node_id(driver) {
                return Ok(id.to_owned());
            }
            NodeIdError::DriverNotOnNode {
                node: node_name.to_owned(),
                driver: driver.to_owned(),
            }
        }
        None => NodeIdError::CsiNodeNotFound {
            node: node_name.to_owned(),
        },
    };
    // As in Go, an annotation that is present but empty still counts as found.
    va.and_then(|va| va.metadata.annotation(NODE_ID_ANNOTATION))
        .map(str::to_owned)
        .ok_or(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::fixtures::*;

    #[test]
    fn node_ids_come_from_csinode_then_from_the_va_annotation() {
        let with_driver = lean_csinode(&csinode(&[("other", "o"), (DRIVER, "id-1")]));
        let without_driver = lean_csinode(&csinode(&[("other", "o")]));
        let annotated = lean_va(&va_annotated(va(Some("pv")), "id-anno"));
        let empty_annotation = lean_va(&va_annotated(va(Some("pv")), ""));
        let plain = lean_va(&va(Some("pv")));
        let not_found = Err(NodeIdError::CsiNodeNotFound {
            node: "node".into(),
        });
        let no_driver = Err(NodeIdError::DriverNotOnNode {
            node: "node".into(),
            driver: DRIVER.into(),
        });
        type Case<'a> = (
            &'a str,
            Option<&'a CsiNode>,
            Option<&'a Va>,
            Result<String, NodeIdError>,
        );
        let cases: Vec<Case<'_>> = vec![
            (
                "csinode with the driver wins",
                Some(&with_driver),
                Some(&annotated),
                Ok("id-1".into()),
            ),
            (
                "csinode with the driver, no va",
                Some(&with_driver),
                None,
                Ok("id-1".into()),
            ),
            (
                "missing csinode falls back to the annotation",
                None,
                Some(&annotated),
                Ok("id-anno".into()),
            ),
            (
                "csinode without the driver falls back to the annotation",
                Some(&without_driver),
                Some(&annotated),
                Ok("id-anno".into()),
            ),
            (
                "an empty annotation still counts",
                None,
                Some(&empty_annotation),
                Ok(String::new()),
            ),
            (
                "attach passes no va: missing csinode is an error",
                None,
                None,
                not_found.clone(),
            ),
            (
                "va without annotation keeps the csinode error",
                None,
                Some(&plain),
                not_found,
            ),
            (
                "csinode without the driver and no annotation",
                Some(&without_driver),
                Some(&plain),
                no_driver.clone(),
            ),
            (
                "csinode without the driver and no va",
                Some(&without_driver),
                None,
                no_driver,
            ),
        ];
        for (name, node, va, want) in cases {
            assert_eq!(node_id(DRIVER, "node", node, va), want, "{name}");
        }
    }

    #[test]
    fn node_id_errors_read_exactly_like_external_attacher() {
        assert_eq!(
            NodeIdError::CsiNodeNotFound { node: "n1".into() }.to_string(),
            "csinode.storage.k8s.io \"n1\" not found"
        );
        assert_eq!(
            NodeIdError::DriverNotOnNode {
                node: "n1".into(),
                driver: "d".into()
            }
            .to_string(),
            "CSINode n1 does not contain driver d"
        );
    }
}
