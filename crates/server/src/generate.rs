//! One request's generation: its choices submitted to the engine, their token events merged and
//! turned into output (incremental detokenization, stop strings, then the reasoning and tool-call
//! parsers when the request has them), timing metrics, and the request's log line. Dropping a
//! `Generation` aborts whatever is still running.

use crate::AppState;
use crate::error::ApiError;
use crate::metrics::Outcome;
use crate::params::GenParams;
use crate::parsers::{
    Output, OutputParser, ReasoningFormat, ReasoningParser, ToolFormat, ToolParser,
};
use crate::stop::StopText;
use engine::{GenerateRequest, TokenEvent};
use model::tokenizer::IncrementalDecoder;
use protocol::Usage;
use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Instant;
use tokio::sync::mpsc;

/// A generated token with its log-probabilities (when asked for).
#[derive(Debug, Clone)]
pub struct TokenInfo {
    pub id: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// How each choice's text is parsed; the default parses nothing (all text is content).
#[derive(Debug, Clone, Default)]
pub struct ParseSpec {
    /// The reasoning format, and whether the text starts inside the thought.
    pub reasoning: Option<(ReasoningFormat, bool)>,
    /// The tool-call format, the most calls a choice may make, and the functions it may call.
    pub tools: Option<(ToolFormat, usize, Vec<String>)>,
    /// Text the prompt ends with that the parsers read as the model's (the opening of a call
    /// that `tool_choice` forces).
    pub prefill: String,
}

impl ParseSpec {
    fn parser(&self, id_seed: u64) -> OutputParser {
        let mut p = OutputParser::new(
            self.reasoning
                .map(|(format, inside)| ReasoningParser::new(format, inside)),
            self.tools.as_ref().map(|(format, max, names)| {
                ToolParser::new(*format, id_seed)
                    .with_max_calls(*max)
                    .with_names(names.clone())
            }),
        );
        if !self.prefill.is_empty() {
            // An opening only: nothing comes out until the model completes the call.
            let early = p.push(&self.prefill);
            debug_assert!(early.is_empty(), "{early:?}");
        }
        p
    }
}

/// A request's sequences (prompts × `n`) are admitted all or none: more than the server ever
/// holds is a 400 (a retry cannot succeed), more than it has room for now a 503 before any is
/// submitted (a concurrent request may still take the last places first; then the ones
/// submitted are aborted and the request gets the 503).
pub(crate) fn check_sequences(
    engine: &engine::EngineHandle,
    prompts: usize,
    n: usize,
) -> Result<(), ApiError> {
    let sequences = prompts * n;
    let c = engine.config();
    let capacity = c.max_running + c.max_queued;
    if sequences > capacity {
        return Err(ApiError::invalid(
            if prompts > 1 { "prompt" } else { "n" },
            format!(
                "this request asks for {sequences} sequences (prompts × n); the server runs and queues at most {capacity} (--max-running-requests + --max-queued-requests)"
            ),
        ));
    }
    let in_flight = engine.in_flight();
    if sequences > 1 && in_flight + sequences > capacity {
        return Err(ApiError::overloaded(format!(
            "the server has room for {} more sequences, this request needs {sequences}; retry later",
            capacity.saturating_sub(in_flight)
        )));
    }
    Ok(())
}

/// What the client should see next.
#[derive(Debug)]
pub enum Update {
    /// New output of choice `index` (possibly none), and the tokens that produced it.
    Output {
        index: usize,
        pieces: Vec<Output>,
        tokens: Vec<TokenInfo>,
    },
    /// Choice `index` is complete (`finish`: `stop`, `length`, `tool_calls`), ended by the stop
    /// string `stop_sequence` if one did.
    Done {
        index: usize,
        finish: &'static str,
        stop_sequence: Option<String>,
    },
    /// The engine failed; the request ends.
    Failed(ApiError),
}

struct Choice {
    engine_id: u64,
    decoder: IncrementalDecoder,
    stop: StopText,
    parser: OutputParser,
    completion_tokens: usize,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
    finish: Option<&'static str>,
    spec_accept_length: Option<f32>,
    /// Prompt tokens the prefix cache supplied, once the engine says.
    cached_tokens: Option<usize>,
}

pub struct Generation {
    state: Arc<AppState>,
    merged: mpsc::UnboundedReceiver<(usize, TokenEvent)>,
    choices: Vec<Choice>,
    queue: VecDeque<Update>,
    prompt_tokens: usize,
    /// Choices per prompt.
    n: usize,
    started: Instant,
    logprobs: bool,
    outcome: Option<Outcome>,
}

impl Generation {
    /// Submits `n` choices for each prompt (choice index = prompt index × n + j), their text
    /// parsed as `parse` says.
    pub fn start(
        state: Arc<AppState>,
        prompts: Vec<Vec<u32>>,
        params: &GenParams,
        parse: &ParseSpec,
        started: Instant,
    ) -> Result<Self, ApiError> {
        let engine = &state.model().engine;
        check_sequences(engine, prompts.len(), params.n.max(1))?;
        let limit = engine
            .config()
            .context_length
            .min(engine.config().kv_capacity_tokens());
        let (merged_tx, merged) = mpsc::unbounded_channel();
        let mut choices = Vec::new();
        let mut prompt_tokens = 0;
        for prompt in prompts {
            prompt_tokens += prompt.len();
            // Without max_tokens, a request may run to the end of the context.
            let max_tokens = params
                .max_tokens
                .unwrap_or_else(|| limit.saturating_sub(prompt.len()).max(1));
            let scripted = match &state.script {
                Some(script) => script.reply_tokens(&state.model().tokenizer, &prompt)?,
                None => Vec::new(),
            };
            for j in 0..params.n {
                let seed = match params.seed {
                    Some(s) => s.wrapping_add(j as u64),
                    None => rand::random(),
                };
                let request = GenerateRequest {
                    prompt: prompt.clone(),
                    max_tokens,
                    sampling: model::sampler::SamplingParams {
                        seed,
                        ..params.sampling.clone()
                    },
                    ignore_eos: params.ignore_eos,
                    stop_token_ids: params.stop_token_ids.clone(),
                    logprobs: params.logprobs,
                    scripted: scripted.clone(),
                    constraint: params.constraint.clone(),
                    embed: false,
                };
                let stream = engine.submit(request).map_err(|e| {
                    if matches!(e, engine::SubmitError::Overloaded(_)) {
                        state
                            .metrics
                            .rejected_overload
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    ApiError::from(e)
                })?;
                let index = choices.len();
                // Call ids need only be unique, not reproducible.
                let parser = parse.parser(rand::random());
                choices.push(Choice {
                    engine_id: stream.id,
                    // Tool-call markup may be control tokens (`[TOOL_CALLS]`,
                    // `<|python_tag|>`): with the tool parser on, they come out as text.
                    decoder: IncrementalDecoder::new(!parser.has_tools()),
                    stop: StopText::new(params.stop.clone()),
                    parser,
                    completion_tokens: 0,
                    first_token: None,
                    last_token: None,
                    finish: None,
                    spec_accept_length: None,
                    cached_tokens: None,
                });
                tokio::spawn(forward(index, stream, merged_tx.clone()));
            }
        }
        Ok(Self {
            state,
            merged,
            choices,
            queue: VecDeque::new(),
            prompt_tokens,
            n: params.n.max(1),
            started,
            logprobs: params.logprobs.is_some(),
            outcome: None,
        })
    }

    pub fn choices(&self) -> usize {
        self.choices.len()
    }

    pub fn usage(&self) -> Usage {
        let completion: usize = self.choices.iter().map(|c| c.completion_tokens).sum();
        let accept: Vec<f64> = self
            .choices
            .iter()
            .filter_map(|c| c.spec_accept_length.map(f64::from))
            .collect();
        // A prompt counts once however many choices it has: its best-served choice's hit.
        let cached: usize = self
            .choices
            .chunks(self.n)
            .map(|c| c.iter().filter_map(|c| c.cached_tokens).max().unwrap_or(0))
            .sum();
        Usage {
            prompt_tokens: self.prompt_tokens as u64,
            completion_tokens: completion as u64,
            total_tokens: (self.prompt_tokens + completion) as u64,
            prompt_tokens_details: Some(protocol::PromptTokensDetails {
                cached_tokens: cached as u64,
            }),
            spec_accept_length: (!accept.is_empty())
                .then(|| accept.iter().sum::<f64>() / accept.len() as f64),
        }
    }

    /// The next update, or `None` once every choice is done.
    pub async fn next(&mut self) -> Option<Update> {
        loop {
            if let Some(u) = self.queue.pop_front() {
                return Some(u);
            }
            if self.outcome.is_some() {
                return None;
            }
            let Some((index, event)) = self.merged.recv().await else {
                self.complete(Outcome::Error);
                return Some(Update::Failed(ApiError::internal(
                    "the engine stopped before the request finished",
                )));
            };
            self.handle(index, event);
        }
    }

    fn handle(&mut self, index: usize, event: TokenEvent) {
        match event {
            TokenEvent::Admitted { cached_tokens } => {
                self.choices[index].cached_tokens = Some(cached_tokens);
            }
            // Only embedding requests (`/v1/embeddings`) get one.
            TokenEvent::Embedding(_) => {}
            TokenEvent::Token {
                id,
                is_stop,
                logprob,
                top_logprobs,
                spec_accept_length,
            } => {
                let info = TokenInfo {
                    id,
                    logprob: logprob.unwrap_or(0.0),
                    top: top_logprobs,
                };
                self.on_token(index, info, is_stop, spec_accept_length);
            }
            TokenEvent::Finished {
                reason,
                spec_accept_length,
                ..
            } => self.on_finished(index, reason.as_str(), spec_accept_length),
            TokenEvent::Failed(failure) => {
                let error = match &failure {
                    // The request's own grammar went past llguidance's limits: its fault.
                    engine::RequestFailure::Grammar(_) => ApiError::invalid(
                        "response_format",
                        format!("{failure}; simplify the schema or grammar"),
                    ),
                    _ => ApiError::internal(failure.to_string()),
                };
                self.queue.push_back(Update::Failed(error));
                self.complete(Outcome::Error);
            }
        }
    }

    /// A token of choice `index`: timed, counted, and (unless the choice is done or it is the stop
    /// token) decoded, checked for stop strings and parsed.
    fn on_token(
        &mut self,
        index: usize,
        info: TokenInfo,
        is_stop: bool,
        spec_accept_length: Option<f32>,
    ) {
        let now = Instant::now();
        let metrics = &self.state.metrics;
        let choice = &mut self.choices[index];
        if spec_accept_length.is_some() {
            choice.spec_accept_length = spec_accept_length;
        }
        match choice.last_token {
            None => metrics.ttft.observe((now - self.started).as_secs_f64()),
            Some(t) => metrics.itl.observe((now - t).as_secs_f64()),
        }
        choice.first_token.get_or_insert(now);
        choice.last_token = Some(now);
        choice.completion_tokens += 1;
        if choice.finish.is_some() || is_stop {
            return;
        }
        let id = info.id;
        let tokens = if self.logprobs {
            vec![info]
        } else {
            Vec::new()
        };
        let piece = match choice.decoder.push(&self.state.model().tokenizer, id) {
            Ok(p) => p,
            Err(e) => {
                self.queue
                    .push_back(Update::Failed(ApiError::internal(format!(
                        "cannot decode token {id}: {e}"
                    ))));
                self.complete(Outcome::Error);
                return;
            }
        };
        let (text, stopped) = choice.stop.push(&piece);
        let pieces = parse_text(&mut choice.parser, &text, &self.state);
        let enough_calls = choice.parser.is_done();
        let engine_id = choice.engine_id;
        self.queue.push_back(Update::Output {
            index,
            pieces,
            tokens,
        });
        if stopped || enough_calls {
            // A stop string, or all the tool calls it may make: end the engine's work on
            // this choice now.
            self.state.model().engine.stop(engine_id);
            self.finish_choice(index, "stop");
        }
    }

    /// The engine finished choice `index` (for `reason`): the text its decoder and stop-string
    /// check held back goes out, unless a stop string ended it already.
    fn on_finished(&mut self, index: usize, reason: &'static str, spec_accept_length: Option<f32>) {
        let choice = &mut self.choices[index];
        if spec_accept_length.is_some() {
            choice.spec_accept_length = spec_accept_length;
        }
        if choice.finish.is_some() {
            return;
        }
        let mut rest = choice.decoder.flush();
        let (text, stopped) = choice.stop.push(&rest);
        rest = text;
        if !stopped {
            rest.push_str(&choice.stop.finish());
        }
        let pieces = parse_text(&mut choice.parser, &rest, &self.state);
        if !pieces.is_empty() {
            self.queue.push_back(Update::Output {
                index,
                pieces,
                tokens: Vec::new(),
            });
        }
        let finish = if stopped { "stop" } else { reason };
        self.finish_choice(index, finish);
    }

    /// Ends choice `index`: what its parsers held back goes out, and a choice that called tools
    /// and stopped finishes with `tool_calls`.
    fn finish_choice(&mut self, index: usize, mut finish: &'static str) {
        let choice = &mut self.choices[index];
        let rest = choice.parser.finish();
        let pieces = count(rest, &self.state);
        if !pieces.is_empty() {
            self.queue.push_back(Update::Output {
                index,
                pieces,
                tokens: Vec::new(),
            });
        }
        if finish == "stop" && choice.parser.tool_calls() > 0 {
            finish = "tool_calls";
        }
        self.choices[index].finish = Some(finish);
        let stop_sequence = self.choices[index].stop.matched().map(str::to_string);
        self.queue.push_back(Update::Done {
            index,
            finish,
            stop_sequence,
        });
        if self.choices.iter().all(|c| c.finish.is_some()) {
            let outcome = if self.choices[0].finish == Some("length") {
                Outcome::Length
            } else {
                Outcome::Stop
            };
            self.complete(outcome);
        }
    }

    /// Records the request's end once: metrics and its log line.
    fn complete(&mut self, outcome: Outcome) {
        if self.outcome.is_some() {
            return;
        }
        self.outcome = Some(outcome);
        let latency = self.started.elapsed();
        let metrics = &self.state.metrics;
        metrics.finished(outcome);
        if outcome != Outcome::Abort {
            metrics.e2e.observe(latency.as_secs_f64());
        }
        let usage = self.usage();
        let ttft = self
            .choices
            .iter()
            .filter_map(|c| c.first_token)
            .min()
            .map(|t| (t - self.started).as_secs_f64() * 1e3);
        let finish = match outcome {
            Outcome::Stop => "stop",
            Outcome::Length => "length",
            Outcome::Abort => "abort",
            Outcome::Error => "error",
        };
        tracing::info!(
            id = self.choices.first().map(|c| c.engine_id),
            prompt_tokens = usage.prompt_tokens,
            completion_tokens = usage.completion_tokens,
            ttft_ms = ttft.map(|t| format!("{t:.1}")),
            latency_ms = format!("{:.1}", latency.as_secs_f64() * 1e3),
            finish_reason = finish,
            "request finished"
        );
    }
}

impl Drop for Generation {
    fn drop(&mut self) {
        // The client went away first: the forwarding tasks see the merged channel close and drop
        // their engine streams, which aborts the choices still running.
        self.complete(Outcome::Abort);
    }
}

/// Text through a choice's parsers (all of it content when it has none).
fn parse_text(parser: &mut OutputParser, text: &str, state: &AppState) -> Vec<Output> {
    count(parser.push(text), state)
}

/// Counts tool calls and malformed ones in the metrics; the malformed markers go no further.
fn count(outputs: Vec<Output>, state: &AppState) -> Vec<Output> {
    let m = &state.metrics;
    outputs
        .into_iter()
        .filter(|o| match o {
            Output::MalformedToolCall => {
                m.tool_call_errors.fetch_add(1, Relaxed);
                false
            }
            Output::ToolCall { .. } => {
                m.tool_calls.fetch_add(1, Relaxed);
                true
            }
            _ => true,
        })
        .collect()
}

/// Moves one choice's engine events into the merged channel until it ends or nobody listens.
async fn forward(
    index: usize,
    mut stream: engine::RequestStream,
    merged: mpsc::UnboundedSender<(usize, TokenEvent)>,
) {
    loop {
        tokio::select! {
            _ = merged.closed() => return,
            event = stream.events.recv() => {
                let Some(event) = event else { return };
                let last = matches!(event, TokenEvent::Finished { .. } | TokenEvent::Failed(_));
                if merged.send((index, event)).is_err() || last {
                    return;
                }
            }
        }
    }
}
