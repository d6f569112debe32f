//! The generation parameters chat and completion requests share, validated with OpenAI's names
//! and ranges (plus vLLM/SGLang's `top_k`, `min_p`, `repetition_penalty`, `ignore_eos`).

use crate::error::ApiError;
use model::sampler::SamplingParams;
use protocol::request::{ChatCompletionRequest, CompletionRequest, GenerationFields};

/// Most choices (`n`) one request may ask for.
pub const MAX_N: i64 = 16;
/// Most stop strings.
pub const MAX_STOPS: usize = 16;
/// Most `top_logprobs`.
pub const MAX_TOP_LOGPROBS: i64 = 20;
/// Most tokens `logit_bias` may bias (OpenAI takes 300; vLLM has no limit).
pub const MAX_LOGIT_BIAS: usize = 1024;
/// The largest bias, either way (OpenAI's range).
pub const LOGIT_BIAS_RANGE: f64 = 100.0;

#[derive(Debug, Clone)]
pub struct GenParams {
    /// `max_tokens` / `max_completion_tokens`; `None`: up to the context.
    pub max_tokens: Option<usize>,
    pub sampling: SamplingParams,
    /// The request's seed; choices use seed, seed + 1, ...; without one each choice draws its own.
    pub seed: Option<u64>,
    pub stop: Vec<String>,
    pub stop_token_ids: Vec<u32>,
    pub n: usize,
    /// `None`: no log-probabilities; `Some(k)`: the chosen token's and the top k.
    pub logprobs: Option<usize>,
    pub stream: bool,
    pub include_usage: bool,
    pub ignore_eos: bool,
    /// Structured output (`response_format`, `regex`, `ebnf`), compiled: each choice gets a
    /// copy in its start state.
    pub constraint: Option<Box<dyn model::sampler::TokenConstraint>>,
}

/// A chat request's parameters: `max_completion_tokens` wins over `max_tokens`, and `logprobs`
/// is a boolean with `top_logprobs` the count.
pub fn for_chat(r: &ChatCompletionRequest, vocab: usize) -> Result<GenParams, ApiError> {
    let max_tokens = max_tokens(&r.generation, r.max_completion_tokens)?;
    shared(&r.generation, max_tokens, vocab, || {
        let on = r.logprobs.unwrap_or(false);
        let top = integer("top_logprobs", r.top_logprobs, 0, MAX_TOP_LOGPROBS)?;
        if top.is_some() && !on {
            return Err(ApiError::invalid(
                "top_logprobs",
                "`top_logprobs` needs `logprobs` set to true",
            ));
        }
        Ok(on.then(|| top.unwrap_or(0) as usize))
    })
}

/// A completion request's parameters: `logprobs` is the count.
pub fn for_completion(r: &CompletionRequest, vocab: usize) -> Result<GenParams, ApiError> {
    let max_tokens = max_tokens(&r.generation, None)?;
    shared(&r.generation, max_tokens, vocab, || {
        Ok(integer("logprobs", r.logprobs, 0, MAX_TOP_LOGPROBS)?.map(|k| k as usize))
    })
}

/// Checks the shared parameters (each in this order, so that a request with several mistakes
/// is told about the same one); `logprobs` reads the route's spelling of them, and `vocab`
/// bounds `logit_bias`'s token ids.
fn shared(
    g: &GenerationFields,
    max_tokens: Option<usize>,
    vocab: usize,
    logprobs: impl FnOnce() -> Result<Option<usize>, ApiError>,
) -> Result<GenParams, ApiError> {
    let (mut sampling, seed) = sampling(g)?;
    sampling.logit_bias = logit_bias(g, vocab)?;
    let stop = stop(g)?;
    let n = integer("n", g.n, 1, MAX_N)?.unwrap_or(1) as usize;
    Ok(GenParams {
        max_tokens,
        sampling,
        seed,
        stop,
        stop_token_ids: g.stop_token_ids.clone().unwrap_or_default(),
        n,
        logprobs: logprobs()?,
        stream: g.stream.unwrap_or(false),
        include_usage: g
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false),
        ignore_eos: g.ignore_eos.unwrap_or(false),
        constraint: None,
    })
}

