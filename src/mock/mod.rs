//! The project's mock CSI driver (`mock-csi-driver`): in-memory volumes and
//! attachments on any number of nodes, capability switches and fault injection.
