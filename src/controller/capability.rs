//! The volume capability sent in ControllerPublishVolume (`docs/design.md#capability`): block
//! or mount, the one CSI access mode for the PV's access modes, and `readonly`.

use k8s_openapi::api::core::v1::{CSIPersistentVolumeSource, PersistentVolumeSpec};

use super::error::{AccessModeError, Error, Result};
use crate::csi::proto::{self, volume_capability::access_mode::Mode};

/// `spec.volumeMode` value selecting a raw block capability.
const VOLUME_MODE_BLOCK: &str = "Block";

/// Maps a PV's `spec.accessModes` to the one CSI access mode sent (the table of
/// `docs/design.md#capability`).
///
/// Duplicates are ignored. `supports_single_node_multi_writer` is the driver's
/// `SINGLE_NODE_MULTI_WRITER` controller capability.
pub fn access_mode(
    pv_modes: &[String],
    supports_single_node_multi_writer: bool,
) -> Result<Mode, AccessModeError> {
    let has = |m: &str| pv_modes.iter().any(|x| x == m);
    let distinct = {
        let mut v: Vec<&str> = pv_modes.iter().map(String::as_str).collect();
        v.sort_unstable();
        v.dedup();
        v.len()
    };
    if has("ReadWriteOncePod") {
        if distinct > 1 {
            return Err(AccessModeError::ReadWriteOncePodWithOthers);
        }
        return Ok(if supports_single_node_multi_writer {
            Mode::SingleNodeSingleWriter
        } else {
            Mode::SingleNodeWriter
        });
    }
    if has("ReadWriteMany") {
        return Ok(Mode::MultiNodeMultiWriter);
    }
    match (has("ReadOnlyMany"), has("ReadWriteOnce")) {
        (true, true) => Err(AccessModeError::ReadOnlyManyAndReadWriteOnce),
        (true, false) => Ok(Mode::MultiNodeReaderOnly),
        (false, true) if supports_single_node_multi_writer => Ok(Mode::SingleNodeMultiWriter),
        (false, true) => Ok(Mode::SingleNodeWriter),
        (false, false) => Err(AccessModeError::Unsupported {
            modes: pv_modes.to_vec(),
        }),
    }
}

/// `readonly` of ControllerPublishVolume: the PV's `csi.readOnly`, but only for drivers with
/// the `PUBLISH_READONLY` capability; always false otherwise.
pub fn readonly(csi: &CSIPersistentVolumeSource, supports_publish_readonly: bool) -> bool {
    supports_publish_readonly && csi.read_only.unwrap_or(false)
}

