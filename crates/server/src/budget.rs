//! The memory budget of requests being prepared: a request's body, its parsed JSON, the
//! rendered prompt and its token ids are held from the moment its body is read until its
//! response starts (or, without streaming, ends). Each request reserves an estimate of those
//! bytes before its body is read; over the budget it is a 503 with `Retry-After` while others
//! hold it, and a 400 when the request alone could never fit.

use crate::Shared;
use crate::error::ApiError;
use axum::extract::{Request, State};
use axum::http::header;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Bytes a request holds per byte of its body while it is prepared: the body, its parsed JSON
/// (strings and maps), the rendered prompt and its token ids: a large message peaks at about 4×
/// its size.
pub const BYTES_PER_BODY_BYTE: usize = 4;

/// The budget's default: an eighth of the machine's memory, between these bounds.
pub const DEFAULT_BUDGET_MIN: usize = 256 << 20;
pub const DEFAULT_BUDGET_MAX: usize = 4 << 30;

/// Bytes reserved by requests in preparation, against a limit.
#[derive(Debug)]
pub struct RequestBudget {
    used: Arc<AtomicUsize>,
    limit: usize,
}

impl RequestBudget {
    pub fn new(limit: usize) -> Self {
        Self {
            used: Arc::new(AtomicUsize::new(0)),
            limit,
        }
    }

    /// An eighth of the memory this machine has (`/proc/meminfo`), within
    /// [`DEFAULT_BUDGET_MIN`]..=[`DEFAULT_BUDGET_MAX`].
    pub fn default_limit() -> usize {
        let total = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|m| {
                let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
                line.split_whitespace().nth(1)?.parse::<usize>().ok()
            })
            .map_or(0, |kib| kib << 10);
        (total / 8).clamp(DEFAULT_BUDGET_MIN, DEFAULT_BUDGET_MAX)
    }

    pub fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes reserved now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Reserves `bytes`, or says why not.
    pub fn reserve(&self, bytes: usize) -> Result<Reservation, ApiError> {
        if bytes > self.limit {
            return Err(ApiError::bad_request(format!(
                "this request would hold about {bytes} bytes while it is prepared, more than the server's request memory budget of {} bytes (--max-request-memory-mb)",
                self.limit
            )));
        }
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                (used + bytes <= self.limit).then_some(used + bytes)
            })
            .map_err(|used| {
                ApiError::overloaded(format!(
                    "requests in preparation hold {used} of the server's {} bytes of request memory; retry later",
                    self.limit
                ))
            })?;
        Ok(Reservation {
            used: self.used.clone(),
            bytes,
        })
    }
}

/// Bytes held in the budget until dropped.
#[derive(Debug)]
pub struct Reservation {
    used: Arc<AtomicUsize>,
    bytes: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// Middleware of the generating routes: reserves the request's estimate (its declared length,
/// or the body limit when it declares none) before its body is read, and holds it until the
/// response is ready.
pub(crate) async fn reserve_memory(
    State(state): State<Shared>,
    req: Request,
    next: Next,
) -> Response {
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    // Past the body limit the extractor answers 413 without reading it: nothing to reserve.
    let body = declared
        .unwrap_or(state.max_body_bytes)
        .min(state.max_body_bytes);
    let _held = match state
        .budget
        .reserve(body.saturating_mul(BYTES_PER_BODY_BYTE))
    {
        Ok(r) => r,
        Err(e) => {
            state
                .metrics
                .rejected_memory
                .fetch_add(1, Ordering::Relaxed);
            return e.into_response();
        }
    };
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_are_released_and_capped() {
        let budget = RequestBudget::new(100);
        let a = budget.reserve(60).unwrap();
        let e = budget.reserve(50).unwrap_err();
        assert_eq!((e.status.as_u16(), e.retry_after), (503, Some(1)));
        assert_eq!(budget.reserve(101).unwrap_err().status.as_u16(), 400);
        drop(a);
        assert_eq!(budget.used(), 0);
        let _b = budget.reserve(100).unwrap();
    }
}
