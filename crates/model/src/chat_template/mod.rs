//! The chat template (`tokenizer.chat_template`), rendered with minijinja the way llama-server
//! renders it, so that the same messages give the same prompt text.
//!
//! What llama.cpp does around the Jinja itself, and this module repeats: messages are checked and
//! rebuilt in its shape ([`messages`]); text parts are joined when the template only takes string
//! content; a leading system message merges into the next when the template ignores it; the
//! context holds `messages`, `bos_token`, `eos_token`, `enable_thinking`, `date_string`,
//! `datetime`, `add_generation_prompt` (only when true) and any extra variables; a BOS the
//! tokenizer adds anyway is cut off the front; and a conversation ending with an assistant message
//! is continued: the prompt ends with that message's text, not with its end-of-turn marker.
//! Blocks are trimmed as in Python's transformers (`trim_blocks`, `lstrip_blocks`); Python string
//! methods come from `minijinja-contrib`'s pycompat; `{{ … }}` prints values as llama.cpp's
//! interpreter does (`True`/`False`, none as nothing, lists run together).

mod clock;
#[cfg(test)]
mod fuzz_tests;
mod messages;
#[cfg(test)]
mod tests;
mod values;

pub use messages::TemplateCaps;

use crate::gguf::{GgufError, GgufFile};
use crate::tokenizer::Tokenizer;
use minijinja::value::Kwargs;
use minijinja::{Environment, Error, ErrorKind, Value};
use serde_json::{Map, Value as Json, json};
use std::time::SystemTime;

/// llama.cpp's template for models without one.
pub const CHATML_TEMPLATE: &str = "{%- for message in messages -%}\n  {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>\\n' -}}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n  {{- '<|im_start|>assistant\\n' -}}\n{%- endif -%}";

const TEMPLATE_NAME: &str = "chat_template";
/// Marks errors raised by the template's own `raise_exception`.
const RAISED: &str = "raise_exception: ";

/// The work one render may do (minijinja's fuel: about one unit an instruction and one per 64
/// bytes of data made): a model's template comes from its file, and one that loops for ever or
/// builds a string without end must fail the request, not hold a thread. The largest request
/// body's conversation takes a few million; this bounds a render to about a second and 1.3 GB.
pub const TEMPLATE_FUEL: u64 = 20_000_000;

#[derive(Debug, thiserror::Error)]
pub enum ChatTemplateError {
    #[error("the chat template does not parse: {0}")]
    Syntax(String),
    #[error("the chat template raised an exception: {0}")]
    Raised(String),
    #[error("the chat template failed to render: {0}")]
    Render(String),
    #[error("invalid messages: {0}")]
    InvalidMessages(String),
    #[error("chat template metadata: {0}")]
    Metadata(#[from] GgufError),
}

/// The special tokens a template sees, and whether the tokenizer adds BOS/EOS itself.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SpecialTokens {
    pub bos_token: String,
    pub eos_token: String,
    /// A rendered prompt that starts with `bos_token` loses it (the tokenizer will add one).
    pub add_bos: bool,
    /// A rendered prompt that ends with `eos_token` loses it.
    pub add_eos: bool,
}

/// Per-request rendering options; the defaults are llama-server's.
#[derive(Debug, Clone)]
pub struct ChatOptions {
    /// End with the assistant's opening (default on).
    pub add_generation_prompt: bool,
    /// A final assistant message is continued instead of closed (default on, as
    /// llama-server's `--prefill-assistant`); turns `add_generation_prompt` off for that request.
    pub prefill_assistant: bool,
    /// `enable_thinking`; `None`: on when the template mentions it (llama-server turns it on for
    /// templates that support thinking), off otherwise.
    pub enable_thinking: Option<bool>,
    /// OpenAI-style `tools` (`[{"type": "function", "function": {…}}]`), passed to the
    /// template in llama.cpp's shape when not empty.
    pub tools: Option<Json>,
    /// More variables (`chat_template_kwargs`); they override the built-in ones.
    pub extra: Map<String, Json>,
    /// The time for `strftime_now`, `date_string` and `datetime` (default: now; UTC).
    pub now: Option<SystemTime>,
}

impl Default for ChatOptions {
    fn default() -> Self {
        Self {
            add_generation_prompt: true,
            prefill_assistant: true,
            enable_thinking: None,
            tools: None,
            extra: Map::new(),
            now: None,
        }
    }
}

/// A parsed chat template. Rendering takes `&self`; `Send + Sync`.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    tokens: SpecialTokens,
    caps: TemplateCaps,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("tokens", &self.tokens)
            .field("caps", &self.caps)
            .finish()
    }
}

