//! Client-side API request budgets: token buckets like client-go's
//! `--kube-api-qps` / `--kube-api-burst` limiter.

use std::{
    sync::Mutex,
    time::{Duration, Instant},
};

/// A token bucket: `burst` tokens, refilled at `qps` per second. Waiting
/// callers are served in no particular order; each `acquire` takes one token.
#[derive(Debug)]
pub struct Budget {
    /// Tokens per second; `None` means unlimited (`qps <= 0`).
    qps: Option<f64>,
    /// Bucket size.
    burst: f64,
    /// Tokens left and when they were last counted.
    state: Mutex<(f64, Instant)>,
}

impl Budget {
    /// A budget of `qps` requests per second with bursts of `burst`. A
    /// non-positive `qps` means no limit.
    pub fn new(qps: f64, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps: (qps > 0.0 && qps.is_finite()).then_some(qps),
            burst,
            state: Mutex::new((burst, Instant::now())),
        }
    }

    /// Takes one token, waiting for it if the bucket is empty.
    pub async fn acquire(&self) {
        let Some(qps) = self.qps else { return };
        loop {
            let wait = {
                let mut state = match self.state.lock() {
                    Ok(s) => s,
                    Err(poisoned) => poisoned.into_inner(),
                };
                let now = Instant::now();
                let (tokens, since) = *state;
                let tokens =
                    (tokens + now.duration_since(since).as_secs_f64() * qps).min(self.burst);
                if tokens >= 1.0 {
                    *state = (tokens - 1.0, now);
                    return;
                }
                *state = (tokens, now);
                Duration::from_secs_f64((1.0 - tokens) / qps)
            };
            tokio::time::sleep(wait).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_burst_is_free_and_then_requests_are_paced() {
        let b = Budget::new(100.0, 5);
        let start = Instant::now();
        for _ in 0..5 {
            b.acquire().await;
        }
        assert!(start.elapsed() < Duration::from_millis(20));
        for _ in 0..10 {
            b.acquire().await;
        }
        // Ten more tokens at 100/s take about 100 ms.
        assert!(
            start.elapsed() >= Duration::from_millis(80),
            "{:?}",
            start.elapsed()
        );
    }

    #[tokio::test]
    async fn zero_qps_means_unlimited() {
        let b = Budget::new(0.0, 1);
        let start = Instant::now();
        for _ in 0..1000 {
            b.acquire().await;
        }
        assert!(start.elapsed() < Duration::from_millis(50));
    }
}
