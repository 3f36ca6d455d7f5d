//! Why csi-translation-lib refuses to translate an in-tree PV.

/// Why csi-translation-lib refuses to translate an in-tree PV. The `Display` texts are the
/// library's; [`Error::Translation`](crate::controller::error::Error::Translation) adds external-attacher's prefix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TranslationError {
    /// An AWS EBS `volumeID` starting with `aws://` that is not a URL whose path is one
    /// `vol-…` segment. The text is the reason (`Invalid format for AWS volume (<id>)`, or
    /// `Invalid disk name (<id>): <Go URL parse error>`).
    #[error("failed to translate Kubernetes ID to EBS Volume ID {0}")]
    EbsVolumeId(String),
    /// A GCE PD PV whose zone label lists several zones that do not share one region, or a
    /// zone not of the form `<locale>-<region>-<zone>`. The text is the reason.
    #[error("failed to get region from zones: {0}")]
    GceRegion(String),
    /// An Azure Disk whose `kind` is set and is not `Managed` (the API server defaults a
    /// missing kind to `Shared`, so such PVs are never migrated).
    #[error("kind({0}) is not supported in csi migration")]
    AzureDiskKind(String),
    /// An Azure File PV with neither `secretNamespace` nor a `claimRef` namespace.
    #[error("could not find a secret namespace in PersistentVolumeSource or ClaimRef")]
    AzureFileSecretNamespace,
}
