//! The `mock-csi-driver` binary: serves the project's mock CSI driver on a
//! Unix socket until SIGINT or SIGTERM.

use std::{path::PathBuf, time::Duration};

use anyhow::Context as _;
use clap::Parser;
use mock_csi_driver::{Capabilities, Config, ExitMode, MockDriver, fault};

/// A mock CSI driver with in-memory volumes on any number of nodes,
/// capability switches and fault injection.
///
/// Prints `ready` on stdout once the endpoint listens. A control socket
/// `<endpoint>.ctl` (newline-delimited JSON) changes faults and readiness at
/// run time and returns the call record and the attachments.
#[derive(Debug, Parser)]
#[command(name = "mock-csi-driver", version, after_long_help = FAULT_HELP)]
struct Args {
    /// Socket to serve: `/path`, `unix:///path` or `unix:/path`.
    #[arg(long)]
    endpoint: String,
    /// Driver name returned by GetPluginInfo.
    #[arg(long)]
    name: String,
    /// Node ID returned by NodeGetInfo.
    #[arg(long, default_value = "mock-node")]
    node_id: String,
    /// Pre-create volumes vol-0 … vol-<N-1> (volume ID = name).
    #[arg(long, default_value_t = 0)]
    volumes: usize,
    /// Most volumes published to one node (NodeGetInfo and publish); 0 = no limit.
    #[arg(long, default_value_t = 0)]
    max_volumes_per_node: i64,
    /// Node IDs starting with this prefix do not exist: publish answers NOT_FOUND.
    #[arg(long)]
    missing_node_prefix: Option<String>,
    /// Do not advertise the CONTROLLER_SERVICE plugin capability.
    #[arg(long)]
    no_controller_service: bool,
    /// Do not advertise PUBLISH_UNPUBLISH_VOLUME (publish/unpublish → UNIMPLEMENTED).
    #[arg(long)]
    no_publish: bool,
    /// Do not advertise PUBLISH_READONLY (readonly is ignored).
    #[arg(long)]
    no_readonly: bool,
    /// Do not advertise LIST_VOLUMES_PUBLISHED_NODES (no published_node_ids).
    #[arg(long)]
    no_published_nodes: bool,
    /// Do not advertise LIST_VOLUMES (ListVolumes → UNIMPLEMENTED).
    #[arg(long)]
    no_list_volumes: bool,
    /// Do not advertise the node STAGE_UNSTAGE_VOLUME capability.
    #[arg(long)]
    no_stage_unstage: bool,
    /// Advertise SINGLE_NODE_MULTI_WRITER (controller and node).
    #[arg(long)]
    single_node_multi_writer: bool,
    /// Probe answers ready=false for this long after start (e.g. 3s, 500ms).
    #[arg(long, value_parser = fault::parse_duration)]
    not_ready_for: Option<Duration>,
    /// Fault rule METHOD=FAULT, repeatable (grammar below).
    #[arg(long = "fault", value_name = "METHOD=FAULT")]
    faults: Vec<fault::Rule>,
}

const FAULT_HELP: &str = "\
FAULTS
  --fault METHOD=FAULT, METHOD a short RPC name (ControllerPublishVolume) or * for all
  (an exact method wins over *). FAULT is one step, or delay:<d>+<step>:
    delay:<duration>     add latency (500ms, 2s, 1.5s, 1m)
    code:<Code>          answer with a gRPC code (Unavailable, RESOURCE_EXHAUSTED, 14)
    every:<N>:<Code>     answer the Nth, 2Nth, ... call with Code; others normally
    hang                 never answer until the fault is cleared or changed
    close[:<duration>]   stop serving and drop all connections (once); serve
                         again on the same path after the duration if given
    exit:<status>        exit the process with this status
  Examples: --fault 'ControllerPublishVolume=code:ResourceExhausted'
            --fault 'ControllerPublishVolume=delay:2s' --fault '*=every:3:Unavailable'

CONTROL SOCKET (<endpoint>.ctl, one JSON object per line each way)
  {\"cmd\":\"set_fault\",\"method\":\"Probe\",\"fault\":\"hang\"}   {\"cmd\":\"clear_faults\"}
  {\"cmd\":\"clear_faults\",\"method\":\"Probe\"}   {\"cmd\":\"get_faults\"}
  {\"cmd\":\"set_ready\",\"ready\":false}   {\"cmd\":\"get_calls\"}   {\"cmd\":\"reset_calls\"}
  {\"cmd\":\"get_state\"}
";

/// Accepts `/path`, `unix:///path` and `unix:/path`.
fn socket_path(endpoint: &str) -> anyhow::Result<PathBuf> {
    let path = endpoint
        .strip_prefix("unix://")
        .or_else(|| endpoint.strip_prefix("unix:"))
        .unwrap_or(endpoint);
    anyhow::ensure!(
        path.starts_with('/') && !endpoint.contains("://") || endpoint.starts_with("unix://"),
        "endpoint {endpoint:?} is not /path, unix:///path or unix:/path"
    );
    anyhow::ensure!(
        path.starts_with('/'),
        "endpoint {endpoint:?} must be an absolute path"
    );
    Ok(PathBuf::from(path))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    attacher_hub::telemetry::init(attacher_hub::telemetry::Format::Text, "info");
    let Args {
        endpoint,
        name,
        node_id,
        volumes,
        max_volumes_per_node,
        missing_node_prefix,
        no_controller_service,
        no_publish,
        no_readonly,
        no_published_nodes,
        no_list_volumes,
        no_stage_unstage,
        single_node_multi_writer,
        not_ready_for,
        faults,
    } = Args::parse();
    let path = socket_path(&endpoint)?;
    let config = Config {
        node_id,
        volumes,
        max_volumes_per_node,
        missing_node_prefix,
        capabilities: Capabilities {
            controller_service: !no_controller_service,
            publish_unpublish: !no_publish,
            publish_readonly: !no_readonly,
            list_volumes: !no_list_volumes,
            list_volumes_published_nodes: !no_published_nodes,
            single_node_multi_writer,
            stage_unstage: !no_stage_unstage,
        },
        not_ready_for,
        faults,
        exit: ExitMode::Process,
        ..Config::new(name)
    };
    let handle = MockDriver::from_config(config)
        .serve(&path)
        .await
        .with_context(|| format!("serving {}", path.display()))?;
    println!("ready");

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r?,
        _ = term.recv() => {}
    }
    tracing::info!("signal received, shutting down");
    handle.shutdown().await;
    Ok(())
}
