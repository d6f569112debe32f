//! Adaptive speculation (`--speculative-adaptive`): per step, give each decoding sequence the
//! number of drafts that maximises the whole batch's expected tokens per second.
//!
//! The model:
//! - A step of work `w` takes `T(w) = a + b·w` seconds, fitted online by least squares over recent
//!   decode steps (exponential forgetting; steps carrying prompt chunks are left out, their rows
//!   are much cheaper each), so it follows the machine and the load. The engine seeds it at
//!   start-up with a few measured steps of 1 to 20 rows, so the first requests' drafts are priced
//!   from this machine, and the slope stays anchored to that calibration by as much evidence as
//!   a few of its steps: when every recent step has the same size (one sequence that is not
//!   drafting) the data cannot tell `a` from `b`, and without the anchor the fit drifted to
//!   `a ≈ 0`, `b ≈` a whole step, which priced every draft like a step, so the sequence never
//!   drafted again to show otherwise. `w` counts rows (tokens in the batch) plus `κ` per row
//!   that needs logits, `κ` being the output head's size relative to the layers' (0.27 for
//!   SmolLM2-135M): a draft row needs logits, a prompt row mostly does not. While decoding is
//!   memory-bound, `b` is small next to `a`; at large batches rows cost their full compute.
//! - Sequence i accepts each successive draft with probability `αᵢ`. For prompt lookup, `α` is
//!   estimated per length of the n-gram match the drafts came from, pooled over requests
//!   ([`MatchAcceptance`]): a continuation of a 10-token match is a copy in progress, one found
//!   on a single token is a guess, and a request's own average would blur the two. Match length
//!   m starts at α = m/(m+2), so that even a busy server tries long matches and learns. For a draft
//!   model, `α` is the request's Beta-style running estimate ([`Acceptance`]; it decays back
//!   towards the prior when the sequence does not speculate, so a sequence that stopped paying
//!   is tried again later). With `k` drafts a sequence emits `1 + α + α² + … + αᵏ` tokens on
//!   average: the `j`-th draft adds `αʲ`.
//! - The batch emits `E` tokens (one per decoding sequence, plus accepted drafts) in `T(n)`,
//!   both taken as if every sequence of the step decoded: one whose prompt goes in this step
//!   counts as a decoding row. A prompt chunk makes the step longer without emitting anything
//!   now, while a draft row costs every later step what it costs this one, so pricing drafts
//!   at such a step's own rate would make them look nearly free. One more draft row adds
//!   `αᵢ^(kᵢ+1)` to `E` and `b` to `T` (plus, for a draft model, its measured seconds per
//!   draft), which raises `E/T` exactly when `αᵢ^(kᵢ+1) > b·E/T`. Drafts are granted greedily,
//!   the largest gain a second first, while the gain clears that bar by 20% (the estimates are
//!   noisy, and a draft near break-even risks more than it can win).
//! - A drafter that must catch up before it drafts (an EAGLE-3 head runs a row for each token
//!   decoded since the sequence last drafted) charges that to the sequence's first draft of the
//!   step: the rows its last step emitted in full, a larger backlog spread over the steps the
//!   sequence has left ([`catch_up_rows`]). The first draft is then offered together with the
//!   drafts after it that make the best rate, so the one-off cost is weighed against what the
//!   drafts bring together.
//!
//! - While no request waits for a slot, a sequence's tokens are weighted by how far it is from
//!   done ([`urgency`]): ½ plus ½ × its remaining `max_tokens` budget over the largest. A
//!   batch that nothing will join ends when its last sequence does, and drafts for sequences
//!   already ahead make every step dearer without bringing that end closer; weighting steers
//!   drafts to the laggards, so the batch finishes together instead of trailing off into
//!   nearly empty steps (figures: BENCHMARKS.md). When requests wait, a sequence that finishes
//!   early lets one in, so every token counts alike. Equal weights give exactly the unweighted
//!   allocation.
//!
//! So speculation fades out smoothly as the batch grows (`E/T` grows, gains shrink) instead of
//! falling off a fixed threshold, and sequences whose drafts are rarely accepted stop paying
//! for them.

