//! Stop strings over streamed text: text that could be the start of a stop string is held back
//! until it is known not to be one, so a stop string is caught even when split across tokens and
//! never reaches the client.

#[derive(Debug, Default)]
pub struct StopText {
    stops: Vec<String>,
    text: String,
    /// Bytes of `text` already released.
    released: usize,
    /// The stop string that matched, once one has.
    matched: Option<usize>,
}

impl StopText {
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops,
            ..Self::default()
        }
    }

    /// Adds decoded text. Returns the text now safe to release, and whether a stop string
    /// matched (the output then ends before it; push nothing more).
    pub fn push(&mut self, piece: &str) -> (String, bool) {
        let from = self.released;
        self.text.push_str(piece);
        // Held-back text never ends a released prefix of a stop string, so a match starts at or
        // after `released`.
        let hit = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(k, s)| self.text[from..].find(s.as_str()).map(|i| (from + i, k)))
            .min();
        if let Some((end, k)) = hit {
            self.matched = Some(k);
            self.text.truncate(end);
            self.released = end;
            return (self.text[from..end].to_string(), true);
        }
        let hold = self.held_back();
        let end = self.text.len() - hold;
        self.released = end;
        (self.text[from..end].to_string(), false)
    }

    /// The stop string that ended the text, if one did.
    pub fn matched(&self) -> Option<&str> {
        self.matched.map(|k| self.stops[k].as_str())
    }

    /// Bytes at the end of the text that begin some stop string.
    fn held_back(&self) -> usize {
        let tail = &self.text[self.released..];
        let mut best = 0;
        for s in &self.stops {
            for k in (best + 1..s.len().min(tail.len() + 1)).rev() {
                if tail.is_char_boundary(tail.len() - k)
                    && s.as_bytes().starts_with(&tail.as_bytes()[tail.len() - k..])
                {
                    best = k;
                    break;
                }
            }
        }
        best
    }

    /// The generation ended without a stop string: everything held back is released.
    pub fn finish(&mut self) -> String {
        let rest = self.text[self.released..].to_string();
        self.released = self.text.len();
        rest
    }

    /// The whole output so far (released or not).
    pub fn text(&self) -> &str {
        &self.text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&str]) -> (Vec<String>, bool, String) {
        let mut s = StopText::new(stops.iter().map(|s| s.to_string()).collect());
        let mut out = Vec::new();
        for p in pieces {
            let (text, stopped) = s.push(p);
            out.push(text);
            if stopped {
                return (out, true, s.text().to_string());
            }
        }
        out.push(s.finish());
        (out, false, s.text().to_string())
    }

    #[test]
    fn a_stop_string_split_across_tokens_is_caught_and_never_sent() {
        let (out, stopped, text) = run(&["END"], &["Hello E", "N", "D and more"]);
        assert!(stopped);
        assert_eq!(out.concat(), "Hello ");
        assert_eq!(text, "Hello ");
        // Nothing of "E" went out before the match was certain.
        assert_eq!(out[0], "Hello ");
    }

    #[test]
    fn the_stop_string_that_matched_is_known() {
        let mut s = StopText::new(vec!["b".into(), "éé".into()]);
        assert!(!s.push("aé").1);
        assert_eq!(s.matched(), None);
        assert!(s.push("é b").1);
        assert_eq!(s.matched(), Some("éé"));
    }

    #[test]
    fn a_false_start_is_released_once_it_cannot_match() {
        let (out, stopped, _) = run(&["END"], &["an E", "X", "it"]);
        assert!(!stopped);
        assert_eq!(out, ["an ", "EX", "it", ""]);
    }

    #[test]
    fn the_earliest_of_several_stops_wins_and_multibyte_text_is_safe() {
        let (out, stopped, _) = run(&["éé", "b"], &["aé", "é b"]);
        assert!(stopped);
        assert_eq!(out.concat(), "a");
        let (out, stopped, _) = run(&["zz"], &["日本", "語"]);
        assert!(!stopped);
        assert_eq!(out.concat(), "日本語");
    }

    #[test]
    fn without_stops_everything_streams_at_once() {
        let (out, _, _) = run(&[], &["a", "b"]);
        assert_eq!(out, ["a", "b", ""]);
    }
}
