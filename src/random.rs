//! A random number for jitter (leader-election retries, watch backoff), without a
//! random-number crate: spreading retries apart needs no more than the standard library's
//! randomly keyed hasher.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// A random number in `[0, 1)`; good enough to spread candidates' retries apart, which is all
/// jitter is for.
pub fn random_unit() -> f64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u64(0);
    (hasher.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_units_stay_in_the_unit_interval() {
        for _ in 0..100 {
            assert!((0.0..1.0).contains(&random_unit()));
        }
    }
}
