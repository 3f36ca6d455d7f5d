//! One task for the electors of a hub.
//!
//! A hub's electors sleep most of the time and wake together on the lines of their
//! [`RenewGrid`](super::RenewGrid). Each in a task of its own, every renewal of a round cost a
//! wake-up of its own, often on the other worker thread, and sent its request to the API
//! connection alone. Run by one [`Runner`], the electors of a round are polled in one go: their
//! requests reach the connection together and leave in a few writes, and the round costs one
//! wake-up. An elector's poll is short (it waits on timers and the API, never blocks), so one
//! task holds up nobody.
//!
//! Each elector still ends on its own: a [`Handle`] gives its result, like a `JoinHandle`, and
//! dropping the handle drops the elector (as aborting its task would). A panic in one elector
//! is caught, and reported by its handle as a task's panic would be; the others run on.

use std::{
    any::Any,
    future::Future,
    panic::AssertUnwindSafe,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use futures::{
    FutureExt, StreamExt,
    future::{AbortHandle, Abortable, BoxFuture},
    stream::FuturesUnordered,
};
use tokio::sync::{mpsc, oneshot};

/// Runs futures (the electors of a hub) in one task. Clones share the task; when the last
/// clone is dropped, the task ends, and the futures it still runs are dropped with it (their
/// handles report [`Ended::Dropped`]), as tasks are when their runtime shuts down.
#[derive(Clone, Debug)]
pub struct Runner {
    /// Where new futures go.
    tx: mpsc::UnboundedSender<BoxFuture<'static, ()>>,
    /// The task, aborted when the last clone goes.
    _task: Arc<tokio_util::task::AbortOnDropHandle<()>>,
}

impl Runner {
    /// Starts the task; call within a Tokio runtime.
    pub fn new() -> Self {
        let (tx, mut rx) = mpsc::unbounded_channel::<BoxFuture<'static, ()>>();
        let task = tokio::spawn(async move {
            let mut running = FuturesUnordered::new();
            loop {
                tokio::select! {
                    Some(()) = running.next(), if !running.is_empty() => {}
                    new = rx.recv() => match new {
                        Some(f) => running.push(f),
                        None => return,
                    },
                }
            }
        });
        Self {
            tx,
            _task: Arc::new(tokio_util::task::AbortOnDropHandle::new(task)),
        }
    }

    /// Runs `future` in the runner's task. Its [`Handle`] resolves to its output (or to the
    /// panic that ended it); dropping the handle drops the future.
    pub fn run<T: Send + 'static>(
        &self,
        future: impl Future<Output = T> + Send + 'static,
    ) -> Handle<T> {
        let (abort, registration) = AbortHandle::new_pair();
        let (done, result) = oneshot::channel();
        let job = Abortable::new(AssertUnwindSafe(future).catch_unwind(), registration).map(
            move |ended| {
                if let Ok(output) = ended {
                    let _ = done.send(output);
                }
            },
        );
        // A runner whose task is gone (the runtime shutting down) drops the job: its handle
        // then reports it ended without an output.
        let _ = self.tx.send(Box::pin(job));
        Handle { result, abort }
    }
}

impl Default for Runner {
    fn default() -> Self {
        Self::new()
    }
}

/// How a future run by a [`Runner`] ended without an output.
#[derive(Debug, thiserror::Error)]
pub enum Ended {
    /// It panicked.
    #[error("it panicked: {0}")]
    Panicked(String),
    /// It was dropped before it finished (the runner's task ended).
    #[error("it was dropped before it finished")]
    Dropped,
}

/// The handle of a future run by a [`Runner`]: resolves to its output. Dropped, it drops the
/// future (at the runner's next poll).
#[derive(Debug)]
pub struct Handle<T> {
    result: oneshot::Receiver<Result<T, Box<dyn Any + Send>>>,
    abort: AbortHandle,
}

impl<T> Future for Handle<T> {
    type Output = Result<T, Ended>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.result).poll(cx).map(|r| match r {
            Ok(Ok(output)) => Ok(output),
            Ok(Err(panic)) => Err(Ended::Panicked(crate::telemetry::panic_message(&*panic))),
            Err(_) => Err(Ended::Dropped),
        })
    }
}

impl<T> Drop for Handle<T> {
    fn drop(&mut self) {
        self.abort.abort();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn each_future_ends_on_its_own_with_its_output() {
        let runner = Runner::new();
        let slow = runner.run(async {
            tokio::time::sleep(Duration::from_secs(10)).await;
            "slow"
        });
        let fast = runner.run(async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            "fast"
        });
        assert_eq!(fast.await.expect("ended"), "fast");
        assert_eq!(slow.await.expect("ended"), "slow");
    }

    #[tokio::test(start_paused = true)]
    async fn a_panic_ends_only_its_own_future() {
        let runner = Runner::new();
        let survivor = runner.run(async {
            tokio::time::sleep(Duration::from_secs(5)).await;
            42
        });
        let bad = runner.run(async {
            tokio::time::sleep(Duration::from_secs(1)).await;
            panic!("elector bug")
        });
        match bad.await {
            Err(Ended::Panicked(text)) => assert_eq!(text, "elector bug"),
            other => panic!("expected the panic, got {other:?}"),
        }
        assert_eq!(survivor.await.expect("ran on"), 42);
    }

    #[tokio::test(start_paused = true)]
    async fn dropping_the_handle_drops_the_future() {
        /// Counts its drops.
        struct Dropped(Arc<AtomicUsize>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let drops = Arc::new(AtomicUsize::new(0));
        let polls = Arc::new(AtomicUsize::new(0));
        let runner = Runner::new();
        let handle = runner.run({
            let (drops, polls) = (drops.clone(), polls.clone());
            async move {
                let _guard = Dropped(drops);
                loop {
                    polls.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        });
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert_eq!(polls.load(Ordering::SeqCst), 3);
        drop(handle);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            polls.load(Ordering::SeqCst),
            3,
            "a dropped future runs no more"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_futures_of_a_round_are_polled_in_one_task() {
        let runner = Runner::new();
        let handles: Vec<_> = (0..20)
            .map(|_| {
                runner.run(async {
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    tokio::task::try_id()
                })
            })
            .collect();
        let mut ids = Vec::new();
        for h in handles {
            ids.push(h.await.expect("ended").expect("in a task"));
        }
        ids.dedup();
        assert_eq!(ids.len(), 1, "one task ran them all");
    }

    #[tokio::test(start_paused = true)]
    async fn the_last_clone_of_the_runner_takes_its_futures_along() {
        let runner = Runner::new();
        let handle = runner.run(async {
            tokio::time::sleep(Duration::from_secs(3)).await;
            "done"
        });
        let clone = runner.clone();
        drop(runner);
        // A clone keeps the task.
        assert_eq!(clone.run(async { "also" }).await.expect("ran"), "also");
        let never = clone.run(std::future::pending::<()>());
        assert_eq!(handle.await.expect("ran"), "done");
        drop(clone);
        assert!(matches!(never.await, Err(Ended::Dropped)));
    }
}
