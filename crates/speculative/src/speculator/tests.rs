//! The speculator driven by a real scheduler over made-up logits: no model runs.

use super::*;
use crate::{NgramDrafter, NgramProposer};
use kvcache::BlockPool;
use model::sampler::SamplingParams;
use scheduler::{Scheduler, SchedulerConfig, StepOutcome};

const VOCAB: usize = 32;

/// A prompt that repeats, so prompt lookup finds the continuation `7, 8, 9, 10`.
const PROMPT: [u32; 8] = [5, 6, 7, 8, 9, 10, 5, 6];

/// NGRAM settings: chains of up to `num_draft_tokens`, matches of 1–4 tokens.
fn config(num_draft_tokens: usize, threshold: Option<usize>, adaptive: bool) -> SpecConfig {
    config_of("NGRAM", num_draft_tokens, threshold, adaptive)
}

/// [`config`] for the algorithms `algorithms` (one, or combined with commas).
fn config_of(
    algorithms: &str,
    num_draft_tokens: usize,
    threshold: Option<usize>,
    adaptive: bool,
) -> SpecConfig {
    SpecConfig::from_flags(crate::SpecFlags {
        algorithm: algorithms.parse().unwrap(),
        num_draft_tokens: Some(num_draft_tokens),
        num_steps: num_draft_tokens,
        eagle_topk: 1,
        ngram_min_match_window: 1,
        ngram_max_match_window: 4,
        disable_batch_threshold: threshold,
        adaptive: Some(adaptive),
        draft_model_path: false,
        suffix: crate::SuffixSettings::default(),
    })
    .unwrap()
    .unwrap()
}

fn speculator(num_draft_tokens: usize, threshold: Option<usize>) -> Speculator {
    let drafter = NgramDrafter(NgramProposer::new(1, 4).unwrap());
    Speculator::new(
        &config(num_draft_tokens, threshold, false),
        0.25,
        Box::new(drafter),
    )
}

fn scheduler() -> Scheduler {
    let pool = BlockPool::with_blocks(4, 64).unwrap();
    Scheduler::new(SchedulerConfig::default(), pool).unwrap()
}

/// Logits whose argmax is `token`.
fn favouring(token: u32) -> Vec<f32> {
    let mut row = vec![0.0; VOCAB];
    row[token as usize] = 10.0;
    row
}

fn greedy() -> Sampler {
    let params = SamplingParams {
        temperature: 0.0,
        ..SamplingParams::default()
    };
    Sampler::new(params, &PROMPT)
}

/// Prefills `ids` (one step, no drafts: nothing decodes yet), each sampling `first`.
fn prefill(s: &mut Scheduler, spec: &mut Speculator, ids: &[u64], first: u32, max_tokens: usize) {
    for &id in ids {
        s.add(SeqId(id), PROMPT.to_vec());
        spec.add(SeqId(id), max_tokens, None);
    }
    let plan = s.plan(Some(spec));
    assert!(plan.drafts.is_empty(), "a prefill has nothing to verify");
    let outcome = StepOutcome {
        ran: true,
        next: ids.iter().map(|&id| (SeqId(id), first)).collect(),
        ..StepOutcome::default()
    };
    s.update(&plan, &outcome);
}

