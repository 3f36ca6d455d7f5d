//! What a driver's API budget reports: how long each request waited, and which limit held it
//! (the [`Observer`] the budget calls; `ApiObserver` records it in the driver's series).

use std::time::Duration;

/// Which limit made a request wait.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limiter {
    /// The driver's own budget.
    Driver,
    /// The process-wide cap.
    Hub,
}

/// Where an API budget reports its waits (the metrics of its driver).
pub trait Observer: Send + Sync + std::fmt::Debug {
    /// One request passed after waiting `waited` in total.
    fn waited(&self, waited: Duration);
    /// One request had to wait for `limiter`.
    fn throttled(&self, limiter: Limiter);
    /// The API server answered one request 429 Too Many Requests.
    fn too_many_requests(&self) {}
    /// A request waited `waited` because the API server asked it to (`Retry-After`).
    fn retry_after_waited(&self, waited: Duration) {
        let _ = waited;
    }
}

/// A driver's API budget metrics.
#[derive(Debug)]
pub(crate) struct ApiObserver {
    pub(crate) wait: prometheus::Histogram,
    pub(crate) throttled_driver: prometheus::IntCounter,
    pub(crate) throttled_hub: prometheus::IntCounter,
    pub(crate) too_many_requests: prometheus::IntCounter,
    pub(crate) retry_after_wait: prometheus::Counter,
}

impl Observer for ApiObserver {
    fn waited(&self, waited: Duration) {
        self.wait.observe(waited.as_secs_f64());
    }

    fn throttled(&self, limiter: Limiter) {
        match limiter {
            Limiter::Driver => self.throttled_driver.inc(),
            Limiter::Hub => self.throttled_hub.inc(),
        }
    }

    fn too_many_requests(&self) {
        self.too_many_requests.inc();
    }

    fn retry_after_waited(&self, waited: Duration) {
        self.retry_after_wait.inc_by(waited.as_secs_f64());
    }
}
