//! The bounds of a driver list, checked before anything is allocated for it: the file's size,
//! the number of drivers and of all their workers. (Each number in an entry has the bound of
//! its flag, see the `MAX_*` constants of [`crate::cli`].)

/// Largest `drivers.yaml` read, in bytes. A ConfigMap holds at most 1 MiB, and a thousand
/// fully commented entries like `drivers.example.yaml`'s first one take about 4 MiB; a larger
/// file is not a driver list, and reading no more than this keeps a mistaken path (a log, a
/// disk image) from filling memory.
pub const MAX_FILE_BYTES: usize = 4 << 20;

/// Most entries under `drivers:`. Clusters run a handful of CSI drivers, the largest a few
/// dozen; each entry costs a connection, a Lease and three worker pools.
pub const MAX_DRIVERS: usize = 1_000;

/// Most workers of all the file's drivers together (attach, detach and PersistentVolume pools).
/// [`crate::cli::MAX_WORKERS`] bounds one pool; this bounds their sum, so that a thousand drivers with
/// large pools cannot start millions of tasks: a hundred drivers with the default ten workers
/// run 3,000.
pub const MAX_HUB_WORKERS: u64 = 100_000;
