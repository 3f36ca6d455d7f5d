//! From a Pod's container to the command line that runs it, as a node would: pure functions,
//! unit-tested below.
//!
//! A container runs under bubblewrap (`bwrap`, Debian's package), which gives it its own mount,
//! PID, UTS and IPC namespaces, a root directory laid out as its image lays it out (the image's
//! files, the host's `/usr` read-only for the shared libraries a distroless base image carries),
//! its volumes at their container paths, the pod's host name and a clean environment. The pod's
//! network namespace (one per pod, shared by its containers, as in Kubernetes) is entered with
//! `nsenter`. Inside the sandbox, util-linux's `setpriv` sets the user, group and supplementary
//! groups, the capability bounding set and `no_new_privs` from the securityContext, then
//! executes the image's entrypoint, which stays PID 1 of its PID namespace as in a container
//! (so a program without a SIGTERM handler ignores SIGTERM there, as it would in a pod).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use k8s_openapi::api::core::v1::{Container, Pod, PodSecurityContext, SecurityContext};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use super::image::Image;

/// The capabilities a container runtime (containerd, CRI-O) grants a container that asks for
/// none: its default set.
pub(crate) const DEFAULT_CAPABILITIES: [&str; 14] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "FSETID",
    "FOWNER",
    "MKNOD",
    "NET_RAW",
    "SETGID",
    "SETUID",
    "SETFCAP",
    "SETPCAP",
    "NET_BIND_SERVICE",
    "SYS_CHROOT",
    "KILL",
    "AUDIT_WRITE",
];

/// Where the ServiceAccount token, the cluster CA and the namespace are mounted.
pub(crate) const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

/// A volume of the pod, ready on the host.
#[derive(Clone, Debug)]
pub(crate) struct HostVolume {
    /// Its directory (or file) on the host.
    pub(crate) path: PathBuf,
    /// Whether its source is read-only whatever the mount says (ConfigMap, Secret, projected).
    pub(crate) read_only: bool,
}

/// What the node knows when it starts a container.
#[derive(Clone, Debug, Default)]
pub(crate) struct Context {
    /// The node's name.
    pub(crate) node: String,
    /// The pod's IP address (reported in its status and in `status.podIP`).
    pub(crate) pod_ip: String,
    /// The node's IP address.
    pub(crate) host_ip: String,
    /// The API server's address as the pod sees it (`KUBERNETES_SERVICE_HOST` and port).
    pub(crate) api_host: String,
    /// See [`Context::api_host`].
    pub(crate) api_port: u16,
    /// The pod's volumes, by name; `kube-api-access` is the ServiceAccount token volume.
    pub(crate) volumes: BTreeMap<String, HostVolume>,
    /// The pod's network namespace (none: the host's).
    pub(crate) netns: Option<PathBuf>,
    /// The container's root directory (its image's layout, mount points made by the caller).
    pub(crate) root: PathBuf,
    /// ConfigMaps and Secrets of the namespace the environment refers to: name -> data.
    pub(crate) config_maps: BTreeMap<String, BTreeMap<String, String>>,
    /// See [`Context::config_maps`].
    pub(crate) secrets: BTreeMap<String, BTreeMap<String, String>>,
}

/// How to run one container.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Plan {
    /// The whole command line, `nsenter` or `bwrap` first.
    pub(crate) argv: Vec<String>,
    /// Directories to make in the root before the start (mount points of directories).
    pub(crate) dirs: Vec<String>,
    /// Files to make in the root before the start (mount points of single files).
    pub(crate) files: Vec<String>,
    /// The user and group the program runs as.
    pub(crate) uid: u32,
    /// See [`Plan::uid`].
    pub(crate) gid: u32,
    /// The environment the program gets.
    pub(crate) env: BTreeMap<String, String>,
}

/// The identity and privileges a container gets from its pod's and its own securityContext
/// and its image.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) uid: u32,
    pub(crate) gid: u32,
    /// Supplementary groups: the pod's `supplementalGroups` and `fsGroup`.
    pub(crate) groups: BTreeSet<u32>,
    /// The capability bounding set (names as in capabilities(7) without `CAP_`).
    pub(crate) capabilities: BTreeSet<String>,
    /// `allowPrivilegeEscalation: false`.
    pub(crate) no_new_privs: bool,
    /// `readOnlyRootFilesystem: true`.
    pub(crate) read_only_root: bool,
}

