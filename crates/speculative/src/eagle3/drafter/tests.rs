//! The drafter on a tiny untrained head with made-up captured streams: chains and trees of the
//! asked size, the same drafts however the streams arrived (all at once or step by step), a
//! reused prefix block used only when it was computed for the same tokens, and verified rows
//! kept along the accepted path only.

use super::*;
use crate::eagle3::{Eagle3Config, TargetShape};

const TARGET: TargetShape = TargetShape {
    n_layers: 8,
    hidden: 16,
    vocab: 100,
};
const BLOCK: usize = 4;

fn drafter() -> Eagle3Drafter {
    let config = Eagle3Config::parse(
        r#"{"hidden_size": 16, "intermediate_size": 24, "num_attention_heads": 4,
            "num_key_value_heads": 2, "vocab_size": 100, "draft_vocab_size": 20}"#,
        TARGET,
    )
    .unwrap();
    let head = Eagle3Head::random(config, (0..20).map(|i| 5 * i).collect(), 3);
    // An F32 embedding of 100 tokens: token t's row is t/100, t/100 + 0.01, …
    let data = (0..100 * 16)
        .flat_map(|i| ((i / 16) as f32 / 100.0 + (i % 16) as f32 * 0.01).to_le_bytes())
        .collect();
    let embedding = TokenEmbedding {
        dtype: GgmlType::F32,
        width: 16,
        data,
    };
    Eagle3Drafter::new(head, embedding, BLOCK, 16)
}

/// The captured streams of position `p` of a sequence whose tokens so far are `tokens`: a
/// function of the prefix, as the target's are.
fn feature(tokens: &[u32], p: usize) -> Vec<f32> {
    let s: u32 = tokens[..=p].iter().sum();
    (0..48)
        .map(|i| ((s as usize * 7 + i * 3 + p) % 23) as f32 / 23.0 - 0.5)
        .collect()
}

fn features(tokens: &[u32], range: std::ops::Range<usize>) -> Vec<f32> {
    range.flat_map(|p| feature(tokens, p)).collect()
}

fn request<'a>(key: u64, tokens: &'a [u32], blocks: &'a [u32], width: usize) -> DraftRequest<'a> {
    DraftRequest {
        key,
        tokens,
        blocks,
        depth: 3,
        width,
        nodes: if width == 1 { 3 } else { 5 },
        sampling: None,
    }
}

#[test]
fn chains_and_trees_have_the_asked_size_and_map_to_target_ids() {
    let mut d = drafter();
    let tokens: Vec<u32> = vec![3, 14, 15, 92, 65, 35, 89];
    let blocks: Vec<u32> = vec![0, 1, 2, 3];
    d.features(1, 0, &features(&tokens, 0..6), false);
    let chain = d
        .draft(&[request(1, &tokens, &blocks, 1)])
        .unwrap()
        .remove(0);
    assert_eq!(chain.len(), 3);
    assert!(chain.is_chain());
    assert!(chain.tokens().iter().all(|t| t % 5 == 0), "{chain:?}");
    let tree = d
        .draft(&[request(1, &tokens, &blocks, 2)])
        .unwrap()
        .remove(0);
    assert_eq!(tree.len(), 5);
    assert!(!tree.is_chain());
    // The first level's best candidate is the chain's first draft.
    assert_eq!(tree.token(1), chain.token(1));
}

#[test]
fn streams_fed_step_by_step_give_the_drafts_of_streams_fed_at_once() {
    let tokens: Vec<u32> = vec![3, 14, 15, 92, 65, 35, 89, 79, 32];
    let blocks: Vec<u32> = vec![4, 5, 6];
    let mut at_once = drafter();
    at_once.features(1, 0, &features(&tokens, 0..8), false);
    let want = at_once.draft(&[request(1, &tokens, &blocks, 1)]).unwrap();
    let mut stepwise = drafter();
    for end in 5..9 {
        let start = if end == 5 { 0 } else { end - 1 };
        stepwise.features(1, start, &features(&tokens[..end], start..end), false);
        stepwise
            .draft(&[request(1, &tokens[..=end.min(8)], &blocks, 1)])
            .unwrap();
    }
    assert_eq!(
        stepwise.draft(&[request(1, &tokens, &blocks, 1)]).unwrap(),
        want
    );
}

#[test]
fn a_reused_prefix_counts_only_when_it_was_computed_for_the_same_tokens() {
    let tokens: Vec<u32> = vec![3, 14, 15, 92, 65, 35, 89, 79, 32];
    // Sequence 1 fills blocks 0 and 1 (positions 0..8); sequence 2 shares block 0 (positions
    // 0..4) as a cached prefix and brings only its own streams from position 4 on.
    let mut d = drafter();
    d.features(1, 0, &features(&tokens, 0..8), false);
    d.draft(&[request(1, &tokens, &[0, 1, 2], 1)]).unwrap();
    d.features(2, 4, &features(&tokens, 4..8), false);
    let shared = d.draft(&[request(2, &tokens, &[0, 3, 4], 1)]).unwrap();
    let mut fresh = drafter();
    fresh.features(2, 0, &features(&tokens, 0..8), false);
    assert_eq!(
        fresh.draft(&[request(2, &tokens, &[0, 3, 4], 1)]).unwrap(),
        shared
    );
    // Other tokens in the shared block: its head KV is not theirs, and is left out, as if the
    // positions had never run.
    let mut other = tokens.clone();
    other[1] = 50;
    d.features(3, 4, &features(&other, 4..8), false);
    let stale = d.draft(&[request(3, &other, &[0, 5, 6], 1)]).unwrap();
    let mut blind = drafter();
    blind.features(3, 4, &features(&other, 4..8), false);
    assert_eq!(
        blind.draft(&[request(3, &other, &[7, 5, 6], 1)]).unwrap(),
        stale
    );
}

