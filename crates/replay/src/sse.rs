//! Incremental Server-Sent Events parsing (only the `data` field matters).
//!
//! Bytes arrive in arbitrary chunks; lines may be split anywhere, end in
//! `\n` or `\r\n`, and an event ends at a blank line. Multiple `data:` lines
//! of one event are joined with `\n`, as the SSE specification says.

/// Accumulates bytes and yields the `data` payload of each complete event.
#[derive(Debug, Default)]
pub(crate) struct SseParser {
    buf: Vec<u8>,
    data: Vec<u8>,
    has_data: bool,
}

impl SseParser {
    /// Feeds `chunk`, calling `on_event` with each completed event's data.
    pub(crate) fn push(&mut self, chunk: &[u8], mut on_event: impl FnMut(&[u8])) {
        self.buf.extend_from_slice(chunk);
        let mut start = 0;
        while let Some(nl) = self.buf[start..].iter().position(|&b| b == b'\n') {
            let end = start + nl;
            let line = strip_cr(&self.buf[start..end]);
            if line.is_empty() {
                self.dispatch(&mut on_event);
            } else if let Some(rest) = line.strip_prefix(b"data:") {
                let rest = rest.strip_prefix(b" ").unwrap_or(rest);
                if self.has_data {
                    self.data.push(b'\n');
                }
                self.data.extend_from_slice(rest);
                self.has_data = true;
            }
            start = end + 1;
        }
        self.buf.drain(..start);
    }

    /// Ends the stream: a last event not followed by a blank line still counts.
    pub(crate) fn finish(&mut self, mut on_event: impl FnMut(&[u8])) {
        if !self.buf.is_empty() {
            self.push(b"\n", &mut on_event);
        }
        self.dispatch(&mut on_event);
    }

    fn dispatch(&mut self, on_event: &mut impl FnMut(&[u8])) {
        if self.has_data {
            on_event(&self.data);
            self.data.clear();
            self.has_data = false;
        }
    }
}

fn strip_cr(line: &[u8]) -> &[u8] {
    line.strip_suffix(b"\r").unwrap_or(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events_split(input: &[u8], split: usize) -> Vec<String> {
        let mut p = SseParser::default();
        let mut out = Vec::new();
        let mut add = |d: &[u8]| out.push(String::from_utf8(d.to_vec()).unwrap());
        for chunk in input.chunks(split) {
            p.push(chunk, &mut add);
        }
        p.finish(&mut add);
        out
    }

    #[test]
    fn parses_events_across_any_chunk_boundary() {
        let input = b": comment\n\ndata: {\"a\":1}\n\ndata:{\"b\":\"x\\ny\"}\r\n\r\nevent: x\ndata: l1\ndata: l2\n\ndata: [DONE]\n\n";
        let want = ["{\"a\":1}", "{\"b\":\"x\\ny\"}", "l1\nl2", "[DONE]"];
        for split in 1..input.len() {
            assert_eq!(events_split(input, split), want, "split {split}");
        }
    }

    #[test]
    fn last_event_without_blank_line() {
        assert_eq!(events_split(b"data: a\n\ndata: b", 3), ["a", "b"]);
        assert_eq!(events_split(b"data: a\n", 100), ["a"]);
        assert!(events_split(b"", 1).is_empty());
    }
}