#[test]
fn prompt_lookup_drafts_ride_along_a_decode_and_verification_keeps_the_matching_ones() {
    let (mut s, mut spec) = (scheduler(), speculator(3, None));
    prefill(&mut s, &mut spec, &[1], 7, 100);
    let plan = s.plan(Some(&mut spec));
    let tree = plan.drafts.get(&SeqId(1)).expect("drafted").clone();
    assert_eq!(tree.tokens(), &[8, 9, 10], "the continuation after `6, 7`");
    assert_eq!(plan.batch[0].len, 4, "the last token and three drafts");
    assert_eq!(plan.inputs[0].tokens, vec![7, 8, 9, 10]);
    assert!(plan.inputs[0].blocks.len() * 4 >= plan.batch[0].start + 4);
    // The target agrees with the first two drafts, then wants 3.
    let rows = [favouring(8), favouring(9), favouring(3), favouring(1)];
    let v = spec.verify(SeqId(1), &tree, |n| &rows[n], &mut greedy(), None);
    let tokens: Vec<u32> = v.emitted.iter().map(|s| s.token).collect();
    assert_eq!(tokens, vec![8, 9, 3]);
    assert_eq!(v.path, vec![1, 2]);
    let outcome = StepOutcome {
        ran: true,
        kept: [(SeqId(1), vec![0, 1])].into(),
        next: vec![(SeqId(1), 3)],
        ..StepOutcome::default()
    };
    s.update(&plan, &outcome);
    let seq = s.get(SeqId(1)).unwrap();
    assert_eq!(seq.generated(), &[7, 8, 9, 3]);
    assert_eq!(
        seq.computed(),
        PROMPT.len() + 3,
        "the rejected draft's KV is gone"
    );
}

#[test]
fn a_rejected_first_draft_still_yields_the_models_own_token() {
    let (mut s, mut spec) = (scheduler(), speculator(2, None));
    prefill(&mut s, &mut spec, &[1], 7, 100);
    let plan = s.plan(Some(&mut spec));
    let tree = plan.drafts[&SeqId(1)].clone();
    let rows = [favouring(4), favouring(9), favouring(10)];
    let v = spec.verify(SeqId(1), &tree, |n| &rows[n], &mut greedy(), None);
    assert_eq!(v.emitted.len(), 1);
    assert_eq!(v.emitted[0].token, 4);
    assert!(v.path.is_empty());
}

#[test]
fn no_drafts_past_max_tokens_nor_over_the_batch_threshold() {
    // One token left: the bonus token takes it, so no drafts.
    let (mut s, mut spec) = (scheduler(), speculator(3, None));
    prefill(&mut s, &mut spec, &[1], 7, 2);
    assert!(s.plan(Some(&mut spec)).drafts.is_empty());
    // Three drafts allowed by max_tokens 3 would be two at most.
    let (mut s, mut spec) = (scheduler(), speculator(3, None));
    prefill(&mut s, &mut spec, &[1], 7, 4);
    assert_eq!(s.plan(Some(&mut spec)).drafts[&SeqId(1)].len(), 2);
    // More running than the threshold: nobody speculates.
    let (mut s, mut spec) = (scheduler(), speculator(3, Some(1)));
    prefill(&mut s, &mut spec, &[1, 2], 7, 100);
    let plan = s.plan(Some(&mut spec));
    assert_eq!(plan.batch.len(), 2);
    assert!(plan.drafts.is_empty());
}

/// The adaptive policy with chains of up to `num_draft_tokens` (κ 0.25 where it is used).
fn adaptive_config(num_draft_tokens: usize) -> SpecConfig {
    config(num_draft_tokens, None, true)
}

#[test]
fn adaptive_drafts_stop_when_rows_cost_more_than_they_can_win() {
    let config = adaptive_config(4);
    let ngram = || Box::new(NgramDrafter(NgramProposer::new(1, 4).unwrap()));
    // Steps are nearly free per row: drafts from a long match pay.
    let mut cheap = Speculator::new(&config, 0.25, ngram());
    // Each row costs as much as a whole step: none pays.
    let mut dear = Speculator::new(&config, 0.0, ngram());
    for rows in 1..=20 {
        cheap.observe_cost(rows as f64, 0.010 + 0.000_01 * rows as f64);
        dear.observe_cost(rows as f64, 0.010 * rows as f64);
    }
    for (spec, drafts) in [(&mut cheap, true), (&mut dear, false)] {
        let mut s = scheduler();
        prefill(&mut s, spec, &[1], 7, 100);
        let plan = s.plan(Some(spec));
        assert_eq!(!plan.drafts.is_empty(), drafts);
    }
}

