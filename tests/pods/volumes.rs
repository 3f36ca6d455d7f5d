//! A pod's volumes on the node, as the kubelet lays them out.
//!
//! * `hostPath`: the path under the node's own root directory (each emulated node has one), so
//!   that two nodes do not share what two machines would not; `DirectoryOrCreate` makes the
//!   directory, `Directory` and `Socket` must exist.
//! * `emptyDir`: a directory of the pod, mode 0777 (memory-backed ones too: no size limit).
//! * `configMap`, `secret`, `downwardAPI`, `projected`: files written the kubelet's way, in a
//!   timestamped directory that a `..data` symbolic link points to, each key a link through
//!   `..data`; an update writes a new directory and swaps the link in one rename, which is what
//!   programs that watch a ConfigMap mount (attacher-hub's reload) see in a cluster. The runner
//!   re-reads them every second (the kubelet's sync period is about a minute).
//! * the ServiceAccount token: a token from the TokenRequest API bound to the pod (one hour),
//!   the cluster's CA and the namespace, at `/var/run/secrets/kubernetes.io/serviceaccount`
//!   in every container unless the pod opts out (the ServiceAccount admission plugin that adds
//!   that volume in a cluster is off in the test control plane, so the runner adds it).
//!
//! With a pod `fsGroup`, the volumes the kubelet manages (all but `hostPath`) belong to that
//! group, directories with the set-group-ID bit, as the kubelet's ownership management does.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, KeyToPath, Pod, Secret, ServiceAccount, Volume};
use kube::api::PostParams;
use kube::{Api, Client};

use super::plan::{Context, HostVolume};

/// The files of a kubelet-managed volume: relative path -> (content, mode).
pub(crate) type Files = BTreeMap<String, (Vec<u8>, u32)>;

/// Where one volume's files come from.
#[derive(Clone, Debug)]
pub(crate) enum Source {
    /// A directory or file used as it is (hostPath, emptyDir).
    Plain,
    /// Files written the kubelet's way and refreshed (configMap, secret, projected, downward API).
    Managed(Vec<Part>),
}

/// One source of files of a managed volume.
#[derive(Clone, Debug)]
pub(crate) enum Part {
    ConfigMap {
        name: String,
        items: Option<Vec<KeyToPath>>,
        optional: bool,
        mode: u32,
    },
    Secret {
        name: String,
        items: Option<Vec<KeyToPath>>,
        optional: bool,
        mode: u32,
    },
    Token {
        path: String,
        expiration: i64,
        audience: Option<String>,
        mode: u32,
    },
    /// A downward API file: path, field path.
    Field {
        path: String,
        field: String,
        mode: u32,
    },
    /// The cluster's CA bundle (the `kube-root-ca.crt` ConfigMap's `ca.crt` in a cluster).
    Ca { path: String, mode: u32 },
}

/// A pod's volumes: where each is on the host and how to refresh it.
#[derive(Debug, Default)]
pub(crate) struct PodVolumes {
    pub(crate) host: BTreeMap<String, HostVolume>,
    pub(crate) managed: BTreeMap<String, Vec<Part>>,
    pub(crate) fs_group: Option<u32>,
}

/// The name of the volume the runner adds for the ServiceAccount token.
pub(crate) const TOKEN_VOLUME: &str = "kube-api-access";

/// Lays out the volumes of `pod` under `pod_dir` (hostPaths under `node_root`).
pub(crate) fn layout(pod: &Pod, node_root: &Path, pod_dir: &Path) -> Result<PodVolumes, String> {
    let spec = pod.spec.as_ref().ok_or("pod without spec")?;
    let fs_group = spec
        .security_context
        .as_ref()
        .and_then(|s| s.fs_group)
        .map(|g| u32::try_from(g).map_err(|_| format!("fsGroup {g} is not a valid id")))
        .transpose()?;
    let mut out = PodVolumes {
        fs_group,
        ..PodVolumes::default()
    };
    for volume in spec.volumes.iter().flatten() {
        let dir = pod_dir.join("volumes").join(&volume.name);
        let (path, read_only, parts) = source(volume, node_root, &dir)?;
        if let Some(parts) = parts {
            out.managed.insert(volume.name.clone(), parts);
        }
        out.host
            .insert(volume.name.clone(), HostVolume { path, read_only });
    }
    if spec.automount_service_account_token != Some(false) {
        let dir = pod_dir.join("volumes").join(TOKEN_VOLUME);
        out.managed.insert(
            TOKEN_VOLUME.to_string(),
            vec![
                Part::Token {
                    path: "token".into(),
                    expiration: 3607,
                    audience: None,
                    mode: 0o644,
                },
                Part::Ca {
                    path: "ca.crt".into(),
                    mode: 0o644,
                },
                Part::Field {
                    path: "namespace".into(),
                    field: "metadata.namespace".into(),
                    mode: 0o644,
                },
            ],
        );
        out.host.insert(
            TOKEN_VOLUME.to_string(),
            HostVolume {
                path: dir,
                read_only: true,
            },
        );
    }
    Ok(out)
}

