//! The Responses API's stored responses (`store`, the default): each response's body, for
//! `GET /v1/responses/{id}`, and the conversation it ends as chat messages, for a later request's
//! `previous_response_id`. Bounded by count and by bytes, the oldest dropped first. Handlers
//! touch it for a lookup or an insert under a plain mutex, never across an await.

use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

/// The most responses kept.
pub const MAX_STORED_RESPONSES: usize = 1024;
/// The most bytes of stored bodies and conversations (as JSON).
pub const MAX_STORED_BYTES: usize = 64 << 20;

/// One stored response.
#[derive(Debug, Clone)]
pub struct Stored {
    /// The response's body, as `POST` answered it.
    pub body: Value,
    /// The conversation up to and with this response, as chat messages (the request's
    /// `instructions` are not in it: they are not carried over).
    pub history: Vec<Value>,
    bytes: usize,
}

impl Stored {
    pub fn new(body: Value, history: Vec<Value>) -> Self {
        let bytes = body.to_string().len() + Value::Array(history.clone()).to_string().len();
        Self {
            body,
            history,
            bytes,
        }
    }
}

#[derive(Default)]
struct Inner {
    by_id: HashMap<String, Stored>,
    /// Ids, oldest first.
    order: VecDeque<String>,
    bytes: usize,
}

/// The bounded store.
pub struct ResponseStore {
    inner: Mutex<Inner>,
    max_count: usize,
    max_bytes: usize,
}

impl Default for ResponseStore {
    fn default() -> Self {
        Self::new(MAX_STORED_RESPONSES, MAX_STORED_BYTES)
    }
}

impl ResponseStore {
    pub fn new(max_count: usize, max_bytes: usize) -> Self {
        Self {
            inner: Mutex::new(Inner::default()),
            max_count,
            max_bytes,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic elsewhere cannot leave the maps half-updated: each change is one insert or
        // remove, so a poisoned lock's data is still whole.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Keeps `stored` under `id`, dropping the oldest responses past either bound (a response
    /// over the byte bound alone is not kept).
    pub fn insert(&self, id: String, stored: Stored) {
        if stored.bytes > self.max_bytes {
            return;
        }
        let mut inner = self.lock();
        while inner.order.len() >= self.max_count || inner.bytes + stored.bytes > self.max_bytes {
            let Some(old) = inner.order.pop_front() else {
                break;
            };
            if let Some(gone) = inner.by_id.remove(&old) {
                inner.bytes -= gone.bytes;
            }
        }
        inner.bytes += stored.bytes;
        inner.order.push_back(id.clone());
        if let Some(replaced) = inner.by_id.insert(id, stored) {
            inner.bytes -= replaced.bytes;
        }
    }

    pub fn get(&self, id: &str) -> Option<Stored> {
        self.lock().by_id.get(id).cloned()
    }

    /// Forgets `id`; whether it was there.
    pub fn remove(&self, id: &str) -> bool {
        let mut inner = self.lock();
        let Some(gone) = inner.by_id.remove(id) else {
            return false;
        };
        inner.bytes -= gone.bytes;
        inner.order.retain(|k| k != id);
        true
    }

    /// (responses, bytes) kept now.
    pub fn usage(&self) -> (usize, usize) {
        let inner = self.lock();
        (inner.by_id.len(), inner.bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn stored(text: &str) -> Stored {
        Stored::new(
            json!({"text": text}),
            vec![json!({"role": "user", "content": text})],
        )
    }

    #[test]
    fn the_oldest_go_first_past_either_bound() {
        let store = ResponseStore::new(2, 1 << 20);
        for id in ["a", "b", "c"] {
            store.insert(id.into(), stored(id));
        }
        assert!(store.get("a").is_none());
        assert_eq!(store.get("c").unwrap().body["text"], "c");
        assert_eq!(store.usage().0, 2);
        let one = stored("x").bytes;
        let store = ResponseStore::new(100, 2 * one + one / 2);
        for id in ["x", "y", "z"] {
            store.insert(id.into(), stored(id));
        }
        assert_eq!(store.usage(), (2, 2 * one));
        assert!(store.get("x").is_none() && store.get("z").is_some());
        // One response bigger than the whole bound is not kept (and evicts nothing).
        store.insert("big".into(), stored(&"w".repeat(4 * one)));
        assert!(store.get("big").is_none());
        assert_eq!(store.usage().0, 2);
    }

    #[test]
    fn removed_responses_are_gone_and_their_bytes_freed() {
        let store = ResponseStore::default();
        store.insert("a".into(), stored("a"));
        assert!(store.remove("a"));
        assert!(!store.remove("a"));
        assert_eq!(store.usage(), (0, 0));
    }
}
