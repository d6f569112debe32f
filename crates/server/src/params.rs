//! The generation parameters chat and completion requests share, validated with OpenAI's names
//! and ranges (plus vLLM/SGLang's `top_k`, `min_p`, `repetition_penalty`, `ignore_eos`).

use crate::body::Body;
use crate::error::ApiError;
use model::sampler::SamplingParams;
use serde_json::Value;

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

/// Reads the shared parameters (each checked in this order, so that a request with several
/// mistakes is told about the same one). `chat` selects how `logprobs` is spelled: a boolean plus
/// `top_logprobs` (chat) or an integer (completions); `vocab` bounds `logit_bias`'s token ids.
pub fn parse(body: &Body, chat: bool, vocab: usize) -> Result<GenParams, ApiError> {
    let max_tokens = max_tokens(body, chat)?;
    let (mut sampling, seed) = sampling(body)?;
    sampling.logit_bias = logit_bias(body, vocab)?;
    let stop = stop(body)?;
    let stop_token_ids = stop_token_ids(body)?;
    let n = body.integer("n", 1, MAX_N)?.unwrap_or(1) as usize;
    let logprobs = logprobs(body, chat)?;
    let stream = body.bool("stream")?.unwrap_or(false);
    let include_usage = include_usage(body)?;
    Ok(GenParams {
        max_tokens,
        sampling,
        seed,
        stop,
        stop_token_ids,
        n,
        logprobs,
        stream,
        include_usage,
        ignore_eos: body.bool("ignore_eos")?.unwrap_or(false),
        constraint: None,
    })
}

/// `max_tokens`, or chat's `max_completion_tokens` (which wins): at least 1.
fn max_tokens(body: &Body, chat: bool) -> Result<Option<usize>, ApiError> {
    let limit = i64::from(u32::MAX);
    let mut max_tokens = body.integer("max_tokens", i64::MIN, limit)?;
    if chat && let Some(v) = body.integer("max_completion_tokens", i64::MIN, limit)? {
        max_tokens = Some(v);
    }
    if let Some(v) = max_tokens
        && v < 1
    {
        let param = if body.get("max_completion_tokens").is_some() {
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
fn sampling(body: &Body) -> Result<(SamplingParams, Option<u64>), ApiError> {
    let top_k = body.integer("top_k", -1, i64::from(u32::MAX))?.unwrap_or(0);
    let seed = body.integer("seed", i64::MIN, i64::MAX)?.map(|s| s as u64);
    let sampling = SamplingParams {
        temperature: body.number("temperature", 0.0, 2.0, false)?.unwrap_or(1.0) as f32,
        top_p: body.number("top_p", 0.0, 1.0, true)?.unwrap_or(1.0) as f32,
        top_k: top_k.max(0) as usize,
        min_p: body.number("min_p", 0.0, 1.0, false)?.unwrap_or(0.0) as f32,
        presence_penalty: body
            .number("presence_penalty", -2.0, 2.0, false)?
            .unwrap_or(0.0) as f32,
        frequency_penalty: body
            .number("frequency_penalty", -2.0, 2.0, false)?
            .unwrap_or(0.0) as f32,
        repetition_penalty: body
            .number("repetition_penalty", 0.0, 10.0, true)?
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
fn logit_bias(body: &Body, vocab: usize) -> Result<Vec<(u32, f32)>, ApiError> {
    const P: &str = "logit_bias";
    let Some(v) = body.get(P) else {
        return Ok(Vec::new());
    };
    let Value::Object(map) = v else {
        return Err(ApiError::invalid(
            P,
            "`logit_bias` must be an object of token ids to biases",
        ));
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
    for (key, value) in map {
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
        let b = value
            .as_f64()
            .filter(|b| b.abs() <= LOGIT_BIAS_RANGE)
            .ok_or_else(|| {
                ApiError::invalid(
                    P,
                    format!(
                        "`logit_bias[{key:?}]` must be a number between -{LOGIT_BIAS_RANGE} and {LOGIT_BIAS_RANGE}"
                    ),
                )
            })?;
        bias.push((id, b as f32));
    }
    bias.sort_unstable_by_key(|&(id, _)| id);
    Ok(bias)
}

/// `stop`: a string or a list of them, none empty, at most [`MAX_STOPS`].
fn stop(body: &Body) -> Result<Vec<String>, ApiError> {
    let stop: Vec<String> = match body.get("stop") {
        None => Vec::new(),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_str().map(str::to_string).ok_or_else(|| {
                    ApiError::invalid("stop", "`stop` must be a string or a list of strings")
                })
            })
            .collect::<Result<_, _>>()?,
        Some(_) => {
            return Err(ApiError::invalid(
                "stop",
                "`stop` must be a string or a list of strings",
            ));
        }
    };
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

/// `stop_token_ids`: a list of token ids.
fn stop_token_ids(body: &Body) -> Result<Vec<u32>, ApiError> {
    match body.get("stop_token_ids") {
        None => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| {
                v.as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .ok_or_else(|| {
                        ApiError::invalid("stop_token_ids", "`stop_token_ids` must be token ids")
                    })
            })
            .collect(),
        Some(_) => Err(ApiError::invalid(
            "stop_token_ids",
            "`stop_token_ids` must be a list of token ids",
        )),
    }
}

/// How many top log-probabilities each token reports, if any: chat's `logprobs` (a boolean) with
/// `top_logprobs`, or completions' `logprobs` (the count).
fn logprobs(body: &Body, chat: bool) -> Result<Option<usize>, ApiError> {
    if !chat {
        return Ok(body
            .integer("logprobs", 0, MAX_TOP_LOGPROBS)?
            .map(|k| k as usize));
    }
    let on = body.bool("logprobs")?.unwrap_or(false);
    let top = body.integer("top_logprobs", 0, MAX_TOP_LOGPROBS)?;
    if top.is_some() && !on {
        return Err(ApiError::invalid(
            "top_logprobs",
            "`top_logprobs` needs `logprobs` set to true",
        ));
    }
    Ok(on.then(|| top.unwrap_or(0) as usize))
}

/// `stream_options.include_usage`.
fn include_usage(body: &Body) -> Result<bool, ApiError> {
    match body.get("stream_options") {
        None => Ok(false),
        Some(Value::Object(o)) => match o.get("include_usage") {
            _ if o.keys().any(|k| k != "include_usage") => Err(ApiError::invalid(
                "stream_options",
                "`stream_options` takes `include_usage` only",
            )),
            None | Some(Value::Null) => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(_) => Err(ApiError::invalid(
                "stream_options",
                "`stream_options.include_usage` must be a boolean",
            )),
        },
        Some(_) => Err(ApiError::invalid(
            "stream_options",
            "`stream_options` must be an object",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_json(json: &str, chat: bool) -> Result<GenParams, ApiError> {
        parse(&Body::parse(json.as_bytes()).unwrap(), chat, 100)
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
