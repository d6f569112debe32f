//! `POST /v1/completions`: a text prompt, several, or token ids, each tokenized and generated
//! as it is (no template), answered as OpenAI's `text_completion`.

use crate::Shared;
use crate::error::ApiError;
use crate::generate::{Generation, ParseSpec, TokenInfo};
use crate::params::{self, GenParams, MAX_N};
use crate::parsers::Output;
use crate::request::{blocking, check_length, check_prompt_bytes, read_request};
use crate::respond::{Finish, SseChunk, StreamFormat, random_id, respond, to_json};
use crate::response_format::{self, Compiled};
use crate::responses::{self, ChoiceResult};
use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::response::Response;
use protocol::request::{CompletionRequest, PromptInput};
use std::time::Instant;

/// Every prompt checked and tokenized before any is submitted; `n` choices each (the best `n`
/// of `best_of`, by their tokens' summed log-probability, when `best_of` is larger).
pub(crate) async fn completions(
    State(state): State<Shared>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let started = Instant::now();
    let mut request: CompletionRequest = read_request(&state, body)?;
    let vocab = state.model().tokenizer.vocab_size();
    let mut params = params::for_completion(&request, vocab)?;
    let extras = Extras::parse(&request, &mut params)?;
    let format = response_format::parse(&request.generation)?;
    let compiled = response_format::compile(&state, format).await?;
    params.constraint = compiled.constraint;
    let unenforced = compiled.unenforced;
    let prompts = prompts(request.prompt.take().map(|p| p.0), vocab)?;
    drop(request);
    crate::generate::check_sequences(&state.model().engine, prompts.len(), params.n)?;
    for p in &prompts {
        if let Prompt::Text(t) = p {
            check_prompt_bytes(&state, t.len(), "prompt")?;
        }
    }
    let echoed = extras.echo.then(|| echo_texts(&state, &prompts));
    let prompts = tokenize(&state, prompts).await?;
    for p in &prompts {
        if p.is_empty() {
            return Err(ApiError::invalid("prompt", "the prompt is empty"));
        }
        check_length(&state, p, &params).map_err(|mut e| {
            if e.param.as_deref() == Some("messages") {
                e.param = Some("prompt".into());
            }
            e
        })?;
    }
    let generation = Generation::start(
        state.clone(),
        prompts,
        &params,
        &ParseSpec::default(),
        started,
    )?;
    let id = format!("cmpl-{}", random_id());
    let format = CompletionStream {
        state: state.clone(),
        id: id.clone(),
        logprobs: params.logprobs.is_some(),
        offsets: Vec::new(),
        echoed: echoed.clone().unwrap_or_default(),
        n: params.n,
    };
    respond(generation, &params, format, |results, usage| {
        let results = extras.best(results, params.n, echoed.as_deref());
        responses::completion(
            &id,
            &state.served_model_name,
            &state.model().tokenizer,
            results,
            usage,
            extras.logprobs,
        )
    })
    .await
    .map(|r| Compiled::mark(&unenforced, r))
}

/// The fields only completions have: `echo`, `best_of` and `suffix`.
struct Extras {
    echo: bool,
    /// Choices kept per prompt (the request's `n`) when `best_of` generated more.
    keep: Option<usize>,
    /// Whether the client asked for log-probabilities (`best_of` asks for them itself).
    logprobs: bool,
}

impl Extras {
    /// Reads them, and sets `params` to generate `best_of` choices a prompt.
    fn parse(request: &CompletionRequest, params: &mut GenParams) -> Result<Self, ApiError> {
        if request.suffix.as_ref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::invalid(
                "suffix",
                "`suffix` is not supported: this server has no fill-in-the-middle prompt format",
            ));
        }
        let echo = request.echo.unwrap_or(false);
        if echo && params.logprobs.is_some() {
            return Err(ApiError::invalid(
                "echo",
                "`echo` with `logprobs` is not supported: the prompt's log-probabilities are not computed",
            ));
        }
        let logprobs = params.logprobs.is_some();
        let best_of = params::integer("best_of", request.best_of, 1, MAX_N)?.map(|b| b as usize);
        let keep = match best_of {
            Some(b) if b < params.n => {
                return Err(ApiError::invalid(
                    "best_of",
                    format!("`best_of` ({b}) must be at least `n` ({})", params.n),
                ));
            }
            Some(b) if b > params.n && params.stream => {
                return Err(ApiError::invalid(
                    "best_of",
                    "`best_of` above `n` cannot be streamed",
                ));
            }
            Some(b) if b > params.n => {
                let keep = params.n;
                params.n = b;
                params.logprobs = Some(params.logprobs.unwrap_or(0));
                Some(keep)
            }
            _ => None,
        };
        Ok(Self {
            echo,
            keep,
            logprobs,
        })
    }

    /// The choices answered: each prompt's `keep` best by summed log-probability (all of them
    /// without `best_of`), with the prompt's text in front when echoing.
    fn best(
        &self,
        mut results: Vec<ChoiceResult>,
        n: usize,
        echoed: Option<&[String]>,
    ) -> Vec<ChoiceResult> {
        if let Some(keep) = self.keep {
            let score =
                |c: &ChoiceResult| c.tokens.iter().map(|t| f64::from(t.logprob)).sum::<f64>();
            let mut kept = Vec::new();
            while !results.is_empty() {
                let rest = results.split_off(n.min(results.len()));
                let mut group = std::mem::replace(&mut results, rest);
                group.sort_by(|a, b| score(b).total_cmp(&score(a)));
                group.truncate(keep);
                kept.extend(group);
            }
            results = kept;
        }
        if let Some(texts) = echoed {
            let per_prompt = self.keep.unwrap_or(n).max(1);
            for (i, c) in results.iter_mut().enumerate() {
                c.content.insert_str(0, &texts[i / per_prompt]);
            }
        }
        results
    }
}

