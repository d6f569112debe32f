//! Choosing the next token from logits: penalties, temperature, top-k, top-p, min-p, a seeded RNG
//! per request (same seed, same output), and log-probabilities for the API's `logprobs`.

mod constraint;

pub use constraint::TokenConstraint;

use std::collections::HashMap;

/// Temperatures below this are greedy (dividing by them would overflow to infinity).
const MIN_TEMPERATURE: f32 = 1e-5;

/// Sampling settings of one request (OpenAI's and vLLM's parameter names and meanings).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 means greedy (argmax).
    pub temperature: f32,
    /// 0 disables.
    pub top_k: usize,
    /// 1 disables.
    pub top_p: f32,
    /// 0 disables: drops tokens below `min_p ×` the most likely one's probability.
    pub min_p: f32,
    /// 1 disables; > 1 discourages tokens already in the prompt or output (CTRL-style).
    pub repetition_penalty: f32,
    /// Subtracted once per occurrence in the output.
    pub frequency_penalty: f32,
    /// Subtracted once if the token occurs in the output.
    pub presence_penalty: f32,
    pub seed: u64,
    /// OpenAI's `logit_bias`: added to these tokens' logits after the penalties (−100 all but
    /// bans a token, +100 all but forces it).
    pub logit_bias: Vec<(u32, f32)>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        Self {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            seed: 0,
            logit_bias: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Whether these settings take the argmax (a temperature of about 0).
    pub fn is_greedy(&self) -> bool {
        self.temperature < MIN_TEMPERATURE
    }

    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Rejects values no request may carry, with the parameter named.
    pub fn validate(&self) -> Result<(), String> {
        let check = |ok: bool, what: &str| if ok { Ok(()) } else { Err(what.to_string()) };
        check(
            self.temperature.is_finite() && self.temperature >= 0.0,
            "temperature must be ≥ 0",
        )?;
        check(
            self.top_p > 0.0 && self.top_p <= 1.0,
            "top_p must be in (0, 1]",
        )?;
        check((0.0..=1.0).contains(&self.min_p), "min_p must be in [0, 1]")?;
        check(
            self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0,
            "repetition_penalty must be > 0",
        )?;
        check(
            (-2.0..=2.0).contains(&self.frequency_penalty),
            "frequency_penalty must be in [-2, 2]",
        )?;
        check(
            (-2.0..=2.0).contains(&self.presence_penalty),
            "presence_penalty must be in [-2, 2]",
        )
    }
}

/// A chosen token with its log-probability and the most likely alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct Sampled {
    pub token: u32,
    /// Log-probability of `token` under the model's distribution after the penalties, before
    /// temperature and the top-k/top-p/min-p filters (when asked for).
    pub logprob: Option<f32>,
    /// The `n` most likely tokens and their log-probabilities, most likely first.
    pub top: Vec<(u32, f32)>,
}

/// splitmix64's increment (the golden ratio in 64 bits).
pub const SPLITMIX_GAMMA: u64 = 0x9e37_79b9_7f4a_7c15;

/// One splitmix64 output for the state `z` (the state then advances by [`SPLITMIX_GAMMA`]): a
/// fast, well-mixed 64-bit hash of `z`, for seeded draws and ids.
pub fn splitmix64(z: u64) -> u64 {
    let mut z = z.wrapping_add(SPLITMIX_GAMMA);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// One request's sampler: its parameters, RNG state, output token counts and constraint.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: u64,
    prompt_tokens: Vec<u32>,
    output_counts: HashMap<u32, u32>,
    probs: Vec<(u32, f32)>,
    /// Tokens emitted in place of sampled ones, in order (see [`Sampler::with_script`]).
    script: Vec<u32>,
    /// Script tokens emitted so far.
    scripted: usize,
    /// Structured output: masks each position's logits before the choice.
    constraint: Option<Box<dyn TokenConstraint>>,
    /// The next position's logits were masked already ([`Sampler::premask`]).
    premasked: bool,
    /// Masks computed since [`Sampler::take_mask_time`] last asked, and their seconds.
    masks: u64,
    mask_seconds: f64,
}