/// `max_tokens`, or chat's `max_completion_tokens` (which wins): at least 1.
fn max_tokens(
    g: &GenerationFields,
    max_completion_tokens: Option<i64>,
) -> Result<Option<usize>, ApiError> {
    let limit = i64::from(u32::MAX);
    let mut max_tokens = integer("max_tokens", g.max_tokens, i64::MIN, limit)?;
    let completion = integer(
        "max_completion_tokens",
        max_completion_tokens,
        i64::MIN,
        limit,
    )?;
    if completion.is_some() {
        max_tokens = completion;
    }
    if let Some(v) = max_tokens
        && v < 1
    {
        let param = if completion.is_some() {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        return Err(ApiError::invalid(
            param,
            format!("`{param}` must be at least 1, got {v}"),
        ));
    }
    Ok(max_tokens.map(|v| v as usize))
}

/// The sampling parameters, and the request's seed.
fn sampling(g: &GenerationFields) -> Result<(SamplingParams, Option<u64>), ApiError> {
    let top_k = integer("top_k", g.top_k, -1, i64::from(u32::MAX))?.unwrap_or(0);
    let seed = g.seed.map(|s| s as u64);
    let sampling = SamplingParams {
        temperature: number("temperature", g.temperature, 0.0, 2.0, false)?.unwrap_or(1.0) as f32,
        top_p: number("top_p", g.top_p, 0.0, 1.0, true)?.unwrap_or(1.0) as f32,
        top_k: top_k.max(0) as usize,
        min_p: number("min_p", g.min_p, 0.0, 1.0, false)?.unwrap_or(0.0) as f32,
        presence_penalty: number("presence_penalty", g.presence_penalty, -2.0, 2.0, false)?
            .unwrap_or(0.0) as f32,
        frequency_penalty: number("frequency_penalty", g.frequency_penalty, -2.0, 2.0, false)?
            .unwrap_or(0.0) as f32,
        repetition_penalty: number("repetition_penalty", g.repetition_penalty, 0.0, 10.0, true)?
            .unwrap_or(1.0) as f32,
        seed: seed.unwrap_or(0),
        logit_bias: Vec::new(),
    };
    sampling
        .validate()
        .map_err(|m| ApiError::bad_request(m.to_string()))?;
    Ok((sampling, seed))
}

/// `logit_bias`: token ids (as the object's keys, OpenAI's form) to biases within
/// ±[`LOGIT_BIAS_RANGE`], at most [`MAX_LOGIT_BIAS`] of them, sorted by id.
fn logit_bias(g: &GenerationFields, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    const P: &str = "logit_bias";
    let Some(map) = &g.logit_bias else {
        return Ok(Vec::new());
    };
    if map.len() > MAX_LOGIT_BIAS {
        return Err(ApiError::invalid(
            P,
            format!(
                "`logit_bias` has {} tokens; at most {MAX_LOGIT_BIAS}",
                map.len()
            ),
        ));
    }
    let mut bias = Vec::with_capacity(map.len());
    for (key, &b) in map {
        let id = key
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|&id| (id as usize) < vocab)
            .ok_or_else(|| {
                ApiError::invalid(
                    P,
                    format!("`logit_bias` key {key:?} is not a token id below {vocab}"),
                )
            })?;
        if b.abs() > LOGIT_BIAS_RANGE {
            return Err(ApiError::invalid(
                P,
                format!(
                    "`logit_bias[{key:?}]` must be a number between -{LOGIT_BIAS_RANGE} and {LOGIT_BIAS_RANGE}"
                ),
            ));
        }
        bias.push((id, b as f32));
    }
    bias.sort_unstable_by_key(|&(id, _)| id);
    Ok(bias)
}

/// `stop`: none empty, at most [`MAX_STOPS`].
fn stop(g: &GenerationFields) -> Result<Vec<String>, ApiError> {
    let stop = g.stop.clone().map(|s| s.0).unwrap_or_default();
    if stop.len() > MAX_STOPS {
        return Err(ApiError::invalid(
            "stop",
            format!("at most {MAX_STOPS} stop strings"),
        ));
    }
    if stop.iter().any(String::is_empty) {
        return Err(ApiError::invalid("stop", "stop strings must not be empty"));
    }
    Ok(stop)
}