/// Each prompt's text as `echo` repeats it (token ids decoded).
fn echo_texts(state: &Shared, prompts: &[Prompt]) -> Vec<String> {
    let tok = &state.model().tokenizer;
    prompts
        .iter()
        .map(|p| match p {
            Prompt::Text(t) => t.clone(),
            Prompt::Ids(ids) => tok.decode(ids, false).unwrap_or_default(),
        })
        .collect()
}

/// One prompt of a request: text is tokenized, token ids are taken as they are.
enum Prompt {
    Text(String),
    Ids(Vec<u32>),
}

/// `prompt`'s prompts, their token ids below `vocab`.
fn prompts(given: Option<Vec<PromptInput>>, vocab: usize) -> Result<Vec<Prompt>, ApiError> {
    let given = given.ok_or_else(|| ApiError::invalid("prompt", "`prompt` is required"))?;
    given
        .into_iter()
        .map(|p| match p {
            PromptInput::Text(t) => Ok(Prompt::Text(t)),
            PromptInput::Ids(ids) if ids.iter().all(|&id| (id as usize) < vocab) => {
                Ok(Prompt::Ids(ids))
            }
            PromptInput::Ids(_) => Err(ApiError::invalid(
                "prompt",
                format!("token ids must be integers below {vocab}"),
            )),
        })
        .collect()
}

/// The prompts as token ids (tokenized off the async threads).
async fn tokenize(state: &Shared, prompts: Vec<Prompt>) -> Result<Vec<Vec<u32>>, ApiError> {
    let state = state.clone();
    blocking(move || {
        prompts
            .into_iter()
            .map(|p| match p {
                Prompt::Ids(ids) => Ok(ids),
                Prompt::Text(t) => state
                    .model()
                    .tokenizer
                    .encode(&t, true, true)
                    .map_err(|e| ApiError::invalid("prompt", format!("cannot tokenize: {e}"))),
            })
            .collect()
    })
    .await
}

struct CompletionStream {
    state: Shared,
    id: String,
    logprobs: bool,
    /// Text offset of each choice so far (completions' `text_offset`).
    offsets: Vec<usize>,
    /// With `echo`: each prompt's text, sent first by its choices.
    echoed: Vec<String>,
    /// Choices per prompt.
    n: usize,
}

impl StreamFormat for CompletionStream {
    fn opening(&mut self, choices: usize) -> Vec<SseChunk> {
        self.offsets = vec![0; choices];
        if self.echoed.is_empty() {
            return Vec::new();
        }
        let model = &self.state.served_model_name;
        (0..choices)
            .map(|i| {
                let text = self.echoed[i / self.n.max(1)].clone();
                self.offsets[i] = text.len();
                to_json(&responses::completion_chunk(
                    &self.id, model, i, text, None, None,
                ))
                .into()
            })
            .collect()
    }

    fn output(&mut self, index: usize, pieces: Vec<Output>, tokens: &[TokenInfo]) -> Vec<SseChunk> {
        let text: String = pieces
            .into_iter()
            .filter_map(|p| match p {
                Output::Content(c) => Some(c),
                _ => None,
            })
            .collect();
        if text.is_empty() && tokens.is_empty() {
            return Vec::new();
        }
        let tok = &self.state.model().tokenizer;
        let logprobs = self
            .logprobs
            .then(|| responses::completion_logprobs(tok, tokens, self.offsets[index]));
        self.offsets[index] += text.len();
        let model = &self.state.served_model_name;
        vec![
            to_json(&responses::completion_chunk(
                &self.id, model, index, text, None, logprobs,
            ))
            .into(),
        ]
    }

    fn done(&mut self, index: usize, finish: Finish) -> Vec<SseChunk> {
        let model = &self.state.served_model_name;
        vec![
            to_json(&responses::completion_chunk(
                &self.id,
                model,
                index,
                String::new(),
                Some(finish.reason),
                None,
            ))
            .into(),
        ]
    }

    fn usage(&mut self, usage: protocol::Usage) -> Vec<SseChunk> {
        vec![
            to_json(&protocol::Completion {
                id: self.id.clone(),
                object: "text_completion".into(),
                created: responses::now_secs(),
                model: self.state.served_model_name.clone(),
                choices: Vec::new(),
                usage: Some(usage),
            })
            .into(),
        ]
    }
}