/// The single volume capability sent in ControllerPublishVolume (`docs/design.md#capability`).
///
/// Block if `spec.volumeMode == Block`; otherwise mount with `fs_type` = `spec.csi.fsType` or
/// `default_fstype` when that is empty, and `mount_flags` = `spec.mountOptions`.
pub fn volume_capability(
    spec: &PersistentVolumeSpec,
    default_fstype: &str,
    supports_single_node_multi_writer: bool,
) -> Result<proto::VolumeCapability> {
    use proto::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
    let csi = spec.csi.as_ref().ok_or(Error::CapabilityWithoutCsi)?;
    let access_type = if spec.volume_mode.as_deref() == Some(VOLUME_MODE_BLOCK) {
        AccessType::Block(BlockVolume {})
    } else {
        let fs_type = csi
            .fs_type
            .as_deref()
            .filter(|f| !f.is_empty())
            .unwrap_or(default_fstype);
        AccessType::Mount(MountVolume {
            fs_type: fs_type.to_owned(),
            mount_flags: spec.mount_options.clone().unwrap_or_default(),
            ..MountVolume::default()
        })
    };
    let mode = access_mode(
        spec.access_modes.as_deref().unwrap_or_default(),
        supports_single_node_multi_writer,
    )?;
    Ok(proto::VolumeCapability {
        access_type: Some(access_type),
        access_mode: Some(AccessMode { mode: mode as i32 }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::fixtures::*;
    use proto::volume_capability::{AccessType, BlockVolume, MountVolume};

    #[test]
    fn access_modes_map_to_one_csi_mode_with_and_without_single_node_multi_writer() {
        use AccessModeError as E;
        let rwop_err = "Kubernetes does not support use of ReadWriteOncePod with other access modes on the same PersistentVolume";
        let rox_rwo_err =
            "CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume";
        // (modes, without SNMW, with SNMW)
        type Want = std::result::Result<Mode, &'static str>;
        let cases: Vec<(&[&str], Want, Want)> = vec![
            (
                &["ReadWriteOncePod"],
                Ok(Mode::SingleNodeWriter),
                Ok(Mode::SingleNodeSingleWriter),
            ),
            (
                &["ReadWriteOncePod", "ReadWriteOncePod"],
                Ok(Mode::SingleNodeWriter),
                Ok(Mode::SingleNodeSingleWriter),
            ),
            (
                &["ReadWriteOncePod", "ReadWriteOnce"],
                Err(rwop_err),
                Err(rwop_err),
            ),
            (
                &["ReadWriteMany", "ReadWriteOncePod"],
                Err(rwop_err),
                Err(rwop_err),
            ),
            (
                &["ReadWriteMany"],
                Ok(Mode::MultiNodeMultiWriter),
                Ok(Mode::MultiNodeMultiWriter),
            ),
            (
                &["ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany"],
                Ok(Mode::MultiNodeMultiWriter),
                Ok(Mode::MultiNodeMultiWriter),
            ),
            (
                &["ReadOnlyMany", "ReadWriteOnce"],
                Err(rox_rwo_err),
                Err(rox_rwo_err),
            ),
            (
                &["ReadOnlyMany"],
                Ok(Mode::MultiNodeReaderOnly),
                Ok(Mode::MultiNodeReaderOnly),
            ),
            (
                &["ReadWriteOnce"],
                Ok(Mode::SingleNodeWriter),
                Ok(Mode::SingleNodeMultiWriter),
            ),
            (
                &["ReadWriteOnce", "ReadWriteOnce"],
                Ok(Mode::SingleNodeWriter),
                Ok(Mode::SingleNodeMultiWriter),
            ),
            (
                &[],
                Err("unsupported AccessMode combination: []"),
                Err("unsupported AccessMode combination: []"),
            ),
            (
                &["Foo", "Bar"],
                Err("unsupported AccessMode combination: [Foo Bar]"),
                Err("unsupported AccessMode combination: [Foo Bar]"),
            ),
        ];
        for (modes, without, with) in cases {
            let modes = strings(modes);
            for (snmw, want) in [(false, without), (true, with)] {
                let got = access_mode(&modes, snmw).map_err(|e: E| e.to_string());
                assert_eq!(got, want.map_err(str::to_owned), "{modes:?} snmw={snmw}");
            }
        }
    }

    #[test]
    fn volume_capabilities_are_block_or_mount_with_fstype_fallback() {
        let mount = |fs: &str, flags: &[&str]| {
            Some(AccessType::Mount(MountVolume {
                fs_type: fs.into(),
                mount_flags: strings(flags),
                ..MountVolume::default()
            }))
        };
        let spec = |mode: Option<&str>, fs: Option<&str>, opts: Option<&[&str]>| {
            let mut s = csi_spec(&["ReadWriteOnce"]);
            s.volume_mode = mode.map(Into::into);
            s.mount_options = opts.map(strings);
            if let Some(csi) = s.csi.as_mut() {
                csi.fs_type = fs.map(Into::into);
            }
            s
        };
        let cases = [
            (
                "block",
                spec(Some("Block"), Some("ext4"), None),
                "xfs",
                Some(AccessType::Block(BlockVolume {})),
            ),
            (
                "filesystem mode with fstype",
                spec(Some("Filesystem"), Some("ext4"), None),
                "xfs",
                mount("ext4", &[]),
            ),
            (
                "no mode, default fstype",
                spec(None, None, None),
                "xfs",
                mount("xfs", &[]),
            ),
            (
                "empty fstype uses the default",
                spec(None, Some(""), None),
                "xfs",
                mount("xfs", &[]),
            ),
            (
                "no fstype, no default",
                spec(None, None, None),
                "",
                mount("", &[]),
            ),
            (
                "mount options become flags",
                spec(None, Some("ext4"), Some(&["ro", "noatime"])),
                "",
                mount("ext4", &["ro", "noatime"]),
            ),
        ];
        for (name, spec, default_fs, want) in cases {
            let cap = volume_capability(&spec, default_fs, false).expect(name);
            assert_eq!(cap.access_type, want, "{name}");
            assert_eq!(
                cap.access_mode.map(|m| m.mode),
                Some(Mode::SingleNodeWriter as i32),
                "{name}"
            );
        }
        let cap = volume_capability(&csi_spec(&["ReadWriteOnce"]), "", true).expect("snmw");
        assert_eq!(
            cap.access_mode.map(|m| m.mode),
            Some(Mode::SingleNodeMultiWriter as i32)
        );
    }

    #[test]
    fn volume_capability_errors_are_the_spec_texts() {
        let mut no_csi = csi_spec(&["ReadWriteOnce"]);
        no_csi.csi = None;
        let cases = [
            (
                no_csi,
                "could not get volume capabilities, pvSpec.CSI is nil",
            ),
            (
                csi_spec(&["ReadOnlyMany", "ReadWriteOnce"]),
                "CSI does not support ReadOnlyMany and ReadWriteOnce on the same PersistentVolume",
            ),
            (csi_spec(&[]), "unsupported AccessMode combination: []"),
        ];
        for (spec, want) in cases {
            let err = volume_capability(&spec, "", false).expect_err(want);
            assert_eq!(err.to_string(), want);
        }
    }

    #[test]
    fn readonly_is_forwarded_only_with_publish_readonly() {
        let ro = |v: Option<bool>| CSIPersistentVolumeSource {
            read_only: v,
            ..CSIPersistentVolumeSource::default()
        };
        let cases = [
            (Some(true), true, true),
            (Some(true), false, false),
            (Some(false), true, false),
            (None, true, false),
        ];
        for (pv_ro, cap, want) in cases {
            assert_eq!(readonly(&ro(pv_ro), cap), want, "{pv_ro:?} {cap}");
        }
    }
}