impl ChatTemplate {
    /// Parses `source`; a template that does not parse is an error naming the line.
    pub fn new(source: &str, tokens: SpecialTokens) -> Result<Self, ChatTemplateError> {
        let mut env = environment();
        env.add_template_owned(TEMPLATE_NAME, source.to_string())
            .map_err(|e| ChatTemplateError::Syntax(describe(&e)))?;
        let mut t = Self {
            env,
            source: source.to_string(),
            tokens,
            caps: TemplateCaps {
                supports_string_content: true,
                supports_typed_content: false,
                supports_system_role: true,
                supports_tools: false,
                supports_tool_calls: false,
                supports_tool_responses: false,
                requires_object_arguments: false,
            },
        };
        t.caps = t.probe_caps();
        Ok(t)
    }

    /// The model's template (`tokenizer.chat_template`, or ChatML when it has none, as in
    /// llama.cpp), with BOS/EOS texts and flags from the tokenizer.
    pub fn from_gguf(gguf: &GgufFile, tok: &Tokenizer) -> Result<Self, ChatTemplateError> {
        let source = match gguf.get("tokenizer.chat_template") {
            None => "",
            Some(_) => gguf.get_str("tokenizer.chat_template")?,
        };
        let source = if source.is_empty() || source == "chatml" {
            CHATML_TEMPLATE
        } else {
            source
        };
        let piece = |id: Option<u32>| {
            id.and_then(|id| tok.token_to_piece(id, true))
                .map(|p| String::from_utf8_lossy(p).into_owned())
                .unwrap_or_default()
        };
        let tokens = SpecialTokens {
            bos_token: piece(tok.bos_id()),
            eos_token: piece(tok.eos_id()),
            add_bos: tok.add_bos(),
            add_eos: tok.add_eos(),
        };
        Self::new(source, tokens)
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.tokens
    }

    /// What the probes found the template to accept.
    pub fn caps(&self) -> &TemplateCaps {
        &self.caps
    }

    /// The prompt for OpenAI-style `messages` (`{"role", "content"}`, content a string or a list
    /// of `{"type": "text", "text"}` parts), as llama-server's `/apply-template` gives it.
    pub fn render(
        &self,
        messages: &[Json],
        opts: &ChatOptions,
    ) -> Result<String, ChatTemplateError> {
        let mut parsed = messages::parse(messages)?;
        let mut add_generation_prompt = opts.add_generation_prompt;
        let mut continued = None;
        if opts.prefill_assistant && parsed.last().is_some_and(|m| m.role == "assistant") {
            let n = parsed.len();
            if n >= 2 && parsed[n - 2].role == "assistant" {
                return Err(ChatTemplateError::InvalidMessages(
                    "Cannot have 2 or more assistant messages at the end of the list.".into(),
                ));
            }
            continued = parsed.pop();
            add_generation_prompt = false;
        }
        let mut msgs: Vec<Json> = parsed.iter().map(messages::Message::to_json).collect();
        if self.caps.requires_object_arguments {
            messages::object_arguments(&mut msgs);
        }
        messages::normalize_content(&mut msgs, &self.caps);
        messages::apply_workarounds(&mut msgs, &self.source, &self.caps)?;

        let tools = match &opts.tools {
            Some(t) => messages::normalize_tools(t)?,
            None => None,
        };
        let ctx = self.context(msgs, tools, opts);
        let prompt = self.render_with(&ctx, add_generation_prompt)?;
        let Some(last) = continued else {
            return Ok(prompt);
        };
        // The assistant's opening, as the difference the flag makes, then the message's text.
        let with_opening = self.render_with(&ctx, true)?;
        let common = common_prefix_len(&prompt, &with_opening);
        Ok(format!(
            "{prompt}{}{}",
            &with_opening[common..],
            last.render_content()
        ))
    }