fn mode(m: Option<i32>) -> u32 {
    m.and_then(|m| u32::try_from(m).ok()).unwrap_or(0o644)
}

/// Where `volume` lives and, for managed ones, its parts.
fn source(
    volume: &Volume,
    node_root: &Path,
    dir: &Path,
) -> Result<(PathBuf, bool, Option<Vec<Part>>), String> {
    if let Some(host) = &volume.host_path {
        let path = node_root.join(host.path.trim_start_matches('/'));
        match host.type_.as_deref().unwrap_or("") {
            "DirectoryOrCreate" => std::fs::create_dir_all(&path)
                .map_err(|e| format!("hostPath {}: {e}", host.path))?,
            "Directory" if !path.is_dir() => {
                return Err(format!(
                    "hostPath type check failed: {} is not a directory",
                    host.path
                ));
            }
            "Socket" | "File" | "FileOrCreate" | "CharDevice" | "BlockDevice" if !path.exists() => {
                return Err(format!(
                    "hostPath type check failed: {} does not exist",
                    host.path
                ));
            }
            _ => {}
        }
        return Ok((path, false, None));
    }
    if volume.empty_dir.is_some() {
        std::fs::create_dir_all(dir).map_err(|e| format!("emptyDir {}: {e}", volume.name))?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777))
            .map_err(|e| format!("emptyDir {}: {e}", volume.name))?;
        return Ok((dir.to_path_buf(), false, None));
    }
    let parts = if let Some(cm) = &volume.config_map {
        vec![Part::ConfigMap {
            name: cm.name.clone(),
            items: cm.items.clone(),
            optional: cm.optional == Some(true),
            mode: mode(cm.default_mode),
        }]
    } else if let Some(s) = &volume.secret {
        vec![Part::Secret {
            name: s.secret_name.clone().unwrap_or_default(),
            items: s.items.clone(),
            optional: s.optional == Some(true),
            mode: mode(s.default_mode),
        }]
    } else if let Some(d) = &volume.downward_api {
        d.items
            .iter()
            .flatten()
            .filter_map(|i| {
                Some(Part::Field {
                    path: i.path.clone(),
                    field: i.field_ref.as_ref()?.field_path.clone(),
                    mode: mode(i.mode.or(d.default_mode)),
                })
            })
            .collect()
    } else if let Some(p) = &volume.projected {
        let default = p.default_mode;
        let mut parts = Vec::new();
        for s in p.sources.iter().flatten() {
            if let Some(t) = &s.service_account_token {
                parts.push(Part::Token {
                    path: t.path.clone(),
                    expiration: t.expiration_seconds.unwrap_or(3600),
                    audience: t.audience.clone(),
                    mode: mode(default),
                });
            } else if let Some(cm) = &s.config_map {
                if cm.name == "kube-root-ca.crt" {
                    parts.push(Part::Ca {
                        path: cm
                            .items
                            .iter()
                            .flatten()
                            .next()
                            .map_or("ca.crt".into(), |i| i.path.clone()),
                        mode: mode(default),
                    });
                } else {
                    parts.push(Part::ConfigMap {
                        name: cm.name.clone(),
                        items: cm.items.clone(),
                        optional: cm.optional == Some(true),
                        mode: mode(default),
                    });
                }
            } else if let Some(sec) = &s.secret {
                parts.push(Part::Secret {
                    name: sec.name.clone(),
                    items: sec.items.clone(),
                    optional: sec.optional == Some(true),
                    mode: mode(default),
                });
            } else if let Some(d) = &s.downward_api {
                for i in d.items.iter().flatten() {
                    if let Some(f) = &i.field_ref {
                        parts.push(Part::Field {
                            path: i.path.clone(),
                            field: f.field_path.clone(),
                            mode: mode(i.mode.or(default)),
                        });
                    }
                }
            }
        }
        parts
    } else {
        return Err(format!(
            "volume {}: only hostPath, emptyDir, configMap, secret, downwardAPI and projected \
             volumes run here",
            volume.name
        ));
    };
    Ok((dir.to_path_buf(), true, Some(parts)))
}

