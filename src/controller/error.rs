//! Why the volume of a VA could not be resolved into a CSI volume: its source, its PV, the
//! translation of an in-tree PV, or its access modes (`docs/design.md#volume-source`,
//! `docs/design.md#capability`). The `Display` texts are exactly those external-attacher writes
//! into `status.attachError` / `detachError`; none of these errors is final: the caller saves
//! the text and retries with backoff.

use super::translation::TranslationError;

/// PV access modes CSI cannot express (`docs/design.md#capability`, csi-lib-utils
/// `accessmodes`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AccessModeError {
    /// ReadWriteOncePod together with any other mode.
    #[error(
        "Kubernetes does not support use of ReadWriteOncePod with other access modes on the same PersistentVolume"
    )]
    ReadWriteOncePodWithOthers,
    /// ReadOnlyMany together with ReadWriteOnce (and no ReadWriteMany).
    #[error("CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume")]
    ReadOnlyManyAndReadWriteOnce,
    /// No known mode (or an empty list); formatted like Go's `%v` of the PV's list.
    #[error("unsupported AccessMode combination: [{}]", .modes.join(" "))]
    Unsupported {
        /// The PV's `spec.accessModes`, as given.
        modes: Vec<String>,
    },
}

/// Why the volume of a VA could not be resolved into a CSI volume
/// (`docs/design.md#volume-source`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// The VA names a PV and carries an inline spec.
    #[error("both InlineCSIVolumeSource and PersistentVolumeName specified in VA source")]
    BothSources,
    /// The VA names neither a PV nor an inline spec.
    #[error("neither InlineCSIVolumeSource nor PersistentVolumeName specified in VA source")]
    NoSource,
    /// The VA's inline spec has no `csi` source.
    #[error("inline volume spec contains nil CSI source")]
    InlineWithoutCsi,
    /// The PV named by the VA is not in the cache.
    #[error("persistentvolume \"{name}\" not found")]
    PvNotFound {
        /// `va.spec.source.persistentVolumeName`.
        name: String,
    },
    /// Attach refused: the PV has a deletionTimestamp.
    #[error("PersistentVolume \"{name}\" is marked for deletion")]
    PvMarkedForDeletion {
        /// The PV's name.
        name: String,
    },
    /// The PV is neither CSI nor an in-tree volume that can be translated.
    #[error("pv spec contained non-csi source that was not migrated")]
    NotCsi,
    /// A capability was asked for a spec without CSI source.
    #[error("could not get volume capabilities, pvSpec.CSI is nil")]
    CapabilityWithoutCsi,
    /// The PV's access modes cannot be expressed in CSI.
    #[error(transparent)]
    AccessMode(#[from] AccessModeError),
    /// csi-translation-lib refuses the in-tree PV. The prefix is the one external-attacher's
    /// `csiAttach` and `csiDetach` put before the library's error.
    #[error("failed to translate in tree pv to CSI: {0}")]
    Translation(#[from] TranslationError),
}

/// Result of this module's fallible helpers.
pub type Result<T, E = Error> = std::result::Result<T, E>;