    /// Renders with exactly the variables in `context` (a JSON object): no message handling, no
    /// BOS stripping. For tests and tools that need the bare template.
    pub fn render_context(&self, context: &Json) -> Result<String, ChatTemplateError> {
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatTemplateError::Render(describe(&e)))?;
        tmpl.render(values::to_value(context)).map_err(render_error)
    }

    /// The variables llama.cpp passes, without `add_generation_prompt`.
    fn context(
        &self,
        messages: Vec<Json>,
        tools: Option<Json>,
        opts: &ChatOptions,
    ) -> Map<String, Json> {
        let now = opts.now.unwrap_or_else(SystemTime::now);
        let mut ctx = Map::new();
        ctx.insert("messages".into(), Json::Array(messages));
        ctx.insert("bos_token".into(), json!(self.tokens.bos_token));
        ctx.insert("eos_token".into(), json!(self.tokens.eos_token));
        let thinking = opts
            .enable_thinking
            .unwrap_or_else(|| self.source.contains("enable_thinking"));
        ctx.insert("enable_thinking".into(), json!(thinking));
        if let Some(tools) = tools {
            ctx.insert("tools".into(), tools);
        }
        ctx.insert("datetime".into(), json!(clock::strftime(now, "%b %d %Y")));
        ctx.insert(
            "date_string".into(),
            json!(clock::strftime(now, "%d %b %Y")),
        );
        // `strftime_now` reads this; templates cannot see it under a name they would use.
        ctx.insert(NOW_KEY.into(), json!(unix_secs(now)));
        for (k, v) in &opts.extra {
            ctx.insert(k.clone(), v.clone());
        }
        ctx
    }

    fn render_with(
        &self,
        ctx: &Map<String, Json>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        let mut ctx = ctx.clone();
        if add_generation_prompt {
            ctx.insert("add_generation_prompt".into(), Json::Bool(true));
        }
        let mut out = self.render_context(&Json::Object(ctx))?;
        let t = &self.tokens;
        if t.add_bos && !t.bos_token.is_empty() && out.starts_with(&t.bos_token) {
            out.drain(..t.bos_token.len());
        }
        if t.add_eos && !t.eos_token.is_empty() && out.ends_with(&t.eos_token) {
            out.truncate(out.len() - t.eos_token.len());
        }
        Ok(out)
    }

    /// Renders small probe conversations to learn whether the template shows string content,
    /// typed (list) content, a system message, tools, tool calls and tool results — llama.cpp's
    /// `caps_get` watches how its own interpreter touches the values instead; the probes reach
    /// the same answers for templates that use content as text, iterate over its parts, or drop
    /// what they do not know.
    fn probe_caps(&self) -> TemplateCaps {
        let probe = |messages: Json, tools: Option<Json>| {
            let mut ctx = json!({"messages": messages, "bos_token": "", "eos_token": "", "add_generation_prompt": true});
            if let Some(tools) = tools {
                ctx["tools"] = tools;
            }
            self.render_context(&ctx).ok()
        };
        const MARK: &str = "PROBE_MARKER_7f3a";
        let shown = |out: &Option<String>| {
            out.as_deref().is_some_and(|o| {
                o.contains(MARK)
                    && !o.contains(&format!("\"{MARK}\""))
                    && !o.contains(&format!("'{MARK}'"))
            })
        };
        let string = probe(json!([{"role": "user", "content": MARK}]), None);
        let typed = probe(
            json!([{"role": "user", "content": [{"type": "text", "text": MARK}]}]),
            None,
        );
        let system = probe(
            json!([
                {"role": "system", "content": MARK},
                {"role": "user", "content": "User message"}
            ]),
            None,
        );
        let supports_typed_content = shown(&typed);
        let contains =
            |out: &Option<String>, needle: &str| out.as_deref().is_some_and(|o| o.contains(needle));
        const TOOL: &str = "probe_tool_7f3a";
        // The call names another function, so that a template showing the tools list does not
        // pass for one showing the call.
        const CALL: &str = "probe_call_7f3a";
        const RESULT: &str = "PROBE_RESULT_7f3a";
        let tools = json!([{"type": "function", "function": {
            "name": TOOL, "description": "", "parameters": {"type": "object", "properties": {}}}}]);
        let with_tools = probe(
            json!([{"role": "user", "content": "x"}]),
            Some(tools.clone()),
        );
        // A call and its result; arguments once as JSON text (OpenAI's form), once as an object.
        // The id is 9 letters and digits, which Mistral's templates insist on.
        let conversation = |arguments: Json| {
            json!([
                {"role": "user", "content": "x"},
                {"role": "assistant", "content": "", "tool_calls": [{"id": "probe0001", "type": "function",
                    "function": {"name": CALL, "arguments": arguments}}]},
                {"role": "tool", "tool_call_id": "probe0001", "content": RESULT},
                {"role": "user", "content": "y"}
            ])
        };
        let as_text = probe(
            conversation(json!("{\"probe_arg\": 1}")),
            Some(tools.clone()),
        );
        let as_object = probe(conversation(json!({"probe_arg": 1})), Some(tools));
        TemplateCaps {
            // A template that breaks on both keeps llama.cpp's default (strings).
            supports_string_content: string.is_some() || !supports_typed_content,
            supports_typed_content,
            supports_system_role: system.is_some_and(|o| o.contains(MARK)),
            supports_tools: contains(&with_tools, TOOL),
            supports_tool_calls: contains(&as_text, CALL) || contains(&as_object, CALL),
            supports_tool_responses: contains(&as_text, RESULT) || contains(&as_object, RESULT),
            requires_object_arguments: !contains(&as_text, "{\"probe_arg\": 1}")
                && contains(&as_object, "probe_arg"),
        }
    }
}

const NOW_KEY: &str = "__specula_now";

fn unix_secs(t: SystemTime) -> i64 {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    }
}

