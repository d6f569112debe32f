//! The HTTP/1.1 listener: an accept loop over hyper in place of `axum::serve`, bounding what
//! clients can hold. Request headers must arrive within a timeout, bodies within another, a
//! keep-alive connection may stay silent only so long between requests, and open connections
//! are capped below the descriptor limit: at the cap a new connection evicts the longest-idle
//! one (no complete request yet, or between requests), and when every connection is busy it is
//! answered 503 and closed, so that `/health` still answers under a flood of idle connections.
//! Shutting down stops accepting, closes idle connections and lets requests in progress finish.

mod body;
mod conn;
mod limits;
#[cfg(test)]
mod tests;

pub use body::{BodyTimeout, body_timeout};
pub use limits::{
    BODY_READ_TIMEOUT, ConnectionLimits, ConnectionStats, FD_RESERVE, HEADER_READ_TIMEOUT,
    KEEP_ALIVE_TIMEOUT, MAX_CONNECTIONS_CAP, StatsSnapshot, default_max_connections, nofile_limit,
    raise_fd_limit,
};

use axum::Router;
use conn::{ConnContext, Registry};
use std::future::Future;
use std::io;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};

/// How long the accept loop waits after an error such as running out of descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// Refusals (503s) being written at once at most; past it a refused connection is just closed.
const MAX_REFUSALS_IN_FLIGHT: usize = 64;

/// How long a refused connection is given to take its 503.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(1);

/// Serves `app` on `listener` within `limits` until `shutdown` completes, then stops accepting,
/// closes idle connections and returns once the requests in progress have finished (bound the
/// wait from outside if it must be bounded). `stats` is kept up to date throughout.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    stats: Arc<ConnectionStats>,
    shutdown: impl Future<Output = ()>,
) -> io::Result<()> {
    let registry = Arc::new(Registry::new(limits.max_connections, stats.clone()));
    let (stop_tx, stop_rx) = watch::channel(false);
    let refusals = Arc::new(Semaphore::new(MAX_REFUSALS_IN_FLIGHT));
    let mut errors = ErrorLog::default();
    let mut shutdown = std::pin::pin!(shutdown);
    tracing::debug!(?limits, "listening");
    loop {
        let accepted = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => accepted,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                ConnectionStats::bump(&stats.accept_errors_total);
                errors.log(&e);
                if !is_connection_error(&e) {
                    // Out of descriptors (or memory): free an idle connection, wait, go on.
                    registry.evict_oldest_idle();
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
                continue;
            }
        };
        ConnectionStats::bump(&stats.accepted_total);
        let _ = stream.set_nodelay(true);
        match registry.admit() {
            Some(slot) => {
                let cx = ConnContext {
                    registry: registry.clone(),
                    app: app.clone(),
                    limits: limits.clone(),
                    shutdown: stop_rx.clone(),
                };
                tokio::spawn(conn::serve_connection(stream, slot, cx));
            }
            None => refuse(stream, limits.max_connections, &stats, &refusals),
        }
    }
    drop(listener);
    drop(stop_rx);
    let open = stats.open.load(std::sync::atomic::Ordering::Relaxed);
    tracing::debug!(open, "stopped accepting; closing connections");
    let _ = stop_tx.send(true);
    stop_tx.closed().await;
    Ok(())
}

/// Answers a connection that finds every slot busy with a 503 and closes it, in a task of its
/// own (at most [`MAX_REFUSALS_IN_FLIGHT`] at once).
fn refuse(mut stream: TcpStream, cap: usize, stats: &ConnectionStats, refusals: &Arc<Semaphore>) {
    ConnectionStats::bump(&stats.refused_total);
    tracing::debug!(cap, "every connection is busy: refusing one");
    let Ok(permit) = refusals.clone().try_acquire_owned() else {
        return;
    };
    tokio::spawn(async move {
        let _permit = permit;
        let _ = tokio::time::timeout(REFUSAL_TIMEOUT, async {
            stream.write_all(&refusal(cap)).await?;
            stream.shutdown().await?;
            // Read what the client sends until it closes, so that closing with its request
            // unread does not reset the connection before it has read the 503.
            let mut sink = [0u8; 4096];
            while stream.read(&mut sink).await? > 0 {}
            io::Result::Ok(())
        })
        .await;
    });
}

/// The whole 503 response for a refused connection.
fn refusal(cap: usize) -> Vec<u8> {
    let body = serde_json::json!({
        "error": {
            "message": format!("too many open connections ({cap})"),
            "type": "service_unavailable",
            "param": null,
            "code": 503,
        }
    })
    .to_string();
    format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// Errors about one connection only (it went away before it was accepted): no need to wait.
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
    )
}

/// Logs accept errors at most once a second, with how many there were since the last line.
#[derive(Default)]
struct ErrorLog {
    last: Option<Instant>,
    unlogged: u64,
}

impl ErrorLog {
    fn log(&mut self, e: &io::Error) {
        let now = Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < Duration::from_secs(1))
        {
            self.unlogged += 1;
            return;
        }
        tracing::warn!(
            since_last = self.unlogged,
            "cannot accept a connection: {e}"
        );
        self.last = Some(now);
        self.unlogged = 0;
    }
}
