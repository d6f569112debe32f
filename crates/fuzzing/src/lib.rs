//! The harness the fuzz targets share (a dev-dependency only): each target is a proptest
//! strategy and a check, run for `SPECULA_FUZZ_CASES` cases (or the target's default) on a
//! thread with a chosen stack, failing on a panic, on one case over its time limit, and on a
//! run that never ends; seeds come from a crate's `testdata/fuzz/` folder, and are edited by
//! [`mutated`] (bytes) or [`replace_node`] (JSON).

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use serde_json::Value;
use std::path::Path;
use std::time::{Duration, Instant};

/// The cases each target runs: `SPECULA_FUZZ_CASES`, else the target's default.
pub fn cases(default: u32) -> u32 {
    std::env::var("SPECULA_FUZZ_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// How a target runs: the longest one case may take, the stack of its thread (`None`: the
/// default), and the run's deadline per case on top of two minutes.
#[derive(Debug, Clone, Copy)]
pub struct Harness {
    pub case_limit: Duration,
    pub stack: Option<usize>,
    pub per_case: Duration,
}

/// Two seconds a case (a hang, or work far past linear, fails the target) on the 2 MiB stack
/// of a tokio blocking thread, where the server parses requests.
pub const DEFAULT: Harness = Harness {
    case_limit: Duration::from_secs(2),
    stack: Some(2 << 20),
    per_case: Duration::from_millis(20),
};

impl Harness {
    /// Runs `test` on `cases(default)` values of the strategy `make` builds.
    pub fn run<S, F, T>(self, default: u32, make: F, test: T)
    where
        S: Strategy + 'static,
        F: FnOnce() -> S + Send + 'static,
        T: Fn(S::Value) -> Result<(), TestCaseError> + Send + 'static,
    {
        let n = cases(default);
        let limit = self.case_limit;
        let (done, finished) = std::sync::mpsc::channel();
        let mut builder = std::thread::Builder::new();
        if let Some(bytes) = self.stack {
            builder = builder.stack_size(bytes);
        }
        let worker = builder
            .spawn(move || {
                let config = Config {
                    cases: n,
                    failure_persistence: None,
                    ..Config::default()
                };
                let result = TestRunner::new(config).run(&make(), |value| {
                    let started = Instant::now();
                    test(value)?;
                    let took = started.elapsed();
                    prop_assert!(took < limit, "one case took {took:?}");
                    Ok(())
                });
                let _ = done.send(());
                if let Err(e) = result {
                    panic!("{e}");
                }
            })
            .expect("spawn the fuzz thread");
        let deadline = Duration::from_secs(120) + self.per_case * n;
        if let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = finished.recv_timeout(deadline) {
            panic!("the fuzz target did not finish within {deadline:?}: a hang");
        }
        if let Err(panic) = worker.join() {
            std::panic::resume_unwind(panic);
        }
    }
}

/// The seed files of `dir`, in name order (at least one).
pub fn seeds(dir: &Path) -> Vec<Vec<u8>> {
    let mut paths: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("a seed").path())
        .collect();
    paths.sort();
    let seeds: Vec<Vec<u8>> = paths
        .iter()
        .map(|p| std::fs::read(p).expect("read a seed"))
        .collect();
    assert!(!seeds.is_empty(), "no seeds in {}", dir.display());
    seeds
}

/// Bytes, shown as text when a case fails.
#[derive(Clone)]
pub struct Bytes(pub Vec<u8>);

impl std::fmt::Debug for Bytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(&self.0))
    }
}

/// The edits a target's seeds get besides the byte-level ones (bits flipped, bytes set,
/// `tokens` inserted, ranges deleted or repeated, the end cut off).
#[derive(Debug, Clone, Copy)]
pub struct Mutations {
    /// Pieces of the seeds' language, inserted anywhere.
    pub tokens: &'static [&'static str],
    /// Whether another seed's tail may replace a seed's end.
    pub splice: bool,
    /// Values (little-endian) that overwrite 8 or 4 bytes: counts, lengths, offsets of a
    /// binary format. Empty for text.
    pub huge: &'static [u64],
}

/// One edit: (what, where, a byte that picks or is the value).
type Edit = (u8, usize, u8);

