//! The token bucket both budgets are made of.

use std::time::Duration;

use tokio::time::Instant;

use super::limit::Limit;

/// A token bucket: `burst` tokens, refilled at `qps` per second.
#[derive(Debug)]
pub(super) struct Bucket {
    pub(super) limit: Limit,
    /// Tokens at `last`; negative when reservations are outstanding.
    tokens: f64,
    last: Instant,
}

impl Bucket {
    pub(super) fn new(limit: Limit, now: Instant) -> Self {
        let tokens = match limit {
            Limit::Unlimited => 0.0,
            Limit::Rate { burst, .. } => f64::from(burst),
        };
        Self {
            limit,
            tokens,
            last: now,
        }
    }

    /// Brings `tokens` up to `now`.
    pub(super) fn advance(&mut self, now: Instant) {
        if let Limit::Rate { qps, burst } = self.limit {
            let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
            self.tokens = (self.tokens + elapsed * qps).min(f64::from(burst));
        }
        self.last = self.last.max(now);
    }

    /// Reserves one token (golang.org/x/time/rate's `reserveN`): the token is ours after the
    /// returned wait. Reservations are served in the order they are made.
    pub(super) fn reserve(&mut self, now: Instant) -> Duration {
        let Limit::Rate { qps, .. } = self.limit else {
            return Duration::ZERO;
        };
        self.advance(now);
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / qps)
        }
    }

    /// Gives back a reserved token that was not used.
    pub(super) fn refund(&mut self) {
        if let Limit::Rate { burst, .. } = self.limit {
            self.tokens = (self.tokens + 1.0).min(f64::from(burst));
        }
    }

    /// Takes a token if one is there now.
    pub(super) fn try_take(&mut self, now: Instant) -> bool {
        match self.limit {
            Limit::Unlimited => true,
            Limit::Rate { .. } => {
                self.advance(now);
                if self.tokens >= 1.0 {
                    self.tokens -= 1.0;
                    true
                } else {
                    false
                }
            }
        }
    }

    /// How long until a whole token is there.
    pub(super) fn until_next(&self) -> Duration {
        match self.limit {
            Limit::Unlimited => Duration::ZERO,
            Limit::Rate { qps, .. } => {
                Duration::from_secs_f64(((1.0 - self.tokens) / qps).max(0.0))
            }
        }
    }

    /// A new limit; keeps the tokens there are, within the new burst.
    pub(super) fn set_limit(&mut self, limit: Limit, now: Instant) {
        self.advance(now);
        self.tokens = match (self.limit, limit) {
            (_, Limit::Unlimited) => 0.0,
            (Limit::Unlimited, Limit::Rate { burst, .. }) => f64::from(burst),
            (Limit::Rate { .. }, Limit::Rate { burst, .. }) => self.tokens.min(f64::from(burst)),
        };
        self.limit = limit;
    }

    pub(super) fn state(&mut self, now: Instant) -> (Limit, f64) {
        self.advance(now);
        (self.limit, self.tokens)
    }
}
