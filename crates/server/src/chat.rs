//! `POST /v1/chat/completions`: messages (and tools) through the chat template, the generation,
//! and the output through the reasoning and tool-call parsers into OpenAI's message or stream
//! deltas (`reasoning_content`, `tool_calls`).

use crate::Shared;
use crate::error::ApiError;
use crate::generate::{Generation, ParseSpec, TokenInfo};
use crate::params::{self, GenParams};
use crate::parsers::{Output, ToolFormat};
use crate::request::{blocking, check_length, check_prompt_bytes, read_request};
use crate::respond::{Finish, SseChunk, StreamFormat, random_id, respond, to_json};
use crate::response_format::{self, Compiled};
use crate::responses;
use crate::tool_request::{self, ToolRequest};
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::Response;
use model::chat_template::ChatOptions;
use protocol::request::ChatCompletionRequest;
use protocol::{ChatCompletionChunk, Delta, FunctionCallDelta, ToolCallDelta};
use serde_json::{Value, json};
use std::time::Instant;

pub(crate) async fn chat(
    State(state): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let request: ChatCompletionRequest = read_request(&state, body)?;
    let run = ChatRun::start(&state, request, started).await?;
    let id = format!("chatcmpl-{}", random_id());
    let logprobs = run.params.logprobs.is_some();
    let format = ChatStream {
        state: state.clone(),
        id: id.clone(),
        logprobs,
    };
    respond(run.generation, &run.params, format, |results, usage| {
        responses::chat_completion(
            &id,
            &state.served_model_name,
            &state.model().tokenizer,
            results,
            usage,
            logprobs,
        )
    })
    .await
    .map(|r| Compiled::mark(&run.unenforced, r))
}

/// A chat request under way: its generation, its parameters, and what of its output language
/// is not enforced. Chat completions, Anthropic's Messages and the Responses API each start one
/// and shape its output their own way.
pub(crate) struct ChatRun {
    pub generation: Generation,
    pub params: GenParams,
    pub unenforced: Vec<String>,
    /// The prompt's tokens.
    pub prompt_tokens: usize,
}

impl ChatRun {
    /// Checks `request`, renders and tokenizes its prompt, compiles its grammar and queues it.
    pub(crate) async fn start(
        state: &Shared,
        request: ChatCompletionRequest,
        started: Instant,
    ) -> Result<Self, ApiError> {
        let prepared = PreparedChat::new(state, request).await?;
        check_length(state, &prepared.prompt, &prepared.params)?;
        let prompt_tokens = prepared.prompt.len();
        let generation = Generation::start(
            state.clone(),
            vec![prepared.prompt],
            &prepared.params,
            &prepared.parse,
            started,
        )?;
        Ok(Self {
            generation,
            params: prepared.params,
            unenforced: prepared.unenforced,
            prompt_tokens,
        })
    }
}

/// A chat request checked, its prompt rendered and tokenized and its grammar compiled, not yet
/// queued (Anthropic's `count_tokens` stops here).
pub(crate) struct PreparedChat {
    pub prompt: Vec<u32>,
    params: GenParams,
    parse: ParseSpec,
    unenforced: Vec<String>,
}

