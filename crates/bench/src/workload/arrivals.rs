//! Poisson arrivals: exponential gaps between request sends, from a seeded RNG.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// Send offsets in seconds for `n` requests arriving as a Poisson process of `rate` per second.
/// The first request goes at 0.
pub fn poisson_offsets(rate: f64, n: usize, seed: u64) -> Vec<f64> {
    assert!(rate > 0.0, "request rate must be positive");
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed_a441_7a1e);
    let mut t = 0.0;
    (0..n)
        .map(|i| {
            if i > 0 {
                // 1 − u lies in (0, 1], so the logarithm stays finite.
                let u: f64 = rng.random();
                t += -(1.0 - u).ln() / rate;
            }
            t
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_gap_is_one_over_rate_and_gaps_are_exponential() {
        let offsets = poisson_offsets(50.0, 20_001, 3);
        let gaps: Vec<f64> = offsets.windows(2).map(|w| w[1] - w[0]).collect();
        let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
        assert!((mean - 0.02).abs() < 0.02 * 0.03, "mean gap {mean}");
        // An exponential's standard deviation equals its mean.
        let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
        assert!((var.sqrt() / mean - 1.0).abs() < 0.05);
        assert_eq!(offsets[0], 0.0);
        assert!(offsets.windows(2).all(|w| w[1] >= w[0]));
    }

    #[test]
    fn same_seed_same_schedule() {
        assert_eq!(poisson_offsets(5.0, 10, 1), poisson_offsets(5.0, 10, 1));
        assert_ne!(poisson_offsets(5.0, 10, 1), poisson_offsets(5.0, 10, 2));
    }
}
