//! One connection: its slot in the registry of open connections (busy or idle, since when), the
//! task that serves it over hyper's HTTP/1.1, and the eviction of the longest-idle one when
//! the registry is full.

use super::body::{GuardedBody, TimedBody};
use super::limits::{ConnectionLimits, ConnectionStats};
use axum::Router;
use axum::body::Body;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::{Notify, watch};
use tokio::time::Instant;

/// In a slot's state, the bit that says it was evicted (the rest count requests in progress).
const EVICTED: u64 = 1 << 63;

/// How long an idle connection being closed may take to flush what it still has to write.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// One open connection, as the registry and its own task see it.
pub(super) struct Slot {
    id: u64,
    /// Requests in progress (headers received, response not yet fully handed to hyper), with
    /// [`EVICTED`] once evicted. Idle is 0.
    state: AtomicU64,
    /// When it last became idle, in nanoseconds since the registry's epoch.
    idle_since: AtomicU64,
    /// Bytes read from the client so far, and at the moment it last became idle.
    bytes_read: AtomicU64,
    idle_bytes: AtomicU64,
    /// Responses completed on it.
    served: AtomicU64,
    /// Woken when it becomes idle or is evicted.
    wake: Notify,
}

impl Slot {
    fn is_idle(&self) -> bool {
        self.state.load(Ordering::Acquire) == 0
    }

    fn is_evicted(&self) -> bool {
        self.state.load(Ordering::Acquire) & EVICTED != 0
    }

    /// Marks it evicted if it is idle; false if it is busy (or already evicted).
    fn try_evict(&self) -> bool {
        self.state
            .compare_exchange(0, EVICTED, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
    }

    /// Whether bytes of a next request have arrived since it became idle.
    fn has_partial_request(&self) -> bool {
        self.bytes_read.load(Ordering::Acquire) != self.idle_bytes.load(Ordering::Acquire)
    }
}

/// A request in progress on a connection; dropping it (with the response body, or with the
/// request's future) may make the connection idle.
pub(super) struct Busy {
    slot: Arc<Slot>,
    registry: Arc<Registry>,
}

impl Busy {
    fn begin(slot: Arc<Slot>, registry: Arc<Registry>) -> Self {
        slot.state.fetch_add(1, Ordering::AcqRel);
        Self { slot, registry }
    }
}

impl Drop for Busy {
    fn drop(&mut self) {
        let slot = &self.slot;
        slot.served.fetch_add(1, Ordering::Relaxed);
        slot.idle_bytes
            .store(slot.bytes_read.load(Ordering::Acquire), Ordering::Release);
        slot.idle_since
            .store(self.registry.now_ns(), Ordering::Release);
        if slot.state.fetch_sub(1, Ordering::AcqRel) & !EVICTED == 1 {
            slot.wake.notify_one();
        }
    }
}

/// The open connections, by id (ids grow with accept order).
pub(super) struct Registry {
    epoch: Instant,
    next_id: AtomicU64,
    slots: Mutex<HashMap<u64, Arc<Slot>>>,
    max: usize,
    pub(super) stats: Arc<ConnectionStats>,
}

impl Registry {
    pub(super) fn new(max: usize, stats: Arc<ConnectionStats>) -> Self {
        Self {
            epoch: Instant::now(),
            next_id: AtomicU64::new(0),
            slots: Mutex::new(HashMap::new()),
            max: max.max(1),
            stats,
        }
    }

