//! The node side of the pod runner: one task per pod bound to an emulated node, doing what the
//! kubelet does with it.
//!
//! * Start: the pod's network namespace (its node's for `hostNetwork`) with the API server reachable
//!   inside, its volumes, then every container (init containers first, one after the other).
//! * Run: a container that exits is restarted as `restartPolicy` says, the first time at once
//!   and then after 10 s, doubling up to 5 min (the kubelet's crash-loop back-off); readiness
//!   probes decide the container's and the pod's Ready condition (a container without one is
//!   ready once started); `failureThreshold` failed liveness probes in a row restart it.
//! * Status: phase, conditions (PodScheduled, Initialized, ContainersReady, Ready) with their
//!   transition times, container states and restart counts, pod and host IP, written to the
//!   pod's status whenever they change, so that kube-controller-manager's Deployment and
//!   DaemonSet controllers (readiness, `minReadySeconds`, `maxSurge`, `maxUnavailable`) act on
//!   them as in a cluster.
//! * Stop: when the pod is deleted gracefully, SIGTERM to every container's process, SIGKILL
//!   to what is left after the grace period (`deletionGracePeriodSeconds`, which the API server
//!   takes from `terminationGracePeriodSeconds`), then the pod object is removed (grace 0), as
//!   the kubelet confirms a deletion.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Container, Pod, Probe};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::{Value, json};
use tokio::process::{Child, Command};
use tokio::sync::{mpsc, watch};

use super::Shared;
use super::image;
use super::netns::Netns;
use super::plan::{self, Context};
use super::volumes;

/// What a container loop tells its pod.
#[derive(Debug)]
enum Event {
    Waiting {
        container: String,
        reason: String,
        message: String,
    },
    Running {
        container: String,
        started: String,
        restarts: i32,
    },
    Ready {
        container: String,
        ready: bool,
    },
    Terminated {
        container: String,
        code: i32,
        reason: String,
        finished: String,
    },
}

/// The state of one container as the pod reports it.
#[derive(Clone, Debug, Default)]
struct ContainerStatus {
    state: Value,
    last_state: Value,
    ready: bool,
    restarts: i32,
    started: bool,
}

