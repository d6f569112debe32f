//! Server-side figures per level: `/metrics` (Prometheus text) is read before and after each
//! level and the counters' deltas reported, under specula's, SGLang's or vLLM's names. A metric a
//! server does not export is simply absent.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One scrape: each sample name with its value summed over label sets (vLLM labels counters by
/// engine, specula and SGLang label cached tokens by tier).
pub type Scrape = BTreeMap<String, f64>;

/// Parses the Prometheus text exposition. A `# TYPE NAME counter` line declares the counter at 0
/// (a Python client shows a labelled counter's family before any sample exists: SGLang's cached
/// tokens stay so until the first cache hit). Other comments, exemplars and lines that do not
/// parse are skipped; at most `MAX_SAMPLES` names are kept, so a hostile or huge page stays
/// bounded.
pub fn parse(text: &str) -> Scrape {
    const MAX_SAMPLES: usize = 100_000;
    let mut out = Scrape::new();
    for line in text.lines().map(str::trim) {
        let (name, value) = match line.strip_prefix('#') {
            Some(comment) => match comment.split_whitespace().collect::<Vec<_>>()[..] {
                ["TYPE", name, "counter"] => (name, 0.0),
                _ => continue,
            },
            None => match sample(line) {
                Some(s) => s,
                None => continue,
            },
        };
        if out.len() >= MAX_SAMPLES && !out.contains_key(name) {
            continue;
        }
        *out.entry(name.to_string()).or_insert(0.0) += value;
    }
    out
}

/// One sample line: `name{labels} value [timestamp] [# exemplar]`.
fn sample(line: &str) -> Option<(&str, f64)> {
    let name_end = line
        .find(|c: char| c == '{' || c.is_whitespace())
        .unwrap_or(line.len());
    let (name, mut rest) = line.split_at(name_end);
    if let Some(labels) = rest.strip_prefix('{') {
        rest = &labels[labels_end(labels)? + 1..];
    }
    let value: f64 = rest.split_whitespace().next()?.parse().ok()?;
    (!name.is_empty() && value.is_finite()).then_some((name, value))
}

/// The index of the `}` that closes a label set, skipping quoted values (with `\` escapes).
fn labels_end(labels: &str) -> Option<usize> {
    let (mut quoted, mut escaped) = (false, false);
    for (i, c) in labels.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(i),
            _ => {}
        }
    }
    None
}

/// The counters a level is read by.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Counter {
    PromptTokens,
    /// Prompt tokens looked up in the prefix cache (vLLM counts these apart from prompt tokens).
    CacheQueries,
    CachedTokens,
    GenerationTokens,
    Preemptions,
    SpecVerifications,
    SpecDraftTokens,
    SpecAcceptedTokens,
    RejectedRequests,
}

/// A server's metric names: the first name of each list that the scrape has is read.
struct Dialect {
    server: &'static str,
    counters: &'static [(Counter, &'static [&'static str])],
}

const DIALECTS: [Dialect; 3] = [
    Dialect {
        server: "specula",
        counters: &[
            (Counter::PromptTokens, &["specula:prompt_tokens_total"]),
            (Counter::CachedTokens, &["specula:cached_tokens_total"]),
            (
                Counter::GenerationTokens,
                &["specula:generation_tokens_total"],
            ),
            (Counter::Preemptions, &["specula:preemptions_total"]),
            (
                Counter::SpecVerifications,
                &["specula:spec_verifications_total"],
            ),
            (
                Counter::SpecDraftTokens,
                &["specula:spec_draft_tokens_total"],
            ),
            (
                Counter::SpecAcceptedTokens,
                &["specula:spec_accepted_tokens_total"],
            ),
            (
                Counter::RejectedRequests,
                &["specula:rejected_requests_total"],
            ),
        ],
    },
    Dialect {
        server: "sglang",
        counters: &[
            (Counter::PromptTokens, &["sglang:prompt_tokens_total"]),
            (Counter::CachedTokens, &["sglang:cached_tokens_total"]),
            (
                Counter::GenerationTokens,
                &["sglang:generation_tokens_total"],
            ),
            (
                Counter::Preemptions,
                &["sglang:num_retracted_requests_total"],
            ),
        ],
    },
    Dialect {
        server: "vllm",
        counters: &[
            (Counter::PromptTokens, &["vllm:prompt_tokens_total"]),
            (
                Counter::CacheQueries,
                &[
                    "vllm:prefix_cache_queries_total",
                    "vllm:gpu_prefix_cache_queries_total",
                ],
            ),
            (
                Counter::CachedTokens,
                &[
                    "vllm:prefix_cache_hits_total",
                    "vllm:gpu_prefix_cache_hits_total",
                ],
            ),
            (Counter::GenerationTokens, &["vllm:generation_tokens_total"]),
            (Counter::Preemptions, &["vllm:num_preemptions_total"]),
            (
                Counter::SpecVerifications,
                &["vllm:spec_decode_num_drafts_total"],
            ),
            (
                Counter::SpecDraftTokens,
                &["vllm:spec_decode_num_draft_tokens_total"],
            ),
            (
                Counter::SpecAcceptedTokens,
                &["vllm:spec_decode_num_accepted_tokens_total"],
            ),
        ],
    },
];

/// The first server whose counter names the scrape has.
fn dialect(scrape: &Scrape) -> Option<&'static Dialect> {
    DIALECTS.iter().find(|d| {
        d.counters
            .iter()
            .any(|(_, names)| names.iter().any(|n| scrape.contains_key(*n)))
    })
}