fn common_prefix_len(a: &str, b: &str) -> usize {
    let n = a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count();
    // Back off to a char boundary of both.
    (0..=n)
        .rev()
        .find(|&i| a.is_char_boundary(i) && b.is_char_boundary(i))
        .unwrap_or(0)
}

/// A minijinja error as one line: kind, detail, template line.
fn describe(e: &Error) -> String {
    let mut s = match e.detail() {
        Some(d) => format!("{}: {d}", e.kind()),
        None => e.kind().to_string(),
    };
    if let Some(line) = e.line() {
        s.push_str(&format!(" (line {line})"));
    }
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(&format!(": {inner}"));
        src = inner.source();
    }
    s
}

fn render_error(e: Error) -> ChatTemplateError {
    if let Some(msg) = e.detail().and_then(|d| d.strip_prefix(RAISED)) {
        return ChatTemplateError::Raised(msg.to_string());
    }
    if e.kind() == ErrorKind::SyntaxError {
        return ChatTemplateError::Syntax(describe(&e));
    }
    if e.kind() == ErrorKind::OutOfFuel {
        return ChatTemplateError::Render(format!(
            "the chat template did more work than a render may ({TEMPLATE_FUEL} steps)"
        ));
    }
    ChatTemplateError::Render(describe(&e))
}

/// The environment every template gets.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    // Default delimiters: building cannot fail.
    if let Ok(syntax) = minijinja::syntax::SyntaxConfig::builder()
        .trim_blocks(true)
        .lstrip_blocks(true)
        .build()
    {
        env.set_syntax(syntax);
    }
    env.set_debug(false);
    env.set_fuel(Some(TEMPLATE_FUEL));
    minijinja_contrib::add_to_environment(&mut env);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.set_formatter(write_value);
    env.add_function("raise_exception", |msg: String| -> Result<Value, Error> {
        Err(Error::new(
            ErrorKind::InvalidOperation,
            format!("{RAISED}{msg}"),
        ))
    });
    env.add_function(
        "strftime_now",
        |state: &minijinja::State, format: String| -> Result<Value, Error> {
            let secs = state
                .lookup(NOW_KEY)
                .and_then(|v| v.as_i64())
                .unwrap_or_else(|| unix_secs(SystemTime::now()));
            let t = if secs >= 0 {
                SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs as u64)
            } else {
                SystemTime::UNIX_EPOCH - std::time::Duration::from_secs(secs.unsigned_abs())
            };
            Ok(Value::from(clock::strftime(t, &format)))
        },
    );
    env.add_filter("tojson", tojson);
    env
}

/// `{{ … }}` output as llama.cpp's interpreter writes it: strings and numbers as text (floats
/// via `std::to_string`), booleans as `True`/`False`, lists as their items run together, and
/// none, undefined and maps as nothing.
fn write_value(
    out: &mut minijinja::Output,
    state: &mut minijinja::State,
    value: &Value,
) -> Result<(), Error> {
    use minijinja::value::ValueKind as K;
    match value.kind() {
        K::String => minijinja::escape_formatter(out, state, value),
        K::Bool => out
            .write_str(if value.is_true() { "True" } else { "False" })
            .map_err(Error::from),
        K::Number => match values::float_of(value) {
            Some(f) => out
                .write_str(&values::format_float_output(f))
                .map_err(Error::from),
            None => minijinja::escape_formatter(out, state, value),
        },
        K::Seq => {
            for item in value.try_iter()? {
                write_value(out, state, &item)?;
            }
            Ok(())
        }
        _ => Ok(()),
    }
}

/// `tojson` as Python's `json.dumps` (transformers' filter): `", "`/`": "` separators, non-ASCII
/// kept, `indent`, `ensure_ascii`, `separators` and `sort_keys` honoured.
fn tojson(value: &Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, Error> {
    let indent = match indent {
        Some(v) => Some(v),
        None => kwargs.get::<Option<Value>>("indent")?,
    };
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_string()),
            None => Some(" ".repeat(usize::try_from(v)?)),
        },
    };
    let mut style = values::DumpStyle::python(indent);
    if let Some(b) = kwargs.get::<Option<bool>>("ensure_ascii")? {
        style.ensure_ascii = b;
    }
    if let Some(b) = kwargs.get::<Option<bool>>("sort_keys")? {
        style.sort_keys = b;
    }
    if let Some(seps) = kwargs.get::<Option<Value>>("separators")?
        && !seps.is_none()
    {
        let mut it = seps.try_iter()?;
        if let (Some(a), Some(b)) = (it.next(), it.next()) {
            style.item_sep = a.to_string();
            style.key_sep = b.to_string();
        }
    }
    kwargs.assert_all_used()?;
    Ok(Value::from_safe_string(values::dumps(value, &style)?))
}