fn now() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Runs `pod` on `node` until it is deleted; `updates` carries the pod as the API server
/// shows it (`None` once it is gone).
pub(crate) async fn run_pod(
    shared: Arc<Shared>,
    node: super::Node,
    mut updates: watch::Receiver<Option<Pod>>,
) {
    let Some(pod) = updates.borrow().clone() else {
        return;
    };
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let name = pod.metadata.name.clone().unwrap_or_default();
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let api: Api<Pod> = Api::namespaced(shared.client.clone(), &ns);
    let spec = pod.spec.clone().unwrap_or_default();
    let pod_dir = shared
        .dir
        .join("pods")
        .join(format!("{ns}_{name}_{}", &uid[..8.min(uid.len())]));
    let log_dir = shared.dir.join("logs");
    let _ = std::fs::create_dir_all(&log_dir);
    let index = shared.next_pod_index();
    let pod_ip = format!("10.244.{}.{}", index / 250, index % 250 + 2);

    // Set up the pod; a failure is reported on its containers and retried, as the kubelet does.
    let mut reporter = Reporter::new(api.clone(), &name, &uid, &node.name, &pod_ip, &spec);
    let (netns, forwarder, ctx, pod_volumes) = loop {
        match prepare(&shared, &pod, &node, &pod_dir, &pod_ip, index).await {
            Ok(ready) => break ready,
            Err(message) => {
                for c in &spec.containers {
                    reporter.waiting(&c.name, "CreateContainerConfigError", &message);
                }
                reporter.flush().await;
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(2)) => {}
                    changed = updates.changed() => {
                        let gone = changed.is_err() || updates.borrow().as_ref().is_none_or(|p| p.metadata.deletion_timestamp.is_some());
                        if gone {
                            confirm_deleted(&api, &name, &uid).await;
                            return;
                        }
                    }
                }
            }
        }
    };
    let ctx = Arc::new(ctx);
    // The network the runner's own requests to the pod (http_get) enter: the pod's, or its
    // node's for hostNetwork.
    shared.set_netns(&name, ctx.netns.clone());

    // Managed volumes (ConfigMaps, Secrets, token) refreshed every second.
    let refresher = {
        let shared = shared.clone();
        let pod = pod.clone();
        let ctx = ctx.clone();
        tokio::spawn(async move {
            let mut token = None;
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                for (volume, parts) in &pod_volumes.managed {
                    let Some(host) = ctx.volumes.get(volume) else {
                        continue;
                    };
                    if let Ok(files) =
                        volumes::files(&shared.client, &pod, parts, &ctx, &shared.ca, &mut token)
                            .await
                    {
                        let _ = volumes::write_atomic(&host.path, &files, pod_volumes.fs_group);
                    }
                }
            }
        })
    };

    let (events_tx, mut events) = mpsc::channel::<Event>(64);
    let mut stops: BTreeMap<String, mpsc::Sender<Duration>> = BTreeMap::new();
    let restart_policy = spec
        .restart_policy
        .clone()
        .unwrap_or_else(|| "Always".into());
    for c in spec.init_containers.iter().flatten() {
        // Init containers run to completion, one after the other.
        let run = ContainerRun::new(&shared, &pod, c, &ctx, &pod_dir, &log_dir, netns.as_ref());
        match run {
            Ok(run) => {
                let (_tx, rx) = mpsc::channel(1);
                container_loop(run, "OnFailure".into(), events_tx.clone(), rx).await;
            }
            Err(message) => reporter.waiting(&c.name, "CreateContainerConfigError", &message),
        }
    }
    reporter.initialized = true;
    for c in &spec.containers {
        let (tx, rx) = mpsc::channel(1);
        stops.insert(c.name.clone(), tx);
        match ContainerRun::new(&shared, &pod, c, &ctx, &pod_dir, &log_dir, netns.as_ref()) {
            Ok(run) => {
                tokio::spawn(container_loop(
                    run,
                    restart_policy.clone(),
                    events_tx.clone(),
                    rx,
                ));
            }
            Err(message) => reporter.waiting(&c.name, "CreateContainerConfigError", &message),
        }
    }
    drop(events_tx);
    reporter.flush().await;

    // Until the pod is deleted.
    let grace = loop {
        tokio::select! {
            event = events.recv() => match event {
                Some(event) => {
                    reporter.apply(event);
                    // Take what else is queued before writing once.
                    while let Ok(event) = events.try_recv() {
                        reporter.apply(event);
                    }
                    reporter.flush().await;
                }
                None => break None,
            },
            changed = updates.changed() => {
                let pod = if changed.is_ok() { updates.borrow().clone() } else { None };
                match pod {
                    None => break Some(Duration::ZERO),
                    Some(p) if p.metadata.deletion_timestamp.is_some() => {
                        let secs = p.metadata.deletion_grace_period_seconds.unwrap_or(30);
                        break Some(Duration::from_secs(u64::try_from(secs).unwrap_or(0)));
                    }
                    Some(_) => {}
                }
            }
        }
    };
    let grace = grace.unwrap_or(Duration::ZERO);
    for stop in stops.values() {
        let _ = stop.send(grace).await;
    }
    // Every container loop ends once its process has.
    while let Some(event) = events.recv().await {
        reporter.apply(event);
    }
    refresher.abort();
    shared.set_netns(&name, None);
    if let Some(f) = forwarder {
        f.abort();
    }
    drop(netns);
    confirm_deleted(&api, &name, &uid).await;
}

/// Removes the pod object once its containers are gone (grace period 0, this pod's UID only).
async fn confirm_deleted(api: &Api<Pod>, name: &str, uid: &str) {
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: Some(uid.to_string()),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    let _ = api.delete(name, &dp).await;
}

/// The pod's network namespace, API forwarder, container context and volumes.
async fn prepare(
    shared: &Arc<Shared>,
    pod: &Pod,
    node: &super::Node,
    pod_dir: &Path,
    pod_ip: &str,
    index: usize,
) -> Result<
    (
        Option<Netns>,
        Option<tokio::task::JoinHandle<()>>,
        Context,
        volumes::PodVolumes,
    ),
    String,