impl Sampler {
    pub fn new(params: SamplingParams, prompt: &[u32]) -> Self {
        let mut prompt_tokens = prompt.to_vec();
        prompt_tokens.sort_unstable();
        prompt_tokens.dedup();
        Self {
            rng: params.seed ^ SPLITMIX_GAMMA,
            params,
            prompt_tokens,
            output_counts: HashMap::new(),
            probs: Vec::new(),
            script: Vec::new(),
            scripted: 0,
            constraint: None,
            premasked: false,
            masks: 0,
            mask_seconds: 0.0,
        }
    }

    /// Every token from now on obeys `constraint` (a grammar): disallowed tokens are masked
    /// before sampling and verification, so drafts it rejects are never accepted.
    pub fn with_constraint(mut self, constraint: Option<Box<dyn TokenConstraint>>) -> Self {
        self.constraint = constraint;
        self
    }

    /// The constraint, for checking drafts against it.
    pub fn constraint_mut(&mut self) -> Option<&mut (dyn TokenConstraint + 'static)> {
        self.constraint.as_deref_mut()
    }

    /// Why the constraint failed, if it did (the sequence cannot go on under it).
    pub fn constraint_failure(&self) -> Option<String> {
        self.constraint.as_ref().and_then(|c| c.failure())
    }

    /// Masks `logits` for the next position now, so that the next [`Sampler::sample`] takes
    /// them as they are: masks of several sequences can then be computed at once.
    pub fn premask(&mut self, logits: &mut [f32]) {
        self.constrain(logits);
        self.premasked = self.constraint.is_some();
    }

    /// Whether a constraint masks this sampler's tokens.
    pub fn is_constrained(&self) -> bool {
        self.constraint.is_some()
    }

    /// Masks the tokens the constraint does not allow here (unless that was done ahead).
    fn constrain(&mut self, logits: &mut [f32]) {
        if std::mem::take(&mut self.premasked) {
            return;
        }
        if let Some(c) = self.constraint.as_mut() {
            let started = std::time::Instant::now();
            c.mask(logits);
            self.masks += 1;
            self.mask_seconds += started.elapsed().as_secs_f64();
        }
    }

    /// The masks computed since the last call, and the seconds they took.
    pub fn take_mask_time(&mut self) -> (u64, f64) {
        let taken = (self.masks, self.mask_seconds);
        (self.masks, self.mask_seconds) = (0, 0.0);
        taken
    }

    /// Moves the constraint past the emitted token.
    fn advance(&mut self, token: u32) {
        if let Some(c) = self.constraint.as_mut() {
            c.advance(token);
        }
    }

    /// Scripted output, for tests of what lies around the model (parsers, the API): the next
    /// `script.len()` tokens are these instead of sampled ones, then sampling goes on as usual.
    /// Log-probabilities are still the model's, and verification accepts a draft exactly when it
    /// is the scripted token.
    pub fn with_script(mut self, script: Vec<u32>) -> Self {
        self.script = script;
        self.scripted = 0;
        self
    }

    /// The scripted token for this position, if the script has not run out.
    fn take_scripted(&mut self) -> Option<u32> {
        let t = self.script.get(self.scripted).copied()?;
        self.scripted += 1;
        Some(t)
    }

    /// splitmix64: small, fast and good enough to draw one uniform number per token.
    fn next_uniform(&mut self) -> f32 {
        let z = splitmix64(self.rng);
        self.rng = self.rng.wrapping_add(SPLITMIX_GAMMA);
        (z >> 40) as f32 / (1u64 << 24) as f32
    }

    /// Chooses the next token from `logits` (modified in place by the penalties) and records it;
    /// with `logprobs: Some(n)`, also its log-probability and the `n` most likely tokens'.
    pub fn sample(&mut self, logits: &mut [f32], logprobs: Option<usize>) -> Sampled {
        self.constrain(logits);
        let s = self.choose(logits, logprobs);
        self.advance(s.token);
        s
    }

