//! The tool-call formats of the model families: the markup that opens and closes a call, how a
//! call's body reads as (name, arguments), and how calls are written back (for the history of a
//! template that cannot show them, for the tools prompt, and for the opening that `tool_choice`
//! forces).

use super::pythonic;
use super::scan::{Quotes, balanced_end};
use serde_json::{Value, json};

/// The model families' tool-call formats (`--tool-call-parser`, SGLang's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>{"name": …, "arguments": {…}}</tool_call>` (Hermes, Qwen 2.5, Qwen 3).
    Hermes,
    /// `{"name": …, "parameters": {…}}` at the start of the message, several joined by `;`,
    /// optionally after `<|python_tag|>` (Llama 3.1–3.3 JSON tool calling).
    Llama3,
    /// `[TOOL_CALLS] [{"name": …, "arguments": {…}}, …]`, or `[TOOL_CALLS]name[ARGS]{…}` of the
    /// newer tokenizers.
    Mistral,
    /// `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>name` and the arguments
    /// in a ```` ```json ```` block, `<｜tool▁call▁end｜>` … `<｜tool▁calls▁end｜>`; V3.1's
    /// `name<｜tool▁sep｜>{…}` too.
    DeepseekV3,
    /// `<|tool_calls_section_begin|><|tool_call_begin|>functions.name:0
    /// <|tool_call_argument_begin|>{…}<|tool_call_end|>…<|tool_calls_section_end|>`.
    KimiK2,
    /// `[name(arg=value, …), …]` at the start of the message (Llama 3.2+/4 pythonic templates),
    /// optionally inside `<|python_start|>` … `<|python_end|>`.
    Pythonic,
}

/// Where calls start and what is dropped around them.
#[derive(Debug)]
pub(super) struct Markup {
    /// Open a call; not part of its body.
    pub openers: &'static [&'static str],
    /// Opens a call where one may start without a marker (the message's start, right after a
    /// call or a `prefixes` marker); part of the body.
    pub implicit: Option<char>,
    /// Section markup around calls, dropped wherever it appears outside a call.
    pub wrappers: &'static [&'static str],
    /// Wrappers after which an implicit call may start.
    pub prefixes: &'static [&'static str],
    /// Dropped between calls.
    pub separator: Option<char>,
}

const DS_CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const DS_CALL_END: &str = "<｜tool▁call▁end｜>";
const DS_SEP: &str = "<｜tool▁sep｜>";
const DS_CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const DS_CALLS_END: &str = "<｜tool▁calls▁end｜>";
const KIMI_CALL_BEGIN: &str = "<|tool_call_begin|>";
const KIMI_CALL_END: &str = "<|tool_call_end|>";
const KIMI_ARGS: &str = "<|tool_call_argument_begin|>";
const KIMI_SECTION_BEGIN: &str = "<|tool_calls_section_begin|>";
const KIMI_SECTION_END: &str = "<|tool_calls_section_end|>";

impl ToolFormat {
    /// Every `--tool-call-parser` name, for help and errors.
    pub const NAMES: &'static str =
        "hermes (qwen25, qwen), llama3, mistral, deepseekv3, kimi_k2, pythonic";

