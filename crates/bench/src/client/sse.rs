//! A server-sent-events decoder: bytes in, complete `data` payloads out, without allocating per
//! event (its two buffers keep their capacity for the life of the request).

/// Splits a byte stream into SSE events and hands each event's `data` to a callback.
#[derive(Debug, Default)]
pub struct SseDecoder {
    /// A line not yet terminated by `\n` (bytes from the previous read).
    partial: Vec<u8>,
    /// The `data` lines of the event being read, joined by `\n`.
    data: Vec<u8>,
    has_data: bool,
}

impl SseDecoder {
    /// Feeds one network read. Stops at the first callback error and returns it.
    pub fn feed<E>(
        &mut self,
        mut bytes: &[u8],
        on_event: &mut impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        while let Some(nl) = bytes.iter().position(|&b| b == b'\n') {
            let (line, rest) = bytes.split_at(nl);
            bytes = &rest[1..];
            if self.partial.is_empty() {
                self.line(line, on_event)?;
            } else {
                let mut whole = std::mem::take(&mut self.partial);
                whole.extend_from_slice(line);
                let result = self.line(&whole, on_event);
                whole.clear();
                self.partial = whole;
                result?;
            }
        }
        self.partial.extend_from_slice(bytes);
        Ok(())
    }

    /// Ends the stream: a last unterminated line and a pending event still count.
    pub fn finish<E>(
        &mut self,
        on_event: &mut impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        if !self.partial.is_empty() {
            let whole = std::mem::take(&mut self.partial);
            self.line(&whole, on_event)?;
        }
        self.dispatch(on_event)
    }

    fn line<E>(
        &mut self,
        line: &[u8],
        on_event: &mut impl FnMut(&[u8]) -> Result<(), E>,
    ) -> Result<(), E> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            return self.dispatch(on_event);
        }
        if let Some(value) = line.strip_prefix(b"data:") {
            let value = value.strip_prefix(b" ").unwrap_or(value);
            if self.has_data {
                self.data.push(b'\n');
            }
            self.data.extend_from_slice(value);
            self.has_data = true;
        }
        // Comments (`:`), `event:`, `id:` and `retry:` lines carry nothing we measure.
        Ok(())
    }

    fn dispatch<E>(&mut self, on_event: &mut impl FnMut(&[u8]) -> Result<(), E>) -> Result<(), E> {
        if !self.has_data {
            return Ok(());
        }
        self.has_data = false;
        let result = on_event(&self.data);
        self.data.clear();
        result
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(reads: &[&[u8]]) -> Vec<String> {
        let mut out = Vec::new();
        let mut dec = SseDecoder::default();
        let mut cb = |d: &[u8]| -> Result<(), ()> {
            out.push(String::from_utf8(d.to_vec()).unwrap());
            Ok(())
        };
        for r in reads {
            dec.feed(r, &mut cb).unwrap();
        }
        dec.finish(&mut cb).unwrap();
        out
    }

    #[test]
    fn splits_events_across_arbitrary_reads() {
        let stream = b"data: {\"a\":1}\n\n: keep-alive\n\ndata: {\"b\":2}\r\n\r\ndata: [DONE]\n\n";
        let whole = events(&[stream]);
        assert_eq!(whole, ["{\"a\":1}", "{\"b\":2}", "[DONE]"]);
        // Every split point gives the same events.
        for cut in 0..stream.len() {
            assert_eq!(
                events(&[&stream[..cut], &stream[cut..]]),
                whole,
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn multi_line_data_and_missing_final_blank_line() {
        assert_eq!(
            events(&[b"event: x\ndata: a\ndata: b\n\ndata: c"]),
            ["a\nb", "c"]
        );
        assert_eq!(events(&[b"data:tight\n\n"]), ["tight"]);
    }

    #[test]
    fn callback_error_stops_feeding() {
        let mut dec = SseDecoder::default();
        let mut seen = 0;
        let r = dec.feed(b"data: 1\n\ndata: 2\n\n", &mut |_: &[u8]| {
            seen += 1;
            Err("stop")
        });
        assert_eq!(r, Err("stop"));
        assert_eq!(seen, 1);
    }
}
