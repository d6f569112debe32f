//! Which prompts each part of a sweep sends. The seeded order of the dataset is read as one long
//! sequence of positions: the warm-up takes the first positions, then each level the next slice
//! of `requests_per_level`, so no prompt repeats within a run (a server's prefix cache would
//! otherwise serve every level after the first from memory). Where the dataset is shorter than
//! the run, positions wrap round it: every prompt is then sent ⌊D/N⌋ or ⌈D/N⌉ times, the least
//! reuse possible. The same seed gives the same prompts level by level, so runs stay paired.

use std::ops::Range;

/// The assignment of dataset positions to the warm-up and to each level of a sweep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptPlan {
    /// Prompts in the dataset.
    pub dataset: usize,
    pub warmup: usize,
    pub per_level: usize,
    /// The slice the first level takes (scripts that run one level per invocation pass the
    /// level's place in their sweep, so that invocations do not repeat each other's prompts).
    pub first_slice: usize,
    /// Every level takes the first level's slice (`--reuse-prompts`).
    pub reuse: bool,
}

impl PromptPlan {
    /// The positions of the warm-up requests.
    pub fn warmup_positions(&self) -> Range<usize> {
        0..self.warmup
    }

    /// The slice of dataset positions that level `level` (0-based, in the order run) sends.
    pub fn level_positions(&self, level: usize) -> Range<usize> {
        let slice = self.first_slice + if self.reuse { 0 } else { level };
        let start = self.warmup + slice * self.per_level;
        start..start + self.per_level
    }

    /// The dataset index of a position.
    pub fn index(&self, position: usize) -> usize {
        position % self.dataset.max(1)
    }

    /// How many of level `level`'s requests send a prompt already sent at an earlier position of
    /// the sweep (the warm-up, an earlier slice, or earlier in the same level).
    pub fn repeated(&self, level: usize) -> usize {
        if self.reuse && level > 0 {
            return self.per_level;
        }
        self.level_positions(level)
            .filter(|&p| p >= self.dataset)
            .count()
    }

    /// Positions the whole sweep of `levels` levels reaches (the warm-up included).
    pub fn needed(&self, levels: usize) -> usize {
        let slices = self
            .first_slice
            .saturating_add(if self.reuse { 1 } else { levels });
        self.warmup
            .saturating_add(slices.saturating_mul(self.per_level))
    }

    /// Refuses a sweep whose positions would not fit the bound (`--first-slice` or the sizes
    /// far too large): generated datasets make a prompt per position.
    pub fn check(&self, levels: usize) -> Result<(), String> {
        let needed = self.needed(levels);
        if needed > Self::MAX_POSITIONS {
            return Err(format!(
                "the sweep would reach dataset position {needed}; at most {} are supported (lower --first-slice, --requests-per-level or --warmup-requests)",
                Self::MAX_POSITIONS
            ));
        }
        Ok(())
    }

    /// The most positions a sweep may reach.
    pub const MAX_POSITIONS: usize = 1_000_000;

    /// The most times any prompt is sent by a sweep of `levels` levels (the warm-up included).
    pub fn max_sends(&self, levels: usize) -> usize {
        let mut sends = vec![0usize; self.dataset.max(1)];
        let positions = (0..levels).flat_map(|k| self.level_positions(k));
        for p in self.warmup_positions().chain(positions) {
            sends[self.index(p)] += 1;
        }
        sends.into_iter().max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    fn plan(dataset: usize, warmup: usize, per_level: usize) -> PromptPlan {
        PromptPlan {
            dataset,
            warmup,
            per_level,
            first_slice: 0,
            reuse: false,
        }
    }

    fn indices(p: &PromptPlan, level: usize) -> Vec<usize> {
        p.level_positions(level).map(|i| p.index(i)).collect()
    }

    #[test]
    fn levels_and_warmup_are_disjoint_when_the_dataset_is_large_enough() {
        let p = plan(100, 5, 10);
        let mut seen: HashSet<usize> = p.warmup_positions().map(|i| p.index(i)).collect();
        for level in 0..9 {
            for i in indices(&p, level) {
                assert!(seen.insert(i), "index {i} repeats at level {level}");
            }
            assert_eq!(p.repeated(level), 0);
        }
        assert_eq!(p.needed(9), 95);
        assert_eq!(p.max_sends(9), 1);
    }

    #[test]
    fn a_small_dataset_wraps_round_with_the_least_reuse() {
        // 36 prompts, 5 warm-up + 4 levels of 10 = 45 positions: 9 prompts are sent twice.
        let p = plan(36, 5, 10);
        let mut sends = vec![0usize; 36];
        for i in p.warmup_positions() {
            sends[p.index(i)] += 1;
        }
        for level in 0..4 {
            for i in indices(&p, level) {
                sends[i] += 1;
            }
        }
        assert_eq!(sends.iter().filter(|&&n| n == 2).count(), 9);
        assert!(sends.iter().all(|&n| n == 1 || n == 2));
        assert_eq!(
            (0..4).map(|l| p.repeated(l)).collect::<Vec<_>>(),
            [0, 0, 0, 9]
        );
        assert_eq!(p.max_sends(4), 2);
    }

    #[test]
    fn a_level_larger_than_the_dataset_repeats_within_itself() {
        let p = plan(4, 0, 10);
        assert_eq!(indices(&p, 0), [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]);
        assert_eq!(p.repeated(0), 6);
    }

    #[test]
    fn reuse_sends_the_first_slice_at_every_level() {
        let p = PromptPlan {
            reuse: true,
            ..plan(100, 5, 10)
        };
        assert_eq!(indices(&p, 0), indices(&p, 3));
        assert_eq!(indices(&p, 0), (5..15).collect::<Vec<_>>());
        assert_eq!((p.repeated(0), p.repeated(1)), (0, 10));
        assert_eq!(p.needed(8), 15);
        assert_eq!(p.max_sends(8), 8);
        // 10 prompts, 5 warm-up, 10 a level: the warm-up's five come round again every level.
        let small = PromptPlan {
            reuse: true,
            ..plan(10, 5, 10)
        };
        assert_eq!(small.max_sends(3), 4);
        assert_eq!(small.repeated(0), 5);
    }

    #[test]
    fn sweeps_past_the_bound_are_refused() {
        let p = PromptPlan {
            first_slice: usize::MAX / 2,
            ..plan(100, 5, 10)
        };
        assert_eq!(p.needed(3), usize::MAX);
        let err = p.check(3).unwrap_err();
        assert!(err.contains("--first-slice"), "{err}");
        assert!(plan(100, 5, 10).check(8).is_ok());
    }

    #[test]
    fn a_first_slice_continues_where_earlier_invocations_stopped() {
        // One level per invocation: invocation k passes first_slice k and gets what level k of
        // one sweep would have had.
        let whole = plan(100, 5, 10);
        for k in 0..5 {
            let one = PromptPlan {
                first_slice: k,
                ..whole
            };
            assert_eq!(indices(&one, 0), indices(&whole, k));
        }
        let late = PromptPlan {
            first_slice: 9,
            ..whole
        };
        assert_eq!(late.repeated(0), 5, "positions 95..105 wrap past 100");
    }
}
