//! Per-key async locks, so that a VA moving from the attach to the detach queue is never worked
//! on by two workers at once; an entry disappears when its last holder is done.

use std::{collections::HashMap, sync::Arc};

use parking_lot::Mutex;

/// Per-key async locks; entries disappear when the last holder is done.
#[derive(Debug, Default)]
pub(super) struct KeyLocks(Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>);

pub(super) struct KeyGuard<'a> {
    locks: &'a KeyLocks,
    key: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl KeyLocks {
    pub(super) async fn lock(&self, key: &str) -> KeyGuard<'_> {
        let m = {
            let mut map = self.0.lock();
            map.entry(key.to_string()).or_default().clone()
        };
        let guard = m.lock_owned().await;
        KeyGuard {
            locks: self,
            key: key.to_string(),
            guard: Some(guard),
        }
    }
}

impl Drop for KeyGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut map = self.locks.0.lock();
        if map
            .get(&self.key)
            .is_some_and(|m| Arc::strong_count(m) == 1)
        {
            map.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn entries(locks: &KeyLocks) -> usize {
        locks.0.lock().len()
    }

    /// A key is worked on by one worker at a time; other keys are free; the entry goes with the
    /// last holder, also when a waiter gives up (a worker aborted while it waited).
    #[tokio::test(start_paused = true)]
    async fn a_key_is_held_once_at_a_time_and_its_entry_goes_with_the_last_holder() {
        let locks = Arc::new(KeyLocks::default());
        let first = locks.lock("va").await;
        drop(locks.lock("other").await);
        assert_eq!(entries(&locks), 1, "a free key leaves nothing behind");

        let second = tokio::spawn({
            let locks = locks.clone();
            async move {
                let _held = locks.lock("va").await;
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
        let third = tokio::spawn({
            let locks = locks.clone();
            async move {
                let _held = locks.lock("va").await;
            }
        });
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert!(!second.is_finished() && !third.is_finished(), "both wait");
        third.abort();
        assert!(third.await.expect_err("aborted").is_cancelled());
        drop(first);
        second.await.expect("the second holder");
        assert_eq!(entries(&locks), 0);
    }
}