    fn now_ns(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Slot>>> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a new connection, evicting the longest-idle one at the cap; `None` when the
    /// registry is full of busy connections.
    pub(super) fn admit(&self) -> Option<Arc<Slot>> {
        let mut slots = self.lock();
        if slots.len() >= self.max && !self.evict_locked(&mut slots) {
            return None;
        }
        let slot = Arc::new(Slot {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            state: AtomicU64::new(0),
            idle_since: AtomicU64::new(self.now_ns()),
            bytes_read: AtomicU64::new(0),
            idle_bytes: AtomicU64::new(0),
            served: AtomicU64::new(0),
            wake: Notify::new(),
        });
        slots.insert(slot.id, slot.clone());
        self.stats.open.store(slots.len() as u64, Ordering::Relaxed);
        Some(slot)
    }

    /// Evicts the longest-idle connection; false when none is idle.
    pub(super) fn evict_oldest_idle(&self) -> bool {
        let mut slots = self.lock();
        self.evict_locked(&mut slots)
    }

    fn evict_locked(&self, slots: &mut HashMap<u64, Arc<Slot>>) -> bool {
        // A connection seen idle may turn busy before it is marked: look again, a few times.
        for _ in 0..4 {
            let oldest = slots
                .values()
                .filter(|s| s.is_idle())
                .min_by_key(|s| (s.idle_since.load(Ordering::Acquire), s.id));
            let Some(victim) = oldest.cloned() else {
                return false;
            };
            if victim.try_evict() {
                slots.remove(&victim.id);
                self.stats.open.store(slots.len() as u64, Ordering::Relaxed);
                ConnectionStats::bump(&self.stats.evicted_total);
                victim.wake.notify_one();
                tracing::debug!(id = victim.id, "evicted an idle connection");
                return true;
            }
        }
        false
    }

    fn remove(&self, id: u64) {
        let mut slots = self.lock();
        if slots.remove(&id).is_some() {
            self.stats.open.store(slots.len() as u64, Ordering::Relaxed);
        }
    }
}

/// Takes a connection's slot out of the registry when its task ends, however it ends.
struct Registered(Arc<Registry>, u64);

impl Drop for Registered {
    fn drop(&mut self) {
        self.0.remove(self.1);
    }
}

/// The client's stream, counting the bytes read from it into its slot, and failing a write
/// that has waited on the client for the send timeout.
struct CountingIo {
    stream: TcpStream,
    slot: Arc<Slot>,
    stats: Arc<ConnectionStats>,
    send_timeout: Duration,
    /// Since when a write has been waiting on the client, as a timer to its deadline.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl CountingIo {
    /// Passes a write's result on, turning a wait past the send timeout into an error.
    fn deadline<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let timeout = self.send_timeout;
        let timer = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if timer.as_mut().poll(cx).is_pending() {
            return Poll::Pending;
        }
        self.stalled = None;
        ConnectionStats::bump(&self.stats.send_timeouts_total);
        tracing::debug!(
            id = self.slot.id,
            "the client read nothing for the send timeout"
        );
        Poll::Ready(Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "the client read nothing for --send-timeout",
        )))
    }
}

impl AsyncRead for CountingIo {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.stream).poll_read(cx, buf);
        let read = (buf.filled().len() - before) as u64;
        if read > 0 {
            self.slot.bytes_read.fetch_add(read, Ordering::AcqRel);
        }
        polled
    }
}

