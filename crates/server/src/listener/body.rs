//! The bodies the listener wraps: a request body that fails once its read deadline passes, and
//! a response body that marks its connection busy until it is dropped.

use super::conn::Busy;
use super::limits::ConnectionStats;
use axum::body::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use std::error::Error as StdError;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::time::Sleep;

type BoxError = Box<dyn StdError + Send + Sync>;

/// The error a request body ends with when it does not arrive within the body read timeout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the request body did not arrive within {} s", .0.as_secs_f64())]
pub struct BodyTimeout(pub Duration);

/// The [`BodyTimeout`] behind `err`, if it is one (axum's `BytesRejection` for a body that
/// timed out has one in its chain).
pub fn body_timeout<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a BodyTimeout> {
    let mut at = Some(err);
    // Bounded: error chains are short, and a cyclic one must not hang us.
    for _ in 0..32 {
        let e = at?;
        if let Some(t) = e.downcast_ref::<BodyTimeout>() {
            return Some(t);
        }
        at = e.source();
    }
    None
}

/// A request body with a deadline: [`BodyTimeout`] once `timeout` has passed since it was
/// first polled without having ended.
pub(super) struct TimedBody {
    inner: Incoming,
    timeout: Duration,
    sleep: Option<Pin<Box<Sleep>>>,
    expired: bool,
    stats: Arc<ConnectionStats>,
}

impl TimedBody {
    pub(super) fn new(inner: Incoming, timeout: Duration, stats: Arc<ConnectionStats>) -> Self {
        Self {
            inner,
            timeout,
            sleep: None,
            expired: false,
            stats,
        }
    }
}

impl Body for TimedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if this.expired {
            return Poll::Ready(Some(Err(Box::new(BodyTimeout(this.timeout)))));
        }
        // The deadline runs from the first read: a handler that reads late is not penalised.
        let timeout = this.timeout;
        let sleep = this
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            return Poll::Ready(frame.map(|f| f.map_err(BoxError::from)));
        }
        if sleep.as_mut().poll(cx).is_ready() {
            this.expired = true;
            ConnectionStats::bump(&this.stats.body_timeouts_total);
            tracing::debug!(timeout_s = timeout.as_secs_f64(), "request body timed out");
            return Poll::Ready(Some(Err(Box::new(BodyTimeout(timeout)))));
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        !self.expired && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// A response body that holds its connection's [`Busy`] mark until hyper drops it, after its
/// last frame: a connection whose response is still being written is never evicted.
pub(super) struct GuardedBody<B> {
    inner: B,
    _busy: Busy,
}

impl<B> GuardedBody<B> {
    pub(super) fn new(inner: B, busy: Busy) -> Self {
        Self { inner, _busy: busy }
    }
}

impl<B: Body + Unpin> Body for GuardedBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<B::Data>, B::Error>>> {
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}