/// Online least-squares fit of step time against rows in the step.
#[derive(Debug, Clone)]
pub struct CostModel {
    /// Decayed sums: weight, n, t, n², n·t.
    s: [f64; 5],
    forget: f64,
    /// The calibrated slope and its weight (in the units of Σw(n − n̄)²) once anchored.
    anchor: Option<(f64, f64)>,
}

impl Default for CostModel {
    fn default() -> Self {
        Self {
            s: [0.0; 5],
            forget: 0.995,
            anchor: None,
        }
    }
}

/// The anchor weighs as much as this many calibration steps.
const ANCHOR_STEPS: f64 = 10.0;

/// Before the fit has seen enough different batch sizes: 5 ms a step plus 1 ms a row.
const PRIOR: (f64, f64) = (0.005, 0.001);

impl CostModel {
    /// A step of `work` units took `seconds`.
    pub fn observe(&mut self, work: f64, seconds: f64) {
        let n = work;
        for v in &mut self.s {
            *v *= self.forget;
        }
        self.s[0] += 1.0;
        self.s[1] += n;
        self.s[2] += seconds;
        self.s[3] += n * n;
        self.s[4] += n * seconds;
    }

    /// Anchors the slope at what the steps seen so far (the start-up calibration) give: from
    /// now on the fitted slope is shrunk towards it by as much evidence as [`ANCHOR_STEPS`] of
    /// those steps (ridge regression on the slope), so steps all of one size leave it there
    /// and only the level `a` moves.
    pub fn anchor(&mut self) {
        let [w, sn, _, snn, _] = self.s;
        if w >= 8.0 {
            let spread = (snn - sn * sn / w) / w;
            self.anchor = Some((self.coefficients().1, ANCHOR_STEPS * spread));
        }
    }

    /// `(a, b)` of `T(n) = a + b·n`.
    pub fn coefficients(&self) -> (f64, f64) {
        let [w, sn, st, snn, snt] = self.s;
        if w < 8.0 {
            return PRIOR;
        }
        // Σw(n − n̄)² and Σw(n − n̄)(t − t̄).
        let (sxx, sxy) = (snn - sn * sn / w, snt - sn * st / w);
        let b = match self.anchor {
            Some((b0, weight)) => (sxy + weight * b0) / (sxx + weight),
            // All of one size: no slope can be told apart.
            None if sxx <= 1e-9 * w => return PRIOR,
            None => sxy / sxx,
        };
        let a = (st - b * sn) / w;
        // A slope at or below zero would grant unlimited drafts; time cannot fall with rows.
        (a.max(1e-4), b.max(1e-5))
    }

    pub fn predict(&self, work: f64) -> f64 {
        let (a, b) = self.coefficients();
        a + b * work
    }
}

/// One sequence's running estimate of the chance its next draft is accepted.
#[derive(Debug, Clone, Copy)]
pub struct Acceptance {
    accepted: f64,
    rejected: f64,
}

/// The prior: one accepted draft and two rejections (α = ⅓), so a new request tries a draft or
/// two while steps are cheap and earns more by being right.
const PRIOR_ACCEPTED: f64 = 1.0;
const PRIOR_REJECTED: f64 = 2.0;

impl Default for Acceptance {
    fn default() -> Self {
        Self {
            accepted: PRIOR_ACCEPTED,
            rejected: PRIOR_REJECTED,
        }
    }
}

impl Acceptance {
    /// An estimate starting at `alpha`, worth as much evidence as the default prior.
    pub fn starting_at(alpha: f64) -> Self {
        let weight = PRIOR_ACCEPTED + PRIOR_REJECTED;
        Self {
            accepted: weight * alpha,
            rejected: weight * (1.0 - alpha),
        }
    }

    /// After verifying `proposed` drafts of which the first `accepted` were taken.
    pub fn record(&mut self, proposed: usize, accepted: usize) {
        self.record_forgetting(proposed, accepted, 0.9);
    }

    /// [`Acceptance::record`], the old evidence weighted by `forget` first.
    fn record_forgetting(&mut self, proposed: usize, accepted: usize, forget: f64) {
        self.accepted = self.accepted * forget + accepted as f64;
        self.rejected = self.rejected * forget + f64::from(u8::from(accepted < proposed));
    }