    /// A `--tool-call-parser` name.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "hermes" | "qwen25" | "qwen" => Self::Hermes,
            "llama3" => Self::Llama3,
            "mistral" => Self::Mistral,
            "deepseekv3" => Self::DeepseekV3,
            "kimi_k2" => Self::KimiK2,
            "pythonic" => Self::Pythonic,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Hermes => "hermes",
            Self::Llama3 => "llama3",
            Self::Mistral => "mistral",
            Self::DeepseekV3 => "deepseekv3",
            Self::KimiK2 => "kimi_k2",
            Self::Pythonic => "pythonic",
        }
    }

    pub(super) fn markup(self) -> &'static Markup {
        const fn m(
            openers: &'static [&'static str],
            implicit: Option<char>,
            wrappers: &'static [&'static str],
            prefixes: &'static [&'static str],
            separator: Option<char>,
        ) -> Markup {
            Markup {
                openers,
                implicit,
                wrappers,
                prefixes,
                separator,
            }
        }
        static HERMES: Markup = m(&["<tool_call>"], None, &[], &[], None);
        static LLAMA3: Markup = m(
            &[],
            Some('{'),
            &["<|python_tag|>"],
            &["<|python_tag|>"],
            Some(';'),
        );
        static MISTRAL: Markup = m(&["[TOOL_CALLS]"], None, &[], &[], None);
        static DEEPSEEK: Markup = m(
            &[DS_CALL_BEGIN],
            None,
            &[DS_CALLS_BEGIN, DS_CALLS_END],
            &[],
            None,
        );
        static KIMI: Markup = m(
            &[KIMI_CALL_BEGIN],
            None,
            &[KIMI_SECTION_BEGIN, KIMI_SECTION_END],
            &[],
            None,
        );
        static PYTHONIC: Markup = m(
            &[],
            Some('['),
            &["<|python_start|>", "<|python_end|>"],
            &["<|python_start|>"],
            None,
        );
        match self {
            Self::Hermes => &HERMES,
            Self::Llama3 => &LLAMA3,
            Self::Mistral => &MISTRAL,
            Self::DeepseekV3 => &DEEPSEEK,
            Self::KimiK2 => &KIMI,
            Self::Pythonic => &PYTHONIC,
        }
    }

    /// The tag that closes a call opened by a marker, for formats that have one.
    fn closer(self) -> Option<&'static str> {
        match self {
            Self::Hermes => Some("</tool_call>"),
            Self::DeepseekV3 => Some(DS_CALL_END),
            Self::KimiK2 => Some(KIMI_CALL_END),
            Self::Llama3 | Self::Mistral | Self::Pythonic => None,
        }
    }

    /// Where the call whose body starts `body` ends: (the body's length, the bytes it takes
    /// with its closing markup); `None` while it is still open.
    pub(super) fn body_end(self, body: &str) -> Option<(usize, usize)> {
        if let Some(closer) = self.closer() {
            let close = body.find(closer).map(|at| (at, at + closer.len()));
            // A new call opened before this one closed ends it (the closer was left out).
            let reopen = self
                .markup()
                .openers
                .iter()
                .filter_map(|o| body.find(o))
                .min()
                .map(|at| (at, at));
            return match (close, reopen) {
                (Some(c), Some(r)) => Some(if r.0 < c.0 { r } else { c }),
                (c, r) => c.or(r),
            };
        }
        let end = match self {
            Self::Llama3 => balanced_end(body, Quotes::Json)?,
            Self::Pythonic => balanced_end(body, Quotes::Python)?,
            _ if body.trim_start().starts_with('[') => balanced_end(body, Quotes::Json)?,
            _ => {
                let args = body.find("[ARGS]")? + "[ARGS]".len();
                args + balanced_end(&body[args..], Quotes::Json)?
            }
        };
        Some((end, end))
    }

    /// The calls in one call's body: (name, arguments object).
    pub(super) fn parse_body(self, body: &str) -> Option<Vec<(String, Value)>> {
        let calls = match self {
            Self::Hermes => vec![json_call(body, &["arguments", "parameters"])?],
            Self::Llama3 => vec![json_call(body, &["parameters", "arguments"])?],
            Self::Mistral => match body.trim_start().strip_prefix('[') {
                Some(_) => match serde_json::from_str::<Value>(body.trim()).ok()? {
                    Value::Array(items) => items
                        .iter()
                        .map(|c| call_of(c, &["arguments", "parameters"]))
                        .collect::<Option<_>>()?,
                    _ => return None,
                },
                None => {
                    let (name, args) = body.split_once("[ARGS]")?;
                    vec![(identifier(name)?, arguments_of(args)?)]
                }
            },
            Self::DeepseekV3 => {
                let (head, rest) = body.split_once(DS_SEP)?;
                if matches!(head.trim(), "function" | "") {
                    let (name, args) = rest.split_once('\n').unwrap_or((rest, ""));
                    let args = args.trim();
                    let args = args.strip_prefix("```json").unwrap_or(args);
                    let args = args.trim_end().strip_suffix("```").unwrap_or(args);
                    vec![(identifier(name)?, arguments_of(args)?)]
                } else {
                    vec![(identifier(head)?, arguments_of(rest)?)]
                }
            }
            Self::KimiK2 => {
                let (head, args) = body.split_once(KIMI_ARGS)?;
                let head = head.trim();
                let head = head.strip_prefix("functions.").unwrap_or(head);
                let name = match head.rsplit_once(':') {
                    Some((name, index)) if index.bytes().all(|b| b.is_ascii_digit()) => name,
                    _ => head,
                };
                vec![(identifier(name)?, arguments_of(args)?)]
            }
            Self::Pythonic => pythonic::parse_calls(body)?,
        };
        (!calls.is_empty()).then_some(calls)
    }

    /// Whether a body that opened without a marker (and did not parse) was meant as a call:
    /// it is then malformed; otherwise it is ordinary text that looked like a call's start.
    pub(super) fn attempted(self, body: &str) -> bool {
        match self {
            Self::Llama3 => match serde_json::from_str::<Value>(body.trim()) {
                Ok(v) => v.get("name").is_some(),
                Err(_) => true,
            },
            Self::Pythonic => {
                let t = body.trim_start().trim_start_matches('[').trim_start();
                let ident = t
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
                    .unwrap_or(t.len());
                ident > 0 && t[ident..].trim_start().starts_with('(')
            }
            _ => true,
        }
    }

    /// Calls written the way this format's models write them (one assistant turn).
    pub fn write_calls(self, calls: &[(&str, &Value)]) -> String {
        let each = |f: &dyn Fn(&str, &Value) -> String| {
            calls.iter().map(|(n, a)| f(n, a)).collect::<Vec<_>>()
        };
        match self {
            Self::Hermes => each(&|n, a| {
                format!(
                    "<tool_call>\n{}\n</tool_call>",
                    json!({"name": n, "arguments": a})
                )
            })
            .join("\n"),
            Self::Llama3 => {
                each(&|n, a| json!({"name": n, "parameters": a}).to_string()).join("; ")
            }
            Self::Mistral => {
                let list: Vec<Value> = calls
                    .iter()
                    .map(|(n, a)| json!({"name": n, "arguments": a}))
                    .collect();
                format!("[TOOL_CALLS] {}", Value::Array(list))
            }
            Self::DeepseekV3 => format!(
                "{DS_CALLS_BEGIN}{}{DS_CALLS_END}",
                each(&|n, a| format!(
                    "{DS_CALL_BEGIN}function{DS_SEP}{n}\n```json\n{a}\n```{DS_CALL_END}"
                ))
                .concat()
            ),
            Self::KimiK2 => {
                let body: Vec<String> = calls
                    .iter()
                    .enumerate()
                    .map(|(i, (n, a))| {
                        format!("{KIMI_CALL_BEGIN}functions.{n}:{i}{KIMI_ARGS}{a}{KIMI_CALL_END}")
                    })
                    .collect();
                format!("{KIMI_SECTION_BEGIN}{}{KIMI_SECTION_END}", body.concat())
            }
            Self::Pythonic => pythonic::write_calls(calls),
        }
    }

    /// The opening of a call the model is made to continue (`tool_choice` `required`, or a
    /// named function: then up to where its arguments begin). `name` is a valid tool name.
    pub fn forced_opening(self, name: Option<&str>) -> String {
        let (start, named) = match self {
            Self::Hermes => ("<tool_call>\n{\"name\": \"", "\", \"arguments\": "),
            Self::Llama3 => ("{\"name\": \"", "\", \"parameters\": "),
            Self::Mistral => ("[TOOL_CALLS] [{\"name\": \"", "\", \"arguments\": "),
            Self::DeepseekV3 => (
                "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>",
                "\n```json\n",
            ),
            Self::KimiK2 => (
                "<|tool_calls_section_begin|><|tool_call_begin|>functions.",
                ":0<|tool_call_argument_begin|>",
            ),
            Self::Pythonic => ("[", "("),
        };
        match name {
            Some(n) => format!("{start}{n}{named}"),
            None => start.to_string(),
        }
    }
}

