//! One gate per test process for the tests that measure timings on the shared machine: a test
//! that takes it [`alone`] runs with no other test of the gate beside it, while tests that
//! take it [`shared`] run beside each other. A test binary runs its tests two at a time (one
//! per core) whatever file they came from, so a bound measured by one test holds only if what
//! runs beside it is known: the hub's isolation test compares attach latencies, and each
//! rollover of a shipped path bounds its attach latency and its leaderless time (the rollovers
//! also share cluster-scoped names). Tests that take neither are not held.

use tokio::sync::{RwLock, RwLockReadGuard, RwLockWriteGuard};

static GATE: RwLock<()> = RwLock::const_new(());

/// The gate held alone: no other test that takes the gate runs until it is dropped.
pub(crate) type Alone = RwLockWriteGuard<'static, ()>;

/// Waits until no other test holds the gate, then holds it alone.
pub(crate) async fn alone() -> Alone {
    GATE.write().await
}

/// Waits until no test holds the gate alone, then holds it with the other sharers.
pub(crate) async fn shared() -> RwLockReadGuard<'static, ()> {
    GATE.read().await
}