#[test]
fn verified_rows_are_kept_along_the_accepted_path() {
    let tokens: Vec<u32> = vec![3, 14, 15, 92, 65, 35];
    let blocks: Vec<u32> = vec![0, 1, 2];
    let mut d = drafter();
    d.features(1, 0, &features(&tokens, 0..5), false);
    let tree = d
        .draft(&[request(1, &tokens, &blocks, 1)])
        .unwrap()
        .remove(0);
    // Verification ran the root (position 5) and the three drafts; two were accepted, then the
    // target's own token.
    let mut longer = tokens.clone();
    longer.extend([tree.token(1), tree.token(2), 7]);
    let mut rows = feature(&longer, 5);
    rows.extend(features(&longer, 6..8));
    rows.extend(vec![9.0; 48]);
    d.features(1, 5, &rows, true);
    d.accepted(1, &[1, 2], &[tree.token(1), tree.token(2)])
        .unwrap();
    let after = d.draft(&[request(1, &longer, &blocks, 1)]).unwrap();
    let mut fresh = drafter();
    fresh.features(1, 0, &features(&longer, 0..8), false);
    assert_eq!(
        fresh.draft(&[request(1, &longer, &blocks, 1)]).unwrap(),
        after
    );
}

#[test]
fn sampled_chains_are_drawn_from_the_distribution_they_carry() {
    let tokens: Vec<u32> = vec![3, 14, 15, 92, 65, 35, 89];
    let blocks: Vec<u32> = vec![0, 1, 2, 3];
    let mut d = drafter();
    d.features(1, 0, &features(&tokens, 0..6), false);
    let greedy = d
        .draft(&[request(1, &tokens, &blocks, 1)])
        .unwrap()
        .remove(0);
    assert!((1..=3).all(|n| greedy.drawn_from(n).is_none()));
    let sampled = |d: &mut Eagle3Drafter, seed: u64| {
        let r = DraftRequest {
            sampling: Some(DraftSampling {
                temperature: 1.0,
                seed,
            }),
            ..request(1, &tokens, &blocks, 1)
        };
        d.draft(&[r]).unwrap().remove(0)
    };
    let first = sampled(&mut d, 7);
    assert_eq!(first.len(), 3);
    assert!(first.is_chain());
    for n in 1..=3 {
        let from = first.drawn_from(n).unwrap();
        let total: f32 = from.iter().map(|&(_, p)| p).sum();
        assert!((total - 1.0).abs() < 1e-4, "{total}");
        assert!(from.windows(2).all(|w| w[0].0 < w[1].0), "sorted by token");
        assert!(from.iter().any(|&(t, p)| t == first.token(n) && p > 0.0));
    }
    assert_eq!(sampled(&mut d, 7), first, "the same seed drafts the same");
    // Over seeds, the first draft follows the distribution it carries.
    let n = 4000;
    let mut counts: HashMap<u32, usize> = HashMap::new();
    for seed in 0..n {
        *counts.entry(sampled(&mut d, seed).token(1)).or_default() += 1;
    }
    let from = first.drawn_from(1).unwrap();
    assert!(counts.len() > 1, "{counts:?}");
    for &(t, p) in from {
        let got = counts.get(&t).copied().unwrap_or(0) as f32 / n as f32;
        assert!((got - p).abs() < 0.025, "token {t}: {got} against {p}");
    }
}

#[test]
fn a_long_stretch_without_drafts_leaves_a_bounded_catch_up() {
    // The drafter's store has 16 blocks of 4: room for 64 positions.
    let tokens: Vec<u32> = (0..60).map(|i| (i * 37 % 100) as u32).collect();
    let blocks: Vec<u32> = (0..16).collect();
    let mut d = drafter();
    // A prompt of 10, then 49 decode steps one stream each, none drafting.
    d.features(1, 0, &features(&tokens, 0..10), false);
    for p in 10..59 {
        d.features(1, p, &features(&tokens, p..p + 1), false);
    }
    assert_eq!(d.backlog(1, 60), MAX_PENDING_ROWS);
    assert_eq!(
        d.catch_up(&[request(1, &tokens, &blocks, 1)]).unwrap(),
        MAX_PENDING_ROWS
    );
    assert_eq!(d.backlog(1, 60), 0);
    // A sequence that drafts every step owes only what its last step decoded.
    d.features(1, 59, &features(&tokens, 59..60), false);
    let more: Vec<u32> = tokens.iter().copied().chain([7]).collect();
    assert_eq!(d.backlog(1, 61), 1);
    assert_eq!(
        d.draft(&[request(1, &more, &blocks, 1)]).unwrap()[0].len(),
        3
    );
}
