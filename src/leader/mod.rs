//! Lease-based leader election with client-go's `LeaderElector` / `LeaseLock` semantics.
//!
//! attacher-hub and the Go external-attacher must be able to contend for the *same*
//! `coordination.k8s.io/v1` Lease (`external-attacher-leader-<sanitized driver>`,
//! `docs/design.md#leader-election`) without ever both leading. So this module writes the Lease
//! exactly as client-go does:
//!
//! * every `retry_period` (jittered by up to [`JITTER_FACTOR`] × `retry_period` while
//!   acquiring), *try to acquire or renew*: GET the Lease; if it does not exist, create it;
//!   otherwise remember the record and the **local** instant at which it last changed. A Lease
//!   whose holder is someone else and whose record changed less than `lease_duration` ago
//!   (measured on our monotonic clock, so clock skew between nodes does not matter) is left
//!   alone. Otherwise it is replaced carrying the `resourceVersion` that was read, so a
//!   `409 Conflict` means that another candidate won the race;
//! * the leader renews every `retry_period` (first with an update from its cached Lease, the
//!   "fast path", then with a GET as above); if renewals keep failing for `renew_deadline` since
//!   the last successful one, it stops leading. Because `renew_deadline < lease_duration`, it has
//!   stopped before any other candidate can consider the Lease expired;
//! * on cancellation with `release_on_cancel`, the leader first publishes
//!   [`Leadership::Standby`] and then writes an empty holder with `leaseDurationSeconds: 1`, so a
//!   waiting candidate (Go or Rust) takes over on its next attempt.
//!
//! Leadership is published as a [`tokio::sync::watch`] value, because a hub must stop only the
//! driver whose Lease it lost, not exit (`docs/design.md#leadership-watch`): controllers start
//! their work when it becomes [`Leadership::Leading`] and stop when it changes away from it.
//! Unlike client-go, whose run loop ends (and external-attacher exits) after leadership is lost,
//! the elector goes back to competing; the caller decides whether a loss is fatal.
//!
//! The Kubernetes client passed to [`LeaderElector::new`] should be a **separate** client from the
//! one the controllers use (as external-attacher does since v3.0), so that a throttled or busy
//! controller client cannot cost the lease. Building it is the caller's job.
//!
//! Not reproduced from client-go: leader-election Events (the reference RBAC does not grant them,
//! so external-attacher's event writes fail anyway) and the `leader_election_*` metrics.
//!
//! The parts: [`config`] (settings and their checks), [`record`] (the Lease codec), [`elector`]
//! (the loop), [`health`] (the health view), [`identity`] (holder identity and namespace),
//! [`balance`] (spreading driver Leases across hub replicas), [`runner`] (one task for a hub's
//! electors), [`guard`] (no leading while
//! another holder renews a Lease of the same name in another namespace) and [`lean`] (Leases
//! read without their managed fields). It uses only [`crate::names`], [`crate::random`],
//! [`crate::telemetry`], [`crate::api_error`], [`crate::backoff`] and, for the elector's requests, the driver's API
//! budget and pushback of [`crate::k8s`] (and kube).

pub mod balance;
pub mod config;
pub mod elector;
pub mod error;
pub mod guard;
pub mod health;
pub mod identity;
pub mod lean;
pub mod record;
pub mod runner;
pub mod timing;

pub use config::{
    Config, ConfigError, DEFAULT_LEASE_DURATION, DEFAULT_RENEW_DEADLINE, DEFAULT_RETRY_PERIOD,
};
pub use elector::{AcquireGate, LeaderElector, Leadership, Seen};
pub use error::{Error, Result};
pub use health::{HEALTH_TOLERANCE, HealthError, Status};
pub use identity::{default_identity, resolve_namespace};
pub use lean::LeanLease;
pub use runner::Runner;
pub use timing::{JITTER_FACTOR, MIN_LEASE_DURATION, RenewGrid, TimingError};