impl PreparedChat {
    pub(crate) async fn new(
        state: &Shared,
        mut request: ChatCompletionRequest,
    ) -> Result<Self, ApiError> {
        let mut params = params::for_chat(&request, state.model().tokenizer.vocab_size())?;
        let output_format = response_format::parse(&request.generation)?;
        let messages = match request.messages.take() {
            Some(m) if !m.is_empty() => m,
            Some(_) => return Err(ApiError::invalid("messages", "`messages` is empty")),
            None => return Err(ApiError::invalid("messages", "`messages` is required")),
        };
        // Text that cannot fit the context however it is tokenized is refused before rendering.
        check_prompt_bytes(state, text_bytes(&messages), "messages")?;
        let (opts, enable_thinking) = template_options(&request)?;
        let separate_reasoning = request.separate_reasoning.unwrap_or(true);
        let tools = ToolRequest::parse(&request)?;
        drop(request);
        tool_request::check_history(&messages)?;
        if tools.forced().is_some() && state.tool_parser.is_none() {
            return Err(ApiError::invalid(
                "tool_choice",
                "`tool_choice` required or a named function needs the server started with --tool-call-parser",
            ));
        }
        // Without a parser, a template that cannot take tools still gets them, in Hermes' syntax.
        let format = state.tool_parser.unwrap_or(ToolFormat::Hermes);
        let opening = tools
            .forced()
            .map(|name| format.forced_opening(name))
            .unwrap_or_default();
        // A forced call is generated under its grammar (the answer is the call, not text), and
        // so are the calls of strict functions.
        let grammar = tools.grammar(state.tool_parser, output_format)?;
        let compiled = response_format::compile(state, grammar).await?;
        params.constraint = compiled.constraint;
        let tool_spec = state.tool_parser.filter(|_| tools.offered()).map(|f| {
            let most = if tools.parallel { usize::MAX } else { 1 };
            (f, most, tools.names())
        });
        let prompt = Prompt {
            messages,
            opts,
            tools,
            format,
            prefill: opening.clone(),
        };
        let (prompt, text) = prompt.render(state).await?;
        let parse = ParseSpec {
            // A forced call's opening ends the prompt: no thought comes before it.
            reasoning: state
                .reasoning_parser
                .filter(|_| separate_reasoning && opening.is_empty())
                .map(|f| (f, f.starts_inside(&text, enable_thinking))),
            tools: tool_spec,
            prefill: opening,
        };
        Ok(Self {
            prompt,
            params,
            parse,
            unenforced: compiled.unenforced,
        })
    }
}

/// The bytes of every string in `messages` (walked without recursion).
fn text_bytes(messages: &[Value]) -> usize {
    let mut stack: Vec<&Value> = messages.iter().collect();
    let mut bytes = 0usize;
    while let Some(v) = stack.pop() {
        match v {
            Value::String(s) => bytes = bytes.saturating_add(s.len()),
            Value::Array(items) => stack.extend(items),
            Value::Object(map) => stack.extend(map.values()),
            _ => {}
        }
    }
    bytes
}

/// `add_generation_prompt` and `chat_template_kwargs` as the template's options, and
/// `chat_template_kwargs.enable_thinking` (`None`: not given).
fn template_options(
    request: &ChatCompletionRequest,
) -> Result<(ChatOptions, Option<bool>), ApiError> {
    let mut opts = ChatOptions::default();
    if let Some(v) = request.add_generation_prompt {
        opts.add_generation_prompt = v;
    }
    if let Some(kw) = &request.chat_template_kwargs {
        opts.extra = kw.clone();
    }
    let enable_thinking = match opts.extra.get("enable_thinking") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(_) => {
            return Err(ApiError::invalid(
                "chat_template_kwargs",
                "`chat_template_kwargs.enable_thinking` must be a boolean",
            ));
        }
    };
    Ok((opts, enable_thinking))
}

/// What the chat template renders: the messages, its options, and the tools (adapted to what
/// the template can take, in `format`), then `prefill` after the rendered text.
struct Prompt {
    messages: Vec<Value>,
    opts: ChatOptions,
    tools: ToolRequest,
    format: ToolFormat,
    prefill: String,
}

