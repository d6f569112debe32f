//! Batch invariance on the real model, in both activation modes: a sequence's logits are bitwise
//! the same alone, inside a batch of any size (joining at different steps), as a prefill chunk or
//! token by token; and the same on the other architectures' layers (the synthetic qwen3, Llama 3
//! and gemma3 models of the reference fixtures: Q/K norms, a wider attention, RoPE divisors, a
//! sliding window of 24 positions that the longer prompts cross).

mod common;

use model::{ActMode, KvDtype, LogitsFor, Model, Runner, SeqInput, Tree};

const BLOCK: usize = 16;

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

fn argmax(v: &[f32]) -> u32 {
    model::sampler::argmax(v)
}

/// Eight different prompts (token ids of ordinary text), of different lengths.
fn prompts() -> Vec<Vec<u32>> {
    prompts_in(49_152)
}

/// [`prompts`] for a vocabulary of `vocab` tokens.
fn prompts_in(vocab: usize) -> Vec<Vec<u32>> {
    (0..8u32)
        .map(|i| {
            (0..(5 + 3 * i))
                .map(|j| (200 + (i * 977 + j * 131) % 20_000) % vocab as u32)
                .collect()
        })
        .collect()
}

/// The synthetic models of the other architectures (scripts/reference/synthetic.sh).
fn synthetic_models() -> Vec<Model> {
    let dir = common::data_dir("reference").join("synthetic");
    ["qwen3.gguf", "llama3.gguf", "gemma3.gguf"]
        .iter()
        .map(|f| Model::load(&dir.join(f)).unwrap())
        .collect()
}

/// Every activation mode with every KV cache dtype.
fn numerics() -> Vec<(ActMode, KvDtype)> {
    ActMode::ALL
        .into_iter()
        .flat_map(|m| [(m, KvDtype::F32), (m, KvDtype::F16)])
        .collect()
}

#[test]
fn every_architecture_is_batch_invariant() {
    for mut model in synthetic_models() {
        for (mode, kv) in numerics() {
            (model.activations, model.kv_cache_dtype) = (mode, kv);
            batched_equals_alone(&model);
            chunk_equals_one_by_one(&model);
        }
    }
}

/// Blocks of sequence `i` in a shared pool: disjoint ranges.
fn blocks(i: usize, per_seq: usize) -> Vec<u32> {
    ((i * per_seq) as u32..((i + 1) * per_seq) as u32).collect()
}

/// Greedy decoding of one prompt alone: prefill as one chunk, then `steps` tokens one by one.
/// Returns the logits of every step.
fn alone(model: &Model, prompt: &[u32], steps: usize) -> Vec<Vec<u32>> {
    let mut runner = Runner::new(model, BLOCK, 8);
    let table = blocks(0, 8);
    let mut tokens = prompt.to_vec();
    let mut out = Vec::new();
    let mut start = 0;
    for _ in 0..steps {
        let input = SeqInput {
            tokens: &tokens[start..],
            start_pos: start,
            blocks: &table,
            logits: LogitsFor::Last,
            tree: None,
        };
        let logits = runner.forward(model, &[input]).unwrap();
        let last = logits.last(0);
        out.push(bits(last));
        start = tokens.len();
        tokens.push(argmax(last));
    }
    out
}

#[test]
fn batched_decoding_is_bitwise_identical_to_decoding_alone() {
    let mut model = Model::load(&common::model_path()).unwrap();
    for (mode, kv) in numerics() {
        (model.activations, model.kv_cache_dtype) = (mode, kv);
        batched_equals_alone(&model);
    }
}

fn batched_equals_alone(model: &Model) {
    let prompts = prompts_in(model.config.vocab_size);
    let steps = 6;
    let expected: Vec<Vec<Vec<u32>>> = prompts.iter().map(|p| alone(model, p, steps)).collect();

    // All eight together; sequence i joins at step i % 3 (its prefill then rides along with the
    // others' single-token decodes).
    let per_seq = 8;
    let mut runner = Runner::new(model, BLOCK, per_seq * prompts.len());
    let tables: Vec<Vec<u32>> = (0..prompts.len()).map(|i| blocks(i, per_seq)).collect();
    let mut tokens: Vec<Vec<u32>> = prompts.clone();
    let mut done: Vec<usize> = vec![0; prompts.len()]; // tokens already in the KV cache
    let mut got: Vec<Vec<Vec<u32>>> = vec![Vec::new(); prompts.len()];
    for step in 0..steps + 2 {
        let active: Vec<usize> = (0..prompts.len())
            .filter(|&i| step >= i % 3 && got[i].len() < steps)
            .collect();
        if active.is_empty() {
            break;
        }
        let inputs: Vec<SeqInput<'_>> = active
            .iter()
            .map(|&i| SeqInput {
                tokens: &tokens[i][done[i]..],
                start_pos: done[i],
                blocks: &tables[i],
                logits: LogitsFor::Last,
                tree: None,
            })
            .collect();
        let logits = runner.forward(model, &inputs).unwrap();
        for (slot, &i) in active.iter().enumerate() {
            let last = logits.last(slot);
            got[i].push(bits(last));
            done[i] = tokens[i].len();
            tokens[i].push(argmax(last));
        }
    }
    for i in 0..prompts.len() {
        assert_eq!(got[i].len(), steps);
        for s in 0..steps {
            assert!(
                got[i][s] == expected[i][s],
                "{}, {} KV: sequence {i}, step {s}: batched logits differ from alone",
                model.activations,
                model.kv_cache_dtype
            );
        }
    }
}