> {
    let spec = pod.spec.as_ref().ok_or("pod without spec")?;
    let host_network = spec.host_network == Some(true);
    let (netns, forwarder) = if host_network {
        (None, None)
    } else {
        let ns = Netns::create(&format!("ah-pod-{}-{index}", std::process::id()))?;
        let f = ns
            .forward(shared.api)
            .map_err(|e| format!("API server forwarder in the pod's network: {e}"))?;
        (Some(ns), Some(f))
    };
    let pod_volumes = volumes::layout(pod, &node.root, pod_dir)?;
    let ns = pod.metadata.namespace.clone().unwrap_or_default();
    let mut ctx = Context {
        node: node.name.clone(),
        pod_ip: if host_network {
            "127.0.0.1".into()
        } else {
            pod_ip.to_string()
        },
        host_ip: "127.0.0.1".into(),
        api_host: "127.0.0.1".into(),
        api_port: shared.api.port(),
        volumes: pod_volumes.host.clone(),
        netns: Some(netns.as_ref().map_or_else(
            || node.net.netns.path().to_path_buf(),
            |n| n.path().to_path_buf(),
        )),
        ..Context::default()
    };
    // The ConfigMaps and Secrets the environment refers to.
    for c in spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
    {
        for from in c.env_from.iter().flatten() {
            if let Some(r) = &from.config_map_ref {
                fetch_config_map(shared, &ns, &r.name, &mut ctx).await?;
            }
            if let Some(r) = &from.secret_ref {
                fetch_secret(shared, &ns, &r.name, &mut ctx).await?;
            }
        }
        for var in c.env.iter().flatten() {
            if let Some(from) = &var.value_from {
                if let Some(r) = &from.config_map_key_ref {
                    fetch_config_map(shared, &ns, &r.name, &mut ctx).await?;
                }
                if let Some(r) = &from.secret_key_ref {
                    fetch_secret(shared, &ns, &r.name, &mut ctx).await?;
                }
            }
        }
    }
    let mut token = None;
    for (volume, parts) in &pod_volumes.managed {
        let files =
            volumes::files(&shared.client, pod, parts, &ctx, &shared.ca, &mut token).await?;
        let host = &pod_volumes.host[volume];
        volumes::write_atomic(&host.path, &files, pod_volumes.fs_group)
            .map_err(|e| format!("volume {volume}: {e}"))?;
    }
    Ok((netns, forwarder, ctx, pod_volumes))
}

async fn fetch_config_map(
    shared: &Shared,
    ns: &str,
    name: &str,
    ctx: &mut Context,
) -> Result<(), String> {
    let api: Api<k8s_openapi::api::core::v1::ConfigMap> =
        Api::namespaced(shared.client.clone(), ns);
    if let Some(cm) = api
        .get_opt(name)
        .await
        .map_err(|e| format!("configmap {name}: {e}"))?
    {
        ctx.config_maps
            .insert(name.to_string(), cm.data.unwrap_or_default());
    }
    Ok(())
}

async fn fetch_secret(
    shared: &Shared,
    ns: &str,
    name: &str,
    ctx: &mut Context,
) -> Result<(), String> {
    let api: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(shared.client.clone(), ns);
    if let Some(s) = api
        .get_opt(name)
        .await
        .map_err(|e| format!("secret {name}: {e}"))?
    {
        let data = s
            .data
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v.0).into_owned()))
            .collect();
        ctx.secrets.insert(name.to_string(), data);
    }
    Ok(())
}

/// Everything needed to start one container, again and again.
struct ContainerRun {
    name: String,
    plan: plan::Plan,
    root: PathBuf,
    log: PathBuf,
    readiness: Option<Probe>,
    liveness: Option<Probe>,
    container: Container,
    netns: Option<PathBuf>,
}

