//! The benchmark's configuration, as the CLI fills it and as the JSON report records it.

use crate::goodput::Objectives;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use std::path::PathBuf;
use std::time::Duration;

/// Which OpenAI endpoint to load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    Chat,
    Completions,
}

impl Endpoint {
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
        }
    }
}

/// Where the prompts come from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DatasetSpec {
    /// The built-in set of realistic chat prompts.
    Synthetic,
    /// Built-in requests whose answer repeats much of the prompt (rewrite, copy, extract).
    Rewrite,
    /// Built-in programming requests (write, explain, fix, convert, test, edit code).
    Code,
    /// Built-in two-turn editing: turn two asks to revise the code the assistant wrote in turn one.
    Edit,
    /// Random words, about this many tokens per prompt.
    Random { input_tokens: usize },
    /// `groups` system prompts of about `prefix_tokens` tokens shared by the requests of each
    /// group, each request adding its own question.
    SharedPrefix { prefix_tokens: usize, groups: usize },
    /// The ShareGPT V3 file SGLang's and vLLM's benchmarks use (fetched by the CLI).
    ShareGpt,
    /// A JSONL file (`{"prompt"}` or `{"messages"}` per line) or a ShareGPT-style JSON array.
    File(PathBuf),
}

impl DatasetSpec {
    /// Parses `synthetic`, `rewrite`, `code`, `edit`, `random:N`, `shared-prefix:TOKENS:GROUPS`, `sharegpt` or
    /// a file path.
    pub fn parse(s: &str) -> Result<Self, String> {
        if let Some(rest) = s.strip_prefix("shared-prefix:") {
            let parsed = rest
                .split_once(':')
                .and_then(|(t, g)| Some((t.parse::<usize>().ok()?, g.parse::<usize>().ok()?)));
            return match parsed {
                Some((prefix_tokens, groups)) if prefix_tokens > 0 && groups > 0 => {
                    Ok(Self::SharedPrefix {
                        prefix_tokens,
                        groups,
                    })
                }
                _ => Err(format!(
                    "`{s}`: shared-prefix:TOKENS:GROUPS needs a positive prefix length and number of groups"
                )),
            };
        }
        match s {
            "synthetic" => Ok(Self::Synthetic),
            "rewrite" => Ok(Self::Rewrite),
            "code" => Ok(Self::Code),
            "edit" => Ok(Self::Edit),
            "sharegpt" => Ok(Self::ShareGpt),
            _ => match s.strip_prefix("random:") {
                Some(n) => match n.parse::<usize>() {
                    Ok(n) if n > 0 => Ok(Self::Random { input_tokens: n }),
                    _ => Err(format!(
                        "`{s}`: random:N needs a positive number of input tokens"
                    )),
                },
                None => Ok(Self::File(PathBuf::from(s))),
            },
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchConfig {
    pub base_url: String,
    /// `None`: the first id of `GET /v1/models`.
    pub model: Option<String>,
    pub max_tokens: u32,
    pub concurrency: Vec<usize>,
    pub requests_per_level: usize,
    pub warmup_requests: usize,
    pub endpoint: Endpoint,
    pub stream: bool,
    pub ignore_eos: bool,
    pub temperature: f32,
    pub seed: u64,
    /// Poisson arrivals at this many requests per second, capped by the level's concurrency.
    pub request_rate: Option<f64>,
    #[serde(with = "duration_secs")]
    pub timeout: Duration,
    pub dataset: DatasetSpec,
    /// Merged into every request body (overrides the fields the benchmark sets).
    pub extra_body: Map<String, Value>,
    /// Extra HTTP headers. Values are not written to reports (they may hold secrets).
    #[serde(skip)]
    pub headers: Vec<(String, String)>,
    #[serde(skip)]
    pub api_key: Option<String>,
    pub keep_alive: bool,
    /// Every level sends the first level's prompts instead of its own slice of the dataset.
    #[serde(default)]
    pub reuse_prompts: bool,
    /// The prompt slice the first level takes (see [`crate::workload::PromptPlan`]).
    #[serde(default)]
    pub first_slice: usize,
    /// Ask the server to empty its prefix cache before each level.
    #[serde(default)]
    pub flush_cache: bool,
    /// Latency objectives for goodput.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub goodput: Option<Objectives>,
}

impl BenchConfig {
    /// Which prompts the warm-up and each level send, for a dataset of `dataset` prompts.
    pub fn prompt_plan(&self, dataset: usize) -> crate::workload::PromptPlan {
        crate::workload::PromptPlan {
            dataset,
            warmup: self.warmup_requests,
            per_level: self.requests_per_level,
            first_slice: self.first_slice,
            reuse: self.reuse_prompts,
        }
    }
}

impl Default for BenchConfig {
    fn default() -> Self {
        Self {
            base_url: "http://localhost:30000".into(),
            model: None,
            max_tokens: 200,
            concurrency: vec![1, 2, 5, 10, 30, 70, 100, 250],
            requests_per_level: 30,
            warmup_requests: 5,
            endpoint: Endpoint::Chat,
            stream: true,
            ignore_eos: true,
            temperature: 0.0,
            seed: 1,
            request_rate: None,
            timeout: Duration::from_secs(600),
            dataset: DatasetSpec::Synthetic,
            extra_body: Map::new(),
            headers: Vec::new(),
            api_key: None,
            keep_alive: true,
            reuse_prompts: false,
            first_slice: 0,
            flush_cache: false,
            goodput: None,
        }
    }
}

mod duration_secs {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(d.as_secs_f64())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let secs = f64::deserialize(d)?;
        Duration::try_from_secs_f64(secs).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dataset_specs_parse() {
        assert_eq!(DatasetSpec::parse("synthetic"), Ok(DatasetSpec::Synthetic));
        assert_eq!(DatasetSpec::parse("sharegpt"), Ok(DatasetSpec::ShareGpt));
        assert_eq!(
            DatasetSpec::parse("random:128"),
            Ok(DatasetSpec::Random { input_tokens: 128 })
        );
        assert!(DatasetSpec::parse("random:0").is_err());
        assert_eq!(
            DatasetSpec::parse("shared-prefix:1000:4"),
            Ok(DatasetSpec::SharedPrefix {
                prefix_tokens: 1000,
                groups: 4
            })
        );
        for bad in [
            "shared-prefix:1000",
            "shared-prefix:0:4",
            "shared-prefix:10:x",
        ] {
            assert!(DatasetSpec::parse(bad).is_err(), "{bad}");
        }
        assert!(DatasetSpec::parse("random:x").is_err());
        assert_eq!(
            DatasetSpec::parse("p.jsonl"),
            Ok(DatasetSpec::File("p.jsonl".into()))
        );
    }

    #[test]
    fn defaults_are_the_documented_sweep() {
        let c = BenchConfig::default();
        assert_eq!(c.concurrency, [1, 2, 5, 10, 30, 70, 100, 250]);
        assert_eq!(
            (c.max_tokens, c.requests_per_level, c.warmup_requests),
            (200, 30, 5)
        );
        assert!(c.ignore_eos && c.stream);
    }
}