impl AsyncWrite for CountingIo {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.deadline(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.deadline(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.stream).poll_flush(cx);
        self.deadline(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// What a connection's task needs besides its stream.
pub(super) struct ConnContext {
    pub(super) registry: Arc<Registry>,
    pub(super) app: Router,
    pub(super) limits: ConnectionLimits,
    /// Turns true when the server shuts down; its receivers, dropped as tasks end, tell the
    /// server when the last connection has closed.
    pub(super) shutdown: watch::Receiver<bool>,
}

/// The application as hyper calls it on one connection: each request marks the connection
/// busy until its response body is dropped, and gets a read deadline on its body.
#[derive(Clone)]
struct AppService {
    app: Router,
    slot: Arc<Slot>,
    registry: Arc<Registry>,
    body_timeout: Duration,
}

type Responding =
    Pin<Box<dyn Future<Output = Result<hyper::Response<GuardedBody<Body>>, Infallible>> + Send>>;

impl hyper::service::Service<hyper::Request<Incoming>> for AppService {
    type Response = hyper::Response<GuardedBody<Body>>;
    type Error = Infallible;
    type Future = Responding;

    fn call(&self, req: hyper::Request<Incoming>) -> Responding {
        let busy = Busy::begin(self.slot.clone(), self.registry.clone());
        let stats = self.registry.stats.clone();
        let req = req.map(|b| Body::new(TimedBody::new(b, self.body_timeout, stats)));
        let response = tower_service::Service::call(&mut self.app.clone(), req);
        Box::pin(async move {
            let response = response.await.unwrap_or_else(|e| match e {});
            Ok(response.map(|b| GuardedBody::new(b, busy)))
        })
    }
}

/// Serves one admitted connection until it closes, times out, is evicted, or is drained.
pub(super) async fn serve_connection(stream: TcpStream, slot: Arc<Slot>, cx: ConnContext) {
    let ConnContext {
        registry,
        app,
        limits,
        mut shutdown,
    } = cx;
    let _registered = Registered(registry.clone(), slot.id);
    let stats = registry.stats.clone();
    let service = AppService {
        app,
        slot: slot.clone(),
        registry: registry.clone(),
        body_timeout: limits.body_read_timeout,
    };
    let io = TokioIo::new(CountingIo {
        stream,
        slot: slot.clone(),
        stats: stats.clone(),
        send_timeout: limits.send_timeout,
        stalled: None,
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .keep_alive(true)
        .serve_connection(io, service);
    let mut conn = std::pin::pin!(conn);
    let mut keep_alive_deadline: Option<Instant> = None;
    let mut draining = *shutdown.borrow();
    if draining {
        conn.as_mut().graceful_shutdown();
    }
    loop {
        let idle_timer = async {
            match keep_alive_deadline {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        tokio::select! {
            result = conn.as_mut() => {
                if let Err(e) = result {
                    if e.is_timeout() {
                        ConnectionStats::bump(&stats.header_timeouts_total);
                        tracing::debug!(id = slot.id, "request headers timed out");
                    } else {
                        tracing::debug!(id = slot.id, "connection ended: {e}");
                    }
                }
                return;
            }
            () = slot.wake.notified() => {
                if slot.is_evicted() {
                    break;
                }
                keep_alive_deadline = keep_alive_deadline_of(&slot, &registry, &limits);
            }
            () = idle_timer => {
                keep_alive_deadline = None;
                if !slot.has_partial_request() && slot.try_evict() {
                    registry.remove(slot.id);
                    ConnectionStats::bump(&stats.keep_alive_timeouts_total);
                    tracing::debug!(id = slot.id, "keep-alive connection idle too long");
                    break;
                }
            }
            _ = shutdown.changed(), if !draining => {
                draining = true;
                if slot.try_evict() {
                    registry.remove(slot.id);
                    break;
                }
                // Busy: hyper finishes the response in progress, then closes.
                conn.as_mut().graceful_shutdown();
            }
        }
    }
    // Idle and marked evicted: close now. With no byte of a next request read, hyper is
    // between messages and closes at once, after flushing what it may still hold; with part of
    // one read it would wait for the rest, so it is dropped.
    if !slot.has_partial_request() {
        conn.as_mut().graceful_shutdown();
        let _ = tokio::time::timeout(CLOSE_GRACE, conn.as_mut()).await;
    }
}

/// When an idle keep-alive connection times out: `None` while it is busy or before its first
/// response (the header read timeout covers a connection's first request).
fn keep_alive_deadline_of(
    slot: &Slot,
    registry: &Registry,
    limits: &ConnectionLimits,
) -> Option<Instant> {
    if !slot.is_idle() || slot.served.load(Ordering::Acquire) == 0 {
        return None;
    }
    let since = Duration::from_nanos(slot.idle_since.load(Ordering::Acquire));
    Some(registry.epoch + since + limits.keep_alive_timeout)
}