/// A seed with up to five edits of `with`'s kinds.
pub fn mutated(seeds: Vec<Vec<u8>>, with: Mutations) -> impl Strategy<Value = Bytes> {
    let n = seeds.len();
    (0..n, 0..n, vec((0u8..9, any::<usize>(), any::<u8>()), 0..6))
        .prop_map(move |(i, j, edits)| Bytes(mutate(&seeds[i], &seeds[j], &edits, with)))
}

fn mutate(seed: &[u8], other: &[u8], edits: &[Edit], with: Mutations) -> Vec<u8> {
    let mut b = seed.to_vec();
    for &(kind, at, v) in edits {
        let at = at % (b.len() + 1);
        let len = usize::from(v % 16) + 1;
        match kind {
            0 if at < b.len() => b[at] ^= 1 << (v % 8),
            1 if at < b.len() => b[at] = v,
            2 if !with.tokens.is_empty() => {
                let t = with.tokens[usize::from(v) % with.tokens.len()].as_bytes();
                b.splice(at..at, t.iter().copied());
            }
            3 => {
                b.drain(at..(at + len).min(b.len()));
            }
            4 => b.truncate(at),
            5 => {
                let piece = b[at..(at + len).min(b.len())].to_vec();
                b.splice(at..at, piece);
            }
            6 if with.splice => {
                b.truncate(at);
                b.extend_from_slice(&other[usize::from(v) * other.len() / 256..]);
            }
            7 | 8 if !with.huge.is_empty() => {
                let huge = with.huge[usize::from(v) % with.huge.len()].to_le_bytes();
                let width = if kind == 7 { 8 } else { 4 };
                let end = (at + width).min(b.len());
                b[at..end].copy_from_slice(&huge[..end - at]);
            }
            _ => {}
        }
    }
    b
}

/// Replaces node `k` (of the nodes in pre-order, modulo their number) of `v` by `new`.
pub fn replace_node(v: &mut Value, k: usize, new: Value) {
    fn count(v: &Value) -> usize {
        1 + match v {
            Value::Array(a) => a.iter().map(count).sum(),
            Value::Object(o) => o.values().map(count).sum(),
            _ => 0,
        }
    }
    fn walk(v: &mut Value, k: &mut usize, new: &mut Option<Value>) {
        if *k == 0 {
            if let Some(n) = new.take() {
                *v = n;
            }
            return;
        }
        *k -= 1;
        let children: Vec<&mut Value> = match v {
            Value::Array(a) => a.iter_mut().collect(),
            Value::Object(o) => o.values_mut().collect(),
            _ => return,
        };
        for c in children {
            walk(c, k, new);
            if new.is_none() {
                return;
            }
        }
    }
    let mut k = k % count(v);
    walk(v, &mut k, &mut Some(new));
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_edit_does_what_it_says_and_only_when_enabled() {
        let text = Mutations {
            tokens: &["XY"],
            splice: false,
            huge: &[],
        };
        assert_eq!(mutate(b"abc", b"", &[(0, 0, 0)], text), b"`bc");
        assert_eq!(mutate(b"abc", b"", &[(2, 1, 0)], text), b"aXYbc");
        assert_eq!(mutate(b"abc", b"", &[(3, 1, 0)], text), b"ac");
        assert_eq!(mutate(b"abc", b"", &[(5, 1, 1)], text), b"abcbc");
        assert_eq!(mutate(b"abc", b"zz", &[(6, 1, 0)], text), b"abc");
        let binary = Mutations {
            splice: true,
            huge: &[0x0102],
            ..text
        };
        assert_eq!(mutate(b"abc", b"zz", &[(6, 1, 0)], binary), b"azz");
        assert_eq!(
            mutate(b"abcdef", b"", &[(8, 1, 0)], binary),
            b"a\x02\x01\0\0f"
        );
        assert_eq!(mutate(b"abc", b"", &[(7, 2, 0)], binary), b"ab\x02");
    }

    #[test]
    fn replace_node_counts_nodes_in_pre_order() {
        let mut v = json!({"a": [1, 2], "b": 3});
        replace_node(&mut v, 3, json!("x"));
        assert_eq!(v, json!({"a": [1, "x"], "b": 3}));
        replace_node(&mut v, 5, json!(null));
        assert_eq!(v, json!(null));
    }
}
