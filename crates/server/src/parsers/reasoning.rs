//! Reasoning parsers (`--reasoning-parser`): split a model's text, as it streams, into the
//! thought (`reasoning_content`) and the answer (`content`).
//!
//! The thought sits between a start and an end tag (`<think>` … `</think>` for DeepSeek-R1 and
//! Qwen3, `◁think▷` … `◁/think▷` for Kimi). Some chat templates open the thought themselves, so
//! the model's text starts inside it and only the end tag appears: the parser is then created
//! already inside. A tag split across chunks is held back until it is complete or ruled out, so
//! no piece of a tag ever reaches either output.

/// The model families' reasoning formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReasoningFormat {
    /// `<think>` … `</think>`; R1's template opens the thought, so its text starts inside.
    DeepseekR1,
    /// `<think>` … `</think>`; inside from the start only when the template opened it
    /// (thinking enabled).
    Qwen3,
    /// `◁think▷` … `◁/think▷`.
    Kimi,
}

impl ReasoningFormat {
    /// The `--reasoning-parser` names.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "deepseek-r1" => Some(Self::DeepseekR1),
            "qwen3" | "qwen3-thinking" => Some(Self::Qwen3),
            "kimi" => Some(Self::Kimi),
            _ => None,
        }
    }

    fn tags(self) -> (&'static str, &'static str) {
        match self {
            Self::DeepseekR1 | Self::Qwen3 => ("<think>", "</think>"),
            Self::Kimi => ("◁think▷", "◁/think▷"),
        }
    }

    /// Whether the model's text starts inside the thought, after `prompt`: inside when the
    /// prompt ends with the start tag (the template opened the thought), outside when it ends
    /// with the end tag (the template closed an empty one, as Qwen3's does with thinking off);
    /// otherwise DeepSeek-R1 starts inside (its models may leave the start tag out) unless
    /// thinking is turned off (`chat_template_kwargs.enable_thinking: false`).
    pub fn starts_inside(self, prompt: &str, enable_thinking: Option<bool>) -> bool {
        let (start, end) = self.tags();
        let tail = prompt.trim_end();
        if tail.ends_with(end) {
            return false;
        }
        tail.ends_with(start)
            || (matches!(self, Self::DeepseekR1) && enable_thinking != Some(false))
    }

    /// The `--reasoning-parser` name.
    pub fn name(self) -> &'static str {
        match self {
            Self::DeepseekR1 => "deepseek-r1",
            Self::Qwen3 => "qwen3",
            Self::Kimi => "kimi",
        }
    }
}

/// Text split into thought and answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Split {
    pub reasoning: String,
    pub content: String,
}

/// One choice's streaming reasoning parser.
#[derive(Debug, Clone)]
pub struct ReasoningParser {
    start: &'static str,
    end: &'static str,
    inside: bool,
    /// Whether the thought has ended (a second start tag is then plain text).
    done: bool,
    /// Text held back: it may be the beginning of the tag being looked for.
    pending: String,
    /// Leading whitespace right after the end tag is dropped (as peers do).
    trim_next: bool,
}

impl ReasoningParser {
    /// A parser for `format`; `inside` says whether the text starts inside the thought.
    pub fn new(format: ReasoningFormat, inside: bool) -> Self {
        let (start, end) = format.tags();
        Self {
            start,
            end,
            inside,
            done: false,
            pending: String::new(),
            trim_next: false,
        }
    }

    /// Feeds the next piece of text; returns what is now known to be thought or answer.
    pub fn push(&mut self, text: &str) -> Split {
        self.pending.push_str(text);
        let mut out = Split::default();
        loop {
            if !self.inside && !self.done {
                // A thought opens only at the start of the output (after whitespace): a start
                // tag later is text the answer mentions.
                let t = self.pending.trim_start();
                if t.starts_with(self.start) {
                    let skip = self.pending.len() - t.len() + self.start.len();
                    self.pending.drain(..skip);
                    self.inside = true;
                    continue;
                }
                if self.start.starts_with(t) {
                    return out;
                }
                self.done = true;
            }
            if !self.inside {
                let ready = std::mem::take(&mut self.pending);
                self.emit(&mut out, &ready);
                return out;
            }
            if let Some(at) = self.pending.find(self.end) {
                let before: String = self.pending.drain(..at).collect();
                self.pending.drain(..self.end.len());
                self.emit(&mut out, &before);
                self.inside = false;
                self.done = true;
                self.trim_next = true;
                continue;
            }
            // Keep back the longest end of the text that could start the end tag.
            let keep = partial_tag(&self.pending, self.end);
            let cut = self.pending.len() - keep;
            let ready: String = self.pending.drain(..cut).collect();
            self.emit(&mut out, &ready);
            return out;
        }
    }