impl ContainerRun {
    fn new(
        _shared: &Shared,
        pod: &Pod,
        c: &Container,
        ctx: &Context,
        pod_dir: &Path,
        log_dir: &Path,
        _netns: Option<&Netns>,
    ) -> Result<ContainerRun, String> {
        let image_name = c.image.clone().unwrap_or_default();
        let image = image::resolve(&image_name)?;
        let root = pod_dir.join("containers").join(&c.name);
        let mut ctx = ctx.clone();
        ctx.root = root.clone();
        let plan = plan::plan(pod, c, &image, &ctx)?;
        let name = pod.metadata.name.clone().unwrap_or_default();
        Ok(ContainerRun {
            name: c.name.clone(),
            plan,
            root,
            log: log_dir.join(format!("{name}_{}.log", c.name)),
            readiness: c.readiness_probe.clone(),
            liveness: c.liveness_probe.clone(),
            container: c.clone(),
            netns: ctx.netns.clone(),
        })
    }

    /// The container's root directory: a fresh copy of the image's layout.
    fn make_root(&self) -> std::io::Result<()> {
        let _ = std::fs::remove_dir_all(&self.root);
        std::fs::create_dir_all(&self.root)?;
        for (link, target) in [
            ("bin", "usr/bin"),
            ("lib", "usr/lib"),
            ("lib64", "usr/lib64"),
            ("sbin", "usr/sbin"),
        ] {
            std::os::unix::fs::symlink(target, self.root.join(link))?;
        }
        for dir in &self.plan.dirs {
            std::fs::create_dir_all(self.root.join(dir))?;
        }
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(
            self.root.join("tmp"),
            std::fs::Permissions::from_mode(0o1777),
        )?;
        for file in &self.plan.files {
            let path = self.root.join(file);
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent)?;
            }
            std::fs::write(path, b"")?;
        }
        // The users a distroless base image names.
        std::fs::write(
            self.root.join("etc/passwd"),
            "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n",
        )?;
        std::fs::write(self.root.join("etc/group"), "root:x:0:\nnonroot:x:65532:\n")?;
        Ok(())
    }

    fn spawn(&self) -> Result<Child, String> {
        self.make_root()
            .map_err(|e| format!("root of container {}: {e}", self.name))?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| format!("log {}: {e}", self.log.display()))?;
        let err = log.try_clone().map_err(|e| e.to_string())?;
        let mut cmd = Command::new(&self.plan.argv[0]);
        cmd.args(&self.plan.argv[1..])
            .stdin(std::process::Stdio::null())
            .stdout(log)
            .stderr(err)
            .kill_on_drop(true);
        cmd.spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.plan.argv[0]))
    }

    async fn probe(&self, probe: &Probe) -> Result<(), String> {
        let timeout =
            Duration::from_secs(u64::try_from(probe.timeout_seconds.unwrap_or(1)).unwrap_or(1));
        let connect = |port: u16| {
            let netns = self.netns.clone();
            async move {
                match netns {
                    Some(path) => {
                        let ns = NetnsRef(path);
                        ns.connect(port, timeout).await
                    }
                    None => tokio::net::TcpStream::connect(("127.0.0.1", port)).await,
                }
            }
        };
        let work = async {
            if let Some(http) = &probe.http_get {
                let port = plan::port(&self.container, &http.port)?;
                let path = http.path.clone().unwrap_or_else(|| "/".into());
                let stream = connect(port)
                    .await
                    .map_err(|e| format!("dial tcp :{port}: {e}"))?;
                let status = http_status(stream, &path)
                    .await
                    .map_err(|e| format!("GET {path}: {e}"))?;
                if (200..400).contains(&status) {
                    Ok(())
                } else {
                    Err(format!("HTTP probe failed with statuscode: {status}"))
                }
            } else if let Some(tcp) = &probe.tcp_socket {
                let port = plan::port(&self.container, &tcp.port)?;
                connect(port)
                    .await
                    .map(drop)
                    .map_err(|e| format!("dial tcp :{port}: {e}"))
            } else {
                Err("only httpGet and tcpSocket probes run here".to_string())
            }
        };
        tokio::time::timeout(timeout, work)
            .await
            .unwrap_or_else(|_| Err(format!("probe timed out after {timeout:?}")))
    }
}

/// A network namespace by path, for probes (the pod owns the [`Netns`]).
struct NetnsRef(PathBuf);

