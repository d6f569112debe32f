//! The connection limits with their defaults, the descriptor limit they derive from, and the
//! counters the listener keeps.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// How long a client may take to send a request's headers, from the moment the connection
/// opens or the previous response ends (hyper's `header_read_timeout`).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a request's body may take to arrive, from the moment its handler starts reading it.
pub const BODY_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a keep-alive connection may stay silent between requests (uvicorn's
/// `--timeout-keep-alive` default). Once a byte of the next request has arrived, the header read
/// timeout applies instead.
pub const KEEP_ALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a response may wait on a client that reads nothing (nginx's `send_timeout`): a
/// write that cannot go on for this long closes the connection, and the request's generation
/// with it, so a client that stops reading a long stream cannot hold a connection slot (and its
/// KV) for good.
pub const SEND_TIMEOUT: Duration = Duration::from_secs(60);

/// The most connections held open by default, whatever the descriptor limit.
pub const MAX_CONNECTIONS_CAP: usize = 16384;

/// Descriptors kept for everything but client connections (model files, logs, the refusals
/// being written, the connection accepted while another is being evicted).
pub const FD_RESERVE: u64 = 256;

/// What the listener holds connections to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// See [`HEADER_READ_TIMEOUT`].
    pub header_read_timeout: Duration,
    /// See [`BODY_READ_TIMEOUT`].
    pub body_read_timeout: Duration,
    /// See [`KEEP_ALIVE_TIMEOUT`].
    pub keep_alive_timeout: Duration,
    /// See [`SEND_TIMEOUT`].
    pub send_timeout: Duration,
    /// Open connections at most; at the cap a new one evicts the longest-idle one, or is refused
    /// with a 503 when none is idle. See [`default_max_connections`].
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    /// The defaults, with the cap derived from the descriptor limit as it is now: call
    /// [`raise_fd_limit`] first.
    fn default() -> Self {
        Self {
            header_read_timeout: HEADER_READ_TIMEOUT,
            body_read_timeout: BODY_READ_TIMEOUT,
            keep_alive_timeout: KEEP_ALIVE_TIMEOUT,
            send_timeout: SEND_TIMEOUT,
            max_connections: default_max_connections(),
        }
    }
}

/// The connection cap the descriptor limit allows: the soft `RLIMIT_NOFILE` less
/// [`FD_RESERVE`] (at least half of it), at most [`MAX_CONNECTIONS_CAP`].
pub fn default_max_connections() -> usize {
    let soft = nofile_limit().map_or(1024, |(soft, _)| soft);
    let usable = soft.saturating_sub(FD_RESERVE).max(soft / 2).max(1);
    usize::try_from(usable).map_or(MAX_CONNECTIONS_CAP, |n| n.min(MAX_CONNECTIONS_CAP))
}

/// The soft and hard `RLIMIT_NOFILE` (`u64::MAX` for unlimited), or `None` where it cannot be read.
pub fn nofile_limit() -> Option<(u64, u64)> {
    #[cfg(unix)]
    {
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `lim` is a valid, writable `rlimit` for the duration of the call.
        let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
        // `rlim_t` is `u64` on Linux and macOS but not everywhere.
        #[allow(clippy::unnecessary_cast)]
        (rc == 0).then_some((lim.rlim_cur as u64, lim.rlim_max as u64))
    }
    #[cfg(not(unix))]
    None
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit (on macOS at most `OPEN_MAX`, 10240, which
/// the kernel enforces), for a server that holds many connections. Returns the soft limit
/// before and after (equal when it could not be raised, or was already at the hard limit); logs
/// what it did.
pub fn raise_fd_limit() -> (u64, u64) {
    let Some((soft, hard)) = nofile_limit() else {
        tracing::warn!("cannot read the open-file limit (RLIMIT_NOFILE)");
        return (0, 0);
    };
    let target = if cfg!(target_os = "macos") {
        hard.min(10240)
    } else {
        hard
    };
    if soft >= target {
        tracing::debug!(soft, hard, "open-file limit already at its maximum");
        return (soft, soft);
    }
    #[cfg(unix)]
    {
        #[allow(clippy::unnecessary_cast)]
        let lim = libc::rlimit {
            rlim_cur: target as libc::rlim_t,
            rlim_max: hard as libc::rlim_t,
        };
        // SAFETY: `lim` is a valid `rlimit` for the duration of the call.
        let rc = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
        if rc != 0 {
            let err = std::io::Error::last_os_error();
            tracing::warn!(soft, hard, "cannot raise the open-file limit: {err}");
            return (soft, soft);
        }
    }
    let after = nofile_limit().map_or(soft, |(now, _)| now);
    tracing::info!(before = soft, after, hard, "raised the open-file limit");
    (soft, after)
}

/// Counters the listener keeps, for `/metrics`. All are totals since start but `open`.
#[derive(Debug, Default)]
pub struct ConnectionStats {
    /// Connections open now (a gauge).
    pub open: AtomicU64,
    /// Connections accepted (admitted or refused).
    pub accepted_total: AtomicU64,
    /// Idle connections closed to make room for a new one.
    pub evicted_total: AtomicU64,
    /// Connections answered 503 because every slot was busy.
    pub refused_total: AtomicU64,
    /// Connections closed because their request headers did not arrive in time.
    pub header_timeouts_total: AtomicU64,
    /// Request bodies that did not arrive in time.
    pub body_timeouts_total: AtomicU64,
    /// Keep-alive connections closed after staying silent too long between requests.
    pub keep_alive_timeouts_total: AtomicU64,
    /// Connections closed because the client read nothing of a response for too long.
    pub send_timeouts_total: AtomicU64,
    /// Failed `accept` calls (descriptors exhausted and the like).
    pub accept_errors_total: AtomicU64,
}

/// A copy of [`ConnectionStats`] at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    pub open: u64,
    pub accepted_total: u64,
    pub evicted_total: u64,
    pub refused_total: u64,
    pub header_timeouts_total: u64,
    pub body_timeouts_total: u64,
    pub keep_alive_timeouts_total: u64,
    pub send_timeouts_total: u64,
    pub accept_errors_total: u64,
}

impl ConnectionStats {
    /// The counters as they are now (each read on its own).
    pub fn snapshot(&self) -> StatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        StatsSnapshot {
            open: get(&self.open),
            accepted_total: get(&self.accepted_total),
            evicted_total: get(&self.evicted_total),
            refused_total: get(&self.refused_total),
            header_timeouts_total: get(&self.header_timeouts_total),
            body_timeouts_total: get(&self.body_timeouts_total),
            keep_alive_timeouts_total: get(&self.keep_alive_timeouts_total),
            send_timeouts_total: get(&self.send_timeouts_total),
            accept_errors_total: get(&self.accept_errors_total),
        }
    }

    pub(super) fn bump(counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::Relaxed);
    }
}
