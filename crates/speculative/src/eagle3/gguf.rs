//! EAGLE-3 heads in llama.cpp's GGUF form (architecture `eagle3`, as its converter writes them):
//! `fc.weight`, one block `blk.0.*` whose `attn_norm` is SGLang's `input_layernorm` and
//! `attn_norm_2` its `hidden_norm`, `output_norm`, `output` over the draft vocabulary, and `d2t`
//! as absolute target ids (I64 or I32). `eagle3.target_layers` names the layers whose *input*
//! llama.cpp captures, which is what [`Eagle3Config::capture_layers`] means too. The converter
//! permutes Q and K rows for llama.cpp's adjacent-pair RoPE; they are put back in HF's order.
//! A head without `output` borrows the target's output rows, one without `token_embd` the
//! target's embedding (as every SGLang head does).

use super::{
    Eagle3Config, Eagle3Error, Eagle3Head, Matrix, TargetShape, checked_target_ids, read_integers,
};
use kernels::quant::{GgmlType, dequantize};
use model::gguf::{GgufFile, MetaValue};
use std::path::Path;

/// The target's output layer as it is stored, lent to a head that has none.
#[derive(Debug, Clone, Copy)]
pub struct TargetOutput<'a> {
    pub dtype: GgmlType,
    /// Values per row (the target's hidden width).
    pub cols: usize,
    /// Every row's bytes, row after row.
    pub data: &'a [u8],
}

impl Eagle3Head {
    /// Loads a head from a GGUF file written by llama.cpp's converter, for `target`, borrowing
    /// `output` when the file has no output layer.
    pub fn load_gguf(
        path: &Path,
        target: TargetShape,
        output: Option<TargetOutput<'_>>,
    ) -> Result<Self, Eagle3Error> {
        let file = GgufFile::open(path).map_err(|e| Eagle3Error::Io {
            path: path.display().to_string(),
            message: e.to_string(),
        })?;
        Self::from_gguf(&file, target, output)
    }

    /// A head from an open GGUF file (see [`Eagle3Head::load_gguf`]).
    pub fn from_gguf(
        file: &GgufFile,
        target: TargetShape,
        output: Option<TargetOutput<'_>>,
    ) -> Result<Self, Eagle3Error> {
        let config = gguf_config(file, target)?;
        let c = &config;
        let (h, q, kv) = (c.hidden, c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim);
        let m = |name: &str, rows: usize, cols: usize| matrix(file, name, rows, cols);
        let v = |name: &str, len: usize| matrix(file, name, 1, len).map(|m| m.data);
        let draft_to_target = draft_to_target(file, c.vocab)?;
        let lm_head = if file.tensor_info("output.weight").is_some() {
            m("output.weight", c.draft_vocab, h)?
        } else {
            borrowed_output(output, &draft_to_target, h)?
        };
        let unpermute = |w: Matrix, heads: usize| unpermute_rows(w, heads, c.head_dim);
        Ok(Self {
            fc: m("fc.weight", h, 3 * c.target_hidden)?,
            input_norm: v("blk.0.attn_norm.weight", h)?,
            hidden_norm: v("blk.0.attn_norm_2.weight", h)?,
            wq: unpermute(m("blk.0.attn_q.weight", q, 2 * h)?, c.n_heads),
            wk: unpermute(m("blk.0.attn_k.weight", kv, 2 * h)?, c.n_kv_heads),
            wv: m("blk.0.attn_v.weight", kv, 2 * h)?,
            wo: m("blk.0.attn_output.weight", h, q)?,
            post_attention_norm: v("blk.0.ffn_norm.weight", h)?,
            gate: m("blk.0.ffn_gate.weight", c.intermediate, h)?,
            up: m("blk.0.ffn_up.weight", c.intermediate, h)?,
            down: m("blk.0.ffn_down.weight", h, c.intermediate)?,
            norm: v("output_norm.weight", h)?,
            lm_head,
            draft_to_target,
            embed: match file.tensor_info("token_embd.weight") {
                Some(_) => Some(m("token_embd.weight", c.vocab, h)?),
                None => None,
            },
            config,
        })
    }
}