    /// A step without speculation: the evidence fades towards the prior, slowly (a sequence
    /// that stopped paying is retried after a hundred steps or so).
    pub fn decay(&mut self) {
        self.accepted = PRIOR_ACCEPTED + (self.accepted - PRIOR_ACCEPTED) * 0.99;
        self.rejected = PRIOR_REJECTED + (self.rejected - PRIOR_REJECTED) * 0.99;
    }

    pub fn alpha(&self) -> f64 {
        self.accepted / (self.accepted + self.rejected)
    }
}

/// Acceptance by the length of the n-gram match a draft came from, pooled over all requests:
/// a draft continuing a 10-token match (the model is copying) is far likelier to be accepted
/// than one found on a single token, and a request's own average mixes both regimes.
#[derive(Debug, Clone)]
pub struct MatchAcceptance {
    /// Index: match length - 1, the last bucket also holding longer matches.
    buckets: Vec<Acceptance>,
}

/// Forgetting per observation of a bucket: about the last few hundred drafts count.
const MATCH_FORGET: f64 = 0.995;

impl MatchAcceptance {
    /// Buckets for matches of 1 to `max_match` tokens. Match length m starts at α = m/(m+2)
    /// (⅓ for one token, ⅔ for four, 0.8 for eight): longer matches are likelier copies, and
    /// the prior must let a busy server try them, or it never learns what they are worth.
    pub fn new(max_match: usize) -> Self {
        Self {
            buckets: (1..=max_match.max(1))
                .map(|m| Acceptance::starting_at(m as f64 / (m as f64 + 2.0)))
                .collect(),
        }
    }

    fn index(&self, matched: usize) -> usize {
        matched.saturating_sub(1).min(self.buckets.len() - 1)
    }

    /// The chance that each successive draft of a `matched`-token match is accepted.
    pub fn alpha(&self, matched: usize) -> f64 {
        self.buckets[self.index(matched)].alpha()
    }

    /// After verifying `proposed` drafts of a `matched`-token match, the first `accepted` taken.
    pub fn record(&mut self, matched: usize, proposed: usize, accepted: usize) {
        let i = self.index(matched);
        self.buckets[i].record_forgetting(proposed, accepted, MATCH_FORGET);
    }
}

/// How much better than break-even a draft must look to be granted: the fit and the acceptance
/// estimates are noisy, and near break-even a wrong guess costs throughput while a right one
/// gains almost nothing, so marginal drafts are left out.
const HURDLE: f64 = 1.2;

/// A remaining budget this long or longer counts as "far from done" alike: a request without a
/// tight `max_tokens` would otherwise make every other sequence's tokens look worthless.
const URGENCY_HORIZON: usize = 512;

/// The weight of a sequence that is (about) done, next to 1 for the furthest from done.
const URGENCY_FLOOR: f64 = 0.5;

/// Each decoding sequence's weight from its remaining token budget (`max_tokens` minus tokens
/// generated): from [`URGENCY_FLOOR`] for a spent budget to 1 for the largest in the batch (each
/// capped at [`URGENCY_HORIZON`]), linear in between. The floor keeps drafts that pay well for a
/// leader (a copy in progress at a small batch) while marginal ones go to the laggards: without
/// it, leaders lose their drafts even where the whole batch gains from them.
pub fn urgency(remaining: &[usize]) -> Vec<f64> {
    let capped = |r: usize| r.min(URGENCY_HORIZON) as f64;
    let most = remaining.iter().map(|&r| capped(r)).fold(1.0, f64::max);
    remaining
        .iter()
        .map(|&r| URGENCY_FLOOR + (1.0 - URGENCY_FLOOR) * capped(r) / most)
        .collect()
}

/// One sequence that could take drafts this step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Demand {
    /// The chance that each successive draft is accepted.
    pub alpha: f64,
    /// The most drafts it can take.
    pub max: usize,
    /// What its tokens are worth ([`urgency`], or 1).
    pub weight: f64,
    /// Seconds its first draft costs besides a draft's own price: the drafter's catching up on
    /// what the sequence decoded since it last drafted ([`catch_up_rows`]).
    pub once: f64,
    /// What proposing one of its drafts costs besides the draft's row in the target's step
    /// (zero for prompt lookup; a draft model's or a head's forward share).
    pub draft_seconds: f64,
}

