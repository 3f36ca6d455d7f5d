//! A request rate limit, read as client-go reads `--kube-api-qps`/`--kube-api-burst`.

use serde::Serialize;

/// client-go's `rest.DefaultQPS`: what a QPS of 0 means.
const CLIENT_GO_DEFAULT_QPS: f64 = 5.0;
/// client-go's `rest.DefaultBurst`: what a burst of 0 means.
const CLIENT_GO_DEFAULT_BURST: u32 = 10;

/// A request rate limit.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase", tag = "kind")]
pub enum Limit {
    /// No client-side limit.
    Unlimited,
    /// `qps` requests per second on average, bursts of up to `burst`.
    Rate {
        /// Tokens per second; finite and greater than zero.
        qps: f64,
        /// Bucket size; at least 1.
        burst: u32,
    },
}

impl Limit {
    /// What client-go makes of a QPS/burst pair (`rest.Config`): QPS 0 means 5, burst 0 means
    /// 10, and a negative QPS turns the limiter off. `burst` must not be negative; callers
    /// refuse that before.
    pub fn client_go(qps: f64, burst: u32) -> Self {
        let qps = if qps == 0.0 {
            CLIENT_GO_DEFAULT_QPS
        } else {
            qps
        };
        let burst = if burst == 0 {
            CLIENT_GO_DEFAULT_BURST
        } else {
            burst
        };
        Self::rate(qps, burst)
    }

    /// The process-wide cap from `--hub-kube-api-qps`/`--hub-kube-api-burst` (or the
    /// `hubKubeApiQps`/`hubKubeApiBurst` fields): QPS 0 (the default) or below means no cap;
    /// burst 0 means twice the QPS (client-go's default ratio), at least 1.
    pub fn cap(qps: f64, burst: u32) -> Self {
        // NaN and non-positive values alike mean no cap.
        if qps.is_nan() || qps <= 0.0 {
            return Self::Unlimited;
        }
        let burst = if burst == 0 {
            // Saturating float-to-int conversion; at least one token.
            ((qps * 2.0).ceil() as u32).max(1)
        } else {
            burst
        };
        Self::rate(qps, burst)
    }

    fn rate(qps: f64, burst: u32) -> Self {
        if qps.is_finite() && qps > 0.0 {
            Self::Rate {
                qps,
                burst: burst.max(1),
            }
        } else {
            Self::Unlimited
        }
    }

    /// The rate, if limited.
    pub fn qps(&self) -> Option<f64> {
        match self {
            Self::Unlimited => None,
            Self::Rate { qps, .. } => Some(*qps),
        }
    }
}

impl std::fmt::Display for Limit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unlimited => f.write_str("no limit"),
            Self::Rate { qps, burst } => write!(f, "{qps} QPS, burst {burst}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_go_defaults_apply_to_zero_and_a_negative_qps_means_no_limit() {
        assert_eq!(
            Limit::client_go(0.0, 0),
            Limit::Rate {
                qps: 5.0,
                burst: 10
            }
        );
        assert_eq!(Limit::client_go(2.5, 7), Limit::Rate { qps: 2.5, burst: 7 });
        assert_eq!(Limit::client_go(-1.0, 10), Limit::Unlimited);
        assert_eq!(Limit::client_go(f64::NAN, 10), Limit::Unlimited);
    }

    #[test]
    fn the_cap_is_off_by_default_and_its_burst_defaults_to_twice_the_qps() {
        assert_eq!(Limit::cap(0.0, 0), Limit::Unlimited);
        assert_eq!(Limit::cap(-3.0, 5), Limit::Unlimited);
        assert_eq!(
            Limit::cap(50.0, 0),
            Limit::Rate {
                qps: 50.0,
                burst: 100
            }
        );
        assert_eq!(Limit::cap(0.2, 0), Limit::Rate { qps: 0.2, burst: 1 });
        assert_eq!(
            Limit::cap(50.0, 60),
            Limit::Rate {
                qps: 50.0,
                burst: 60
            }
        );
    }
}
