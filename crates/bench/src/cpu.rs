//! CPU time used by this process, to report what the client itself costs.

/// User + system CPU seconds of this process so far (0 where the OS does not say).
pub fn process_cpu_seconds() -> f64 {
    #[cfg(unix)]
    {
        let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
        // SAFETY: getrusage fills the struct we pass; RUSAGE_SELF is always valid.
        let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
        if rc != 0 {
            return 0.0;
        }
        // SAFETY: getrusage returned 0, so the struct is initialised.
        let usage = unsafe { usage.assume_init() };
        let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
        secs(usage.ru_utime) + secs(usage.ru_stime)
    }
    #[cfg(not(unix))]
    {
        0.0
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn cpu_time_grows_with_work() {
        let before = super::process_cpu_seconds();
        let mut x = 0u64;
        for i in 0..50_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(std::hint::black_box(i));
        }
        std::hint::black_box(x);
        assert!(super::process_cpu_seconds() > before);
    }
}