impl Prompt {
    /// The prompt's token ids and its text (rendered and tokenized off the async threads).
    async fn render(self, state: &Shared) -> Result<(Vec<u32>, String), ApiError> {
        let state = state.clone();
        let Prompt {
            mut messages,
            mut opts,
            tools,
            format,
            prefill,
        } = self;
        blocking(move || {
            let template = state
                .model()
                .template
                .as_ref()
                .ok_or_else(|| ApiError::bad_request("this model has no chat template"))?;
            opts.tools = tools.adapt(&mut messages, template.caps(), format);
            let mut text = template
                .render(&messages, &opts)
                .map_err(|e| ApiError::invalid("messages", e.to_string()))?;
            text.push_str(&prefill);
            check_prompt_bytes(&state, text.len(), "messages")?;
            let ids = state
                .model()
                .tokenizer
                .encode(&text, true, true)
                .map_err(|e| ApiError::invalid("messages", format!("cannot tokenize: {e}")))?;
            Ok((ids, text))
        })
        .await
    }
}

struct ChatStream {
    state: Shared,
    id: String,
    logprobs: bool,
}

impl ChatStream {
    fn chunk(
        &self,
        index: usize,
        delta: Delta,
        finish: Option<&str>,
        logprobs: Option<Value>,
    ) -> SseChunk {
        let model = &self.state.served_model_name;
        to_json(&responses::chat_chunk(
            &self.id, model, index, delta, finish, logprobs,
        ))
        .into()
    }
}

/// The delta of one piece of output: a tool call's first delta carries its id, type and name
/// (and empty arguments), later ones its argument text.
fn delta_of(piece: Output) -> Option<Delta> {
    let call = |index: usize, id: Option<String>, function: FunctionCallDelta| Delta {
        tool_calls: Some(vec![ToolCallDelta {
            index: index as u32,
            kind: id.as_ref().map(|_| "function".to_string()),
            id,
            function: Some(function),
        }]),
        ..Delta::default()
    };
    Some(match piece {
        Output::Content(c) => Delta {
            content: Some(c),
            ..Delta::default()
        },
        Output::Reasoning(r) => Delta {
            reasoning_content: Some(r),
            ..Delta::default()
        },
        Output::ToolCall { index, id, name } => call(
            index,
            Some(id),
            FunctionCallDelta {
                name: Some(name),
                arguments: Some(String::new()),
            },
        ),
        Output::ToolArguments { index, fragment } => call(
            index,
            None,
            FunctionCallDelta {
                name: None,
                arguments: Some(fragment),
            },
        ),
        Output::MalformedToolCall => return None,
    })
}

impl StreamFormat for ChatStream {
    fn opening(&mut self, choices: usize) -> Vec<SseChunk> {
        (0..choices)
            .map(|i| {
                let delta = Delta {
                    role: Some("assistant".into()),
                    content: Some(String::new()),
                    ..Delta::default()
                };
                self.chunk(i, delta, None, None)
            })
            .collect()
    }

    fn output(&mut self, index: usize, pieces: Vec<Output>, tokens: &[TokenInfo]) -> Vec<SseChunk> {
        let mut logprobs = (self.logprobs && !tokens.is_empty()).then(
            || json!({"content": responses::chat_logprobs(&self.state.model().tokenizer, tokens)}),
        );
        let mut deltas: Vec<Delta> = pieces.into_iter().filter_map(delta_of).collect();
        if deltas.is_empty() && logprobs.is_some() {
            // Tokens whose text the parsers hold back still report their log-probabilities.
            deltas.push(Delta {
                content: Some(String::new()),
                ..Delta::default()
            });
        }
        deltas
            .into_iter()
            .map(|d| self.chunk(index, d, None, logprobs.take()))
            .collect()
    }

    fn done(&mut self, index: usize, finish: Finish) -> Vec<SseChunk> {
        vec![self.chunk(index, Delta::default(), Some(finish.reason), None)]
    }

    fn usage(&mut self, usage: protocol::Usage) -> Vec<SseChunk> {
        vec![
            to_json(&ChatCompletionChunk {
                id: self.id.clone(),
                object: "chat.completion.chunk".into(),
                created: responses::now_secs(),
                model: self.state.served_model_name.clone(),
                choices: Vec::new(),
                usage: Some(usage),
            })
            .into(),
        ]
    }
}
