//! Goodput: the requests per second that met every service-level objective given with
//! `--goodput ttft:MS tpot:MS e2e:MS` (vLLM's and SGLang's spelling; `e2el` is accepted too).

use crate::record::RequestRecord;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Latency objectives in milliseconds; a request is good when it succeeded and met each one set.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Objectives {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ttft_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tpot_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub e2e_ms: Option<f64>,
}

impl Objectives {
    /// Parses `KEY:MS` items (`ttft`, `tpot`, `e2e` or `e2el`), each key at most once.
    pub fn parse<S: AsRef<str>>(items: &[S]) -> Result<Self, String> {
        let mut slo = Self::default();
        for item in items {
            let item = item.as_ref();
            let bad = || format!("`{item}`: expected ttft:MS, tpot:MS or e2e:MS, e.g. ttft:500");
            let (key, value) = item.split_once(':').ok_or_else(bad)?;
            let ms: f64 = value.trim().parse().map_err(|_| bad())?;
            if !(ms.is_finite() && ms > 0.0) {
                return Err(format!(
                    "`{item}`: the objective must be a positive number of ms"
                ));
            }
            let slot = match key.trim() {
                "ttft" => &mut slo.ttft_ms,
                "tpot" => &mut slo.tpot_ms,
                "e2e" | "e2el" => &mut slo.e2e_ms,
                _ => return Err(bad()),
            };
            if slot.replace(ms).is_some() {
                return Err(format!("`{item}`: {} is given twice", key.trim()));
            }
        }
        Ok(slo)
    }

    /// Whether an objective needs streamed responses (TTFT and TPOT are measured on streams).
    pub fn needs_streaming(&self) -> bool {
        self.ttft_ms.is_some() || self.tpot_ms.is_some()
    }

    /// Whether a request succeeded within every objective. A request of one token has no TPOT,
    /// so it cannot miss that objective.
    pub fn met_by(&self, r: &RequestRecord) -> bool {
        let within = |limit: Option<f64>, value: Option<f64>| match (limit, value) {
            (None, _) => true,
            (Some(ms), Some(s)) => s * 1e3 <= ms,
            (Some(_), None) => false,
        };
        r.ok()
            && within(self.ttft_ms, r.ttft_s)
            && (r.completion_tokens <= 1 || within(self.tpot_ms, r.tpot_s()))
            && within(self.e2e_ms, Some(r.latency_s))
    }
}

impl fmt::Display for Objectives {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = [
            ("TTFT", self.ttft_ms),
            ("TPOT", self.tpot_ms),
            ("E2E", self.e2e_ms),
        ]
        .into_iter()
        .filter_map(|(name, ms)| ms.map(|ms| format!("{name} <= {ms} ms")))
        .collect();
        f.write_str(&parts.join(", "))
    }
}

/// A level's goodput.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct Goodput {
    /// Requests that met every objective.
    pub good: usize,
    /// Good requests per second of the level's wall time.
    pub request_rate: f64,
    /// Good requests / requests sent (failed ones count as missed).
    pub share: f64,
}

impl Goodput {
    pub fn of(slo: &Objectives, records: &[RequestRecord], duration_s: f64) -> Self {
        let good = records.iter().filter(|r| slo.met_by(r)).count();
        Self {
            good,
            request_rate: if duration_s > 0.0 {
                good as f64 / duration_s
            } else {
                0.0
            },
            share: if records.is_empty() {
                0.0
            } else {
                good as f64 / records.len() as f64
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::record::ErrorClass;

    fn record(ttft_ms: f64, latency_ms: f64, tokens: u64) -> RequestRecord {
        let mut r = RequestRecord::new(0, 0.0);
        r.http_status = Some(200);
        r.finish_reason = Some("length".into());
        r.ttft_s = Some(ttft_ms / 1e3);
        r.latency_s = latency_ms / 1e3;
        r.completion_tokens = tokens;
        r
    }

    #[test]
    fn objectives_parse_in_the_peers_spelling() {
        let slo = Objectives::parse(&["ttft:500", "tpot:50", "e2el:3000"]).unwrap();
        assert_eq!(
            slo,
            Objectives {
                ttft_ms: Some(500.0),
                tpot_ms: Some(50.0),
                e2e_ms: Some(3000.0)
            }
        );
        assert_eq!(
            slo.to_string(),
            "TTFT <= 500 ms, TPOT <= 50 ms, E2E <= 3000 ms"
        );
        assert_eq!(Objectives::parse(&["e2e:1.5"]).unwrap().e2e_ms, Some(1.5));
        for bad in ["ttft", "ttft:x", "itl:5", "ttft:0", "ttft:-1", "tpot:inf"] {
            assert!(Objectives::parse(&[bad]).is_err(), "{bad}");
        }
        let twice = Objectives::parse(&["e2e:1", "e2el:2"]).unwrap_err();
        assert!(twice.contains("twice"), "{twice}");
    }

    #[test]
    fn goodput_against_a_known_latency_distribution() {
        // 10 requests: TTFT 100..1000 ms, each 11 tokens over TTFT + 10 × 40 ms (TPOT 40 ms),
        // except every third with TPOT 80 ms; one more failed.
        let mut records: Vec<RequestRecord> = (1..=10)
            .map(|i| {
                let ttft = 100.0 * f64::from(i);
                let tpot = if i % 3 == 0 { 80.0 } else { 40.0 };
                record(ttft, ttft + 10.0 * tpot, 11)
            })
            .collect();
        let mut failed = record(10.0, 20.0, 11);
        failed.fail(ErrorClass::BrokenStream, "cut");
        records.push(failed);

        let ttft = Objectives::parse(&["ttft:500"]).unwrap();
        let g = Goodput::of(&ttft, &records, 2.0);
        assert_eq!(g.good, 5, "TTFT 100..500 ms");
        assert!((g.request_rate - 2.5).abs() < 1e-12);
        assert!((g.share - 5.0 / 11.0).abs() < 1e-12);

        // TPOT <= 50 ms rules out i = 3, 6, 9; with TTFT <= 500 ms that leaves 1, 2, 4, 5.
        let both = Objectives::parse(&["ttft:500", "tpot:50"]).unwrap();
        assert_eq!(Goodput::of(&both, &records, 2.0).good, 4);
        // E2E <= 1000 ms: 500 + 400 = 900 passes, 300 + 800 = 1100 does not, 600 + 400 > 1000.
        let e2e = Objectives::parse(&["e2e:1000"]).unwrap();
        assert_eq!(Goodput::of(&e2e, &records, 2.0).good, 4, "i = 1, 2, 4, 5");
        assert_eq!(Goodput::of(&e2e, &[], 0.0), Goodput::default());
    }

    #[test]
    fn a_one_token_answer_has_no_tpot_to_miss_but_needs_a_ttft() {
        let tpot = Objectives::parse(&["tpot:1"]).unwrap();
        assert!(tpot.met_by(&record(10.0, 10.0, 1)));
        assert!(!tpot.met_by(&record(10.0, 500.0, 3)));
        let mut whole = record(10.0, 10.0, 5);
        whole.ttft_s = None;
        assert!(!Objectives::parse(&["ttft:1000"]).unwrap().met_by(&whole));
        assert!(Objectives::parse(&["e2e:1000"]).unwrap().met_by(&whole));
    }
}