/// The identity of `container`, or the kubelet's refusal to start it.
pub(crate) fn identity(
    pod: &Pod,
    container: &Container,
    image: &Image,
) -> Result<Identity, String> {
    let none_pod = PodSecurityContext::default();
    let none = SecurityContext::default();
    let spec = pod.spec.as_ref().ok_or("pod without spec")?;
    let psc = spec.security_context.as_ref().unwrap_or(&none_pod);
    let sc = container.security_context.as_ref().unwrap_or(&none);
    let to_u32 =
        |v: i64, what: &str| u32::try_from(v).map_err(|_| format!("{what} {v} is not a valid id"));
    let uid = match sc.run_as_user.or(psc.run_as_user) {
        Some(u) => to_u32(u, "runAsUser")?,
        None => image.user.map_or(0, |(u, _)| u),
    };
    let gid = match sc.run_as_group.or(psc.run_as_group) {
        Some(g) => to_u32(g, "runAsGroup")?,
        None if sc.run_as_user.or(psc.run_as_user).is_none() => image.user.map_or(0, |(_, g)| g),
        None => 0,
    };
    let non_root = sc.run_as_non_root.or(psc.run_as_non_root).unwrap_or(false);
    if non_root && uid == 0 {
        return Err(format!(
            "container has runAsNonRoot and image will run as root (pod: {}, container: {})",
            pod.metadata.name.as_deref().unwrap_or_default(),
            container.name
        ));
    }
    let mut groups: BTreeSet<u32> = BTreeSet::new();
    for g in psc.supplemental_groups.iter().flatten() {
        groups.insert(to_u32(*g, "supplementalGroups")?);
    }
    if let Some(g) = psc.fs_group {
        groups.insert(to_u32(g, "fsGroup")?);
    }
    let mut capabilities: BTreeSet<String> = if sc.privileged == Some(true) {
        ALL_CAPABILITIES.iter().map(|c| c.to_string()).collect()
    } else {
        DEFAULT_CAPABILITIES.iter().map(|c| c.to_string()).collect()
    };
    if let Some(caps) = &sc.capabilities {
        for drop in caps.drop.iter().flatten() {
            let drop = drop.trim_start_matches("CAP_").to_ascii_uppercase();
            if drop == "ALL" {
                capabilities.clear();
            } else {
                capabilities.remove(&drop);
            }
        }
        for add in caps.add.iter().flatten() {
            let add = add.trim_start_matches("CAP_").to_ascii_uppercase();
            if add == "ALL" {
                capabilities.extend(ALL_CAPABILITIES.iter().map(|c| c.to_string()));
            } else {
                capabilities.insert(add);
            }
        }
    }
    Ok(Identity {
        uid,
        gid,
        groups,
        capabilities,
        no_new_privs: sc.allow_privilege_escalation == Some(false),
        read_only_root: sc.read_only_root_filesystem == Some(true),
    })
}

/// Every capability of Linux 6 (for `privileged` and `add: [ALL]`).
const ALL_CAPABILITIES: [&str; 41] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "DAC_READ_SEARCH",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "SETPCAP",
    "LINUX_IMMUTABLE",
    "NET_BIND_SERVICE",
    "NET_BROADCAST",
    "NET_ADMIN",
    "NET_RAW",
    "IPC_LOCK",
    "IPC_OWNER",
    "SYS_MODULE",
    "SYS_RAWIO",
    "SYS_CHROOT",
    "SYS_PTRACE",
    "SYS_PACCT",
    "SYS_ADMIN",
    "SYS_BOOT",
    "SYS_NICE",
    "SYS_RESOURCE",
    "SYS_TIME",
    "SYS_TTY_CONFIG",
    "MKNOD",
    "LEASE",
    "AUDIT_WRITE",
    "AUDIT_CONTROL",
    "SETFCAP",
    "MAC_OVERRIDE",
    "MAC_ADMIN",
    "SYSLOG",
    "WAKE_ALARM",
    "BLOCK_SUSPEND",
    "AUDIT_READ",
    "PERFMON",
    "BPF",
    "CHECKPOINT_RESTORE",
];

