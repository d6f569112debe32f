//! The head as the drafter runs it: many rows at once (every sequence's rows of a draft step in
//! one product per matrix), its matrices quantised to Q8_0 and multiplied by the runtime's own
//! kernels with int8 activations. A head is small enough that its weights, a quarter of their
//! f32 size, stay in the last-level cache across the draft steps of a round. Drafts need not be
//! exact (verification is), so the drafter uses this form; [`Eagle3Head::step`] stays the f32
//! reference. A matrix whose width is not a multiple of 32 (tiny test heads) keeps f32 rows.

use super::{Eagle3Head, Matrix};
use kernels::gemm::{Activations, PackedMatrix, QMatrix, gemm_many};
use kernels::ops::{Gate, RopeFreqs, RopeMode, dot, gated_mul, rms_norm, rope_angles, rope_apply};
use kernels::quant::{ActMode, GgmlType};

/// Values a Q8_0 block holds.
const BLOCK: usize = 32;

/// One matrix in the form its products run in.
struct Product {
    rows: usize,
    cols: usize,
    form: Form,
}

enum Form {
    /// Q8_0 blocks, and their packed copy where this CPU's kernels read one.
    Q8 {
        data: Vec<u8>,
        packed: Option<PackedMatrix>,
    },
    /// f32 rows, multiplied by dot products.
    F32(Vec<f32>),
}

/// Q8_0 blocks of `row` (a multiple of 32 values): per block an f16 scale and 32 signed bytes.
fn quantize_q8_0(row: &[f32], out: &mut Vec<u8>) {
    for block in row.chunks_exact(BLOCK) {
        let amax = block.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        let d = amax / 127.0;
        let inv = if d > 0.0 { 1.0 / d } else { 0.0 };
        out.extend(kernels::attention::f16::from_f32(d).to_le_bytes());
        out.extend(block.iter().map(|x| (x * inv).round() as i8 as u8));
    }
}

impl Product {
    fn new(m: &Matrix) -> Self {
        let form = if m.cols.is_multiple_of(BLOCK) {
            let mut data = Vec::with_capacity(m.rows * m.cols / BLOCK * 34);
            for row in m.data.chunks_exact(m.cols) {
                quantize_q8_0(row, &mut data);
            }
            let q = QMatrix::new(GgmlType::Q8_0, m.rows, m.cols, &data).expect("sized rows");
            let packed = PackedMatrix::for_this_cpu(&q);
            Form::Q8 { data, packed }
        } else {
            Form::F32(m.data.clone())
        };
        Self {
            rows: m.rows,
            cols: m.cols,
            form,
        }
    }

    fn matrix(&self) -> Option<QMatrix<'_>> {
        match &self.form {
            Form::Q8 { data, packed } => {
                let q = QMatrix::new(GgmlType::Q8_0, self.rows, self.cols, data).expect("sized");
                Some(match packed {
                    Some(p) => q.with_packed(p),
                    None => q,
                })
            }
            Form::F32(_) => None,
        }
    }

    /// `x` (`m × cols`) times this matrix's rows, by dot products.
    fn dots(&self, x: &[f32], out: &mut [f32]) {
        let Form::F32(w) = &self.form else {
            unreachable!("only f32 rows are multiplied by dots")
        };
        for (xr, o) in x
            .chunks_exact(self.cols)
            .zip(out.chunks_exact_mut(self.rows))
        {
            for (o, wr) in o.iter_mut().zip(w.chunks_exact(self.cols)) {
                *o = dot(wr, xr);
            }
        }
    }
}

