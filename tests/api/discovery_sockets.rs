//! Discovery mode (`--driver-sockets`) over a directory that holds what a node's plugin
//! directory holds, against the real API server: a controller plugin (served), a socket file
//! left by a driver killed with SIGKILL (stale: recorded, not served, served again once a driver
//! listens there), and node plugins (recorded as having no controller service, never served):
//! one that does not offer the controller service, one that offers it and answers
//! ControllerGetCapabilities with `Unimplemented`, and one that offers it and dies when asked,
//! as the GCE PD driver's node plugin does (v1.28.1: its identity service always offers
//! CONTROLLER_SERVICE, and without `--run-controller-service` it registers a nil controller
//! server whose ControllerGetCapabilities dereferences it). None of the recorded ones gets a
//! Lease, a VolumeAttachment write or a `driver_up` series, and the dying one is asked once.

use crate::support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::Api;
use serde_json::Value;
use support::{
    Attacher, ChildProcess, Cluster, NodeDriver, PvBuilder, WAIT_TIMEOUT, create_csinode_with,
    create_node, create_va, eventually, is_attached, mock_csi_driver_bin, sanitize_driver_name,
    unique_driver_name, unique_name, wait_for,
};

/// A `mock-csi-driver` process serving `name` at `socket` with `args`, once it printed `ready`.
async fn mock(socket: &Path, name: &str, args: &[&str]) -> ChildProcess {
    let mut cmd = tokio::process::Command::new(mock_csi_driver_bin());
    cmd.arg(format!("--endpoint={}", socket.display()))
        .arg(format!("--name={name}"))
        .arg("--volumes=2")
        .args(args);
    let mut p = ChildProcess::spawn(&format!("mock-{name}"), cmd);
    p.wait_for_output("ready", 1, WAIT_TIMEOUT)
        .await
        .unwrap_or_else(|e| panic!("mock {name}: {e}"));
    p
}

/// `<root>/<dir>/csi.sock`, its directory created.
fn socket_in(root: &Path, dir: &str) -> PathBuf {
    std::fs::create_dir_all(root.join(dir)).expect("a socket directory");
    root.join(dir).join("csi.sock")
}

/// Kills `p` with SIGKILL, as an OOM kill or a node's hard stop does: its socket file stays.
async fn kill(p: &mut ChildProcess, socket: &Path) {
    let pid = p.id().expect("running");
    let status = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    eventually("the process is gone", WAIT_TIMEOUT, || {
        let gone = p.exited().is_some();
        async move { gone.then_some(()) }
    })
    .await;
    assert!(socket.exists(), "the killed driver's socket file stays");
    let refused = std::os::unix::net::UnixStream::connect(socket).expect_err("nobody listens");
    assert_eq!(refused.kind(), std::io::ErrorKind::ConnectionRefused);
}

/// The `/drivers` entry of `socket`.
fn entry_of<'a>(drivers: &'a [Value], socket: &Path) -> Option<&'a Value> {
    let want = format!("unix://{}", socket.display());
    drivers.iter().find(|d| d["socket"] == want.as_str())
}

fn state(entry: Option<&Value>) -> &str {
    entry
        .and_then(|e| e["state"]["state"].as_str())
        .unwrap_or("-")
}

