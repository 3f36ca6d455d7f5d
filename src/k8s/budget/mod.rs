//! Client-side API request budgets.
//!
//! Every Go sidecar has its own client-go rate limiter (`--kube-api-qps`/`--kube-api-burst`), so
//! a hub that replaces N sidecars gives each driver its own [`ApiBudget`] with exactly those
//! limits: a driver never waits for another driver's tokens. On top of that, an operator may set
//! an optional process-wide [`FairCap`] (off by default) that bounds the hub's total request
//! rate and hands its tokens to the waiting drivers in turn, so a driver with one pending write
//! is served within about one round of the drivers that wait, however many writes another
//! driver has queued.
//!
//! Order: the driver's own budget is taken first, then the cap, so a driver held back by its
//! own budget never holds shared tokens.
//!
//! Hand-written because the two crates that offer token buckets (`governor`, `leaky-bucket`)
//! have no notion of fairness between callers, and client-go's limiter is a reservation-based
//! token bucket (`golang.org/x/time/rate`) whose FIFO pacing we reproduce in `Bucket`.

mod api_budget;
mod bucket;
mod fair_cap;
mod limit;

pub use api_budget::{ApiBudget, BudgetStatus};
pub use fair_cap::{CapStatus, FairCap};
pub use limit::Limit;

/// What the tests of the parts share: a driver's budget whose observer counts what it reports.
#[cfg(test)]
mod testing {
    use std::{sync::Arc, time::Duration};

    use parking_lot::Mutex;

    use super::{ApiBudget, FairCap, Limit};
    use crate::metrics::{Limiter, Observer};

    #[derive(Debug, Default)]
    pub(super) struct Counts {
        pub(super) waited: Mutex<Vec<Duration>>,
        pub(super) throttled: Mutex<Vec<Limiter>>,
    }

    #[derive(Debug)]
    struct Shared(Arc<Counts>);

    impl Observer for Shared {
        fn waited(&self, waited: Duration) {
            self.0.waited.lock().push(waited);
        }
        fn throttled(&self, limiter: Limiter) {
            self.0.throttled.lock().push(limiter);
        }
    }

    pub(super) fn budget(
        name: &str,
        limit: Limit,
        cap: &Arc<FairCap>,
    ) -> (Arc<ApiBudget>, Arc<Counts>) {
        let counts = Arc::new(Counts::default());
        let b = ApiBudget::new(name, limit, cap.clone(), Box::new(Shared(counts.clone())));
        (b, counts)
    }
}