/// The head's configuration from the file's `eagle3.*` keys, checked against `target`.
fn gguf_config(file: &GgufFile, target: TargetShape) -> Result<Eagle3Config, Eagle3Error> {
    let bad = |e: model::gguf::GgufError| Eagle3Error::Config(e.to_string());
    let arch = file.architecture().map_err(bad)?;
    if arch != "eagle3" {
        return Err(Eagle3Error::Config(format!(
            "the GGUF file is a `{arch}` model, not an `eagle3` head"
        )));
    }
    let dim = |key: &str| -> Result<usize, Eagle3Error> {
        let n = file.get_u32(&format!("eagle3.{key}")).map_err(bad)? as usize;
        if n == 0 || n > super::config::MAX_DIM {
            return Err(Eagle3Error::Config(format!("eagle3.{key} is {n}")));
        }
        Ok(n)
    };
    let flag = |key: &str| {
        let key = format!("eagle3.{key}");
        file.get(&key).map_or(Ok(false), |_| file.get_bool(&key))
    };
    if flag("norm_before_fc").map_err(bad)? {
        return Err(Eagle3Error::Config(
            "heads that norm the target's states before fc (norm_before_fc) are not supported"
                .into(),
        ));
    }
    if file.tensor_info("blk.0.rope_freqs.weight").is_some() {
        return Err(Eagle3Error::Config(
            "heads with RoPE frequency scaling (rope_freqs) are not supported".into(),
        ));
    }
    let (hidden, n_heads) = (dim("embedding_length")?, dim("attention.head_count")?);
    let present = |key: &str| file.get(&format!("eagle3.{key}")).is_some();
    let head_dim = if present("attention.key_length") {
        dim("attention.key_length")?
    } else if hidden.is_multiple_of(n_heads) {
        hidden / n_heads
    } else {
        return Err(Eagle3Error::Config(
            "embedding_length is not a multiple of attention.head_count".into(),
        ));
    };
    let draft_vocab = match file.tensor_info("d2t") {
        Some(t) => t.n_elements(),
        None => target.vocab,
    };
    let config = Eagle3Config {
        hidden,
        intermediate: dim("feed_forward_length")?,
        n_heads,
        n_kv_heads: if present("attention.head_count_kv") {
            dim("attention.head_count_kv")?
        } else {
            n_heads
        },
        head_dim,
        vocab: target.vocab,
        draft_vocab,
        target_hidden: dim("target_hidden_size")?,
        capture_layers: target_layers(file, target.n_layers)?,
        rms_eps: file
            .get_f32("eagle3.attention.layer_norm_rms_epsilon")
            .map_err(bad)?,
        rope_theta: match file.get("eagle3.rope.freq_base") {
            Some(_) => file.get_f32("eagle3.rope.freq_base").map_err(bad)?,
            None => 10_000.0,
        },
        norm_before_residual: flag("norm_before_residual").map_err(bad)?,
    };
    if !(config.rms_eps > 0.0 && config.rope_theta > 0.0) {
        return Err(Eagle3Error::Config(
            "the RMS epsilon and RoPE base must be positive".into(),
        ));
    }
    config.check(target)?;
    Ok(config)
}

/// `eagle3.target_layers`: three layers whose input is captured (the target's layer count
/// itself meaning its final stream).
fn target_layers(file: &GgufFile, n_layers: usize) -> Result<[usize; 3], Eagle3Error> {
    let key = "eagle3.target_layers";
    let ids = file
        .get_array(key)
        .map_err(|e| Eagle3Error::Config(e.to_string()))?;
    let layers: Vec<usize> = ids
        .iter()
        .map(|v| {
            MetaValue::as_int(v)
                .and_then(|i| usize::try_from(i).ok())
                .filter(|&l| l <= n_layers)
                .ok_or_else(|| {
                    Eagle3Error::WrongTarget(format!(
                        "{key} holds {v:?}, not a layer of a {n_layers}-layer target"
                    ))
                })
        })
        .collect::<Result<_, _>>()?;
    layers.try_into().map_err(|l: Vec<usize>| {
        Eagle3Error::Config(format!("{key} must hold three layers, not {}", l.len()))
    })
}

