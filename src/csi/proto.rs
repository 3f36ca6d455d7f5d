//! The generated `csi.v1` types, clients and servers, fenced in one module.
//!
//! Messages that carry secrets (fields marked `csi_secret` in
//! `proto/csi.proto`) are generated without `Debug`; their `Debug` below
//! prints every field except the secrets, which show as `<redacted>` followed
//! by the number of entries. The list of such messages comes from the build.

#![allow(clippy::all, clippy::pedantic, missing_docs, unreachable_pub)]

use std::fmt;

tonic::include_proto!("csi.v1");

/// The kubelet's plugin registration API (`pluginregistration`), read by
/// discovery mode to learn drivers' names and sockets.
pub mod registration {
    tonic::include_proto!("pluginregistration");
}

/// Fully qualified names of the messages generated without `Debug` because
/// they carry a `csi_secret` field, one per line, sorted.
pub const SECRET_BEARING_MESSAGES: &str =
    include_str!(concat!(env!("OUT_DIR"), "/secret_bearing_messages.txt"));

/// Formats a secrets map without its keys or values.
struct Redacted(usize);

impl fmt::Debug for Redacted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "<redacted {} entries>", self.0)
    }
}

macro_rules! redacting_debug {
    ($ty:ident { $($field:ident),* $(,)? } secrets: $secrets:ident) => {
        impl fmt::Debug for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.debug_struct(stringify!($ty))
                    $(.field(stringify!($field), &self.$field))*
                    .field(stringify!($secrets), &Redacted(self.$secrets.len()))
                    .finish()
            }
        }
    };
}

redacting_debug!(CreateVolumeRequest {
    name, capacity_range, volume_capabilities, parameters, volume_content_source,
    accessibility_requirements, mutable_parameters,
} secrets: secrets);
redacting_debug!(DeleteVolumeRequest { volume_id } secrets: secrets);
redacting_debug!(ControllerPublishVolumeRequest {
    volume_id, node_id, volume_capability, readonly, volume_context,
} secrets: secrets);
redacting_debug!(ControllerUnpublishVolumeRequest { volume_id, node_id, reason } secrets: secrets);
redacting_debug!(ValidateVolumeCapabilitiesRequest {
    volume_id, volume_context, volume_capabilities, parameters, mutable_parameters,
} secrets: secrets);
redacting_debug!(ControllerListVolumeHealthRequest { max_entries, starting_token } secrets: secrets);
redacting_debug!(ControllerGetVolumeHealthRequest { volume_id } secrets: secrets);
redacting_debug!(NodeGetStorageHealthRequest {} secrets: secrets);
redacting_debug!(NodeStageVolumeRequest {
    volume_id, publish_context, staging_target_path, volume_capability, volume_context,
} secrets: secrets);
redacting_debug!(NodePublishVolumeRequest {
    volume_id, publish_context, staging_target_path, target_path, volume_capability,
    readonly, volume_context,
} secrets: secrets);

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &str = "s3cr3t-value-that-must-never-be-printed";

    fn secrets() -> std::collections::HashMap<String, String> {
        [("password".to_string(), SECRET.to_string())].into()
    }

    #[test]
    fn debug_of_every_secret_bearing_message_hides_the_secret() {
        let printed = [
            format!(
                "{:?}",
                CreateVolumeRequest {
                    secrets: secrets(),
                    ..Default::default()
                }
            ),
            format!(
                "{:?}",
                DeleteVolumeRequest {
                    secrets: secrets(),
                    ..Default::default()
                }
            ),
            format!(
                "{:#?}",
                ControllerPublishVolumeRequest {
                    volume_id: "v".into(),
                    secrets: secrets(),
                    ..Default::default()
                }
            ),
            format!(
                "{:?}",
                ControllerUnpublishVolumeRequest {
                    secrets: secrets(),
                    ..Default::default()
                }
            ),
            format!(
                "{:?}",
                ValidateVolumeCapabilitiesRequest {
                    secrets: secrets(),
                    ..Default::default()
                }
            ),
            format!(
                "{:?}",
                NodeStageVolumeRequest {
                    secrets: secrets(),
                    ..Default::default()
                }
            ),
            format!(
                "{:?}",
                NodePublishVolumeRequest {
                    secrets: secrets(),
                    ..Default::default()
                }
            ),
            format!(
                "{:?}",
                ControllerListVolumeHealthRequest {
                    secrets: secrets(),
                    ..Default::default()
                }
            ),
            format!(
                "{:?}",
                ControllerGetVolumeHealthRequest {
                    secrets: secrets(),
                    ..Default::default()
                }
            ),
            format!("{:?}", NodeGetStorageHealthRequest { secrets: secrets() }),
        ];
        for p in &printed {
            assert!(!p.contains(SECRET), "secret leaked: {p}");
            assert!(!p.contains("password"), "secret key leaked: {p}");
            assert!(p.contains("<redacted 1 entries>"), "{p}");
        }
        // Every message the build found with a csi_secret field is covered above.
        let covered = [
            "CreateVolumeRequest",
            "DeleteVolumeRequest",
            "ControllerPublishVolumeRequest",
            "ControllerUnpublishVolumeRequest",
            "ValidateVolumeCapabilitiesRequest",
            "NodeStageVolumeRequest",
            "NodePublishVolumeRequest",
            "ControllerListVolumeHealthRequest",
            "ControllerGetVolumeHealthRequest",
            "NodeGetStorageHealthRequest",
        ];
        let found: Vec<&str> = SECRET_BEARING_MESSAGES
            .lines()
            .map(|l| l.trim_start_matches(".csi.v1."))
            .collect();
        let mut expected = covered.to_vec();
        expected.sort();
        assert_eq!(found, expected);
    }
}