/// Products of the same `m` input rows by several matrices, in one parallel region where they
/// are quantised.
fn products(ps: &[&Product], x: &[f32], m: usize, acts: &mut Activations) -> Vec<Vec<f32>> {
    let mut outs: Vec<Vec<f32>> = ps.iter().map(|p| vec![0.0; m * p.rows]).collect();
    let quantised: Vec<Option<QMatrix<'_>>> = ps.iter().map(|p| p.matrix()).collect();
    if quantised.iter().any(Option::is_some) {
        acts.set(x, m, ps[0].cols);
    }
    let mut batch: Vec<(QMatrix<'_>, &mut [f32])> = Vec::new();
    for ((p, q), out) in ps.iter().zip(&quantised).zip(outs.iter_mut()) {
        match q {
            Some(q) => batch.push((*q, out.as_mut_slice())),
            None => p.dots(x, out),
        }
    }
    if !batch.is_empty() {
        gemm_many(&mut batch, acts);
    }
    outs
}

/// The rows of a batch after the first half of the layer.
pub struct ProjectedRows {
    pub q: Vec<f32>,
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub residual: Vec<f32>,
}

/// The head's matrices in their product form, and the activations buffer they share.
pub struct BatchedHead {
    fc: Product,
    wq: Product,
    wk: Product,
    wv: Product,
    wo: Product,
    gate: Product,
    up: Product,
    down: Product,
    lm_head: Product,
    acts: Activations,
}

impl BatchedHead {
    pub fn new(head: &Eagle3Head) -> Self {
        let mut acts = Activations::default();
        acts.mode = ActMode::Int8;
        Self {
            fc: Product::new(&head.fc),
            wq: Product::new(&head.wq),
            wk: Product::new(&head.wk),
            wv: Product::new(&head.wv),
            wo: Product::new(&head.wo),
            gate: Product::new(&head.gate),
            up: Product::new(&head.up),
            down: Product::new(&head.down),
            lm_head: Product::new(&head.lm_head),
            acts,
        }
    }

    /// The first half of the layer for `positions.len()` rows: `embeddings` (`hidden` values a
    /// row) and `features` (all captured states, `3 × target_hidden` a row, or all carries).
    pub fn project(
        &mut self,
        head: &Eagle3Head,
        embeddings: &[f32],
        features: &[f32],
        positions: &[usize],
    ) -> ProjectedRows {
        let c = &head.config;
        let (h, m) = (c.hidden, positions.len());
        let g = if features.len() == m * h {
            features.to_vec()
        } else {
            products(&[&self.fc], features, m, &mut self.acts).remove(0)
        };
        let mut a = vec![0.0f32; m * 2 * h];
        let mut normed_g = vec![0.0f32; m * h];
        for r in 0..m {
            let row = &mut a[r * 2 * h..(r + 1) * 2 * h];
            rms_norm(
                &embeddings[r * h..(r + 1) * h],
                &head.input_norm,
                c.rms_eps,
                &mut row[..h],
            );
            rms_norm(
                &g[r * h..(r + 1) * h],
                &head.hidden_norm,
                c.rms_eps,
                &mut row[h..],
            );
            normed_g[r * h..(r + 1) * h].copy_from_slice(&row[h..]);
        }
        let mut qkv = products(&[&self.wq, &self.wk, &self.wv], &a, m, &mut self.acts);
        let v = qkv.pop().expect("three products");
        let mut k = qkv.pop().expect("three products");
        let mut q = qkv.pop().expect("three products");
        let freqs = RopeFreqs {
            rot_dims: c.head_dim,
            base: c.rope_theta,
            freq_scale: 1.0,
            divisors: None,
        };
        let (qw, kw) = (c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
        let mut angles = Vec::new();
        for (r, &p) in positions.iter().enumerate() {
            rope_angles(p, &freqs, &mut angles);
            rope_apply(
                &mut q[r * qw..(r + 1) * qw],
                c.head_dim,
                RopeMode::Neox,
                &angles,
            );
            rope_apply(
                &mut k[r * kw..(r + 1) * kw],
                c.head_dim,
                RopeMode::Neox,
                &angles,
            );
        }
        let residual = if c.norm_before_residual { normed_g } else { g };
        ProjectedRows { q, k, v, residual }
    }

    /// The second half for `m` rows: attention outputs through `o_proj` onto the residuals,
    /// then the MLP; returns the carries (`m × hidden`).
    pub fn finish(&mut self, head: &Eagle3Head, attn: &[f32], residual: &[f32]) -> Vec<f32> {
        let c = &head.config;
        let (h, m) = (c.hidden, residual.len() / c.hidden);
        let mut h1 = products(&[&self.wo], attn, m, &mut self.acts).remove(0);
        h1.iter_mut().zip(residual).for_each(|(x, r)| *x += r);
        let mut n = vec![0.0f32; m * h];
        for (x, o) in h1.chunks_exact(h).zip(n.chunks_exact_mut(h)) {
            rms_norm(x, &head.post_attention_norm, c.rms_eps, o);
        }
        let mut gu = products(&[&self.gate, &self.up], &n, m, &mut self.acts);
        let up = gu.pop().expect("two products");
        let mut gate = gu.pop().expect("two products");
        gated_mul(Gate::Silu, &mut gate, &up);
        let mut out = products(&[&self.down], &gate, m, &mut self.acts).remove(0);
        out.iter_mut().zip(&h1).for_each(|(x, r)| *x += r);
        out
    }

    /// Logits over the draft vocabulary of `m` carries (`m × draft_vocab`).
    pub fn logits(&mut self, head: &Eagle3Head, carries: &[f32]) -> Vec<f32> {
        let c = &head.config;
        let m = carries.len() / c.hidden;
        let mut n = vec![0.0f32; carries.len()];
        for (x, o) in carries
            .chunks_exact(c.hidden)
            .zip(n.chunks_exact_mut(c.hidden))
        {
            rms_norm(x, &head.norm, c.rms_eps, o);
        }
        products(&[&self.lm_head], &n, m, &mut self.acts).remove(0)
    }
}