    /// [`sample`](Self::sample) on logits the constraint has masked already.
    fn choose(&mut self, logits: &mut [f32], logprobs: Option<usize>) -> Sampled {
        self.apply_penalties(logits);
        let token = if let Some(t) = self.take_scripted() {
            t
        } else if self.params.temperature < MIN_TEMPERATURE {
            argmax(logits)
        } else {
            self.draw(logits)
        };
        *self.output_counts.entry(token).or_insert(0) += 1;
        let Some(n_top) = logprobs else {
            return Sampled {
                token,
                logprob: None,
                top: Vec::new(),
            };
        };
        let (top, logprob_of) = log_probs(logits, n_top);
        Sampled {
            token,
            logprob: Some(logprob_of(logits[token as usize])),
            top,
        }
    }

    fn apply_penalties(&self, logits: &mut [f32]) {
        let p = &self.params;
        if p.repetition_penalty != 1.0 {
            // Every token seen in the prompt or the output, once.
            let output_only = self
                .output_counts
                .keys()
                .filter(|t| self.prompt_tokens.binary_search(t).is_err());
            for &t in self.prompt_tokens.iter().chain(output_only) {
                let l = &mut logits[t as usize];
                *l = if *l > 0.0 {
                    *l / p.repetition_penalty
                } else {
                    *l * p.repetition_penalty
                };
            }
        }
        if p.frequency_penalty != 0.0 || p.presence_penalty != 0.0 {
            for (&t, &n) in &self.output_counts {
                logits[t as usize] -= p.frequency_penalty * n as f32 + p.presence_penalty;
            }
        }
        for &(t, bias) in &p.logit_bias {
            // A masked token (−∞) stays masked: a bias never lets a grammar's refusal through.
            if let Some(l) = logits.get_mut(t as usize) {
                *l += bias;
            }
        }
    }

    /// Draws from softmax(logits / T) after the filters. The most likely token has weight 1
    /// (its logit is the maximum), so min-p is a fixed threshold and needs no sort; top-p sorts
    /// only as many of the most likely tokens as it takes to reach `top_p`.
    fn draw(&mut self, logits: &[f32]) -> u32 {
        let total = self.candidates(logits);
        self.pick(total, &[])
    }

