//! What every generating route answers with: the whole response once the generation ends, or
//! its events streamed as SSE in the route's [`StreamFormat`], then the usage chunk and `[DONE]`.

use crate::error::ApiError;
use crate::generate::{Generation, TokenInfo, Update};
use crate::params::GenParams;
use crate::parsers::Output;
use crate::responses::ChoiceResult;
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use std::convert::Infallible;
use tokio::sync::mpsc;

/// How an endpoint renders a streamed generation's events as `data:` payloads.
pub(crate) trait StreamFormat: Send + 'static {
    /// Chunks before any text (chat: each choice's assistant role).
    fn opening(&mut self, choices: usize) -> Vec<String>;
    /// Chunks for new output of choice `index` and the tokens that made it.
    fn output(&mut self, index: usize, pieces: Vec<Output>, tokens: &[TokenInfo]) -> Vec<String>;
    fn done(&mut self, index: usize, finish: &str) -> String;
    /// The final chunk with `usage` and no choices.
    fn usage(&self, usage: protocol::Usage) -> String;
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
            Update::Done { index, finish } => results[index].finish = Some(finish),
            Update::Failed(e) => return Err(e),
        }
    }
    Ok((results, generation.usage()))
}

/// Streams a generation as SSE in `format`, then the usage chunk (if asked) and `[DONE]`. A client
/// that goes away closes the channel, which drops the generation and aborts it.
fn stream(
    mut generation: Generation,
    include_usage: bool,
    mut format: impl StreamFormat,
) -> Response {
    let (tx, rx) = mpsc::channel::<String>(64);
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
                Some(Update::Done { index, finish }) => vec![format.done(index, finish)],
                Some(Update::Failed(e)) => {
                    let _ = tx.send(to_json(&e.body())).await;
                    return;
                }
            };
            for data in chunks {
                if tx.send(data).await.is_err() {
                    return;
                }
            }
        }
        if include_usage {
            let _ = tx.send(format.usage(generation.usage())).await;
        }
        let _ = tx.send("[DONE]".into()).await;
    });
    sse(rx)
}

/// An SSE response whose events come from `rx`; when the client goes away the body is dropped,
/// `rx` with it, and the producer sees its channel closed.
fn sse(rx: mpsc::Receiver<String>) -> Response {
    let events = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|data| (Ok::<_, Infallible>(Event::default().data(data)), rx))
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