#[test]
fn a_prefill_chunk_equals_feeding_tokens_one_by_one() {
    let mut model = Model::load(&common::model_path()).unwrap();
    for (mode, kv) in numerics() {
        (model.activations, model.kv_cache_dtype) = (mode, kv);
        chunk_equals_one_by_one(&model);
    }
}

fn chunk_equals_one_by_one(model: &Model) {
    // 26 tokens: past a 16-slot block and the synthetic gemma3's 24-position window.
    let prompt = &prompts_in(model.config.vocab_size)[7];
    let table = blocks(0, 4);

    let mut chunked = Runner::new(model, BLOCK, 4);
    let all = chunked
        .forward(
            model,
            &[SeqInput {
                tokens: prompt,
                start_pos: 0,
                blocks: &table,
                logits: LogitsFor::All,
                tree: None,
            }],
        )
        .unwrap();

    let mut single = Runner::new(model, BLOCK, 4);
    for (pos, tok) in prompt.iter().enumerate() {
        let one = single
            .forward(
                model,
                &[SeqInput {
                    tokens: std::slice::from_ref(tok),
                    start_pos: pos,
                    blocks: &table,
                    logits: LogitsFor::Last,
                    tree: None,
                }],
            )
            .unwrap();
        assert_eq!(
            bits(one.last(0)),
            bits(all.row(0, pos)),
            "{}, {} KV: position {pos}",
            model.activations,
            model.kv_cache_dtype
        );
    }
}

#[test]
fn bad_batches_are_errors_not_panics() {
    let model = Model::load(&common::model_path()).unwrap();
    let mut runner = Runner::new(&model, BLOCK, 2);
    let table = [0u32, 1];
    let too_long: Vec<u32> = vec![1; 40];
    let cases = [
        SeqInput {
            tokens: &too_long,
            start_pos: 0,
            blocks: &table,
            logits: LogitsFor::Last,
            tree: None,
        },
        SeqInput {
            tokens: &[1],
            start_pos: 0,
            blocks: &[7],
            logits: LogitsFor::Last,
            tree: None,
        },
        SeqInput {
            tokens: &[1_000_000],
            start_pos: 0,
            blocks: &table,
            logits: LogitsFor::Last,
            tree: None,
        },
        SeqInput {
            tokens: &[],
            start_pos: 0,
            blocks: &table,
            logits: LogitsFor::Last,
            tree: None,
        },
    ];
    for case in cases {
        assert!(runner.forward(&model, &[case]).is_err());
    }
}

/// Logits of the last of `tokens`, computed in one forward pass of a fresh runner.
fn last_logits(model: &Model, tokens: &[u32]) -> Vec<u32> {
    let mut runner = Runner::new(model, BLOCK, 8);
    let table = blocks(0, 8);
    let input = SeqInput {
        tokens,
        start_pos: 0,
        blocks: &table,
        logits: LogitsFor::Last,
        tree: None,
    };
    bits(runner.forward(model, &[input]).unwrap().last(0))
}

#[test]
fn a_draft_tree_node_sees_exactly_its_path_and_the_accepted_path_compacts() {
    let model = Model::load(&common::model_path()).unwrap();
    let prompt: Vec<u32> = prompts()[5].clone(); // 20 tokens: the tree crosses a block edge
    let root = prompt.len() - 1;
    // Node 0 is the sequence's last token; nine candidates below it in three branches.
    let parents = [0usize, 0, 0, 1, 1, 2, 3, 3, 6, 5];
    let nodes: Vec<u32> = [
        prompt[root],
        1000,
        2000,
        3000,
        4000,
        5000,
        6000,
        7000,
        8000,
        9000,
    ]
    .to_vec();
    let tree = Tree {
        root,
        parents: &parents,
    };
    let mut runner = Runner::new(&model, BLOCK, 8);
    let table = blocks(0, 8);
    let prefill = SeqInput {
        tokens: &prompt[..root],
        start_pos: 0,
        blocks: &table,
        logits: LogitsFor::None,
        tree: None,
    };
    runner.forward(&model, &[prefill]).unwrap();
    let verify = SeqInput {
        tokens: &nodes,
        start_pos: root,
        blocks: &table,
        logits: LogitsFor::All,
        tree: Some(tree),
    };
    let logits = runner.forward(&model, &[verify]).unwrap();
    for n in 0..nodes.len() {
        let path: Vec<u32> = tree.path(n).iter().map(|&i| nodes[i]).collect();
        let reference = last_logits(&model, &[&prompt[..root], &path[..]].concat());
        assert!(
            bits(logits.row(0, n)) == reference,
            "node {n} (path {:?}) differs from decoding its path",
            tree.path(n)
        );
    }
    // Accept the path to node 8 (0 → 1 → 3 → 6 → 8): move it into consecutive slots and decode
    // one more token; the result is that of the path decoded plainly.
    let path = tree.path(8);
    for (k, &n) in path.iter().enumerate() {
        runner.move_kv(&table, root + n, root + k).unwrap();
    }
    let next = argmax(logits.row(0, 8));
    let decode = SeqInput {
        tokens: &[next],
        start_pos: root + path.len(),
        blocks: &table,
        logits: LogitsFor::Last,
        tree: None,
    };
    let got = bits(runner.forward(&model, &[decode]).unwrap().last(0));
    let accepted: Vec<u32> = path.iter().map(|&i| nodes[i]).collect();
    let want = last_logits(&model, &[&prompt[..root], &accepted[..], &[next]].concat());
    assert!(got == want, "decoding after compaction differs");
    // A tree whose node precedes its parent is refused, not run.
    let bad = SeqInput {
        tree: Some(Tree {
            root,
            parents: &[0, 2, 0],
        }),
        tokens: &nodes[..3],
        ..verify
    };
    assert!(runner.forward(&model, &[bad]).is_err());
}