impl NetnsRef {
    async fn connect(
        &self,
        port: u16,
        timeout: Duration,
    ) -> std::io::Result<tokio::net::TcpStream> {
        super::netns::connect_in(&self.0, port, timeout).await
    }
}

/// The status code of `GET path` over `stream` (HTTP/1.0, so the server closes the connection).
async fn http_status(mut stream: tokio::net::TcpStream, path: &str) -> std::io::Result<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    stream
        .write_all(
            format!(
                "GET {path} HTTP/1.0\r\nHost: localhost\r\nUser-Agent: kube-probe/1.37\r\n\r\n"
            )
            .as_bytes(),
        )
        .await?;
    let mut head = vec![0u8; 64];
    let n = stream.read(&mut head).await?;
    let text = String::from_utf8_lossy(&head[..n]);
    text.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP answer: {text}")))
}

/// Sends `signal` to the program inside the sandbox (bwrap's one child; bwrap itself does not
/// pass signals on).
fn signal(child: &Child, signal: &str) {
    let Some(pid) = child.id() else { return };
    let inner = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .ok()
        .and_then(|s| s.split_whitespace().next().map(str::to_string));
    // With nsenter in front, bwrap is nsenter's exec: the same PID.
    let target = inner.unwrap_or_else(|| pid.to_string());
    let _ = std::process::Command::new("kill")
        .args([&format!("-{signal}"), &target])
        .status();
}

/// Stops `child`: SIGTERM, then SIGKILL after `grace`; its exit code.
async fn terminate(child: &mut Child, grace: Duration) -> i32 {
    signal(child, "TERM");
    match tokio::time::timeout(grace, child.wait()).await {
        Ok(Ok(status)) => exit_code(status),
        _ => {
            let _ = child.start_kill();
            child.wait().await.map(exit_code).unwrap_or(137)
        }
    }
}

fn exit_code(status: std::process::ExitStatus) -> i32 {
    use std::os::unix::process::ExitStatusExt;
    status
        .code()
        .unwrap_or_else(|| 128 + status.signal().unwrap_or(9))
}

/// Probe timing with the API's defaults.
struct ProbeClock {
    period: Duration,
    initial: Duration,
    success: u32,
    failure: u32,
}

impl ProbeClock {
    fn of(p: &Probe) -> ProbeClock {
        let secs = |v: Option<i32>, d: i32| {
            Duration::from_secs(u64::try_from(v.unwrap_or(d)).unwrap_or(0))
        };
        ProbeClock {
            period: secs(p.period_seconds, 10),
            initial: secs(p.initial_delay_seconds, 0),
            success: u32::try_from(p.success_threshold.unwrap_or(1)).unwrap_or(1),
            failure: u32::try_from(p.failure_threshold.unwrap_or(3)).unwrap_or(3),
        }
    }
}