/// A float (or quantised) tensor of `rows × cols` values (a vector as `1 × cols`) in f32.
fn matrix(file: &GgufFile, name: &str, rows: usize, cols: usize) -> Result<Matrix, Eagle3Error> {
    let t = file
        .tensor(name)
        .map_err(|e| Eagle3Error::Weights(e.to_string()))?;
    let want: Vec<usize> = if rows == 1 {
        vec![cols]
    } else {
        vec![cols, rows]
    };
    if t.info.shape != want {
        return Err(Eagle3Error::Weights(format!(
            "{name} has shape {:?}, the config needs {want:?}",
            t.info.shape
        )));
    }
    if t.info.dtype.is_integer() {
        return Err(Eagle3Error::Weights(format!(
            "{name} holds {}, not weights",
            t.info.dtype
        )));
    }
    let mut data = vec![0.0; rows * cols];
    dequantize(t.info.dtype, t.bytes, &mut data)
        .map_err(|e| Eagle3Error::Weights(format!("{name}: {e}")))?;
    Ok(Matrix { rows, cols, data })
}

/// `d2t` as absolute target ids (llama.cpp's converter adds the offsets), each checked; without
/// it the draft vocabulary is the target's.
fn draft_to_target(file: &GgufFile, vocab: usize) -> Result<Vec<u32>, Eagle3Error> {
    let Ok(t) = file.tensor("d2t") else {
        return Ok((0..vocab as u32).collect());
    };
    let ids = match t.info.dtype {
        GgmlType::I64 => read_integers(t.bytes, true),
        GgmlType::I32 => read_integers(t.bytes, false),
        other => {
            return Err(Eagle3Error::Weights(format!(
                "d2t is {other}; it must be I64 or I32"
            )));
        }
    };
    checked_target_ids(&ids, vocab)
}

/// The target's output rows of the draft vocabulary, for a head that has no output layer.
fn borrowed_output(
    output: Option<TargetOutput<'_>>,
    ids: &[u32],
    hidden: usize,
) -> Result<Matrix, Eagle3Error> {
    let o = output.ok_or_else(|| {
        Eagle3Error::Weights("output.weight is missing and no target lends one".into())
    })?;
    let row_bytes = o.dtype.bytes_for(o.cols).filter(|_| o.cols == hidden);
    let Some(row_bytes) = row_bytes else {
        return Err(Eagle3Error::WrongTarget(format!(
            "the target's output rows hold {} values, the head's width is {hidden}",
            o.cols
        )));
    };
    let mut data = vec![0.0; ids.len() * hidden];
    for (&id, out) in ids.iter().zip(data.chunks_exact_mut(hidden)) {
        let at = id as usize * row_bytes;
        let row = o.data.get(at..at + row_bytes).ok_or_else(|| {
            Eagle3Error::WrongTarget(format!("the target's output has no row {id}"))
        })?;
        dequantize(o.dtype, row, out).map_err(|e| Eagle3Error::Weights(e.to_string()))?;
    }
    Ok(Matrix {
        rows: ids.len(),
        cols: hidden,
        data,
    })
}

/// Undoes the converter's Q/K row permutation: within each head, its row `2i + j` (llama.cpp's
/// adjacent RoPE pairs) is HF's row `j · head_dim/2 + i` (pairs half a head apart).
fn unpermute_rows(w: Matrix, heads: usize, head_dim: usize) -> Matrix {
    let half = head_dim / 2;
    let mut data = vec![0.0; w.data.len()];
    for h in 0..heads {
        for i in 0..half {
            for j in 0..2 {
                let from = (h * head_dim + 2 * i + j) * w.cols;
                let to = (h * head_dim + j * half + i) * w.cols;
                data[to..to + w.cols].copy_from_slice(&w.data[from..from + w.cols]);
            }
        }
    }
    Matrix { data, ..w }
}
