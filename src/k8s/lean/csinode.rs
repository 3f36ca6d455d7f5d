//! The cached CSINode.

use k8s_openapi::api::storage::v1::CSINode;

use super::Cached;

/// A cached CSINode: its name and, per driver registered on the node, the node ID.
///
/// Every driver's entry is kept, not only those of the drivers this process serves: the set it
/// serves changes at run time (configuration reloads, sockets appearing), and an entry costs a
/// few dozen bytes per node.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CsiNode {
    /// `metadata.name`: the node's name.
    pub name: String,
    /// `spec.drivers`: (name, nodeID), in the object's order.
    pub drivers: Box<[(Box<str>, Box<str>)]>,
}

impl CsiNode {
    /// The node ID `driver` registered on this node (the first entry of that name, as Go finds
    /// it).
    pub fn node_id(&self, driver: &str) -> Option<&str> {
        self.drivers
            .iter()
            .find(|(name, _)| &**name == driver)
            .map(|(_, id)| &**id)
    }
}

impl Cached for CsiNode {
    fn name(&self) -> &str {
        &self.name
    }
}

impl From<CSINode> for CsiNode {
    fn from(node: CSINode) -> Self {
        Self {
            name: node.metadata.name.unwrap_or_default(),
            drivers: node
                .spec
                .drivers
                .into_iter()
                .map(|d| (d.name.into_boxed_str(), d.node_id.into_boxed_str()))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::storage::v1::CSINodeDriver;

    use super::*;

    #[test]
    fn node_ids_are_found_by_driver_first_entry_first() {
        let mut api = CSINode::default();
        api.metadata.name = Some("n".into());
        api.spec.drivers = [("a", "1"), ("b", "2"), ("a", "3")]
            .into_iter()
            .map(|(name, id)| CSINodeDriver {
                name: name.into(),
                node_id: id.into(),
                topology_keys: Some(vec!["zone".into()]),
                ..CSINodeDriver::default()
            })
            .collect();
        let node = CsiNode::from(api);
        assert_eq!(node.name(), "n");
        assert_eq!(node.node_id("a"), Some("1"));
        assert_eq!(node.node_id("b"), Some("2"));
        assert_eq!(node.node_id("c"), None);
    }
}
