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