/// Whose metric names a scrape speaks: `specula`, `sglang` or `vllm`.
pub fn server_of(scrape: &Scrape) -> Option<&'static str> {
    dialect(scrape).map(|d| d.server)
}

/// The server's counters moved by one level (None: not exported, or it went backwards, as after
/// a restart).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ServerDeltas {
    /// Whose metric names these are: `specula`, `sglang` or `vllm`.
    pub server: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_tokens: Option<u64>,
    /// Prompt tokens whose KV came from the prefix cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_tokens: Option<u64>,
    /// Prompt tokens looked up in the prefix cache: vLLM's prefix-cache queries, else the
    /// prompt tokens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_lookups: Option<u64>,
    /// cached tokens / cache lookups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_hit_rate: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation_tokens: Option<u64>,
    /// Requests preempted (SGLang: retracted) to free KV.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preemptions: Option<u64>,
    /// Verification passes (vLLM: drafts), draft tokens proposed and accepted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_verifications: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_draft_tokens: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spec_accepted_tokens: Option<u64>,
    /// Requests refused at capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rejected_requests: Option<u64>,
}

impl ServerDeltas {
    /// The deltas between two scrapes, read with the first dialect the `after` scrape speaks;
    /// None when it speaks none.
    pub fn between(before: &Scrape, after: &Scrape) -> Option<Self> {
        let dialect = dialect(after)?;
        let delta = |counter: Counter| -> Option<u64> {
            let (_, names) = dialect.counters.iter().find(|(c, _)| *c == counter)?;
            let name = names.iter().find(|n| after.contains_key(**n))?;
            let d = after[*name] - before.get(*name).copied().unwrap_or(0.0);
            (d >= 0.0).then(|| d.round() as u64)
        };
        let prompt_tokens = delta(Counter::PromptTokens);
        let cached_tokens = delta(Counter::CachedTokens);
        let cache_lookups = delta(Counter::CacheQueries).or(prompt_tokens);
        let cache_hit_rate = match (cached_tokens, cache_lookups) {
            (Some(hit), Some(all)) if all > 0 => Some(hit as f64 / all as f64),
            _ => None,
        };
        Some(Self {
            server: dialect.server.to_string(),
            prompt_tokens,
            cached_tokens,
            cache_lookups,
            cache_hit_rate,
            generation_tokens: delta(Counter::GenerationTokens),
            preemptions: delta(Counter::Preemptions),
            spec_verifications: delta(Counter::SpecVerifications),
            spec_draft_tokens: delta(Counter::SpecDraftTokens),
            spec_accepted_tokens: delta(Counter::SpecAcceptedTokens),
            rejected_requests: delta(Counter::RejectedRequests),
        })
    }

    /// Accepted / proposed draft tokens, where both moved.
    pub fn spec_acceptance(&self) -> Option<f64> {
        match (self.spec_accepted_tokens, self.spec_draft_tokens) {
            (Some(a), Some(d)) if d > 0 => Some(a as f64 / d as f64),
            _ => None,
        }
    }

    /// Tokens per verification pass from the counters: 1 + accepted / verifications (the
    /// server-side counterpart of `usage.spec_accept_length`).
    pub fn spec_accept_length(&self) -> Option<f64> {
        match (self.spec_accepted_tokens, self.spec_verifications) {
            (Some(a), Some(v)) if v > 0 => Some(1.0 + a as f64 / v as f64),
            _ => None,
        }
    }