/// Runs one container: starts it, probes it, restarts it, until told to stop (with the grace
/// period) or, under `restartPolicy` Never or OnFailure, until it ends for good.
async fn container_loop(
    run: ContainerRun,
    restart_policy: String,
    events: mpsc::Sender<Event>,
    mut stop: mpsc::Receiver<Duration>,
) {
    let mut restarts = 0;
    let mut backoff = Duration::ZERO;
    loop {
        let started_at = Instant::now();
        let mut child = match run.spawn() {
            Ok(child) => child,
            Err(message) => {
                let _ = events
                    .send(Event::Waiting {
                        container: run.name.clone(),
                        reason: "RunContainerError".into(),
                        message,
                    })
                    .await;
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(10)) => continue,
                    _ = stop.recv() => return,
                }
            }
        };
        let _ = events
            .send(Event::Running {
                container: run.name.clone(),
                started: now(),
                restarts,
            })
            .await;
        let readiness = run.readiness.as_ref().map(ProbeClock::of);
        let liveness = run.liveness.as_ref().map(ProbeClock::of);
        if readiness.is_none() {
            let _ = events
                .send(Event::Ready {
                    container: run.name.clone(),
                    ready: true,
                })
                .await;
        }
        let start = tokio::time::Instant::now();
        let mut next_ready = readiness.as_ref().map(|c| start + c.initial);
        let mut next_live = liveness.as_ref().map(|c| start + c.initial + c.period);
        let (mut ok_in_row, mut fail_in_row, mut ready) = (0u32, 0u32, false);
        let mut live_fail = 0u32;
        let far = start + Duration::from_secs(365 * 24 * 3600);
        let (code, reason, stopping) = loop {
            tokio::select! {
                status = child.wait() => {
                    let code = status.map(exit_code).unwrap_or(-1);
                    break (code, if code == 0 { "Completed" } else { "Error" }.to_string(), false);
                }
                grace = stop.recv() => {
                    let code = terminate(&mut child, grace.unwrap_or(Duration::ZERO)).await;
                    break (code, if code == 0 { "Completed" } else { "Error" }.to_string(), true);
                }
                _ = tokio::time::sleep_until(next_ready.unwrap_or(far)) => {
                    let (Some(clock), Some(probe)) = (&readiness, &run.readiness) else { continue };
                    next_ready = Some(tokio::time::Instant::now() + clock.period);
                    let passed = run.probe(probe).await.is_ok();
                    if passed { ok_in_row += 1; fail_in_row = 0; } else { fail_in_row += 1; ok_in_row = 0; }
                    let now_ready = if passed { ok_in_row >= clock.success || ready } else { fail_in_row < clock.failure && ready };
                    if now_ready != ready {
                        ready = now_ready;
                        let _ = events.send(Event::Ready { container: run.name.clone(), ready }).await;
                    }
                }
                _ = tokio::time::sleep_until(next_live.unwrap_or(far)) => {
                    let (Some(clock), Some(probe)) = (&liveness, &run.liveness) else { continue };
                    next_live = Some(tokio::time::Instant::now() + clock.period);
                    match run.probe(probe).await {
                        Ok(()) => live_fail = 0,
                        Err(why) => {
                            live_fail += 1;
                            if live_fail >= clock.failure {
                                let _ = events.send(Event::Waiting {
                                    container: run.name.clone(),
                                    reason: "Unhealthy".into(),
                                    message: format!("Liveness probe failed: {why}"),
                                }).await;
                                let code = terminate(&mut child, Duration::from_secs(30)).await;
                                break (code, "Error".to_string(), false);
                            }
                        }
                    }
                }
            }
        };
        let _ = events
            .send(Event::Terminated {
                container: run.name.clone(),
                code,
                reason,
                finished: now(),
            })
            .await;
        if stopping || restart_policy == "Never" || (restart_policy == "OnFailure" && code == 0) {
            return;
        }
        // Crash-loop back-off: at once, then 10 s doubling to 5 min; reset after 10 min running.
        if started_at.elapsed() > Duration::from_secs(600) {
            backoff = Duration::ZERO;
        }
        if !backoff.is_zero() {
            let _ = events
                .send(Event::Waiting {
                    container: run.name.clone(),
                    reason: "CrashLoopBackOff".into(),
                    message: format!(
                        "back-off {}s restarting failed container",
                        backoff.as_secs()
                    ),
                })
                .await;
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.recv() => return,
        }
        backoff = if backoff.is_zero() {
            Duration::from_secs(10)
        } else {
            (backoff * 2).min(Duration::from_secs(300))
        };
        restarts += 1;
    }
}

/// The pod's status, written when it changes.
struct Reporter {
    api: Api<Pod>,
    name: String,
    uid: String,
    node: String,
    pod_ip: String,
    containers: BTreeMap<String, ContainerStatus>,
    images: BTreeMap<String, String>,
    initialized: bool,
    ready_since: Option<String>,
    not_ready_since: String,
    start_time: String,
    written: Option<Value>,
}

impl Reporter {
    fn new(
        api: Api<Pod>,
        name: &str,
        uid: &str,
        node: &str,
        pod_ip: &str,
        spec: &k8s_openapi::api::core::v1::PodSpec,
    ) -> Reporter {
        let containers = spec
            .containers
            .iter()
            .map(|c| {
                (
                    c.name.clone(),
                    ContainerStatus {
                        state: json!({"waiting": {"reason": "ContainerCreating"}}),
                        ..ContainerStatus::default()
                    },
                )
            })
            .collect();
        let images = spec
            .containers
            .iter()
            .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
            .collect();
        Reporter {
            api,
            name: name.into(),
            uid: uid.into(),
            node: node.into(),
            pod_ip: pod_ip.into(),
            containers,
            images,
            initialized: false,
            ready_since: None,
            not_ready_since: now(),
            start_time: now(),
            written: None,
        }
    }

