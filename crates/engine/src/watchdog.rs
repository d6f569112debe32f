//! The engine's watchdog (SGLang's `--watchdog-timeout`): a plain thread, independent of the
//! async runtime, that calls its `on_failure` once the engine thread has died, or once requests
//! are in flight and no step has completed for the timeout. The server's policy is crash-only:
//! it exits non-zero there, so that systemd or Kubernetes restarts it.

use crate::EngineHandle;
use std::time::{Duration, Instant};

/// How often the watchdog looks: an engine that died is noticed within this.
pub const WATCHDOG_POLL: Duration = Duration::from_millis(100);

/// Why the watchdog fired.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EngineFailure {
    #[error("the engine thread has stopped")]
    Died,
    #[error(
        "the engine made no progress for {0:?} with {1} requests in flight (--watchdog-timeout)"
    )]
    Stuck(Duration, usize),
}

/// Starts the watchdog over `engine`: `on_failure` runs once, on its thread, when the engine
/// dies or stalls for `timeout` with work in flight.
pub fn spawn(
    engine: EngineHandle,
    timeout: Duration,
    on_failure: impl FnOnce(EngineFailure) + Send + 'static,
) -> std::io::Result<()> {
    std::thread::Builder::new()
        .name("specula-watchdog".into())
        .spawn(move || on_failure(watch(&engine, timeout)))?;
    Ok(())
}

/// Waits until the engine fails, and says how.
fn watch(engine: &EngineHandle, timeout: Duration) -> EngineFailure {
    let mut last_steps = engine.stats().snapshot().steps;
    let mut since = Instant::now();
    loop {
        std::thread::sleep(WATCHDOG_POLL);
        if !engine.is_alive() {
            return EngineFailure::Died;
        }
        let snapshot = engine.stats().snapshot();
        if snapshot.steps != last_steps || snapshot.in_flight == 0 {
            // Progress, or nothing to do: the clock starts again.
            last_steps = snapshot.steps;
            since = Instant::now();
        } else if since.elapsed() >= timeout {
            return EngineFailure::Stuck(timeout, snapshot.in_flight);
        }
    }
}
