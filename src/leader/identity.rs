//! Who competes and where: the default holder identity and the Lease namespace.

use std::path::Path;

use super::error::{Error, Result};
use crate::names::sanitize_driver_name;

/// Namespace of the pod, written by the kubelet into every service-account volume.
const SERVICE_ACCOUNT_NAMESPACE_FILE: &str =
    "/var/run/secrets/kubernetes.io/serviceaccount/namespace";

/// The default identity: the host name (the pod name in a pod), sanitized like a driver name,
/// as external-attacher does.
pub fn default_identity() -> Result<String> {
    let host = hostname::get().map_err(Error::Hostname)?;
    Ok(sanitize_driver_name(&host.to_string_lossy()))
}

/// The Lease namespace: `flag` if non-empty, else `$POD_NAMESPACE` if non-empty, else the
/// trimmed service-account namespace file if non-empty, else `default`: the order
/// external-attacher resolves `--leader-election-namespace` in.
pub fn resolve_namespace(flag: Option<&str>) -> String {
    resolve_namespace_from(
        flag,
        std::env::var("POD_NAMESPACE").ok().as_deref(),
        Path::new(SERVICE_ACCOUNT_NAMESPACE_FILE),
    )
}

/// [`resolve_namespace`] with its environment passed in.
fn resolve_namespace_from(flag: Option<&str>, env: Option<&str>, file: &Path) -> String {
    if let Some(ns) = flag.filter(|ns| !ns.is_empty()) {
        return ns.to_string();
    }
    if let Some(ns) = env.filter(|ns| !ns.is_empty()) {
        return ns.to_string();
    }
    if let Ok(text) = std::fs::read_to_string(file) {
        let ns = text.trim();
        if !ns.is_empty() {
            return ns.to_string();
        }
    }
    "default".to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_identity_is_sanitized_host_name() {
        let id = default_identity().expect("host name");
        assert!(!id.is_empty());
        assert!(id.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
    }

    #[test]
    fn namespace_resolution_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("namespace");
        let missing = dir.path().join("missing");
        assert_eq!(
            resolve_namespace_from(Some("flag"), Some("env"), &file),
            "flag"
        );
        assert_eq!(resolve_namespace_from(Some(""), Some("env"), &file), "env");
        std::fs::write(&file, "  sa-ns\n").expect("write");
        assert_eq!(resolve_namespace_from(None, Some(""), &file), "sa-ns");
        assert_eq!(resolve_namespace_from(None, None, &missing), "default");
        std::fs::write(&file, " \n").expect("write");
        assert_eq!(resolve_namespace_from(None, None, &file), "default");
    }
}
