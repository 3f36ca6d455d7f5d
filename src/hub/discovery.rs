//! [`Discovery`]: driver sockets found by a glob (`--driver-sockets`) and through the kubelet's
//! plugin registration directory (`--kubelet-registration-dir`).

use std::{
    collections::HashMap,
    path::{Path, PathBuf},
    sync::Arc,
};

use crate::{config::Settings, csi::Address};

/// Discovery of driver sockets: by a glob, and/or through the kubelet's
/// plugin registration directory.
#[derive(Clone)]
pub struct Discovery {
    /// The glob, e.g. `/var/lib/kubelet/plugins/*/csi.sock`.
    pub pattern: Option<String>,
    /// The kubelet's plugin registration directory, e.g.
    /// `/var/lib/kubelet/plugins_registry`: every `CSIPlugin` registered there
    /// is a driver, at the endpoint and with the name it registered.
    pub registration_dir: Option<PathBuf>,
    /// Settings of a discovered socket (the flags' defaults).
    pub settings_for: Arc<dyn Fn(Address) -> Settings + Send + Sync>,
}

impl std::fmt::Debug for Discovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Discovery")
            .field("pattern", &self.pattern)
            .field("registration_dir", &self.registration_dir)
            .finish_non_exhaustive()
    }
}

impl Discovery {
    /// The sockets matching the glob now, as driver settings.
    fn scan_glob(&self) -> Vec<Settings> {
        let Some(pattern) = &self.pattern else {
            return Vec::new();
        };
        let paths = match glob::glob(pattern) {
            Ok(paths) => paths,
            Err(error) => {
                tracing::warn!(%pattern, %error, "invalid driver socket glob");
                return Vec::new();
            }
        };
        paths
            .filter_map(Result::ok)
            .filter(|p| is_socket(p))
            .filter_map(|p| p.to_str().and_then(|s| s.parse::<Address>().ok()))
            .map(|a| (self.settings_for)(a))
            .collect()
    }

    /// The CSI plugins registered in the registration directory now.
    async fn scan_registrations(
        &self,
        known: &mut HashMap<PathBuf, Option<Settings>>,
    ) -> Vec<Settings> {
        let Some(dir) = &self.registration_dir else {
            return Vec::new();
        };
        let sockets: Vec<PathBuf> = match std::fs::read_dir(dir) {
            Ok(entries) => entries
                .filter_map(Result::ok)
                .map(|e| e.path())
                .filter(|p| is_socket(p))
                .collect(),
            Err(error) => {
                tracing::debug!(dir = %dir.display(), %error, "cannot read the plugin registration directory");
                Vec::new()
            }
        };
        known.retain(|path, _| sockets.contains(path));
        let mut found = Vec::new();
        for socket in sockets {
            if let Some(known) = known.get(&socket) {
                found.extend(known.clone());
                continue;
            }
            let settings = match crate::csi::registration::plugin_info(&socket).await {
                Ok(info) if info.r#type == crate::csi::registration::CSI_PLUGIN_TYPE => {
                    match info.endpoint.parse::<Address>() {
                        Ok(address) => {
                            tracing::info!(registration = %socket.display(), driver = %info.name, endpoint = %info.endpoint, "found a registered CSI plugin");
                            let mut s = (self.settings_for)(address);
                            s.expected_name = Some(info.name).filter(|n| !n.is_empty());
                            Some(s)
                        }
                        Err(error) => {
                            tracing::warn!(registration = %socket.display(), %error, "registered CSI plugin has an unusable endpoint");
                            None
                        }
                    }
                }
                Ok(info) => {
                    tracing::debug!(registration = %socket.display(), kind = %info.r#type, "not a CSI plugin");
                    None
                }
                Err(error) => {
                    // Not cached: asked again on the next scan.
                    tracing::debug!(%error, "reading a plugin registration failed");
                    continue;
                }
            };
            found.extend(settings.clone());
            known.insert(socket, settings);
        }
        found
    }

    /// Everything discovered now, sorted by socket, without duplicates.
    pub(crate) async fn scan(
        &self,
        known: &mut HashMap<PathBuf, Option<Settings>>,
    ) -> Vec<Settings> {
        let mut found = self.scan_registrations(known).await;
        for s in self.scan_glob() {
            if !found.iter().any(|f| f.address == s.address) {
                found.push(s);
            }
        }
        found.sort_by(|a, b| a.address.path().cmp(b.address.path()));
        found
    }
}

fn is_socket(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_socket())
}