/// The most weighted tokens a second a step makes when sequence `d` alone takes its best
/// number of drafts (none included): the step emits `tokens` in `seconds` without drafts, and a
/// draft row adds `row` seconds besides `d.draft_seconds`. Which of several drafters drafts
/// for a sequence is the one whose demand gives the highest rate.
pub fn best_rate(tokens: f64, seconds: f64, row: f64, d: &Demand) -> f64 {
    let (mut best, mut gain, mut p) = (tokens / seconds, 0.0, 1.0);
    for k in 1..=d.max {
        p *= d.alpha;
        gain += d.weight * p;
        let t = seconds + k as f64 * (row + d.draft_seconds) + d.once;
        best = best.max((tokens + gain) / t);
    }
    best
}

/// Rows of catching up a sequence's first draft of a step is charged for, of a `backlog` of
/// rows the drafter has not run (an EAGLE-3 head's rows for tokens decoded since the sequence
/// last drafted), when about `steps_left` steps remain to it. A sequence drafting every step
/// owes the rows its last step emitted, [`STEADY_ROWS`] or fewer, and they are a cost of
/// drafting now. A larger backlog (a fresh prompt, a sequence back from a stretch without
/// drafts) is paid once for every step that follows, so it is spread over them, but never to
/// less than the steady state's rows: a head that pays can start, even alone at C=1, and one
/// that does not is not let in by a long answer ahead.
pub fn catch_up_rows(backlog: usize, steps_left: f64) -> f64 {
    let backlog = backlog as f64;
    backlog.min(STEADY_ROWS).max(backlog / steps_left.max(1.0))
}

/// The rows a drafting sequence's step leaves to catch up on at most, in the steady state
/// (its token and a few accepted drafts).
const STEADY_ROWS: f64 = 4.0;

