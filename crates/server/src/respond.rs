//! What every generating route answers with: the whole response once the generation ends, or
//! its events streamed as SSE in the route's [`StreamFormat`] (OpenAI's: `data:` chunks, the
//! usage chunk and `[DONE]`; Anthropic's and the Responses API's: named events).

use crate::error::ApiError;
use crate::generate::{Generation, TokenInfo, Update};
use crate::params::GenParams;
use crate::parsers::Output;
use crate::responses::ChoiceResult;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use std::convert::Infallible;
use tokio::sync::mpsc;

/// One server-sent event: its `event:` name, if it has one, and its `data:`.
pub(crate) struct SseChunk {
    pub event: Option<&'static str>,
    pub data: String,
}

impl SseChunk {
    /// A named event whose data is `body` as JSON.
    pub(crate) fn named<T: serde::Serialize>(event: &'static str, body: &T) -> Self {
        Self {
            event: Some(event),
            data: to_json(body),
        }
    }
}

impl From<String> for SseChunk {
    fn from(data: String) -> Self {
        Self { event: None, data }
    }
}

/// How a choice ended: the finish reason (`stop`, `length`, `tool_calls`) and the stop string
/// that ended it, if one did.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Finish<'a> {
    pub reason: &'a str,
    pub stop_sequence: Option<&'a str>,
}

/// How an endpoint renders a streamed generation's events.
pub(crate) trait StreamFormat: Send + 'static {
    /// Chunks before any text (chat: each choice's assistant role).
    fn opening(&mut self, choices: usize) -> Vec<SseChunk>;
    /// Chunks for new output of choice `index` and the tokens that made it.
    fn output(&mut self, index: usize, pieces: Vec<Output>, tokens: &[TokenInfo]) -> Vec<SseChunk>;
    fn done(&mut self, index: usize, finish: Finish) -> Vec<SseChunk>;
    /// The last chunks, with `usage` (sent when the client asked for usage, or
    /// [`StreamFormat::USAGE_ALWAYS`]).
    fn usage(&mut self, usage: protocol::Usage) -> Vec<SseChunk>;
    /// Whether the usage chunks are sent whatever the request asked.
    const USAGE_ALWAYS: bool = false;
    /// An error that ends the stream.
    fn error(&self, e: &ApiError) -> SseChunk {
        to_json(&e.body()).into()
    }
    /// The stream's last event, after the usage.
    fn end(&self) -> Option<SseChunk> {
        Some("[DONE]".to_string().into())
    }
}

/// The response to a generation: streamed in `format`, or collected whole and shaped by
/// `whole`.
pub(crate) async fn respond<B: serde::Serialize>(
    generation: Generation,
    params: &GenParams,
    format: impl StreamFormat,
    whole: impl FnOnce(Vec<ChoiceResult>, protocol::Usage) -> B,
) -> Result<Response, ApiError> {
    if params.stream {
        return Ok(stream(generation, params.include_usage, format));
    }
    let n = generation.choices();
    let (results, usage) = collect(generation, n).await?;
    Ok(axum::Json(whole(results, usage)).into_response())
}

/// Runs a generation to its end (non-streaming responses).
async fn collect(
    mut generation: Generation,
    n: usize,
) -> Result<(Vec<ChoiceResult>, protocol::Usage), ApiError> {
    let mut results: Vec<ChoiceResult> = (0..n).map(|_| ChoiceResult::default()).collect();
    while let Some(update) = generation.next().await {
        match update {
            Update::Output {
                index,
                pieces,
                tokens,
            } => {
                for piece in pieces {
                    results[index].add(piece);
                }
                results[index].tokens.extend(tokens);
            }
            Update::Done {
                index,
                finish,
                stop_sequence,
            } => {
                results[index].finish = Some(finish);
                results[index].stop_sequence = stop_sequence;
            }
            Update::Failed(e) => return Err(e),
        }
    }
    Ok((results, generation.usage()))
}

/// Streams a generation as SSE in `format`, then the usage chunks (if asked) and the end. A
/// client that goes away closes the channel, which drops the generation and aborts it.
fn stream<F: StreamFormat>(
    mut generation: Generation,
    include_usage: bool,
    mut format: F,
) -> Response {
    let (tx, rx) = mpsc::channel::<SseChunk>(64);
    tokio::spawn(async move {
        for chunk in format.opening(generation.choices()) {
            if tx.send(chunk).await.is_err() {
                return;
            }
        }
        loop {
            let update = tokio::select! {
                _ = tx.closed() => return,
                u = generation.next() => u,
            };
            let chunks = match update {
                None => break,
                Some(Update::Output {
                    index,
                    pieces,
                    tokens,
                }) => format.output(index, pieces, &tokens),
                Some(Update::Done {
                    index,
                    finish,
                    stop_sequence,
                }) => {
                    let finish = Finish {
                        reason: finish,
                        stop_sequence: stop_sequence.as_deref(),
                    };
                    format.done(index, finish)
                }
                Some(Update::Failed(e)) => {
                    let _ = tx.send(format.error(&e)).await;
                    return;
                }
            };
            for data in chunks {
                if tx.send(data).await.is_err() {
                    return;
                }
            }
        }
        if include_usage || F::USAGE_ALWAYS {
            for chunk in format.usage(generation.usage()) {
                if tx.send(chunk).await.is_err() {
                    return;
                }
            }
        }
        if let Some(end) = format.end() {
            let _ = tx.send(end).await;
        }
    });
    sse(rx)
}

/// An SSE response whose events come from `rx`; when the client goes away the body is dropped,
/// `rx` with it, and the producer sees its channel closed.
fn sse(rx: mpsc::Receiver<SseChunk>) -> Response {
    let events = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|chunk| {
            let mut event = Event::default().data(chunk.data);
            if let Some(name) = chunk.event {
                event = event.event(name);
            }
            (Ok::<_, Infallible>(event), rx)
        })
    });
    Sse::new(events).into_response()
}

/// A response body as JSON text.
pub(crate) fn to_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).expect("response types serialise")
}

/// 16 random hex digits for a response id.
pub(crate) fn random_id() -> String {
    format!("{:016x}", rand::random::<u64>())
}