    /// The `--verbose` line's body: the figures present, e.g. `cache hit 42.0% (420 of 1000
    /// prompt tokens) | preemptions 0 | drafts 300, accepted 120 (40.0%) | rejected 0`.
    pub fn summary(&self) -> String {
        let mut parts = Vec::new();
        match (self.cache_hit_rate, self.cached_tokens, self.cache_lookups) {
            (Some(rate), Some(hit), Some(all)) => parts.push(format!(
                "cache hit {:.1}% ({hit} of {all} prompt tokens)",
                rate * 100.0
            )),
            (Some(rate), _, _) => parts.push(format!("cache hit {:.1}%", rate * 100.0)),
            _ => {}
        }
        if self.cache_hit_rate.is_none()
            && let Some(all) = self.prompt_tokens
        {
            parts.push(format!("prompt tokens {all}"));
        }
        if let Some(n) = self.preemptions {
            parts.push(format!("preemptions {n}"));
        }
        // A server that did not speculate shows no draft figures.
        if let Some(d) = self.spec_draft_tokens.filter(|&d| d > 0) {
            let accepted = self.spec_accepted_tokens.map_or(String::new(), |a| {
                let rate = self
                    .spec_acceptance()
                    .map_or(String::new(), |r| format!(" ({:.1}%)", r * 100.0));
                format!(", accepted {a}{rate}")
            });
            let length = self
                .spec_accept_length()
                .map_or(String::new(), |l| format!(", accept length {l:.2}"));
            parts.push(format!("drafts {d}{accepted}{length}"));
        }
        if let Some(n) = self.rejected_requests {
            parts.push(format!("rejected {n}"));
        }
        parts.join(" | ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPECULA: &str = "# HELP specula:prompt_tokens_total Prompt tokens.\n\
# TYPE specula:prompt_tokens_total counter\n\
specula:prompt_tokens_total 1000\n\
specula:cached_tokens_total{tier=\"device\"} 300\n\
specula:cached_tokens_total{tier=\"host\"} 100\n\
specula:cached_tokens_total{tier=\"storage\"} 0\n\
specula:preemptions_total 2\n\
specula:spec_draft_tokens_total 50\n\
specula:spec_accepted_tokens_total 20\n\
specula:spec_accept_length_bucket{le=\"+Inf\"} 7\n";

    #[test]
    fn parse_sums_label_sets_and_skips_what_is_not_a_sample() {
        let s = parse(SPECULA);
        assert_eq!(s["specula:prompt_tokens_total"], 1000.0);
        assert_eq!(s["specula:cached_tokens_total"], 400.0);
        assert_eq!(s["specula:spec_accept_length_bucket"], 7.0);
        let odd = parse(concat!(
            "a{x=\"has space\",y=\"}\"} 2.5 1700000000\n",
            "b 1e3\nc NaN\nd\n{e=\"1\"} 3\nf{unclosed 4\n",
            "g{q=\"say \\\"}\\\" twice\"} 7\n",
            "h_total{a=\"b\"} 5 # {trace_id=\"t\"} 1.0 1700000000\n",
        ));
        assert_eq!(odd.get("a"), Some(&2.5));
        assert_eq!(odd.get("b"), Some(&1000.0));
        assert_eq!(odd.get("g"), Some(&7.0), "escaped quotes inside a value");
        assert_eq!(
            odd.get("h_total"),
            Some(&5.0),
            "the exemplar is not the value"
        );
        assert_eq!(odd.len(), 4, "{odd:?}");
    }

    #[test]
    fn specula_deltas_read_its_own_names() {
        let before = parse(SPECULA);
        let after = parse(
            &SPECULA
                .replace("prompt_tokens_total 1000", "prompt_tokens_total 1500")
                .replace("\"device\"} 300", "\"device\"} 500")
                .replace("spec_draft_tokens_total 50", "spec_draft_tokens_total 90")
                .replace(
                    "spec_accepted_tokens_total 20",
                    "spec_accepted_tokens_total 30",
                ),
        );
        let d = ServerDeltas::between(&before, &after).unwrap();
        assert_eq!(d.server, "specula");
        assert_eq!((d.prompt_tokens, d.cached_tokens), (Some(500), Some(200)));
        assert_eq!(d.cache_hit_rate, Some(0.4));
        assert_eq!(d.preemptions, Some(0));
        assert_eq!(
            (d.spec_draft_tokens, d.spec_accepted_tokens),
            (Some(40), Some(10))
        );
        assert_eq!(d.spec_acceptance(), Some(0.25));
        assert_eq!(d.rejected_requests, None, "not exported here");
        assert_eq!(
            d.summary(),
            "cache hit 40.0% (200 of 500 prompt tokens) | preemptions 0 | drafts 40, accepted 10 (25.0%)"
        );
    }

    #[test]
    fn sglang_and_vllm_names_are_read_too() {
        let sglang = |p: f64, c: f64, r: f64| {
            parse(&format!(
                "sglang:prompt_tokens_total{{model_name=\"m\"}} {p}\n\
                 sglang:cached_tokens_total{{model_name=\"m\",cache_source=\"device\"}} {c}\n\
                 sglang:num_retracted_requests_total{{model_name=\"m\"}} {r}\n\
                 sglang:cache_hit_rate{{model_name=\"m\"}} 0.9\n"
            ))
        };
        let d = ServerDeltas::between(&sglang(10.0, 0.0, 1.0), &sglang(110.0, 25.0, 4.0)).unwrap();
        assert_eq!(d.server, "sglang");
        assert_eq!((d.cache_hit_rate, d.preemptions), (Some(0.25), Some(3)));
        assert_eq!(d.spec_draft_tokens, None);

        let vllm = |q: f64, h: f64, drafts: f64| {
            parse(&format!(
                "vllm:prompt_tokens_total{{engine=\"0\"}} {}\n\
                 vllm:prefix_cache_queries_total{{engine=\"0\"}} {q}\n\
                 vllm:prefix_cache_hits_total{{engine=\"0\"}} {h}\n\
                 vllm:spec_decode_num_draft_tokens_total{{engine=\"0\"}} {drafts}\n\
                 vllm:spec_decode_num_accepted_tokens_total{{engine=\"0\"}} {}\n",
                q * 1.05,
                drafts / 2.0
            ))
        };
        let d = ServerDeltas::between(&vllm(0.0, 0.0, 0.0), &vllm(200.0, 50.0, 80.0)).unwrap();
        assert_eq!(d.server, "vllm");
        assert_eq!((d.prompt_tokens, d.cache_lookups), (Some(210), Some(200)));
        assert_eq!(d.cache_hit_rate, Some(0.25));
        assert!(
            d.summary()
                .starts_with("cache hit 25.0% (50 of 200 prompt tokens)")
        );
        assert_eq!(d.spec_acceptance(), Some(0.5));
        assert_eq!(d.preemptions, None);
    }

    #[test]
    fn counters_declared_before_their_first_sample_read_as_zero() {
        // A fresh SGLang: the families are declared, no sample exists yet.
        let fresh = "# HELP sglang:prompt_tokens_total Number of prefill tokens processed.\n\
# TYPE sglang:prompt_tokens_total counter\n\
# TYPE sglang:cached_tokens_total counter\n\
# TYPE sglang:num_retracted_requests_total counter\n\
# TYPE sglang:token_usage gauge\n";
        let before = parse(fresh);
        assert_eq!(
            before.get("sglang:token_usage"),
            None,
            "gauges are not declared"
        );
        let after = parse(&format!(
            "{fresh}sglang:prompt_tokens_total{{model_name=\"m\"}} 80\n"
        ));
        let d = ServerDeltas::between(&before, &after).unwrap();
        assert_eq!(d.server, "sglang");
        assert_eq!((d.prompt_tokens, d.cached_tokens), (Some(80), Some(0)));
        assert_eq!((d.cache_hit_rate, d.preemptions), (Some(0.0), Some(0)));
    }

    #[test]
    fn the_server_side_accept_length_counts_the_bonus_token() {
        let d = ServerDeltas {
            spec_verifications: Some(10),
            spec_draft_tokens: Some(40),
            spec_accepted_tokens: Some(15),
            ..ServerDeltas::default()
        };
        assert_eq!(d.spec_accept_length(), Some(2.5));
        assert_eq!(
            d.summary(),
            "drafts 40, accepted 15 (37.5%), accept length 2.50"
        );
    }

    #[test]
    fn unknown_servers_and_restarts_give_nothing() {
        assert_eq!(
            ServerDeltas::between(&Scrape::new(), &parse("process_cpu_seconds_total 3\n")),
            None
        );
        let before = parse("specula:prompt_tokens_total 100\n");
        let after = parse("specula:prompt_tokens_total 40\n");
        let d = ServerDeltas::between(&before, &after).unwrap();
        assert_eq!((d.prompt_tokens, d.cache_hit_rate), (None, None));
        assert_eq!(d.summary(), "");
    }
}
