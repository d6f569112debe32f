//! A response's output as the Responses API writes it: items (reasoning, message, function
//! call, each with its id), the response body around them, and the stream of typed events
//! (`response.created` ... `response.output_text.delta` ... `response.completed`), each with
//! its `sequence_number`. The finished response is stored (unless `store: false`) from the
//! same items, streamed or not.

use crate::Shared;
use crate::error::ApiError;
use crate::generate::TokenInfo;
use crate::parsers::Output;
use crate::respond::{Finish, SseChunk, StreamFormat, random_id};
use crate::response_store::Stored;
use crate::responses::{ChoiceResult, now_secs};
use serde_json::{Map, Value, json};

/// One output item.
#[derive(Debug, Clone)]
pub(crate) enum Item {
    Reasoning {
        id: String,
        text: String,
    },
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

fn item_id(prefix: &str) -> String {
    format!("{prefix}_{}", random_id())
}

impl Item {
    fn id(&self) -> &str {
        match self {
            Item::Reasoning { id, .. } | Item::Message { id, .. } | Item::Call { id, .. } => id,
        }
    }

    /// The item as JSON, `status` (`completed`, `incomplete`, `in_progress`) on it.
    fn json(&self, status: &str) -> Value {
        match self {
            Item::Reasoning { id, text } => json!({
                "type": "reasoning", "id": id, "summary": [], "status": status,
                "content": [{"type": "reasoning_text", "text": text}],
            }),
            Item::Message { id, text } => json!({
                "type": "message", "id": id, "status": status, "role": "assistant",
                "content": [text_part(text)],
            }),
            Item::Call {
                id,
                call_id,
                name,
                arguments,
            } => json!({
                "type": "function_call", "id": id, "call_id": call_id, "name": name,
                "arguments": arguments, "status": status,
            }),
        }
    }
}

fn text_part(text: &str) -> Value {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// The items of a whole (non-streamed) answer: its reasoning, its text (also when there is
/// nothing else), its calls.
pub(crate) fn items_of(result: &ChoiceResult) -> Vec<Item> {
    let mut items = Vec::new();
    if !result.reasoning.is_empty() {
        items.push(Item::Reasoning {
            id: item_id("rs"),
            text: result.reasoning.clone(),
        });
    }
    if !result.content.is_empty() || result.tool_calls.is_empty() {
        items.push(Item::Message {
            id: item_id("msg"),
            text: result.content.clone(),
        });
    }
    items.extend(result.tool_calls.iter().map(|c| Item::Call {
        id: item_id("fc"),
        call_id: c.id.clone(),
        name: c.function.name.clone(),
        arguments: c.function.arguments.clone(),
    }));
    items
}

/// The answer as the chat message a later request's history holds.
fn assistant_message(items: &[Item]) -> Value {
    let (mut reasoning, mut text, mut calls) = (String::new(), String::new(), Vec::new());
    for item in items {
        match item {
            Item::Reasoning { text: t, .. } => reasoning.push_str(t),
            Item::Message { text: t, .. } => text.push_str(t),
            Item::Call {
                call_id,
                name,
                arguments,
                ..
            } => calls.push(json!({"id": call_id, "type": "function",
                "function": {"name": name, "arguments": arguments}})),
        }
    }
    let mut message = json!({"role": "assistant", "content": text});
    if !reasoning.is_empty() {
        message["reasoning_content"] = Value::String(reasoning);
    }
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    message
}

/// What the response says of itself besides its output: its id, the request's fields echoed,
/// and what is stored with it.
#[derive(Clone)]
pub(crate) struct Meta {
    pub state: Shared,
    pub id: String,
    pub created_at: u64,
    /// The request's fields as the response echoes them (`instructions`, `tools`, `text`, ...).
    pub echo: Map<String, Value>,
    pub store: bool,
    /// The conversation before the answer (without the instructions).
    pub history: Vec<Value>,
}

impl Meta {
    pub fn new(state: Shared, echo: Map<String, Value>, store: bool, history: Vec<Value>) -> Self {
        Self {
            state,
            id: item_id("resp"),
            created_at: now_secs(),
            echo,
            store,
            history,
        }
    }

    /// The response body: `status` `in_progress` (no usage yet), `completed` or `incomplete`
    /// (`max_output_tokens` reached).
    fn body(&self, items: &[Item], status: &str, usage: Option<protocol::Usage>) -> Value {
        let item_status = if status == "incomplete" {
            "incomplete"
        } else {
            "completed"
        };
        let mut body = self.echo.clone();
        let fields = [
            ("id", json!(self.id)),
            ("object", json!("response")),
            ("created_at", json!(self.created_at)),
            ("status", json!(status)),
            ("model", json!(self.state.served_model_name)),
            ("error", Value::Null),
            (
                "incomplete_details",
                match status {
                    "incomplete" => json!({"reason": "max_output_tokens"}),
                    _ => Value::Null,
                },
            ),
            (
                "output",
                Value::Array(items.iter().map(|i| i.json(item_status)).collect()),
            ),
            ("usage", usage.map_or(Value::Null, |u| self.usage(u, items))),
        ];
        body.extend(fields.into_iter().map(|(k, v)| (k.to_string(), v)));
        Value::Object(body)
    }

    /// The Responses API's usage; the reasoning's tokens are counted by tokenizing its text.
    fn usage(&self, u: protocol::Usage, items: &[Item]) -> Value {
        let tokenizer = &self.state.model().tokenizer;
        let reasoning: usize = items
            .iter()
            .filter_map(|i| match i {
                Item::Reasoning { text, .. } => tokenizer.encode(text, false, false).ok(),
                _ => None,
            })
            .map(|ids| ids.len())
            .sum();
        let cached = u.prompt_tokens_details.map_or(0, |d| d.cached_tokens);
        json!({
            "input_tokens": u.prompt_tokens,
            "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": u.completion_tokens,
            "output_tokens_details": {"reasoning_tokens": reasoning},
            "total_tokens": u.total_tokens,
        })
    }

    /// The finished body, stored when the request asked for that.
    pub fn finish(&self, items: &[Item], finish: &str, usage: protocol::Usage) -> Value {
        let status = if finish == "length" {
            "incomplete"
        } else {
            "completed"
        };
        let body = self.body(items, status, Some(usage));
        if self.store {
            let mut history = self.history.clone();
            history.push(assistant_message(items));
            let stored = Stored::new(body.clone(), history);
            self.state.responses.insert(self.id.clone(), stored);
        }
        body
    }
}

/// The open item of a stream and what has been sent of it.
struct OpenItem {
    item: Item,
    output_index: usize,
}

/// A response streamed as the Responses API's events.
pub(crate) struct ResponsesStream {
    pub meta: Meta,
    sequence: u64,
    open: Option<OpenItem>,
    done: Vec<Item>,
    finish: &'static str,
}

impl ResponsesStream {
    pub fn new(meta: Meta) -> Self {
        Self {
            meta,
            sequence: 0,
            open: None,
            done: Vec::new(),
            finish: "stop",
        }
    }

    /// An event of type `name` with `fields`, numbered.
    fn event(&mut self, name: &'static str, fields: Value) -> SseChunk {
        let mut body = json!({"type": name, "sequence_number": self.sequence});
        if let (Value::Object(b), Value::Object(f)) = (&mut body, fields) {
            b.extend(f);
        }
        self.sequence += 1;
        SseChunk {
            event: Some(name),
            data: body.to_string(),
        }
    }

    /// Opens `item` (closing the open one): `output_item.added`, and a message's empty text
    /// part.
    fn open(&mut self, item: Item, out: &mut Vec<SseChunk>) {
        self.close(out);
        let output_index = self.done.len();
        let added = json!({"output_index": output_index, "item": item.json("in_progress")});
        let added = match &item {
            // An item is added with nothing in it yet: its text arrives as deltas.
            Item::Reasoning { id, .. } => {
                json!({"output_index": output_index, "item": {"type": "reasoning", "id": id,
                    "summary": [], "content": [], "status": "in_progress"}})
            }
            Item::Message { id, .. } => {
                json!({"output_index": output_index, "item": {"type": "message", "id": id,
                    "status": "in_progress", "role": "assistant", "content": []}})
            }
            Item::Call { .. } => added,
        };
        out.push(self.event("response.output_item.added", added));
        if let Item::Message { id, .. } = &item {
            let part = json!({"item_id": id, "output_index": output_index, "content_index": 0,
                "part": text_part("")});
            out.push(self.event("response.content_part.added", part));
        }
        self.open = Some(OpenItem { item, output_index });
    }

    /// Closes the open item: its text's `done` events, then `output_item.done`.
    fn close(&mut self, out: &mut Vec<SseChunk>) {
        let Some(OpenItem { item, output_index }) = self.open.take() else {
            return;
        };
        let at = json!({"item_id": item.id(), "output_index": output_index});
        let with = |extra: Value| {
            let mut v = at.clone();
            if let (Value::Object(v), Value::Object(e)) = (&mut v, extra) {
                v.extend(e);
            }
            v
        };
        match &item {
            Item::Reasoning { text, .. } => {
                let done = with(json!({"content_index": 0, "text": text}));
                out.push(self.event("response.reasoning_text.done", done));
            }
            Item::Message { text, .. } => {
                let done = with(json!({"content_index": 0, "text": text, "logprobs": []}));
                out.push(self.event("response.output_text.done", done));
                let part = with(json!({"content_index": 0, "part": text_part(text)}));
                out.push(self.event("response.content_part.done", part));
            }
            Item::Call {
                name, arguments, ..
            } => {
                let done = with(json!({"name": name, "arguments": arguments}));
                out.push(self.event("response.function_call_arguments.done", done));
            }
        }
        let done = json!({"output_index": output_index, "item": item.json("completed")});
        out.push(self.event("response.output_item.done", done));
        self.done.push(item);
    }

    /// Text for the open item of `kind` (opening one when another kind is open).
    fn text(
        &mut self,
        kind: fn(&Item) -> bool,
        fresh: fn() -> Item,
        delta: String,
    ) -> Vec<SseChunk> {
        let mut out = Vec::new();
        if !self.open.as_ref().is_some_and(|o| kind(&o.item)) {
            self.open(fresh(), &mut out);
        }
        let open = self.open.as_mut().expect("an open item");
        let mut fields = json!({"item_id": open.item.id(), "output_index": open.output_index,
            "delta": &delta});
        let name = match &mut open.item {
            Item::Reasoning { text, .. } => {
                text.push_str(&delta);
                fields["content_index"] = json!(0);
                "response.reasoning_text.delta"
            }
            Item::Message { text, .. } => {
                text.push_str(&delta);
                fields["content_index"] = json!(0);
                fields["logprobs"] = json!([]);
                "response.output_text.delta"
            }
            Item::Call { arguments, .. } => {
                arguments.push_str(&delta);
                "response.function_call_arguments.delta"
            }
        };
        out.push(self.event(name, fields));
        out
    }
}

impl StreamFormat for ResponsesStream {
    const USAGE_ALWAYS: bool = true;

    fn opening(&mut self, _choices: usize) -> Vec<SseChunk> {
        let body = self.meta.body(&[], "in_progress", None);
        vec![
            self.event("response.created", json!({"response": body.clone()})),
            self.event("response.in_progress", json!({"response": body})),
        ]
    }

    fn output(&mut self, _: usize, pieces: Vec<Output>, _: &[TokenInfo]) -> Vec<SseChunk> {
        let mut out = Vec::new();
        for piece in pieces {
            let is_reasoning = |i: &Item| matches!(i, Item::Reasoning { .. });
            let is_message = |i: &Item| matches!(i, Item::Message { .. });
            let is_call = |i: &Item| matches!(i, Item::Call { .. });
            match piece {
                Output::Reasoning(r) if !r.is_empty() => {
                    let fresh = || Item::Reasoning {
                        id: item_id("rs"),
                        text: String::new(),
                    };
                    out.extend(self.text(is_reasoning, fresh, r));
                }
                Output::Content(c) if !c.is_empty() => {
                    let fresh = || Item::Message {
                        id: item_id("msg"),
                        text: String::new(),
                    };
                    out.extend(self.text(is_message, fresh, c));
                }
                Output::ToolCall { id, name, .. } => {
                    let call = Item::Call {
                        id: item_id("fc"),
                        call_id: id,
                        name,
                        arguments: String::new(),
                    };
                    self.open(call, &mut out);
                }
                Output::ToolArguments { fragment, .. }
                    if self.open.as_ref().is_some_and(|o| is_call(&o.item)) =>
                {
                    out.extend(self.text(is_call, || unreachable!("a call is open"), fragment));
                }
                _ => {}
            }
        }
        out
    }

    fn done(&mut self, _: usize, finish: Finish) -> Vec<SseChunk> {
        let mut out = Vec::new();
        if self.done.is_empty() && self.open.is_none() {
            // An empty answer is still one (empty) message, as the whole response has.
            let empty = Item::Message {
                id: item_id("msg"),
                text: String::new(),
            };
            self.open(empty, &mut out);
        }
        self.close(&mut out);
        self.finish = if finish.reason == "length" {
            "length"
        } else {
            "stop"
        };
        out
    }

    fn usage(&mut self, usage: protocol::Usage) -> Vec<SseChunk> {
        let body = self.meta.finish(&self.done, self.finish, usage);
        let name = if body["status"] == "incomplete" {
            "response.incomplete"
        } else {
            "response.completed"
        };
        vec![self.event(name, json!({"response": body}))]
    }

    fn error(&self, e: &ApiError) -> SseChunk {
        let body = json!({"type": "error", "sequence_number": self.sequence,
            "code": e.kind(), "message": e.message, "param": e.param});
        SseChunk {
            event: Some("error"),
            data: body.to_string(),
        }
    }

    fn end(&self) -> Option<SseChunk> {
        None
    }
}