/// The environment of `container`: the in-cluster variables, `envFrom`, then `env` (later
/// ones win, `$(NAME)` in values refers to the ones before), as the kubelet builds it.
pub(crate) fn environment(
    pod: &Pod,
    container: &Container,
    ctx: &Context,
) -> Result<BTreeMap<String, String>, String> {
    let mut env = BTreeMap::new();
    env.insert(
        "PATH".to_string(),
        "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
    );
    let spec = pod.spec.as_ref().ok_or("pod without spec")?;
    let host_network = spec.host_network == Some(true);
    env.insert(
        "HOSTNAME".to_string(),
        if host_network {
            ctx.node.clone()
        } else {
            pod.metadata.name.clone().unwrap_or_default()
        },
    );
    let port = ctx.api_port.to_string();
    for (k, v) in [
        ("KUBERNETES_SERVICE_HOST", ctx.api_host.clone()),
        ("KUBERNETES_SERVICE_PORT", port.clone()),
        ("KUBERNETES_SERVICE_PORT_HTTPS", port.clone()),
        ("KUBERNETES_PORT", format!("tcp://{}:{port}", ctx.api_host)),
    ] {
        env.insert(k.to_string(), v);
    }
    let lookup = |maps: &BTreeMap<String, BTreeMap<String, String>>,
                  kind: &str,
                  name: &str,
                  key: Option<&str>,
                  optional: bool|
     -> Result<Option<Vec<(String, String)>>, String> {
        match (maps.get(name), key) {
            (None, _) if optional => Ok(None),
            (None, _) => Err(format!("{kind} \"{name}\" not found")),
            (Some(data), Some(key)) => match data.get(key) {
                Some(v) => Ok(Some(vec![(key.to_string(), v.clone())])),
                None if optional => Ok(None),
                None => Err(format!("couldn't find key {key} in {kind} {name}")),
            },
            (Some(data), None) => Ok(Some(
                data.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            )),
        }
    };
    for from in container.env_from.iter().flatten() {
        let prefix = from.prefix.clone().unwrap_or_default();
        let found = if let Some(cm) = &from.config_map_ref {
            lookup(
                &ctx.config_maps,
                "configmap",
                &cm.name,
                None,
                cm.optional == Some(true),
            )?
        } else if let Some(s) = &from.secret_ref {
            lookup(
                &ctx.secrets,
                "secret",
                &s.name,
                None,
                s.optional == Some(true),
            )?
        } else {
            None
        };
        for (k, v) in found.into_iter().flatten() {
            env.insert(format!("{prefix}{k}"), v);
        }
    }
    for var in container.env.iter().flatten() {
        let value = match (&var.value, &var.value_from) {
            (Some(v), _) => Some(expand(v, &env)),
            (None, Some(from)) => {
                if let Some(field) = &from.field_ref {
                    Some(field_value(pod, &field.field_path, ctx)?)
                } else if let Some(r) = &from.config_map_key_ref {
                    lookup(
                        &ctx.config_maps,
                        "configmap",
                        &r.name,
                        Some(&r.key),
                        r.optional == Some(true),
                    )?
                    .map(|mut v| v.remove(0).1)
                } else if let Some(r) = &from.secret_key_ref {
                    lookup(
                        &ctx.secrets,
                        "secret",
                        &r.name,
                        Some(&r.key),
                        r.optional == Some(true),
                    )?
                    .map(|mut v| v.remove(0).1)
                } else if from.resource_field_ref.is_some() {
                    // Limits are not enforced here; report none, as a node without limits would.
                    Some("0".to_string())
                } else {
                    None
                }
            }
            (None, None) => Some(String::new()),
        };
        if let Some(value) = value {
            env.insert(var.name.clone(), value);
        }
    }
    Ok(env)
}

/// A downward API field of the pod.
pub(crate) fn field_value(pod: &Pod, path: &str, ctx: &Context) -> Result<String, String> {
    let meta = &pod.metadata;
    let spec = pod.spec.as_ref().ok_or("pod without spec")?;
    let keyed = |map: &Option<BTreeMap<String, String>>, rest: &str| {
        let key = rest
            .strip_prefix("['")
            .and_then(|r| r.strip_suffix("']"))
            .unwrap_or(rest);
        map.as_ref()
            .and_then(|m| m.get(key))
            .cloned()
            .unwrap_or_default()
    };
    Ok(match path {
        "metadata.name" => meta.name.clone().unwrap_or_default(),
        "metadata.namespace" => meta.namespace.clone().unwrap_or_default(),
        "metadata.uid" => meta.uid.clone().unwrap_or_default(),
        "spec.nodeName" => ctx.node.clone(),
        "spec.serviceAccountName" => spec.service_account_name.clone().unwrap_or_default(),
        "status.podIP" | "status.podIPs" => ctx.pod_ip.clone(),
        "status.hostIP" | "status.hostIPs" => ctx.host_ip.clone(),
        p if p.starts_with("metadata.labels") => keyed(&meta.labels, &p["metadata.labels".len()..]),
        p if p.starts_with("metadata.annotations") => {
            keyed(&meta.annotations, &p["metadata.annotations".len()..])
        }
        other => return Err(format!("unsupported fieldRef {other}")),
    })
}