    /// The end of the text: whatever was held back is released as it stands.
    pub fn finish(&mut self) -> Split {
        let mut out = Split::default();
        let rest = std::mem::take(&mut self.pending);
        self.emit(&mut out, &rest);
        out
    }

    fn emit(&mut self, out: &mut Split, text: &str) {
        if self.inside {
            out.reasoning.push_str(text);
            return;
        }
        let text = if self.trim_next {
            let t = text.trim_start();
            if !t.is_empty() {
                self.trim_next = false;
            }
            t
        } else {
            text
        };
        out.content.push_str(text);
    }
}

/// The length of the longest suffix of `text` that is a proper prefix of `tag` (on character
/// boundaries).
pub(crate) fn partial_tag(text: &str, tag: &str) -> usize {
    let longest = (tag.len() - 1).min(text.len());
    (1..=longest)
        .rev()
        .find(|&n| {
            text.is_char_boundary(text.len() - n) && tag.starts_with(&text[text.len() - n..])
        })
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` fed in every chunking (`assert_any_chunking`) must give `want`.
    fn check(format: ReasoningFormat, inside: bool, text: &str, want: (&str, &str)) {
        let run = |pieces: &[&str]| {
            let mut p = ReasoningParser::new(format, inside);
            let mut all = Split::default();
            let mut splits: Vec<Split> = pieces.iter().map(|s| p.push(s)).collect();
            splits.push(p.finish());
            for piece in splits {
                all.reasoning.push_str(&piece.reasoning);
                all.content.push_str(&piece.content);
            }
            all
        };
        let want = Split {
            reasoning: want.0.into(),
            content: want.1.into(),
        };
        super::super::assert_any_chunking(text, &want, run);
    }

    #[test]
    fn thought_and_answer_are_split_wherever_the_chunks_break() {
        use ReasoningFormat::*;
        check(
            Qwen3,
            false,
            "<think>a < b</think>\n\nYes.",
            ("a < b", "Yes."),
        );
        check(Qwen3, false, "No thought here.", ("", "No thought here."));
        check(
            Qwen3,
            true,
            "pondering ünïcode</think>Done",
            ("pondering ünïcode", "Done"),
        );
        check(DeepseekR1, true, "x</think>y <think>z", ("x", "y <think>z"));
        check(Kimi, false, "◁think▷deep◁/think▷answer", ("deep", "answer"));
        // An unfinished thought stays a thought; a lone '<' is text.
        check(Qwen3, false, "<think>still going", ("still going", ""));
        check(Qwen3, false, "a <thin b", ("", "a <thin b"));
        check(Qwen3, false, "  <thi", ("", "  <thi"));
        // A thought opens only at the start: later, the tags are the answer's text.
        check(
            Qwen3,
            false,
            "Use <think> tags</think> like this.",
            ("", "Use <think> tags</think> like this."),
        );
        check(Qwen3, false, "\n<think>a</think>b", ("a", "b"));
    }

    #[test]
    fn partial_tags_are_found_on_char_boundaries() {
        assert_eq!(partial_tag("abc</thi", "</think>"), 5);
        assert_eq!(partial_tag("abc", "</think>"), 0);
        assert_eq!(partial_tag("x◁", "◁/think▷"), "◁".len());
        assert_eq!(
            ReasoningFormat::parse("qwen3"),
            Some(ReasoningFormat::Qwen3)
        );
        assert_eq!(ReasoningFormat::parse("nope"), None);
    }

    #[test]
    fn the_prompt_says_whether_the_thought_is_open() {
        use ReasoningFormat::*;
        assert!(Qwen3.starts_inside("<|im_start|>assistant\n<think>\n", None));
        assert!(!Qwen3.starts_inside("<|im_start|>assistant\n", None));
        assert!(!Qwen3.starts_inside("assistant\n<think>\n\n</think>\n\n", Some(false)));
        assert!(DeepseekR1.starts_inside("<｜Assistant｜>", None));
        assert!(!DeepseekR1.starts_inside("<｜Assistant｜>", Some(false)));
        assert!(Kimi.starts_inside("x◁think▷", None));
        for f in [Qwen3, DeepseekR1, Kimi] {
            assert_eq!(ReasoningFormat::parse(f.name()), Some(f));
        }
    }
}
