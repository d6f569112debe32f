//! The harness the fuzz targets share (a dev-dependency only): each target is a proptest
//! strategy and a check, run for `SPECULA_FUZZ_CASES` cases (or the target's default) on a
//! thread with a chosen stack, failing on a panic, on one case over its time limit, and on a
//! run that never ends; seeds come from a crate's `testdata/fuzz/` folder.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
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
