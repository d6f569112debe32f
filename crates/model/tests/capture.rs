//! Capturing residual streams (what an EAGLE-3 head reads): the streams entering the chosen layers
//! come back for every row of the sequences that ask, bitwise the same alone, in a batch beside
//! sequences that do not capture, or fed token by token; capturing changes no logits; and the
//! stream entering layer 0 is the token's embedding.

mod common;

use model::{Capture, LogitsFor, Model, Runner, SeqInput};

const BLOCK: usize = 16;

fn models() -> Vec<Model> {
    let dir = common::data_dir("reference").join("synthetic");
    let mut models: Vec<Model> = ["qwen3.gguf", "gemma3.gguf"]
        .iter()
        .map(|f| Model::load(&dir.join(f)).unwrap())
        .collect();
    models.push(Model::load(&common::model_path()).unwrap());
    models
}

fn prompt(i: u32, vocab: usize) -> Vec<u32> {
    (0..(6 + 5 * i))
        .map(|j| (300 + (i * 733 + j * 97) % 20_000) % vocab as u32)
        .collect()
}

fn input<'a>(tokens: &'a [u32], start: usize, blocks: &'a [u32]) -> SeqInput<'a> {
    SeqInput {
        tokens: &tokens[start..],
        start_pos: start,
        blocks,
        logits: LogitsFor::Last,
        tree: None,
    }
}

fn layers(model: &Model) -> [usize; 3] {
    let n = model.config.n_layers;
    [0, n / 2, n - 1]
}

#[test]
fn captured_streams_are_batch_invariant_and_leave_logits_alone() {
    for model in models() {
        let vocab = model.config.vocab_size;
        let prompts: Vec<Vec<u32>> = (0..3).map(|i| prompt(i, vocab)).collect();
        let tables: Vec<Vec<u32>> = (0..3u32).map(|i| (i * 4..i * 4 + 4).collect()).collect();
        let layers = layers(&model);

        // Sequence 1 alone, capturing: prefill, then one token fed on its own.
        let mut runner = Runner::new(&model, BLOCK, 12);
        let p = &prompts[1];
        let mut longer = p.clone();
        longer.push(17);
        let alone = Capture {
            layers: &layers,
            seqs: &[true],
        };
        let first = runner
            .forward_capturing(&model, &[input(p, 0, &tables[1])], Some(alone))
            .unwrap();
        let second = runner
            .forward_capturing(&model, &[input(&longer, p.len(), &tables[1])], Some(alone))
            .unwrap();
        let width = 3 * model.config.hidden;
        assert_eq!(first.feature_width, width);
        assert_eq!(first.features(0).len(), p.len() * width);
        assert_eq!(second.features(0).len(), width);

        // The same prefill without capturing: the same logits, and no features.
        let mut plain = Runner::new(&model, BLOCK, 12);
        let none = plain.forward(&model, &[input(p, 0, &tables[1])]).unwrap();
        assert_eq!(bits(none.last(0)), bits(first.last(0)));
        assert!(none.features.is_empty());

        // In a batch of three where only sequence 1 captures, fed all at once.
        let mut batch = Runner::new(&model, BLOCK, 12);
        let inputs: Vec<SeqInput<'_>> = (0..3)
            .map(|i| input(if i == 1 { &longer } else { &prompts[i] }, 0, &tables[i]))
            .collect();
        let marks = [false, true, false];
        let logits = batch
            .forward_capturing(
                &model,
                &inputs,
                Some(Capture {
                    layers: &layers,
                    seqs: &marks,
                }),
            )
            .unwrap();
        assert!(logits.features(0).is_empty() && logits.features(2).is_empty());
        let both: Vec<f32> = [first.features(0), second.features(0)].concat();
        assert_eq!(
            bits(logits.features(1)),
            bits(&both),
            "{:?}",
            model.config.arch
        );
    }
}

#[test]
fn the_stream_entering_layer_zero_is_the_embedding() {
    for model in models() {
        let p = prompt(2, model.config.vocab_size);
        let table: Vec<u32> = (0..4).collect();
        let mut runner = Runner::new(&model, BLOCK, 4);
        let logits = runner
            .forward_capturing(
                &model,
                &[input(&p, 0, &table)],
                Some(Capture {
                    layers: &layers(&model),
                    seqs: &[true],
                }),
            )
            .unwrap();
        let h = model.config.hidden;
        let embd = model.weights.embeddings.matrix(&model.file);
        for (r, &t) in p.iter().enumerate() {
            let mut row = vec![0.0f32; h];
            kernels::quant::dequantize(embd.dtype, embd.row(t as usize), &mut row).unwrap();
            if let Some(s) = model.config.embed_scale {
                row.iter_mut().for_each(|x| *x *= s);
            }
            let got = &logits.features(0)[r * 3 * h..r * 3 * h + h];
            assert_eq!(bits(got), bits(&row));
        }
    }
}

#[test]
fn a_capture_of_a_layer_the_model_lacks_is_refused() {
    let model = Model::load(&common::model_path()).unwrap();
    let p = prompt(0, model.config.vocab_size);
    let table: Vec<u32> = (0..4).collect();
    let mut runner = Runner::new(&model, BLOCK, 4);
    let n = model.config.n_layers;
    let e = runner
        .forward_capturing(
            &model,
            &[input(&p, 0, &table)],
            Some(Capture {
                layers: &[1, 2, n + 1],
                seqs: &[true],
            }),
        )
        .unwrap_err();
    assert!(e.to_string().contains(&format!("layer {}", n + 1)), "{e}");
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}