    fn waiting(&mut self, container: &str, reason: &str, message: &str) {
        if let Some(c) = self.containers.get_mut(container) {
            c.state = json!({"waiting": {"reason": reason, "message": message}});
            c.ready = false;
        }
    }

    fn apply(&mut self, event: Event) {
        match event {
            Event::Waiting {
                container,
                reason,
                message,
            } => {
                if let Some(c) = self.containers.get_mut(&container) {
                    if reason == "Unhealthy" {
                        // Shown as a message on the running state's way out; keep the state.
                        c.ready = false;
                        let _ = message;
                    } else {
                        c.state = json!({"waiting": {"reason": reason, "message": message}});
                        c.ready = false;
                    }
                }
            }
            Event::Running {
                container,
                started,
                restarts,
            } => {
                if let Some(c) = self.containers.get_mut(&container) {
                    c.state = json!({"running": {"startedAt": started}});
                    c.restarts = restarts;
                    c.started = true;
                    c.ready = false;
                }
            }
            Event::Ready { container, ready } => {
                if let Some(c) = self.containers.get_mut(&container) {
                    c.ready = ready && c.state.get("running").is_some();
                }
            }
            Event::Terminated {
                container,
                code,
                reason,
                finished,
            } => {
                if let Some(c) = self.containers.get_mut(&container) {
                    let started = c
                        .state
                        .pointer("/running/startedAt")
                        .cloned()
                        .unwrap_or(Value::Null);
                    let terminated = json!({"terminated": {"exitCode": code, "reason": reason,
                        "startedAt": started, "finishedAt": finished}});
                    c.last_state = terminated.clone();
                    c.state = terminated;
                    c.ready = false;
                }
            }
        }
    }

    fn status(&mut self) -> Value {
        let all_ready = self.containers.values().all(|c| c.ready);
        match (all_ready, &self.ready_since) {
            (true, None) => self.ready_since = Some(now()),
            (false, Some(_)) => {
                self.ready_since = None;
                self.not_ready_since = now();
            }
            _ => {}
        }
        let ready_time = self
            .ready_since
            .clone()
            .unwrap_or_else(|| self.not_ready_since.clone());
        let ready = if all_ready { "True" } else { "False" };
        let any_started = self.containers.values().any(|c| c.started);
        let statuses: Vec<Value> = self
            .containers
            .iter()
            .map(|(name, c)| {
                json!({
                    "name": name,
                    "image": self.images.get(name),
                    "imageID": "",
                    "containerID": format!("bwrap://{}/{name}", self.uid),
                    "ready": c.ready,
                    "started": c.state.get("running").is_some(),
                    "restartCount": c.restarts,
                    "state": c.state,
                    "lastState": if c.last_state.is_null() { json!({}) } else { c.last_state.clone() },
                })
            })
            .collect();
        json!({
            "phase": if any_started { "Running" } else { "Pending" },
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": self.pod_ip,
            "podIPs": [{"ip": self.pod_ip}],
            "startTime": self.start_time,
            "conditions": [
                {"type": "PodScheduled", "status": "True", "lastTransitionTime": self.start_time},
                {"type": "Initialized", "status": if self.initialized { "True" } else { "False" }, "lastTransitionTime": self.start_time},
                {"type": "ContainersReady", "status": ready, "lastTransitionTime": ready_time},
                {"type": "Ready", "status": ready, "lastTransitionTime": ready_time},
            ],
            "containerStatuses": statuses,
        })
    }

    async fn flush(&mut self) {
        let status = self.status();
        if self.written.as_ref() == Some(&status) {
            return;
        }
        let patch = json!({"status": status});
        match self
            .api
            .patch_status(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => self.written = Some(status),
            Err(e) => eprintln!(
                "pod runner: status of pod {} on {}: {e}",
                self.name, self.node
            ),
        }
    }
}