/// The files of a managed volume now: its ConfigMaps and Secrets read from the API server,
/// its token requested (only when `token` is `None`; the caller keeps the one it has).
pub(crate) async fn files(
    client: &Client,
    pod: &Pod,
    parts: &[Part],
    ctx: &Context,
    ca: &[u8],
    token: &mut Option<Vec<u8>>,
) -> Result<Files, String> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let mut files = Files::new();
    let select = |data: BTreeMap<String, Vec<u8>>,
                  items: &Option<Vec<KeyToPath>>,
                  mode: u32,
                  files: &mut Files,
                  what: &str|
     -> Result<(), String> {
        match items {
            None => {
                for (k, v) in data {
                    files.insert(k, (v, mode));
                }
            }
            Some(items) => {
                for item in items {
                    let v = data
                        .get(&item.key)
                        .ok_or_else(|| format!("{what}: no key {}", item.key))?;
                    let m = item
                        .mode
                        .and_then(|m| u32::try_from(m).ok())
                        .unwrap_or(mode);
                    files.insert(item.path.clone(), (v.clone(), m));
                }
            }
        }
        Ok(())
    };
    for part in parts {
        match part {
            Part::ConfigMap {
                name,
                items,
                optional,
                mode,
            } => {
                let api: Api<ConfigMap> = Api::namespaced(client.clone(), &ns);
                match api
                    .get_opt(name)
                    .await
                    .map_err(|e| format!("configmap {name}: {e}"))?
                {
                    None if *optional => {}
                    None => return Err(format!("configmap \"{name}\" not found")),
                    Some(cm) => {
                        let mut data: BTreeMap<String, Vec<u8>> = cm
                            .data
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (k, v.into_bytes()))
                            .collect();
                        for (k, v) in cm.binary_data.unwrap_or_default() {
                            data.insert(k, v.0);
                        }
                        select(data, items, *mode, &mut files, &format!("configmap {name}"))?;
                    }
                }
            }
            Part::Secret {
                name,
                items,
                optional,
                mode,
            } => {
                let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
                match api
                    .get_opt(name)
                    .await
                    .map_err(|e| format!("secret {name}: {e}"))?
                {
                    None if *optional => {}
                    None => return Err(format!("secret \"{name}\" not found")),
                    Some(s) => {
                        let mut data: BTreeMap<String, Vec<u8>> = s
                            .data
                            .unwrap_or_default()
                            .into_iter()
                            .map(|(k, v)| (k, v.0))
                            .collect();
                        for (k, v) in s.string_data.unwrap_or_default() {
                            data.insert(k, v.into_bytes());
                        }
                        select(data, items, *mode, &mut files, &format!("secret {name}"))?;
                    }
                }
            }
            Part::Token {
                path,
                expiration,
                audience,
                mode,
            } => {
                if token.is_none() {
                    *token = Some(request_token(client, pod, *expiration, audience.clone()).await?);
                }
                files.insert(path.clone(), (token.clone().unwrap_or_default(), *mode));
            }
            Part::Field { path, field, mode } => {
                let v = super::plan::field_value(pod, field, ctx)?;
                files.insert(path.clone(), (v.into_bytes(), *mode));
            }
            Part::Ca { path, mode } => {
                files.insert(path.clone(), (ca.to_vec(), *mode));
            }
        }
    }
    Ok(files)
}

/// A token of the pod's ServiceAccount, bound to the pod, from the TokenRequest API.
async fn request_token(
    client: &Client,
    pod: &Pod,
    expiration: i64,
    audience: Option<String>,
) -> Result<Vec<u8>, String> {
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let api: Api<ServiceAccount> = Api::namespaced(client.clone(), &ns);
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            attestations: None,
            audiences: audience.map(|a| vec![a]),
            expiration_seconds: Some(expiration),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
        }),
        ..TokenRequest::default()
    };
    let answer = api
        .create_token_request(&sa, &PostParams::default(), &request)
        .await
        .map_err(|e| format!("token of serviceaccount {ns}/{sa}: {e}"))?;
    Ok(answer
        .status
        .and_then(|s| s.token)
        .map(String::into_bytes)
        .unwrap_or_default())
}