    /// Fills `probs` with the tokens the filters keep and their unnormalised weights; returns
    /// the weights' sum.
    fn candidates(&mut self, logits: &[f32]) -> f32 {
        let p = &self.params;
        let inv_t = 1.0 / p.temperature;
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        self.probs.clear();
        self.probs.extend(
            logits
                .iter()
                .enumerate()
                .map(|(i, &l)| (i as u32, ((l - max) * inv_t).exp()))
                // Masked tokens (−∞) weigh nothing and are never drawn.
                .filter(|&(_, q)| q > 0.0 && q >= p.min_p),
        );
        // Most likely first; ties broken by token id so the order is deterministic.
        let by_prob = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < self.probs.len() {
            self.probs.select_nth_unstable_by(p.top_k - 1, by_prob);
            self.probs.truncate(p.top_k);
        }
        if p.top_p < 1.0 {
            let total: f32 = self.probs.iter().map(|&(_, q)| q).sum();
            let mut k = self.probs.len().min(64);
            loop {
                if k < self.probs.len() {
                    self.probs.select_nth_unstable_by(k - 1, by_prob);
                }
                self.probs[..k].sort_unstable_by(by_prob);
                let head: f32 = self.probs[..k].iter().map(|&(_, q)| q).sum();
                if head / total >= p.top_p || k == self.probs.len() {
                    break;
                }
                k = (k * 4).min(self.probs.len());
            }
            let mut acc = 0.0;
            let mut keep = k;
            for (i, &(_, q)) in self.probs[..k].iter().enumerate() {
                acc += q / total;
                if acc >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            self.probs.truncate(keep);
        }
        self.probs.iter().map(|&(_, q)| q).sum()
    }

    /// Draws from `probs` (weights summing to `total`), leaving out `skip`.
    fn pick(&mut self, total: f32, skip: &[u32]) -> u32 {
        let mut r = self.next_uniform() * total;
        let mut last = None;
        for &(t, q) in self.probs.iter().filter(|&&(t, _)| !skip.contains(&t)) {
            if r < q {
                return t;
            }
            r -= q;
            last = Some(t);
        }
        last.or(skip.first().copied()).unwrap_or(0)
    }

    /// Speculative verification of a draft-tree node's candidate next tokens (one for a chain):
    /// the token this position emits, and which candidate it is, if any. Greedy: the argmax.
    /// Sampling: each candidate in turn is accepted with its probability among what earlier
    /// rejections left; when all are rejected the token comes from the target's distribution
    /// without them (rejection sampling with deterministic drafts, SpecInfer's multi-candidate
    /// form), so the emitted token is distributed exactly as [`Sampler::sample`]'s. Records the
    /// token like `sample` does, so penalties see the same history.
    pub fn verify(
        &mut self,
        logits: &mut [f32],
        drafts: &[u32],
        logprobs: Option<usize>,
    ) -> (Sampled, Option<usize>) {
        self.constrain(logits);
        let verdict = self.verify_masked(logits, drafts, logprobs);
        self.advance(verdict.0.token);
        verdict
    }

    /// [`verify`](Self::verify) on logits the constraint has masked already.
    fn verify_masked(
        &mut self,
        logits: &mut [f32],
        drafts: &[u32],
        logprobs: Option<usize>,
    ) -> (Sampled, Option<usize>) {
        if self.params.temperature < MIN_TEMPERATURE || self.scripted < self.script.len() {
            let s = self.choose(logits, logprobs);
            let accepted = drafts.iter().position(|&d| d == s.token);
            return (s, accepted);
        }
        self.apply_penalties(logits);
        let mut rest = self.candidates(logits);
        let mut token = None;
        for (i, &draft) in drafts.iter().enumerate() {
            if drafts[..i].contains(&draft) {
                continue;
            }
            let q = self
                .probs
                .iter()
                .find(|&&(t, _)| t == draft)
                .map_or(0.0, |&(_, q)| q);
            // q ≥ rest: the draft is all the mass left (up to rounding), accepted for sure.
            if self.next_uniform() * rest < q || (q > 0.0 && q >= rest) {
                token = Some(draft);
                break;
            }
            rest -= q;
        }
        let token = token.unwrap_or_else(|| self.pick(rest, drafts));
        (
            self.emit(logits, token, logprobs),
            drafts.iter().position(|&d| d == token),
        )
    }

    /// Speculative verification of one draft that was drawn from `proposal` (the drafter's own
    /// distribution: `(token, probability)` sorted by token, summing to 1): the token this
    /// position emits, and whether it is the draft. Sampling: the draft is accepted with
    /// probability min(1, q/p), and on rejection the token is drawn from the residual
    /// max(q − p, 0) renormalised (Leviathan et al.'s speculative sampling), so the emitted token
    /// is distributed exactly as [`Sampler::sample`]'s whatever the proposal. Greedy or scripted
    /// positions, and a draft the proposal does not hold, are verified as by
    /// [`Sampler::verify`].
    pub fn verify_proposed(
        &mut self,
        logits: &mut [f32],
        draft: u32,
        proposal: &[(u32, f32)],
        logprobs: Option<usize>,
    ) -> (Sampled, bool) {
        self.constrain(logits);
        let verdict = self.verify_proposed_masked(logits, draft, proposal, logprobs);
        self.advance(verdict.0.token);
        verdict
    }

    /// [`verify_proposed`](Self::verify_proposed) on logits the constraint has masked already.
    fn verify_proposed_masked(
        &mut self,
        logits: &mut [f32],
        draft: u32,
        proposal: &[(u32, f32)],
        logprobs: Option<usize>,
    ) -> (Sampled, bool) {
        let p_of = |t: u32| {
            proposal
                .binary_search_by_key(&t, |&(id, _)| id)
                .map_or(0.0, |i| proposal[i].1)
        };
        let p_draft = p_of(draft);
        if self.params.temperature < MIN_TEMPERATURE
            || self.scripted < self.script.len()
            || p_draft <= 0.0
        {
            let (s, which) = self.verify_masked(logits, &[draft], logprobs);
            return (s, which.is_some());
        }
        self.apply_penalties(logits);
        let total = self.candidates(logits);
        let q_draft = self
            .probs
            .iter()
            .find(|&&(t, _)| t == draft)
            .map_or(0.0, |&(_, w)| w / total);
        let token = if self.next_uniform() * p_draft < q_draft {
            draft
        } else {
            // The residual's weights, in the candidates' scale; all zero only through rounding
            // (then p ≥ q everywhere, so p = q and a rejection cannot happen): q itself then.
            let mut residual = 0.0;
            for c in &mut self.probs {
                c.1 = (c.1 - p_of(c.0) * total).max(0.0);
                residual += c.1;
            }
            if residual > 0.0 {
                self.pick(residual, &[])
            } else {
                let total = self.candidates(logits);
                self.pick(total, &[])
            }
        };
        (self.emit(logits, token, logprobs), token == draft)
    }

    /// Records `token` as emitted (penalties see it) and, when asked, its log-probability and
    /// the `n` most likely tokens'.
    fn emit(&mut self, logits: &[f32], token: u32, logprobs: Option<usize>) -> Sampled {
        *self.output_counts.entry(token).or_insert(0) += 1;
        let (top, logprob) = match logprobs {
            Some(n) => {
                let (top, logprob_of) = log_probs(logits, n);
                (top, Some(logprob_of(logits[token as usize])))
            }
            None => (Vec::new(), None),
        };
        Sampled {
            token,
            logprob,
            top,
        }
    }
}

/// Index of the largest logit (the lowest id among equals).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}

/// The `n` most likely tokens (most likely first, lower id among equals) with their
/// log-probabilities.
pub fn top_logprobs(logits: &[f32], n: usize) -> Vec<(u32, f32)> {
    log_probs(logits, n).0
}

/// The `n` most likely tokens with log-probabilities, and a function from a logit to its
/// log-probability.
fn log_probs(logits: &[f32], n: usize) -> (Vec<(u32, f32)>, impl Fn(f32) -> f32) {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| f64::from(l - max).exp()).sum();
    let log_z = max + sum.ln() as f32;
    let mut top: Vec<(u32, f32)> = Vec::with_capacity(n);
    if n > 0 {
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let n = n.min(idx.len());
        let by = |a: &u32, b: &u32| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        };
        idx.select_nth_unstable_by(n - 1, by);
        idx.truncate(n);
        idx.sort_unstable_by(by);
        // Tokens a constraint masked (−∞) are not alternatives.
        top = idx
            .into_iter()
            .filter(|&t| logits[t as usize] > f32::NEG_INFINITY)
            .map(|t| (t, logits[t as usize] - log_z))
            .collect();
    }
    (top, move |l: f32| l - log_z)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_script_is_followed_then_sampling_resumes() {
        let logits = vec![0.0, 5.0, 1.0, 0.5];
        let mut s = Sampler::new(SamplingParams::default(), &[]).with_script(vec![3, 0]);
        let first = s.sample(&mut logits.clone(), Some(1));
        assert_eq!(first.token, 3);
        // The model's own log-probability of the scripted token, and its top choice.
        assert!(first.logprob.unwrap() < -4.0);
        assert_eq!(first.top[0].0, 1);
        // Verification accepts the draft that is the scripted token, and only that one.
        assert_eq!(
            s.verify(&mut logits.clone(), &[1, 0], None),
            (s_tok(0), Some(1))
        );
        let mut greedy = Sampler::new(SamplingParams::greedy(), &[]).with_script(vec![2]);
        assert_eq!(greedy.verify(&mut logits.clone(), &[1], None).1, None);
        assert_eq!(greedy.sample(&mut logits.clone(), None).token, 1);
    }

    fn s_tok(token: u32) -> Sampled {
        Sampled {
            token,
            logprob: None,
            top: Vec::new(),
        }
    }

    fn logits() -> Vec<f32> {
        vec![1.0, 3.0, 2.0, 3.0, -1.0, 0.5]
    }

    #[test]
    fn greedy_takes_the_first_maximum_and_reports_logprobs() {
        let mut s = Sampler::new(SamplingParams::greedy(), &[]);
        let out = s.sample(&mut logits(), Some(3));
        assert_eq!(out.token, 1);
        let z: f64 = logits().iter().map(|&l| (l as f64).exp()).sum();
        assert!((out.logprob.unwrap() as f64 - (3.0 - z.ln())).abs() < 1e-5);
        assert_eq!(s.sample(&mut logits(), None).logprob, None);
        assert_eq!(out.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 3, 2]);
    }

    #[test]
    fn logit_bias_moves_the_choice_and_bans_tokens() {
        let biased = |bias: Vec<(u32, f32)>| SamplingParams {
            logit_bias: bias,
            ..SamplingParams::greedy()
        };
        let mut s = Sampler::new(biased(vec![(4, 100.0)]), &[]);
        assert_eq!(s.sample(&mut logits(), None).token, 4);
        // Both maxima banned: the next best is chosen.
        let mut s = Sampler::new(biased(vec![(1, -100.0), (3, -100.0)]), &[]);
        assert_eq!(s.sample(&mut logits(), None).token, 2);
        // Sampling never draws a banned token.
        let mut s = Sampler::new(
            SamplingParams {
                temperature: 1.0,
                ..biased(vec![(1, -100.0), (3, -100.0)])
            },
            &[],
        );
        for _ in 0..200 {
            let t = s.sample(&mut logits(), None).token;
            assert!(t != 1 && t != 3, "{t}");
        }
    }

    #[test]
    fn same_seed_same_tokens_and_seeds_differ() {
        let params = SamplingParams {
            temperature: 1.0,
            seed: 42,
            ..Default::default()
        };
        let run = |p: SamplingParams| {
            let mut s = Sampler::new(p, &[]);
            (0..50)
                .map(|_| s.sample(&mut logits(), None).token)
                .collect::<Vec<_>>()
        };
        assert_eq!(run(params.clone()), run(params.clone()));
        assert_ne!(
            run(params.clone()),
            run(SamplingParams { seed: 43, ..params })
        );
    }

    #[test]
    fn top_k_one_is_greedy_and_filters_restrict_the_choice() {
        let mut s = Sampler::new(
            SamplingParams {
                top_k: 1,
                seed: 1,
                ..Default::default()
            },
            &[],
        );
        for _ in 0..20 {
            assert_eq!(s.sample(&mut logits(), None).token, 1);
        }
        // min_p 0.5 keeps tokens within half of the best probability: ids 1 and 3 (equal) only.
        let mut s = Sampler::new(
            SamplingParams {
                min_p: 0.5,
                seed: 2,
                ..Default::default()
            },
            &[],
        );
        for _ in 0..50 {
            assert!([1, 3].contains(&s.sample(&mut logits(), None).token));
        }
        // top_p 0.5 stops after the first token whose cumulative mass reaches one half.
        let mut s = Sampler::new(
            SamplingParams {
                top_p: 0.5,
                seed: 3,
                ..Default::default()
            },
            &[],
        );
        for _ in 0..50 {
            assert!([1, 3].contains(&s.sample(&mut logits(), None).token));
        }
    }

    #[test]
    fn sampling_follows_the_distribution() {
        let mut s = Sampler::new(
            SamplingParams {
                seed: 9,
                ..Default::default()
            },
            &[],
        );
        let n = 20_000;
        let hits = (0..n)
            .filter(|_| s.sample(&mut [0.0, 0.0, 2.0f32.ln()], None).token == 2)
            .count();
        // p(2) = 2 / (1 + 1 + 2) = 0.5
        assert!((hits as f64 / n as f64 - 0.5).abs() < 0.02, "{hits}");
    }

    #[test]
    fn penalties_push_repeated_tokens_down() {
        let params = SamplingParams {
            temperature: 0.0,
            presence_penalty: 1.5,
            ..Default::default()
        };
        let mut s = Sampler::new(params, &[]);
        assert_eq!(s.sample(&mut logits(), None).token, 1);
        assert_eq!(
            s.sample(&mut logits(), None).token,
            3,
            "1 was used: 3 now leads"
        );
        let mut s = Sampler::new(
            SamplingParams {
                temperature: 0.0,
                repetition_penalty: 2.0,
                ..Default::default()
            },
            &[1, 3],
        );
        assert_eq!(s.sample(&mut logits(), None).token, 2, "3/2 = 1.5 < 2");
        // Token 2 is now in the output but not the prompt; 1 and 3 (prompt) were penalised once:
        // a token in both the prompt and the output is not penalised twice.
        let mut s = Sampler::new(
            SamplingParams {
                temperature: 0.0,
                repetition_penalty: 2.0,
                ..Default::default()
            },
            &[1],
        );
        assert_eq!(
            s.sample(&mut [0.0, 4.0, 2.1, 0.0], None).token,
            2,
            "4/2 = 2 < 2.1"
        );
        assert_eq!(
            s.sample(&mut [0.0, 4.0, 2.1, 0.0], None).token,
            1,
            "2.1/2 < 4/2: 1 penalised once"
        );
        let mut tiny = Sampler::new(
            SamplingParams {
                temperature: 1e-40,
                seed: 1,
                ..Default::default()
            },
            &[],
        );
        assert_eq!(
            tiny.sample(&mut logits(), None).token,
            1,
            "a tiny temperature is greedy"
        );
    }

    #[test]
    fn invalid_params_are_named() {
        let bad = SamplingParams {
            top_p: 0.0,
            ..Default::default()
        };
        assert!(bad.validate().unwrap_err().contains("top_p"));
        assert!(SamplingParams::default().validate().is_ok());
    }

    #[test]
    fn top_p_over_a_large_vocabulary_keeps_exactly_the_nucleus() {
        // 500 tokens with spread-out logits: the nucleus needs more than the first 64 sorted.
        let logits: Vec<f32> = (0..500).map(|i| ((i * 37 % 500) as f32) * 0.004).collect();
        let params = SamplingParams {
            temperature: 1.0,
            top_p: 0.8,
            seed: 5,
            ..Default::default()
        };
        // The nucleus by brute force: most likely first, smallest prefix reaching 0.8.
        let mut order: Vec<usize> = (0..500).collect();
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        let max = logits[order[0]];
        let q: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
        let total: f32 = q.iter().sum();
        let mut acc = 0.0;
        let mut nucleus = std::collections::HashSet::new();
        for &t in &order {
            nucleus.insert(t as u32);
            acc += q[t] / total;
            if acc >= 0.8 {
                break;
            }
        }
        assert!(nucleus.len() > 64, "{}", nucleus.len());
        let mut s = Sampler::new(params, &[]);
        let mut seen = std::collections::HashSet::new();
        for _ in 0..2000 {
            let t = s.sample(&mut logits.clone(), None).token;
            assert!(nucleus.contains(&t), "token {t} outside the nucleus");
            seen.insert(t);
        }
        assert!(seen.len() > nucleus.len() / 2);
    }

    #[test]
    fn verified_tokens_follow_the_target_distribution() {
        // Target: softmax of [ln 1, ln 2, ln 3, ln 4] = 0.1, 0.2, 0.3, 0.4. Whatever the draft,
        // the emitted token must have exactly these frequencies.
        let logits = [1.0f32.ln(), 2.0f32.ln(), 3.0f32.ln(), 4.0f32.ln()];
        for draft in [0u32, 3] {
            let mut s = Sampler::new(
                SamplingParams {
                    temperature: 1.0,
                    seed: 11 + u64::from(draft),
                    ..Default::default()
                },
                &[],
            );
            let n = 40_000;
            let mut counts = [0usize; 4];
            let mut accepted = 0;
            for _ in 0..n {
                let (t, ok) = s.verify(&mut logits.clone(), &[draft], None);
                counts[t.token as usize] += 1;
                accepted += usize::from(ok.is_some());
                assert_eq!(ok.is_some(), t.token == draft);
            }
            for (i, &c) in counts.iter().enumerate() {
                let want = (i + 1) as f64 / 10.0;
                assert!(
                    (c as f64 / n as f64 - want).abs() < 0.01,
                    "draft {draft}: {counts:?}"
                );
            }
            let p_draft = (draft + 1) as f64 / 10.0;
            assert!((accepted as f64 / n as f64 - p_draft).abs() < 0.01);
        }
        // Greedy: accepted exactly when the draft is the argmax.
        let mut g = Sampler::new(SamplingParams::greedy(), &[]);
        assert_eq!(g.verify(&mut logits.clone(), &[3], None).1, Some(0));
        let (t, ok) = g.verify(&mut logits.clone(), &[1], None);
        assert_eq!(ok, None);
        assert_eq!(t.token, 3);
        assert_eq!(g.verify(&mut logits.clone(), &[1, 3], None).1, Some(1));
    }

    #[test]
    fn several_candidates_keep_the_target_distribution() {
        // Target 0.1, 0.2, 0.3, 0.4; a node with candidates [1, 3] (and a repeated one) must
        // still emit each token with exactly its probability, accepting candidate i when the
        // token is candidate i.
        let logits = [1.0f32.ln(), 2.0f32.ln(), 3.0f32.ln(), 4.0f32.ln()];
        for drafts in [vec![1u32, 3], vec![3, 0, 2], vec![2, 2, 1]] {
            let mut s = Sampler::new(
                SamplingParams {
                    temperature: 1.0,
                    seed: 5,
                    ..Default::default()
                },
                &[],
            );
            let n = 40_000;
            let mut counts = [0usize; 4];
            for _ in 0..n {
                let (t, which) = s.verify(&mut logits.clone(), &drafts, None);
                counts[t.token as usize] += 1;
                assert_eq!(which, drafts.iter().position(|&d| d == t.token));
            }
            for (i, &c) in counts.iter().enumerate() {
                let want = (i + 1) as f64 / 10.0;
                assert!(
                    (c as f64 / n as f64 - want).abs() < 0.01,
                    "drafts {drafts:?}: {counts:?}"
                );
            }
        }
    }

    #[test]
    fn drafts_drawn_from_a_proposal_keep_the_target_distribution() {
        // Target 0.1, 0.2, 0.3, 0.4 (top-k 3 cuts token 0: 0, 2/9, 3/9, 4/9). Drafts drawn from
        // proposals that hold a token the target cannot emit, one close to the target, and one
        // far from it: the output keeps the target's frequencies, and a draft is accepted with
        // probability Σ min(p, q) (more often than a point mass on the proposal's best token).
        let logits = [1.0f32.ln(), 2.0f32.ln(), 3.0f32.ln(), 4.0f32.ln()];
        let q = [0.0, 2.0 / 9.0, 3.0 / 9.0, 4.0 / 9.0];
        let proposals: [&[(u32, f32)]; 3] = [
            &[(0, 0.5), (3, 0.5)],
            &[(1, 0.2), (2, 0.3), (3, 0.5)],
            &[(1, 0.9), (2, 0.1)],
        ];
        for (k, proposal) in proposals.into_iter().enumerate() {
            let mut s = Sampler::new(
                SamplingParams {
                    temperature: 1.0,
                    top_k: 3,
                    seed: 17 + k as u64,
                    ..Default::default()
                },
                &[],
            );
            let (n, mut rng) = (40_000, 99 + k as u64);
            let (mut counts, mut accepted) = ([0usize; 4], 0);
            for _ in 0..n {
                let mut u = (splitmix64(rng) >> 40) as f32 / (1u64 << 24) as f32;
                rng = rng.wrapping_add(SPLITMIX_GAMMA);
                let &(draft, _) = proposal
                    .iter()
                    .find(|&&(_, p)| {
                        u -= p;
                        u < 0.0
                    })
                    .unwrap_or(proposal.last().unwrap());
                let (t, ok) = s.verify_proposed(&mut logits.clone(), draft, proposal, None);
                assert_eq!(ok, t.token == draft);
                counts[t.token as usize] += 1;
                accepted += usize::from(ok);
            }
            for (i, &c) in counts.iter().enumerate() {
                let got = c as f64 / n as f64;
                assert!((got - q[i]).abs() < 0.01, "proposal {k}: {counts:?}");
            }
            let overlap: f64 = proposal
                .iter()
                .map(|&(t, p)| f64::from(p).min(q[t as usize]))
                .sum();
            let rate = accepted as f64 / n as f64;
            assert!(
                (rate - overlap).abs() < 0.01,
                "proposal {k}: {rate} {overlap}"
            );
        }
        // Greedy: a plain match against the argmax.
        let mut g = Sampler::new(SamplingParams::greedy(), &[]);
        let (t, ok) = g.verify_proposed(&mut logits.clone(), 1, &[(1, 1.0)], None);
        assert_eq!((t.token, ok), (3, false));
    }
}