/// A chain of the token 1 for each request, as long as it asks.
fn chains_of_ones(requests: &[DraftRequest<'_>]) -> Vec<DraftTree> {
    requests
        .iter()
        .map(|r| DraftTree::chain(vec![1; r.nodes]))
        .collect()
}

/// A drafter whose catching up takes 30 ms for 10 rows and whose drafts take no time: chains of
/// the token 1.
struct SlowToCatchUp;

impl Drafter for SlowToCatchUp {
    fn guess(&mut self, _tokens: &[u32], _max: usize, _width: usize) -> Guess {
        Guess::AfterSlots
    }

    fn slots(&self, _depth: usize, _width: usize, nodes: usize) -> usize {
        nodes
    }

    fn catch_up(&mut self, _requests: &[DraftRequest<'_>]) -> Result<usize, model::ModelError> {
        std::thread::sleep(std::time::Duration::from_millis(30));
        Ok(10)
    }

    fn draft(
        &mut self,
        requests: &[DraftRequest<'_>],
    ) -> Result<Vec<DraftTree>, model::ModelError> {
        Ok(chains_of_ones(requests))
    }

    fn accepted(
        &mut self,
        _key: u64,
        _path: &[usize],
        _tokens: &[u32],
    ) -> Result<(), model::ModelError> {
        Ok(())
    }

    fn forget(&mut self, _key: u64) {}
}

#[test]
fn catching_up_is_priced_apart_from_the_drafts() {
    // The adaptive policy prices every draft by the drafter's seconds per draft token; a
    // sequence's one-off catching up (30 ms here, 10 ms a draft if it were counted in) must
    // not make every later draft look dear.
    let mut spec = Speculator::new(&config(3, None, false), 0.25, Box::new(SlowToCatchUp));
    let mut s = scheduler();
    prefill(&mut s, &mut spec, &[1], 7, 100);
    let plan = s.plan(Some(&mut spec));
    assert_eq!(plan.drafts[&SeqId(1)].len(), 3);
    assert!(
        spec.catch_up_seconds() >= 0.003,
        "{}",
        spec.catch_up_seconds()
    );
    assert!(spec.draft_seconds() < 0.005, "{}", spec.draft_seconds());
}

#[test]
fn a_prompt_chunk_in_the_step_does_not_make_drafts_cheap() {
    // 4 ms a step plus 2 ms a unit of work (κ 0.25): sequence 1 (prompt lookup's 3-token match,
    // α 0.6) pays for a draft alone but not beside a second decoding sequence. With the second
    // sequence's 150-token prompt going in this step instead, the drafts are priced as if it
    // decoded: the step is longer, but its prompt rows emit nothing and a draft row still
    // costs what it costs every later step.
    let adaptive = || {
        let config = adaptive_config(3);
        let drafter = Box::new(NgramDrafter(NgramProposer::new(1, 4).unwrap()));
        let mut spec = Speculator::new(&config, 0.25, drafter);
        for rows in 1..=20 {
            spec.observe_cost(rows as f64, 0.004 + 0.002 * rows as f64);
        }
        spec
    };
    let drafts = |plan: &StepPlan| plan.drafts.get(&SeqId(1)).map_or(0, DraftTree::len);
    // Alone: drafts.
    let (mut s, mut spec) = (scheduler(), adaptive());
    prefill(&mut s, &mut spec, &[1], 7, 100);
    assert!(drafts(&s.plan(Some(&mut spec))) > 0);
    // Beside a decoding sequence: none.
    let (mut s, mut spec) = (scheduler(), adaptive());
    prefill(&mut s, &mut spec, &[1, 2], 7, 100);
    assert_eq!(drafts(&s.plan(Some(&mut spec))), 0);
    // Beside a long prompt going in: none either.
    let (mut s, mut spec) = (scheduler(), adaptive());
    prefill(&mut s, &mut spec, &[1], 7, 100);
    s.add(SeqId(2), (0..150).map(|i| 11 + i % 20).collect());
    spec.add(SeqId(2), 100, None);
    let plan = s.plan(Some(&mut spec));
    assert_eq!(plan.batch.len(), 2, "the prompt goes in beside the decode");
    assert!(plan.batch[1].len > 100);
    assert_eq!(drafts(&plan), 0);
}

/// What a drafter was told after verifications: `(what, sequence)`.
type Told = std::rc::Rc<std::cell::RefCell<Vec<(&'static str, u64)>>>;

/// A drafter that drafts after its slots (chains of the token 1) and notes what it is told.
struct Recorder(Told);

impl Drafter for Recorder {
    fn guess(&mut self, _tokens: &[u32], _max: usize, _width: usize) -> Guess {
        Guess::AfterSlots
    }

    fn draft(
        &mut self,
        requests: &[DraftRequest<'_>],
    ) -> Result<Vec<DraftTree>, model::ModelError> {
        Ok(chains_of_ones(requests))
    }

    fn accepted(&mut self, key: u64, _path: &[usize], _t: &[u32]) -> Result<(), model::ModelError> {
        self.0.borrow_mut().push(("accepted", key));
        Ok(())
    }

    fn observed(&mut self, key: u64, _path: &[usize], _t: &[u32]) -> Result<(), model::ModelError> {
        self.0.borrow_mut().push(("observed", key));
        Ok(())
    }
}

#[test]
fn combined_drafters_draft_for_each_sequence_whichever_pays_and_count_apart() {
    // A head-like drafter listed first, prompt lookup second; steps nearly free per row.
    let told = Told::default();
    let config = config_of("EAGLE3,NGRAM", 3, None, true);
    let drafters: Vec<(Algorithm, Box<dyn Drafter>)> = vec![
        (Algorithm::Eagle3, Box::new(Recorder(told.clone()))),
        (
            Algorithm::Ngram,
            Box::new(NgramDrafter(NgramProposer::new(1, 4).unwrap())),
        ),
    ];
    let mut spec = Speculator::with_drafters(&config, 0.25, drafters);
    for rows in 1..=20 {
        spec.observe_cost(rows as f64, 0.010 + 0.000_01 * rows as f64);
    }
    let mut s = scheduler();
    // Sequence 1 repeats itself (a 3-token match once it has sampled 7, α 0.6 to start);
    // sequence 2 does not, so prompt lookup has nothing for it and the head (α ⅓ to start)
    // drafts.
    s.add(SeqId(1), PROMPT.to_vec());
    s.add(SeqId(2), vec![20, 21, 22, 23]);
    spec.add(SeqId(1), 100, None);
    spec.add(SeqId(2), 100, None);
    let plan = s.plan(Some(&mut spec));
    assert!(plan.drafts.is_empty(), "a prefill has nothing to verify");
    s.update(
        &plan,
        &StepOutcome {
            ran: true,
            next: vec![(SeqId(1), 7), (SeqId(2), 24)],
            ..StepOutcome::default()
        },
    );
    let plan = s.plan(Some(&mut spec));
    let lookup = plan.drafts[&SeqId(1)].clone();
    assert_eq!(
        lookup.tokens(),
        &[8, 9, 10],
        "the repeat is prompt lookup's"
    );
    let head = plan.drafts[&SeqId(2)].clone();
    assert_eq!(head.tokens(), &[1, 1, 1], "the fresh text is the head's");
    let rows = [favouring(8), favouring(9), favouring(3), favouring(4)];
    let v = spec.verify(SeqId(1), &lookup, |n| &rows[n], &mut greedy(), None);
    assert_eq!(v.path, vec![1, 2]);
    let rows = [favouring(1), favouring(2), favouring(2), favouring(2)];
    let v = spec.verify(SeqId(2), &head, |n| &rows[n], &mut greedy(), None);
    assert_eq!(v.path, vec![1]);
    // The head saw both verifications: its own drafts accepted, the other's observed.
    assert_eq!(*told.borrow(), [("observed", 1), ("accepted", 2)]);
    let report: Vec<DrafterReport> = spec.drafters().collect();
    assert_eq!(report[0].algorithm, Algorithm::Eagle3);
    let counts = |i: usize| {
        let c = report[i].counts;
        (c.chosen, c.proposed, c.accepted)
    };
    assert_eq!(counts(0), (1, 3, 1));
    assert_eq!(counts(1), (1, 3, 2));
}