/// Writes `files` into `dir` the kubelet's way (see the module's documentation); returns
/// whether anything changed. `group` owns what it writes, as `fsGroup` asks.
pub(crate) fn write_atomic(dir: &Path, files: &Files, group: Option<u32>) -> std::io::Result<bool> {
    std::fs::create_dir_all(dir)?;
    let data = dir.join("..data");
    if let Ok(current) = std::fs::read_link(&data) {
        let current = dir.join(current);
        let same = read_tree(&current)? == *files;
        if same {
            return Ok(false);
        }
    }
    let stamp = format!(
        "..{}",
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default()
    );
    let fresh = dir.join(&stamp);
    std::fs::create_dir_all(&fresh)?;
    for (rel, (content, mode)) in files {
        let path = fresh.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, content)?;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(*mode))?;
    }
    if let Some(g) = group {
        chgrp_tree(&fresh, g)?;
        chgrp_tree(dir, g)?;
    }
    let old = std::fs::read_link(&data).ok();
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&stamp, &tmp)?;
    std::fs::rename(&tmp, &data)?;
    // Top-level names through ..data; names gone from the new set removed.
    let top: std::collections::BTreeSet<String> = files
        .keys()
        .filter_map(|k| k.split('/').next().map(str::to_string))
        .collect();
    for name in &top {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("..data").join(name), &link)?;
        }
    }
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("..") && !top.contains(&name) {
            let _ = std::fs::remove_file(entry.path());
        }
    }
    if let Some(old) = old {
        let _ = std::fs::remove_dir_all(dir.join(old));
    }
    Ok(true)
}

fn chgrp_tree(path: &Path, group: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(path, None, Some(group))?;
    let meta = std::fs::symlink_metadata(path)?;
    if meta.is_dir() {
        let mode = meta.permissions().mode() | 0o2070;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
        for entry in std::fs::read_dir(path)? {
            chgrp_tree(&entry?.path(), group)?;
        }
    } else if meta.is_file() {
        let mode = meta.permissions().mode() | 0o040;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    }
    Ok(())
}

fn read_tree(dir: &Path) -> std::io::Result<Files> {
    let mut out = Files::new();
    fn walk(base: &Path, dir: &Path, out: &mut Files) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            let path = entry.path();
            if entry.file_type()?.is_dir() {
                walk(base, &path, out)?;
            } else {
                let rel = path
                    .strip_prefix(base)
                    .map_err(std::io::Error::other)?
                    .to_string_lossy()
                    .into_owned();
                let mode = entry.metadata()?.permissions().mode() & 0o777;
                out.insert(rel, (std::fs::read(&path)?, mode));
            }
        }
        Ok(())
    }
    walk(dir, dir, &mut out)?;
    Ok(out)
}

#[test]
fn an_update_swaps_the_data_link_and_drops_removed_keys() {
    let dir = tempfile::tempdir().expect("temp dir");
    let mut files = Files::new();
    files.insert("drivers.yaml".into(), (b"a".to_vec(), 0o644));
    files.insert("old".into(), (b"x".to_vec(), 0o644));
    assert!(write_atomic(dir.path(), &files, None).unwrap());
    assert!(
        !write_atomic(dir.path(), &files, None).unwrap(),
        "unchanged"
    );
    let first = std::fs::read_link(dir.path().join("..data")).unwrap();
    assert_eq!(
        std::fs::read_link(dir.path().join("drivers.yaml")).unwrap(),
        Path::new("..data/drivers.yaml")
    );
    files.remove("old");
    files.insert("drivers.yaml".into(), (b"b".to_vec(), 0o644));
    assert!(write_atomic(dir.path(), &files, None).unwrap());
    let second = std::fs::read_link(dir.path().join("..data")).unwrap();
    assert_ne!(first, second);
    assert_eq!(
        std::fs::read(dir.path().join("drivers.yaml")).unwrap(),
        b"b"
    );
    assert!(!dir.path().join("old").exists());
    assert!(
        !dir.path().join(first).exists(),
        "the old data directory is removed"
    );
}