/// `$(NAME)` replaced by `env[NAME]` when defined (left as written otherwise), `$$` by `$`:
/// the kubelet's expansion of command, args and env values.
pub(crate) fn expand(text: &str, env: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(inner) = after.strip_prefix('(')
            && let Some(end) = inner.find(')')
        {
            let name = &inner[..end];
            match env.get(name) {
                Some(v) => out.push_str(v),
                None => {
                    out.push_str("$(");
                    out.push_str(name);
                    out.push(')');
                }
            }
            rest = &inner[end + 1..];
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

/// The port a probe or a named port refers to.
pub(crate) fn port(container: &Container, port: &IntOrString) -> Result<u16, String> {
    match port {
        IntOrString::Int(n) => u16::try_from(*n).map_err(|_| format!("port {n} out of range")),
        IntOrString::String(name) => container
            .ports
            .iter()
            .flatten()
            .find(|p| p.name.as_deref() == Some(name.as_str()))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .ok_or_else(|| format!("container {} has no port named {name}", container.name)),
    }
}

/// The command line that runs `container` of `pod` with `image`.
pub(crate) fn plan(
    pod: &Pod,
    container: &Container,
    image: &Image,
    ctx: &Context,
) -> Result<Plan, String> {
    let who = identity(pod, container, image)?;
    let env = environment(pod, container, ctx)?;
    let spec = pod.spec.as_ref().ok_or("pod without spec")?;
    let host_network = spec.host_network == Some(true);

    let mut argv: Vec<String> = Vec::new();
    // A pod's own network, or its node's for hostNetwork: either way a namespace of its own
    // beside the host's (two emulated nodes are one host).
    if let Some(netns) = &ctx.netns {
        argv.extend([
            "nsenter".into(),
            format!("--net={}", netns.display()),
            "--".into(),
        ]);
    }
    argv.push("bwrap".into());
    let root = ctx.root.display().to_string();
    let bind = |ro: bool| if ro { "--ro-bind" } else { "--bind" }.to_string();
    argv.extend([bind(who.read_only_root), root, "/".into()]);
    argv.extend(["--ro-bind", "/usr", "/usr"].map(String::from));
    argv.extend(["--proc", "/proc", "--dev", "/dev"].map(String::from));
    let mut dirs = vec![
        "usr".to_string(),
        "proc".into(),
        "dev".into(),
        "tmp".into(),
        "etc".into(),
    ];
    let mut files = Vec::new();
    for (host, at) in &image.files {
        argv.extend([bind(true), host.display().to_string(), at.clone()]);
        files.push(at.trim_start_matches('/').to_string());
    }
    let automount = spec.automount_service_account_token != Some(false);
    let mut mounts: Vec<(String, String, bool)> = Vec::new();
    for m in container.volume_mounts.iter().flatten() {
        let volume = ctx.volumes.get(&m.name).ok_or_else(|| {
            format!(
                "container {} mounts volume {} that the pod does not have",
                container.name, m.name
            )
        })?;
        let mut source = volume.path.clone();
        if let Some(sub) = m.sub_path.as_deref().filter(|s| !s.is_empty()) {
            source = source.join(sub);
        }
        let read_only = m.read_only == Some(true) || volume.read_only;
        mounts.push((
            source.display().to_string(),
            m.mount_path.clone(),
            read_only,
        ));
    }
    if automount
        && let Some(token) = ctx.volumes.get("kube-api-access")
        && !mounts.iter().any(|(_, at, _)| at == SERVICE_ACCOUNT_DIR)
    {
        mounts.push((
            token.path.display().to_string(),
            SERVICE_ACCOUNT_DIR.into(),
            true,
        ));
    }
    for (source, at, read_only) in mounts {
        let is_file = std::path::Path::new(&source).is_file();
        let rel = at.trim_start_matches('/').to_string();
        if is_file {
            files.push(rel);
        } else {
            dirs.push(rel);
        }
        argv.extend([bind(read_only), source, at]);
    }
    let hostname = if host_network {
        ctx.node.clone()
    } else {
        spec.hostname
            .clone()
            .or_else(|| pod.metadata.name.clone())
            .unwrap_or_default()
    };
    argv.extend(["--unshare-pid", "--unshare-uts", "--unshare-ipc"].map(String::from));
    argv.extend(["--hostname".to_string(), hostname]);
    argv.extend(["--as-pid-1", "--die-with-parent", "--clearenv"].map(String::from));
    for (k, v) in &env {
        argv.extend(["--setenv".to_string(), k.clone(), v.clone()]);
    }
    argv.extend([
        "--chdir".to_string(),
        container.working_dir.clone().unwrap_or_else(|| "/".into()),
    ]);
    argv.extend(["--", "/usr/bin/setpriv"].map(String::from));
    argv.push(format!("--reuid={}", who.uid));
    argv.push(format!("--regid={}", who.gid));
    if who.groups.is_empty() {
        argv.push("--clear-groups".into());
    } else {
        let list: Vec<String> = who.groups.iter().map(u32::to_string).collect();
        argv.push(format!("--groups={}", list.join(",")));
    }
    argv.push("--inh-caps=-all".into());
    argv.push("--ambient-caps=-all".into());
    let mut bounding = vec!["-all".to_string()];
    bounding.extend(
        who.capabilities
            .iter()
            .map(|c| format!("+{}", c.to_ascii_lowercase())),
    );
    argv.push(format!("--bounding-set={}", bounding.join(",")));
    if who.no_new_privs {
        argv.push("--no-new-privs".into());
    }
    argv.push("--".into());
    let command = container
        .command
        .clone()
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| image.entrypoint.clone());
    let args = match (&container.command, &container.args) {
        (_, Some(args)) => args.clone(),
        (Some(c), None) if !c.is_empty() => Vec::new(),
        _ => image.cmd.clone(),
    };
    if command.is_empty() {
        return Err(format!(
            "container {} has no command and its image no entrypoint",
            container.name
        ));
    }
    argv.extend(command.iter().chain(args.iter()).map(|a| expand(a, &env)));
    dirs.sort();
    dirs.dedup();
    Ok(Plan {
        argv,
        dirs,
        files,
        uid: who.uid,
        gid: who.gid,
        env,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> Pod {
        let mut object = json!({
            "metadata": {"name": "hub-1", "namespace": "ns", "uid": "u1", "labels": {"app": "a"}},
        });
        object["spec"] = spec;
        serde_json::from_value(object).expect("pod")
    }

    fn image(user: Option<(u32, u32)>) -> Image {
        Image {
            files: vec![(PathBuf::from("/bin/true"), "/attacher-hub".into())],
            user,
            entrypoint: vec!["/attacher-hub".into()],
            cmd: Vec::new(),
        }
    }

    fn ctx() -> Context {
        Context {
            node: "node-a".into(),
            pod_ip: "10.244.0.5".into(),
            host_ip: "127.0.0.1".into(),
            api_host: "127.0.0.1".into(),
            api_port: 6443,
            root: PathBuf::from("/r"),
            netns: Some(PathBuf::from("/run/netns/p")),
            volumes: BTreeMap::from([(
                "cfg".to_string(),
                HostVolume {
                    path: PathBuf::from("/v/cfg"),
                    read_only: true,
                },
            )]),
            ..Context::default()
        }
    }

    #[test]
    fn the_image_user_applies_unless_the_security_context_says_otherwise() {
        let p = pod(json!({"containers": [{"name": "c"}]}));
        let c = &p.spec.as_ref().unwrap().containers[0];
        let who = identity(&p, c, &image(Some((65532, 65532)))).unwrap();
        assert_eq!((who.uid, who.gid), (65532, 65532));
        assert_eq!(who.capabilities.len(), DEFAULT_CAPABILITIES.len());

        let p = pod(json!({"securityContext": {"runAsUser": 0, "fsGroup": 2000},
            "containers": [{"name": "c", "securityContext": {"runAsGroup": 7,
                "capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]},
                "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true}}]}));
        let c = &p.spec.as_ref().unwrap().containers[0];
        let who = identity(&p, c, &image(Some((65532, 65532)))).unwrap();
        assert_eq!((who.uid, who.gid), (0, 7));
        assert_eq!(who.groups, BTreeSet::from([2000]));
        assert_eq!(
            who.capabilities,
            BTreeSet::from(["NET_BIND_SERVICE".to_string()])
        );
        assert!(who.no_new_privs && who.read_only_root);
    }

    #[test]
    fn run_as_non_root_refuses_a_root_user() {
        let p =
            pod(json!({"securityContext": {"runAsNonRoot": true}, "containers": [{"name": "c"}]}));
        let c = &p.spec.as_ref().unwrap().containers[0];
        let err = identity(&p, c, &image(None)).unwrap_err();
        assert!(
            err.contains("runAsNonRoot and image will run as root"),
            "{err}"
        );
        assert!(identity(&p, c, &image(Some((65532, 65532)))).is_ok());
    }

    #[test]
    fn environment_resolves_the_downward_api_and_expands_references() {
        let p = pod(json!({"containers": [{"name": "c",
            "env": [
                {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
                {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}},
                {"name": "ADDR", "value": "/csi/$(NS).sock"},
                {"name": "K", "valueFrom": {"configMapKeyRef": {"name": "cm", "key": "k"}}}
            ],
            "args": ["--csi-address=$(ADDR)", "--x=$(UNSET)", "$$(ADDR)"]}]}));
        let c = &p.spec.as_ref().unwrap().containers[0];
        let mut cx = ctx();
        let err = environment(&p, c, &cx).unwrap_err();
        assert!(err.contains("configmap \"cm\" not found"), "{err}");
        cx.config_maps.insert(
            "cm".into(),
            BTreeMap::from([("k".to_string(), "v".to_string())]),
        );
        let env = environment(&p, c, &cx).unwrap();
        assert_eq!(env["NS"], "ns");
        assert_eq!(env["NODE"], "node-a");
        assert_eq!(env["APP"], "a");
        assert_eq!(env["ADDR"], "/csi/ns.sock");
        assert_eq!(env["K"], "v");
        assert_eq!(env["KUBERNETES_SERVICE_PORT"], "6443");
        let made = plan(&p, c, &image(None), &cx).unwrap();
        let tail: Vec<&str> = made
            .argv
            .iter()
            .rev()
            .take(4)
            .rev()
            .map(String::as_str)
            .collect();
        assert_eq!(
            tail,
            [
                "/attacher-hub",
                "--csi-address=/csi/ns.sock",
                "--x=$(UNSET)",
                "$(ADDR)"
            ]
        );
    }

    #[test]
    fn the_command_line_binds_volumes_and_drops_privileges() {
        let p = pod(json!({"containers": [{"name": "c",
            "securityContext": {"runAsUser": 65532, "runAsGroup": 65532,
                "capabilities": {"drop": ["ALL"]}, "allowPrivilegeEscalation": false,
                "readOnlyRootFilesystem": true},
            "volumeMounts": [{"name": "cfg", "mountPath": "/etc/attacher-hub"}]}]}));
        let c = &p.spec.as_ref().unwrap().containers[0];
        let made = plan(&p, c, &image(None), &ctx()).unwrap();
        let line = made.argv.join(" ");
        assert!(
            line.starts_with("nsenter --net=/run/netns/p -- bwrap --ro-bind /r / "),
            "{line}"
        );
        assert!(
            line.contains("--ro-bind /v/cfg /etc/attacher-hub"),
            "{line}"
        );
        assert!(line.contains("--hostname hub-1"), "{line}");
        assert!(
            line.contains(
                "--reuid=65532 --regid=65532 --clear-groups --inh-caps=-all \
                           --ambient-caps=-all --bounding-set=-all --no-new-privs -- /attacher-hub"
            ),
            "{line}"
        );
        assert!(made.dirs.contains(&"etc/attacher-hub".to_string()));
        assert_eq!(made.files, ["attacher-hub"]);

        let p = pod(json!({"containers": [{"name": "c",
            "volumeMounts": [{"name": "missing", "mountPath": "/x"}]}]}));
        let c = &p.spec.as_ref().unwrap().containers[0];
        let err = plan(&p, c, &image(None), &ctx()).unwrap_err();
        assert!(err.contains("mounts volume missing"), "{err}");
    }

    #[test]
    fn named_ports_resolve_through_the_container() {
        let p = pod(json!({"containers": [{"name": "c",
            "ports": [{"name": "http-metrics", "containerPort": 8080}]}]}));
        let c = &p.spec.as_ref().unwrap().containers[0];
        assert_eq!(
            port(c, &IntOrString::String("http-metrics".into())),
            Ok(8080)
        );
        assert_eq!(port(c, &IntOrString::Int(9808)), Ok(9808));
        assert!(port(c, &IntOrString::String("nope".into())).is_err());
    }
}
