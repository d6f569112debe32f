//! Loading for `specula serve`: the model, its tokenizer and template, the draft model, and the
//! engine with its KV cache tiers sized from the settings.

use super::{HostTier, ServeConfig};
use anyhow::Context;
use kvcache::DEFAULT_BLOCK_SIZE as BLOCK_SIZE;
use model::Model;
use model::chat_template::ChatTemplate;
use model::tokenizer::Tokenizer;
use server::Loaded;

/// Names a model file's weights for the storage tier: its size and a hash of its first and last
/// MiB (the metadata and the last tensors), so stored KV of another model is never reused.
fn fingerprint(path: &std::path::Path) -> anyhow::Result<String> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let len = f.metadata()?.len();
    let mut buf = Vec::with_capacity(1 << 20);
    (&mut f).take(1 << 20).read_to_end(&mut buf)?;
    let mut h = kvcache::fnv1a(kvcache::FNV_OFFSET, &buf);
    f.seek(SeekFrom::Start(len.saturating_sub(1 << 20)))?;
    buf.clear();
    (&mut f).take(1 << 20).read_to_end(&mut buf)?;
    h = kvcache::fnv1a(h, &buf);
    Ok(format!("{len}-{h:016x}-bs{BLOCK_SIZE}"))
}

/// The model, tokenizer and template, the draft model (both quantising activations as
/// `--activations` says, with KV caches as `--kv-cache-dtype` says) and the engine started on
/// them (the engine checks its own settings and refuses bad ones with a message naming the flag).
pub(super) fn load(path: &std::path::Path, s: &ServeConfig) -> anyhow::Result<Loaded> {
    let mut model = Model::load(path).with_context(|| format!("cannot load {}", path.display()))?;
    model.activations = s.activations;
    model.kv_cache_dtype = s.kv_cache_dtype.dtype();
    let tokenizer = Tokenizer::from_gguf(&model.file)
        .with_context(|| format!("{}: cannot build the tokenizer", path.display()))?;
    let template = match ChatTemplate::from_gguf(&model.file, &tokenizer) {
        Ok(t) => Some(t),
        Err(e) => {
            tracing::warn!("no usable chat template ({e}): /v1/chat/completions will refuse");
            None
        }
    };
    let model_context = model.config.context_length;
    let context_length = match s.context_length {
        Some(c) if c > model_context => {
            tracing::warn!(
                "--context-length {c} is over the model's {model_context}; using it anyway"
            );
            c
        }
        Some(c) => c,
        None => model_context,
    };
    let config = engine::EngineConfig {
        max_running: s.max_running_requests,
        max_queued: s.max_queued_requests,
        max_total_tokens: s.max_total_tokens,
        chunked_prefill_size: s.chunked_prefill_size,
        context_length,
        block_size: BLOCK_SIZE,
        speculative: s.speculative,
        prefix_cache: !s.disable_radix_cache,
        schedule_policy: s.schedule_policy,
        host_cache_blocks: 0,
        hicache_storage_dir: s.hicache_storage_dir.clone(),
        model_fingerprint: fingerprint(path)?,
        grammar_forced_drafts: !s.disable_grammar_forced_drafts,
        test_fault: s.test_engine_fault,
    };
    let mut config = config;
    if let Some(tier) = s.hicache {
        config.host_cache_blocks = host_blocks(&model, &config, tier)?;
    }
    let draft = load_draft(&model, s)?;
    let eog = tokenizer.eog_ids().to_vec();
    let hidden_size = model.config.hidden;
    let engine = engine::start(model, draft, config, eog).context("cannot start the engine")?;
    let mut loaded = Loaded::new(engine, tokenizer, template, s.grammar_config());
    loaded.hidden_size = hidden_size;
    Ok(loaded)
}

/// The draft model (STANDALONE) or EAGLE-3 head (EAGLE3) `--speculative-draft-model-path`
/// names, loaded and fitted to the target.
fn load_draft(model: &Model, s: &ServeConfig) -> anyhow::Result<Option<speculative::Draft>> {
    let eagle3 = s.speculative.is_some_and(|c| c.algorithm().uses_head());
    let Some(path) = s.speculative_draft_model_path.as_deref() else {
        if !eagle3 {
            return Ok(None);
        }
        // No head given: the one built in for this model, if there is one.
        let Some((name, head)) = crate::heads::shipped_for(model)? else {
            anyhow::bail!(
                "no EAGLE-3 head ships for this model: give one with \
                 --speculative-draft-model-path (specula train-draft makes one)"
            );
        };
        tracing::info!(head = name, "EAGLE3 with the built-in head");
        return Ok(Some(speculative::Draft::Eagle3(Box::new(head))));
    };
    if eagle3 {
        let target = crate::heads::target_shape(&model.config);
        let o = model.weights.output.matrix(&model.file);
        let output = speculative::eagle3::TargetOutput {
            dtype: o.dtype,
            cols: o.cols,
            data: o.data,
        };
        let head = speculative::eagle3::Eagle3Head::open(path, target, Some(output))
            .with_context(|| format!("cannot load the EAGLE-3 head {}", path.display()))?;
        return Ok(Some(speculative::Draft::Eagle3(Box::new(head))));
    }
    // A file, or a model by name (pulled if missing), as `--model` takes.
    let p = crate::models::resolve(Some(path))?;
    let mut draft =
        Model::load(&p).with_context(|| format!("cannot load the draft model {}", p.display()))?;
    draft.activations = s.activations;
    draft.kv_cache_dtype = s.kv_cache_dtype.dtype();
    Ok(Some(speculative::Draft::Model(Box::new(draft))))
}

/// The host tier's size in blocks of this model's KV.
fn host_blocks(
    model: &Model,
    config: &engine::EngineConfig,
    tier: HostTier,
) -> anyhow::Result<usize> {
    // The runner's own block size, in the store's dtype (`--kv-cache-dtype`), as the engine's
    // host tier allocates it.
    let block_bytes = model::Runner::block_bytes_for(model, config.block_size);
    let blocks = match tier {
        HostTier::Ratio(r) => (config.kv_blocks() as f64 * r) as usize,
        HostTier::Gb(gb) => (gb * 1e9 / block_bytes as f64) as usize,
    };
    if blocks == 0 {
        anyhow::bail!("the host cache tier holds no block ({block_bytes} bytes each)");
    }
    tracing::info!(
        blocks,
        gb = blocks as f64 * block_bytes as f64 / 1e9,
        "prefix cache host tier"
    );
    Ok(blocks)
}