/// A function name as written between markup (trimmed; not empty, no spaces inside).
fn identifier(text: &str) -> Option<String> {
    let t = text.trim();
    (!t.is_empty() && !t.contains(char::is_whitespace)).then(|| t.to_string())
}

/// Arguments written as a JSON object (or a JSON string holding one); empty text is `{}`.
fn arguments_of(text: &str) -> Option<Value> {
    let t = text.trim();
    if t.is_empty() {
        return Some(json!({}));
    }
    object_arguments(serde_json::from_str(t).ok()?)
}

fn object_arguments(v: Value) -> Option<Value> {
    match v {
        Value::Null => Some(json!({})),
        Value::Object(_) => Some(v),
        // Some models write the arguments as a JSON string.
        Value::String(s) => match serde_json::from_str::<Value>(&s).ok()? {
            o @ Value::Object(_) => Some(o),
            _ => None,
        },
        _ => None,
    }
}

/// `{"name": "…", <one of keys>: {…}}` as (name, arguments); missing arguments are `{}`.
fn json_call(text: &str, keys: &[&str]) -> Option<(String, Value)> {
    call_of(&serde_json::from_str(text.trim()).ok()?, keys)
}

fn call_of(v: &Value, keys: &[&str]) -> Option<(String, Value)> {
    let name = identifier(v.get("name")?.as_str()?)?;
    let args = keys.iter().find_map(|k| v.get(*k)).cloned();
    Some((name, object_arguments(args.unwrap_or(Value::Null))?))
}
