//! One label-selected watch of VolumeAttachments, for the harnesses that time what happens to
//! a run's VAs (the hub tests' attach watch, the fault kit's ledger, the benchmark's timeline).
//! The watch runs as a task and hands every event to the caller's closure, which keeps the
//! record it needs; the start returns once the first list is in, so nothing created after it
//! is missed.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::runtime::watcher;
use kube::{Api, Client};
use tokio::task::JoinHandle;

/// What the watch does when the API server refuses or cuts it (it may be down on purpose):
/// the watcher tries again at the next poll, after `pause` (none when zero).
#[derive(Clone, Copy, Debug)]
pub(crate) struct OnWatchError {
    /// Printed before each error (`<log>: <error>`), or nothing.
    pub(crate) log: Option<&'static str>,
    /// Wait before the next try.
    pub(crate) pause: Duration,
}

/// Starts watching the VAs that match `labels`, handing each event to `on_event` as it
/// arrives; returns the task once the first list is complete (`InitDone`, after `on_event`
/// saw it). Panics, naming the watch as `what`, when the list takes longer than `list_within`
/// or the watch ends before it. The task runs until aborted or until the stream ends.
pub(crate) async fn watch_vas(
    client: &Client,
    labels: &str,
    what: &str,
    list_within: Duration,
    on_error: OnWatchError,
    mut on_event: impl FnMut(watcher::Event<VolumeAttachment>) + Send + 'static,
) -> JoinHandle<()> {
    let api: Api<VolumeAttachment> = Api::all(client.clone());
    let config = watcher::Config::default().labels(labels);
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut ready = Some(ready_tx);
        let mut stream = watcher(api, config).boxed();
        loop {
            let event = match stream.try_next().await {
                Ok(Some(e)) => e,
                Ok(None) => return,
                Err(e) => {
                    if let Some(log) = on_error.log {
                        eprintln!("{log}: {e}");
                    }
                    if !on_error.pause.is_zero() {
                        tokio::time::sleep(on_error.pause).await;
                    }
                    continue;
                }
            };
            let listed = matches!(event, watcher::Event::InitDone);
            on_event(event);
            if listed && let Some(tx) = ready.take() {
                let _ = tx.send(());
            }
        }
    });
    tokio::time::timeout(list_within, ready_rx)
        .await
        .unwrap_or_else(|e| panic!("the {what} did not list within {list_within:?}: {e:?}"))
        .unwrap_or_else(|e| panic!("the {what} ended: {e:?}"));
    task
}