/// Drafts per candidate sequence. `work`: the step's work without drafts; `draft_work`: what one
/// draft row adds to the target's step (1 + κ); `tokens`: the weighted tokens the step emits
/// without drafts (the sum of its decoding sequences' weights); `candidates`: what each
/// candidate could take.
pub fn allocate(
    cost: &CostModel,
    work: f64,
    draft_work: f64,
    tokens: f64,
    candidates: &[Demand],
) -> Vec<usize> {
    let row = cost.coefficients().1 * draft_work;
    let mut ks = vec![0usize; candidates.len()];
    let mut e = tokens.max(f64::MIN_POSITIVE);
    let mut t = cost.predict(work);
    // What candidate i's next drafts add: how many, weighted tokens, seconds. A first draft
    // also pays the catching up, so it is offered with as many drafts after it as give the
    // most tokens a second: a sequence whose drafts pay only once the catching up is shared
    // between a few is not turned away by its first.
    let next = |c: &Demand, k: usize| {
        let b = row + c.draft_seconds;
        let gain = |j: usize| c.weight * c.alpha.powi((k + j) as i32);
        if k > 0 || c.once <= 0.0 {
            return (1, gain(1), b);
        }
        let mut best = (1, gain(1), b + c.once);
        let mut sum = best.1;
        for j in 2..=c.max {
            sum += gain(j);
            let seconds = b * j as f64 + c.once;
            if sum / seconds > best.1 / best.2 {
                best = (j, sum, seconds);
            }
        }
        best
    };
    loop {
        // The best next drafts: the most weighted tokens a second among sequences with room.
        let best = candidates
            .iter()
            .enumerate()
            .filter(|&(i, c)| ks[i] < c.max)
            .map(|(i, c)| (i, next(c, ks[i])))
            .max_by(|x, y| (x.1.1 / x.1.2).total_cmp(&(y.1.1 / y.1.2)));
        let Some((i, (n, gain, seconds))) = best else {
            break;
        };
        if gain <= HURDLE * seconds * e / t {
            break;
        }
        ks[i] += n;
        e += gain;
        t += seconds;
    }
    ks
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fitted(a: f64, b: f64) -> CostModel {
        let mut c = CostModel::default();
        for i in 0..200 {
            let n = 1 + i % 40;
            c.observe(n as f64, a + b * n as f64);
        }
        c
    }

    #[test]
    fn the_cost_fit_recovers_a_line() {
        let c = fitted(0.004, 0.0012);
        let (a, b) = c.coefficients();
        assert!(
            (a - 0.004).abs() < 1e-6 && (b - 0.0012).abs() < 1e-7,
            "{a} {b}"
        );
        assert_eq!(CostModel::default().coefficients(), PRIOR);
    }

    #[test]
    fn an_anchored_slope_survives_steps_all_of_one_size() {
        // Calibrated at 4 ms + 1.2 ms a row; then a thousand single-row steps at 6 ms (the
        // host got slower) with a little noise: the slope stays near the calibration's and the
        // level follows the steps.
        let mut anchored = fitted(0.004, 0.0012);
        anchored.anchor();
        for i in 0..3000 {
            let t = 0.006 + if i % 2 == 0 { 2e-4 } else { -2e-4 };
            anchored.observe(1.27, t);
        }
        let (a, b) = anchored.coefficients();
        assert!((b - 0.0012).abs() < 1e-4, "{b}");
        assert!((a + b * 1.27 - 0.006).abs() < 1e-4, "{a}");
        // With steps of several sizes the data outweighs the anchor.
        for i in 0..1000 {
            let n = 1.0 + (i % 30) as f64;
            anchored.observe(n, 0.002 + 0.0005 * n);
        }
        let (a, b) = anchored.coefficients();
        assert!(
            (b - 0.0005).abs() < 1e-4 && (a - 0.002).abs() < 1e-3,
            "{a} {b}"
        );
    }

    /// Demands of equal weight.
    fn plain(shape: &[(f64, usize)]) -> Vec<Demand> {
        shape
            .iter()
            .map(|&(alpha, max)| Demand {
                alpha,
                max,
                weight: 1.0,
                once: 0.0,
                draft_seconds: 0.0,
            })
            .collect()
    }

    #[test]
    fn drafts_follow_acceptance_and_fade_with_the_batch() {
        let c = fitted(0.004, 0.0012);
        // One sequence that accepts 90% of drafts: several drafts; one at 10%: none.
        let w = 1.27; // a draft row with its logits
        assert!(allocate(&c, w, w, 1.0, &plain(&[(0.9, 8)]))[0] >= 4);
        assert_eq!(allocate(&c, w, w, 1.0, &plain(&[(0.1, 8)])), [0]);
        // The same good sequence in a batch of 60 decodes gets fewer or none.
        let alone = allocate(&c, w, w, 1.0, &plain(&[(0.7, 8)]))[0];
        let crowded = allocate(&c, 60.0 * w, w, 60.0, &plain(&[(0.7, 8)]))[0];
        assert!(crowded < alone, "{crowded} vs {alone}");
        // The better sequence is served first.
        let ks = allocate(&c, 2.0 * w, w, 2.0, &plain(&[(0.3, 8), (0.95, 8)]));
        assert!(ks[1] > ks[0]);
        // Drafts that cost a draft-model forward each are granted more sparingly.
        let free = allocate(&c, w, w, 1.0, &plain(&[(0.8, 8)]))[0];
        let dear = Demand {
            draft_seconds: 0.003,
            ..plain(&[(0.8, 8)])[0]
        };
        let costly = allocate(&c, w, w, 1.0, &[dear])[0];
        assert!(costly < free, "{costly} vs {free}");
        // Never more than a sequence can take.
        assert!(allocate(&c, w, w, 1.0, &plain(&[(0.99, 3)]))[0] <= 3);
    }

    #[test]
    fn a_first_draft_pays_for_the_catching_up() {
        // 4 ms + 1.2 ms a unit of work; one sequence alone, α = 0.8.
        let c = fitted(0.004, 0.0012);
        let w = 1.27;
        let with = |once: f64| {
            let d = Demand {
                alpha: 0.8,
                max: 8,
                weight: 1.0,
                once,
                draft_seconds: 0.0,
            };
            allocate(&c, w, w, 1.0, &[d])[0]
        };
        assert!(with(0.0) > 0);
        // Catching up worth two draft rows: a first draft alone would not pay for it, a few
        // together do.
        assert!(with(0.003) >= 2, "{}", with(0.003));
        // Worth ten steps: no drafts.
        assert_eq!(with(0.06), 0);
        // Spreading: the steady state's rows are charged whole, a fresh prompt's spread over
        // the steps left, never below the steady state's.
        assert_eq!(catch_up_rows(1, 100.0), 1.0);
        assert_eq!(catch_up_rows(3, 100.0), 3.0);
        assert_eq!(catch_up_rows(300, 140.0), STEADY_ROWS);
        assert_eq!(catch_up_rows(300, 10.0), 30.0);
        assert_eq!(catch_up_rows(0, 0.0), 0.0);
    }

    #[test]
    fn the_drafter_whose_drafts_raise_the_rate_most_scores_highest() {
        // A step of 10 ms emitting one token, 1 ms a draft row.
        let d = |alpha, max, draft_seconds| Demand {
            alpha,
            max,
            weight: 1.0,
            once: 0.0,
            draft_seconds,
        };
        let rate = |d: Demand| best_rate(1.0, 0.010, 0.001, &d);
        // Nothing worth drafting leaves the plain rate.
        assert_eq!(rate(d(0.0, 4, 0.0)), 100.0);
        // A long likely suffix match beats a head's guesses that cost their own forward.
        assert!(rate(d(0.8, 16, 0.0)) > rate(d(0.4, 4, 0.0005)));
        // With the same acceptance, the drafter that costs nothing to run wins.
        assert!(rate(d(0.5, 4, 0.0)) > rate(d(0.5, 4, 0.002)));
        // More drafts of the same quality never score lower (the best count is taken).
        assert!(rate(d(0.6, 8, 0.0)) >= rate(d(0.6, 2, 0.0)));
    }

    #[test]
    fn urgency_favours_the_sequences_furthest_from_done() {
        assert_eq!(urgency(&[200, 100, 0]), [1.0, 0.75, 0.5]);
        // Budgets past the horizon count alike.
        assert_eq!(urgency(&[100_000, 512]), [1.0, 1.0]);
        let c = fitted(0.02, 0.0012);
        let w = 1.27;
        let n = 12.0; // a batch where drafts are marginal
        let alike = |weight: f64| Demand {
            alpha: 0.7,
            max: 8,
            weight,
            once: 0.0,
            draft_seconds: 0.0,
        };
        // Equal weights, whatever their scale, give the unweighted allocation.
        let unweighted = allocate(&c, n * w, w, n, &plain(&[(0.7, 8), (0.7, 8)]));
        let halves = allocate(&c, n * w, w, n / 2.0, &[alike(0.5), alike(0.5)]);
        assert_eq!(unweighted, halves);
        // A sequence that is ahead gets fewer drafts than an equally good one behind it.
        let ks = allocate(&c, n * w, w, n * 0.75, &[alike(0.5), alike(1.0)]);
        assert!(ks[0] < ks[1], "{ks:?}");
        assert!(ks[1] > 0, "the laggard still speculates: {ks:?}");
    }

    #[test]
    fn acceptance_is_learned_per_match_length() {
        let mut m = MatchAcceptance::new(4);
        for _ in 0..200 {
            m.record(1, 4, 0);
            m.record(6, 4, 4); // lands in the last bucket
        }
        assert!(m.alpha(1) < 0.1, "{}", m.alpha(1));
        assert!(m.alpha(4) > 0.9 && m.alpha(12) > 0.9);
        assert!((m.alpha(2) - 0.5).abs() < 1e-9, "untouched: the prior");
        let fresh = MatchAcceptance::new(12);
        assert!((fresh.alpha(1) - 1.0 / 3.0).abs() < 1e-9);
        assert!(fresh.alpha(4) > fresh.alpha(2) && (fresh.alpha(8) - 0.8).abs() < 1e-9);
    }

    #[test]
    fn acceptance_learns_and_forgets() {
        let mut a = Acceptance::default();
        for _ in 0..20 {
            a.record(8, 8);
        }
        assert!(a.alpha() > 0.9);
        for _ in 0..60 {
            a.record(8, 0);
        }
        assert!(a.alpha() < 0.2);
        let low = a.alpha();
        for _ in 0..400 {
            a.decay();
        }
        assert!(a.alpha() > low + 0.1, "decays back towards the prior");
    }
}
