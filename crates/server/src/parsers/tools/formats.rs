//! The tool-call formats of the model families: the markup that opens and closes a call, how a
//! call's body reads as (name, arguments), and how calls are written back (for the history of a
//! template that cannot show them, for the tools prompt, and for the opening that `tool_choice`
//! forces).

use super::pythonic;
use super::scan::{Quotes, Scan};
use serde_json::{Value, json};

/// The model families' tool-call formats (`--tool-call-parser`, SGLang's names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// `<tool_call>{"name": …, "arguments": {…}}</tool_call>` (Hermes, Qwen 2.5, Qwen 3); a
    /// whole answer that is such an object without the tags, or a list of them, bare or in a
    /// ```` ```json ```` fence, naming offered tools, is a call too (Qwen2.5-Coder writes them so).
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

/// The state of the search for the end of one call's body.
#[derive(Debug, Clone, Default)]
pub(super) struct BodyScan {
    scan: Scan,
    /// Mistral's `name[ARGS]{…}`: where the arguments start, once found.
    args: Option<usize>,
}

/// Where calls start and what is dropped around them.
#[derive(Debug)]
pub(super) struct Markup {
    /// Open a call; not part of its body.
    pub openers: &'static [&'static str],
    /// Open a call where one may start without a marker (the message's start, right after a
    /// call or a `prefixes` marker); part of the body.
    pub implicit: &'static [char],
    /// Section markup around calls, dropped wherever it appears outside a call.
    pub wrappers: &'static [&'static str],
    /// Wrappers after which an implicit call may start.
    pub prefixes: &'static [&'static str],
    /// Dropped between calls.
    pub separator: Option<char>,
    /// A call opened without a marker is one only if it is the whole message and names an
    /// offered tool (it is held to the end); otherwise it is content.
    pub implicit_is_whole: bool,
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
            implicit: &'static [char],
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
                implicit_is_whole: false,
            }
        }
        static HERMES: Markup = Markup {
            implicit_is_whole: true,
            ..m(&["<tool_call>"], &['{', '`'], &[], &[], None)
        };
        static LLAMA3: Markup = m(
            &[],
            &['{'],
            &["<|python_tag|>"],
            &["<|python_tag|>"],
            Some(';'),
        );
        static MISTRAL: Markup = m(&["[TOOL_CALLS]"], &[], &[], &[], None);
        static DEEPSEEK: Markup = m(
            &[DS_CALL_BEGIN],
            &[],
            &[DS_CALLS_BEGIN, DS_CALLS_END],
            &[],
            None,
        );
        static KIMI: Markup = m(
            &[KIMI_CALL_BEGIN],
            &[],
            &[KIMI_SECTION_BEGIN, KIMI_SECTION_END],
            &[],
            None,
        );
        static PYTHONIC: Markup = m(
            &[],
            &['['],
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

    /// For formats whose calls end with a tag: that tag, then the openers (a call opened
    /// before the last one closed ends it: the closer was left out).
    fn call_ends(self) -> Option<&'static [&'static str]> {
        match self {
            Self::Hermes => Some(&["</tool_call>", "<tool_call>"]),
            Self::DeepseekV3 => Some(&[DS_CALL_END, DS_CALL_BEGIN]),
            Self::KimiK2 => Some(&[KIMI_CALL_END, KIMI_CALL_BEGIN]),
            Self::Llama3 | Self::Mistral | Self::Pythonic => None,
        }
    }

    /// Where the call whose body starts `body` ends: (the body's length, the bytes it takes
    /// with its closing markup); `None` while it is still open. `scan` carries the search from
    /// one call to the next as the body grows (a fresh one per call).
    pub(super) fn body_end(self, body: &str, scan: &mut BodyScan) -> Option<(usize, usize)> {
        if let Some(ends) = self.call_ends() {
            let (at, tag) = scan.scan.find_tag(body, ends)?;
            return Some(if tag == ends[0] {
                (at, at + tag.len())
            } else {
                (at, at)
            });
        }
        let end = match self {
            Self::Llama3 => scan.scan.balanced(body, 0, Quotes::Json)?,
            Self::Pythonic => scan.scan.balanced(body, 0, Quotes::Python)?,
            _ => match body.trim_start().as_bytes().first()? {
                b'[' => scan.scan.balanced(body, 0, Quotes::Json)?,
                _ => {
                    let args = match scan.args {
                        Some(a) => a,
                        None => body.find("[ARGS]")? + "[ARGS]".len(),
                    };
                    scan.args = Some(args);
                    scan.scan.balanced(body, args, Quotes::Json)?
                }
            },
        };
        Some((end, end))
    }

    /// For a call opened without a marker: whether its start reads as a call (`{"` for
    /// llama3 and hermes, or a ```` ```json ```` fence around one for hermes, `[name(` for
    /// pythonic); `None` until enough text has come to tell.
    pub(super) fn looks_like_call(self, body: &str) -> Option<bool> {
        if self == Self::Hermes && body.starts_with('`') {
            return fence_opens_json(body);
        }
        let rest = body.get(1..)?.trim_start();
        match self {
            Self::Llama3 | Self::Hermes => rest.chars().next().map(|c| c == '"'),
            Self::Pythonic => {
                let ident =
                    rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))?;
                let after = rest[ident..].trim_start();
                if after.is_empty() && ident > 0 {
                    return None;
                }
                Some(ident > 0 && after.starts_with('('))
            }
            _ => Some(true),
        }
    }

    /// The calls in one call's body: (name, arguments object).
    pub(super) fn parse_body(self, body: &str) -> Option<Vec<(String, Value)>> {
        let calls = match self {
            Self::Hermes => {
                let keys = &["arguments", "parameters"];
                match serde_json::from_str::<Value>(unfenced(body).trim()).ok()? {
                    Value::Array(items) => items
                        .iter()
                        .map(|c| call_of(c, keys, false))
                        .collect::<Option<_>>()?,
                    v => vec![call_of(&v, keys, false)?],
                }
            }
            // Llama's calls always carry `parameters`: without, it is JSON, not a call.
            Self::Llama3 => vec![json_call(body, &["parameters", "arguments"], true)?],
            Self::Mistral => match body.trim_start().strip_prefix('[') {
                Some(_) => match serde_json::from_str::<Value>(body.trim()).ok()? {
                    Value::Array(items) => items
                        .iter()
                        .map(|c| call_of(c, &["arguments", "parameters"], false))
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

    /// Whether a body that opened without a marker (and is not a valid call) was meant as a
    /// call: it is then malformed; otherwise it is an answer that happens to be JSON.
    pub(super) fn attempted(self, body: &str) -> bool {
        match self {
            Self::Llama3 => match serde_json::from_str::<Value>(body.trim()) {
                Ok(v) => {
                    v.get("name").is_some()
                        && (v.get("parameters").is_some() || v.get("arguments").is_some())
                }
                Err(_) => body.contains("\"name\""),
            },
            // A bare object that is not a call of an offered tool is an answer in JSON.
            Self::Hermes => false,
            // Only bodies that start `[name(` get this far.
            _ => true,
        }
    }

    /// The id of call `index` (of function `name`): `call_` and 24 hex digits, except where the
    /// family's template needs its own: Mistral's checks for 9 letters and digits, and Kimi K2's
    /// shows the id as the call's header (`functions.name:index`, as its models write it).
    pub(super) fn call_id(self, seed: u64, index: usize, name: &str) -> String {
        match self {
            Self::Mistral => {
                const ALPHABET: &[u8] =
                    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
                let (mut a, _) = super::id_bits(seed, index);
                (0..9)
                    .map(|_| {
                        let c = ALPHABET[(a % 62) as usize] as char;
                        a /= 62;
                        c
                    })
                    .collect()
            }
            Self::KimiK2 => format!("functions.{name}:{index}"),
            _ => super::call_id(seed, index),
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

    /// What closes one call after its arguments, where the arguments are a JSON object
    /// (`None` for pythonic calls, whose arguments are not).
    pub fn call_closing(self) -> Option<String> {
        match self {
            Self::Hermes => Some("}\n</tool_call>".into()),
            Self::Llama3 => Some("}".into()),
            Self::Mistral => Some("}]".into()),
            Self::DeepseekV3 => Some(format!("\n```{DS_CALL_END}{DS_CALLS_END}")),
            Self::KimiK2 => Some(format!("{KIMI_CALL_END}{KIMI_SECTION_END}")),
            Self::Pythonic => None,
        }
    }

    /// The marker that opens calls after an answer's text (`None`: the format reads calls only
    /// at the answer's start).
    pub fn call_trigger(self) -> Option<&'static str> {
        match self {
            Self::Hermes => Some("<tool_call>"),
            Self::Mistral => Some("[TOOL_CALLS]"),
            Self::DeepseekV3 => Some(DS_CALLS_BEGIN),
            Self::KimiK2 => Some(KIMI_SECTION_BEGIN),
            Self::Llama3 | Self::Pythonic => None,
        }
    }

    /// Formats that read a JSON object at the answer's start as a call: the key of its
    /// arguments, and what joins several (`None`: the object is the whole answer).
    pub fn bare_call(self) -> Option<(&'static str, Option<&'static str>)> {
        match self {
            Self::Hermes => Some(("arguments", None)),
            Self::Llama3 => Some(("parameters", Some(";"))),
            Self::Mistral | Self::DeepseekV3 | Self::KimiK2 | Self::Pythonic => None,
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

/// Whether `body`, which starts with a backtick, opens a Markdown fence (` ```json ` or bare)
/// whose contents start a JSON object with a key, or a list of objects; `None` until enough
/// text has come to tell.
fn fence_opens_json(body: &str) -> Option<bool> {
    const FENCE: &str = "```";
    let Some(rest) = body.strip_prefix(FENCE) else {
        return if FENCE.starts_with(body) {
            None
        } else {
            Some(false)
        };
    };
    let Some((info, inner)) = rest.split_once('\n') else {
        // The info string so far must be on its way to `json` (or nothing).
        let waiting = rest.len() < 16 && "json".starts_with(&rest.trim().to_ascii_lowercase());
        return if waiting { None } else { Some(false) };
    };
    let info = info.trim();
    if !(info.is_empty() || info.eq_ignore_ascii_case("json")) {
        return Some(false);
    }
    let mut chars = inner.chars().filter(|c| !c.is_whitespace());
    match (chars.next()?, chars.next()?) {
        ('{', c) => Some(c == '"'),
        ('[', c) => Some(c == '{'),
        _ => Some(false),
    }
}

/// The contents of a Markdown code fence (its info string dropped; the closing fence may be
/// missing, where the model stopped right after the JSON); text that is no fence as it is.
fn unfenced(body: &str) -> &str {
    let Some(rest) = body.trim().strip_prefix("```") else {
        return body;
    };
    let inner = rest.split_once('\n').map_or("", |(_, inner)| inner);
    inner.trim_end().strip_suffix("```").unwrap_or(inner)
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

/// `{"name": "…", <one of keys>: {…}}` as (name, arguments); missing arguments are `{}`
/// unless `required`.
fn json_call(text: &str, keys: &[&str], required: bool) -> Option<(String, Value)> {
    call_of(&serde_json::from_str(text.trim()).ok()?, keys, required)
}

fn call_of(v: &Value, keys: &[&str], required: bool) -> Option<(String, Value)> {
    let name = identifier(v.get("name")?.as_str()?)?;
    let args = keys.iter().find_map(|k| v.get(*k)).cloned();
    if required && args.is_none() {
        return None;
    }
    Some((name, object_arguments(args.unwrap_or(Value::Null))?))
}
