//! The kernels' thread pool. A forward pass runs inside it (`run`), so that every parallel product
//! is forked from a pool thread: joining then costs a few atomics instead of waking a sleeping
//! caller through a condition variable, which at ~200 products per token was most of the time.

use std::sync::OnceLock;

static POOL: OnceLock<rayon::ThreadPool> = OnceLock::new();
static REQUESTED: OnceLock<usize> = OnceLock::new();

/// Asks for `n` kernel threads (a `--threads` flag); only effective before the first kernel
/// runs, and over `SPECULA_THREADS`. Returns false if the pool already exists or `n` is 0.
pub fn set_count(n: usize) -> bool {
    n > 0 && POOL.get().is_none() && REQUESTED.set(n).is_ok()
}

fn pool() -> &'static rayon::ThreadPool {
    POOL.get_or_init(|| {
        let threads = REQUESTED.get().copied().unwrap_or_else(|| {
            std::env::var("SPECULA_THREADS")
                .ok()
                .and_then(|v| v.parse().ok())
                .filter(|&n: &usize| n > 0)
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
        });
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .thread_name(|i| format!("specula-kernel-{i}"))
            .build()
            .expect("cannot start the kernel threads")
    })
}

/// Runs `f` on the kernels' pool (parallel products inside it use the pool's threads).
pub fn run<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    pool().install(f)
}

/// Threads the kernels use (`SPECULA_THREADS`, default: all available cores).
pub fn count() -> usize {
    pool().current_num_threads()
}