/// `value` of parameter `key`, checked to be within `lo..=hi` (`open_lo`: excluding `lo`).
fn number(
    key: &str,
    value: Option<f64>,
    lo: f64,
    hi: f64,
    open_lo: bool,
) -> Result<Option<f64>, ApiError> {
    let Some(x) = value else {
        return Ok(None);
    };
    let above = if open_lo { x > lo } else { x >= lo };
    if !(above && x <= hi) {
        let range = if open_lo {
            format!("in ({lo}, {hi}]")
        } else {
            format!("between {lo} and {hi}")
        };
        return Err(ApiError::invalid(
            key,
            format!("`{key}` must be {range}, got {x}"),
        ));
    }
    Ok(Some(x))
}

/// `value` of parameter `key`, checked to be within `lo..=hi`.
pub(crate) fn integer(
    key: &str,
    value: Option<i64>,
    lo: i64,
    hi: i64,
) -> Result<Option<i64>, ApiError> {
    match value {
        Some(x) if x < lo || x > hi => Err(ApiError::invalid(
            key,
            format!("`{key}` must be between {lo} and {hi}, got {x}"),
        )),
        _ => Ok(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_json(json: &str, chat: bool) -> Result<GenParams, ApiError> {
        let body: serde_json::Value = serde_json::from_str(json).unwrap();
        if chat {
            for_chat(
                &protocol::request::parse(body).map_err(ApiError::field)?,
                100,
            )
        } else {
            for_completion(
                &protocol::request::parse(body).map_err(ApiError::field)?,
                100,
            )
        }
    }

    #[test]
    fn defaults_and_aliases() {
        let p = parse_json("{}", true).unwrap();
        assert_eq!(
            (p.n, p.max_tokens, p.stream, p.logprobs),
            (1, None, false, None)
        );
        assert_eq!(p.sampling.temperature, 1.0);
        let p = parse_json(
            r#"{"max_completion_tokens": 7, "logprobs": true, "top_logprobs": 3}"#,
            true,
        )
        .unwrap();
        assert_eq!((p.max_tokens, p.logprobs), (Some(7), Some(3)));
        let p = parse_json(r#"{"logprobs": 2, "stop": "x", "seed": -1}"#, false).unwrap();
        assert_eq!(
            (p.logprobs, p.stop.clone(), p.seed),
            (Some(2), vec!["x".to_string()], Some(u64::MAX))
        );
        let p = parse_json(r#"{"logit_bias": {"7": -100, "3": 2.5}}"#, true).unwrap();
        assert_eq!(p.sampling.logit_bias, vec![(3, 2.5), (7, -100.0)]);
    }

    #[test]
    fn out_of_range_values_name_their_parameter() {
        for (json, param) in [
            (r#"{"temperature": 2.5}"#, "temperature"),
            (r#"{"temperature": "hot"}"#, "temperature"),
            (r#"{"top_p": 0}"#, "top_p"),
            (r#"{"top_p": 1.5}"#, "top_p"),
            (r#"{"max_tokens": -3}"#, "max_tokens"),
            (r#"{"max_tokens": 0}"#, "max_tokens"),
            (r#"{"max_tokens": 1.5}"#, "max_tokens"),
            (r#"{"n": 0}"#, "n"),
            (r#"{"stop": 3}"#, "stop"),
            (r#"{"stop": [""]}"#, "stop"),
            (r#"{"top_logprobs": 2}"#, "top_logprobs"),
            (r#"{"stream": "yes"}"#, "stream"),
            (r#"{"presence_penalty": 3}"#, "presence_penalty"),
            (r#"{"logit_bias": {"100": 1}}"#, "logit_bias"),
            (r#"{"logit_bias": {"x": 1}}"#, "logit_bias"),
            (r#"{"logit_bias": {"5": 101}}"#, "logit_bias"),
            (r#"{"logit_bias": [1]}"#, "logit_bias"),
            (
                r#"{"stream_options": {"continuous_usage_stats": true}}"#,
                "stream_options",
            ),
        ] {
            let e = parse_json(json, true).unwrap_err();
            assert_eq!(e.status.as_u16(), 400, "{json}");
            assert_eq!(e.param.as_deref(), Some(param), "{json}");
        }
    }
}