/// The Leases of `driver` in every namespace.
async fn leases_of(client: &kube::Client, driver: &str) -> Vec<String> {
    let name = format!("external-attacher-leader-{}", sanitize_driver_name(driver));
    Api::<Lease>::all(client.clone())
        .list(&Default::default())
        .await
        .expect("list Leases")
        .items
        .into_iter()
        .filter(|l| l.metadata.name.as_deref() == Some(name.as_str()))
        .map(|l| l.metadata.namespace.unwrap_or_default())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_sockets_and_node_plugins_are_recorded_not_served() {
    let cluster = Cluster::get();
    let client = cluster.client().await;
    let root = tempfile::Builder::new()
        .prefix("ah-plugins-")
        .tempdir()
        .expect("a plugins directory");
    let root = root.path();

    let controller = unique_driver_name("ctl");
    let killed = unique_driver_name("killed");
    let no_cs = unique_driver_name("node-nocs");
    let unimplemented = unique_driver_name("node-unimpl");
    let dying = unique_driver_name("node-dies");
    let (ctl_sock, killed_sock, no_cs_sock, unimpl_sock, dying_sock) = (
        socket_in(root, "ctl"),
        socket_in(root, "killed"),
        socket_in(root, "nocs"),
        socket_in(root, "unimpl"),
        socket_in(root, "dies"),
    );

    let mut ctl = mock(&ctl_sock, &controller, &[]).await;
    // A driver killed before the hub starts: its socket file stays, nothing listens.
    let mut k = mock(&killed_sock, &killed, &[]).await;
    kill(&mut k, &killed_sock).await;
    let _no_cs = mock(&no_cs_sock, &no_cs, &["--no-controller-service"]).await;
    let _unimpl = mock(
        &unimpl_sock,
        &unimplemented,
        &["--fault", "ControllerGetCapabilities=code:Unimplemented"],
    )
    .await;
    // The PD-like node plugin, restarted whenever it dies, as the kubelet restarts a container.
    let dying_starts = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let kubelet = {
        let (sock, name, starts) = (dying_sock.clone(), dying.clone(), dying_starts.clone());
        tokio::spawn(async move {
            loop {
                let mut p = mock(
                    &sock,
                    &name,
                    &["--fault", "ControllerGetCapabilities=exit:2"],
                )
                .await;
                starts.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                while p.exited().is_none() {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        })
    };
    eventually("the node plugin that dies runs", WAIT_TIMEOUT, || {
        let n = dying_starts.load(std::sync::atomic::Ordering::SeqCst);
        async move { (n > 0).then_some(()) }
    })
    .await;

    let mut hub = Attacher::hub_with_env(
        "discovery",
        &[
            format!("--kubeconfig={}", cluster.attacher_kubeconfig.display()),
            format!("--driver-sockets={}/*/csi.sock", root.display()),
            "--leader-election".into(),
            "--kube-api-qps=100".into(),
            "--kube-api-burst=200".into(),
            "-v=2".into(),
        ],
        &[("POD_NAMESPACE", "default")],
    );
    let drivers = eventually(
        "the controller leads; the others are recorded",
        WAIT_TIMEOUT,
        || async {
            let ds = hub.drivers().await?;
            let ok = state(entry_of(&ds, &ctl_sock)) == "leading"
                && state(entry_of(&ds, &killed_sock)) == "staleSocket"
                && [&no_cs_sock, &unimpl_sock, &dying_sock]
                    .iter()
                    .all(|s| state(entry_of(&ds, s)) == "noControllerService");
            ok.then_some(ds)
        },
    )
    .await;
    eprintln!("discovery: /drivers {drivers:#?}");
    assert_eq!(drivers.len(), 5, "one entry per socket: {drivers:#?}");
    let stale = entry_of(&drivers, &killed_sock).expect("the stale socket");
    assert!(
        stale["state"]["reason"]
            .as_str()
            .is_some_and(|r| r.contains(&killed_sock.display().to_string())),
        "the stale socket's entry names its path: {stale}"
    );
    assert!(stale["name"].is_null(), "{stale}");
    for (sock, name) in [
        (&no_cs_sock, &no_cs),
        (&unimpl_sock, &unimplemented),
        (&dying_sock, &dying),
    ] {
        let e = entry_of(&drivers, sock).expect("an entry");
        assert_eq!(e["name"], name.as_str(), "{e}");
        assert!(e["lastError"].is_null(), "recorded, not an error: {e}");
    }

    // The served driver attaches; nothing is written for the others.
    let node = unique_name("disc-node");
    create_node(&client, &node).await;
    let all = [&controller, &killed, &no_cs, &unimplemented, &dying];
    let entries: Vec<NodeDriver> = all
        .iter()
        .map(|d| NodeDriver::new(d, "mock-node"))
        .collect();
    create_csinode_with(&client, &node, &entries).await;
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let mut others = Vec::new();
    for d in &all[1..] {
        let (pv, va) = (unique_name("pv"), unique_name("va"));
        PvBuilder::new(&pv, d, "vol-0").create(&client).await;
        create_va(&client, &va, d, &node, &pv).await;
        others.push(va);
    }
    let (pv, va) = (unique_name("pv"), unique_name("va"));
    PvBuilder::new(&pv, &controller, "vol-0")
        .create(&client)
        .await;
    create_va(&client, &va, &controller, &node, &pv).await;
    wait_for(&vas, &va, "attached", is_attached(), WAIT_TIMEOUT)
        .await
        .expect("the served driver's VA is attached");
    for va in &others {
        let v = vas.get(va).await.expect("the VA");
        let untouched = v.metadata.finalizers.is_none()
            && v.status.as_ref().is_none_or(|s| {
                !s.attached && s.attach_error.is_none() && s.attachment_metadata.is_none()
            })
            && v.metadata
                .managed_fields
                .as_ref()
                .is_some_and(|m| m.len() == 1);
        assert!(
            untouched,
            "nothing is written for a socket that is not served (one writer: the test): {v:?}"
        );
    }
    for d in &all[1..] {
        assert_eq!(
            leases_of(&client, d).await,
            Vec::<String>::new(),
            "no Lease for {d}"
        );
    }
    assert_eq!(leases_of(&client, &controller).await, ["default"]);
    // No series for a socket that is not served, but the unserved check's: that check reports
    // every driver a VolumeAttachment names, served here or not (its cluster-wide view), and
    // these VAs name the unserved sockets' drivers.
    let metrics = hub.metrics().await.expect("metrics");
    let cluster_view = [
        "attacher_hub_driver_unserved{",
        "attacher_hub_driver_waiting_volumeattachments{",
    ];
    for d in &all[1..] {
        let label = format!("driver_name=\"{d}\"");
        let served: Vec<&str> = metrics
            .lines()
            .filter(|l| l.contains(&label))
            .filter(|l| !cluster_view.iter().any(|f| l.starts_with(f)))
            .collect();
        assert!(served.is_empty(), "no series for {d}: {served:?}");
    }
    // Logged once per socket, with its path.
    let stale_lines = |hub: &Attacher| {
        hub.process
            .stderr()
            .lines()
            .chain(hub.process.stdout().lines())
            .filter(|l| {
                l.contains("stale socket") && l.contains(&killed_sock.display().to_string())
            })
            .count()
    };
    assert_eq!(stale_lines(&hub), 1, "the stale socket is logged once");
    // The node plugin that dies when asked for its controller service was asked once: it
    // died, was started again, and is not asked again (checked at the end).
    eventually("the node plugin that died runs again", WAIT_TIMEOUT, || {
        let n = dying_starts.load(std::sync::atomic::Ordering::SeqCst);
        async move { (n >= 2).then_some(()) }
    })
    .await;

    // A driver starts listening at the stale socket's path: it is served.
    let _back = mock(&killed_sock, &killed, &[]).await;
    eventually(
        "the driver at the stale path leads",
        WAIT_TIMEOUT,
        || async {
            let ds = hub.drivers().await?;
            (state(entry_of(&ds, &killed_sock)) == "leading").then_some(())
        },
    )
    .await;
    wait_for(&vas, &others[0], "attached", is_attached(), WAIT_TIMEOUT)
        .await
        .expect("the VA of the driver back at the stale path is attached");

    // The served controller is killed: its socket goes stale, its driver is no longer served.
    kill(&mut ctl, &ctl_sock).await;
    let ds = eventually(
        "the killed controller's socket is stale",
        WAIT_TIMEOUT,
        || async {
            let ds = hub.drivers().await?;
            (state(entry_of(&ds, &ctl_sock)) == "staleSocket").then_some(ds)
        },
    )
    .await;
    assert!(
        entry_of(&ds, &ctl_sock).expect("an entry")["name"].is_null(),
        "{ds:#?}"
    );
    eventually("its driver_up series is gone", WAIT_TIMEOUT, || async {
        let m = hub.metrics().await?;
        (!m.contains(&format!(
            "attacher_hub_driver_up{{driver_name=\"{controller}\"}}"
        )))
        .then_some(())
    })
    .await;
    // And served again when it comes back.
    let _ctl = mock(&ctl_sock, &controller, &[]).await;
    eventually("the controller leads again", WAIT_TIMEOUT, || async {
        let ds = hub.drivers().await?;
        (state(entry_of(&ds, &ctl_sock)) == "leading").then_some(())
    })
    .await;
    assert_eq!(
        dying_starts.load(std::sync::atomic::Ordering::SeqCst),
        2,
        "the node plugin that dies when asked was never asked again"
    );
    hub.assert_running();
    kubelet.abort();
    hub.process.stop().await;
}
