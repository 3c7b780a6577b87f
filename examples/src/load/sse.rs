//! An incremental parser of Server-Sent Events (`text/event-stream`), fed with the body's bytes
//! as they arrive, in pieces of any size.
//!
//! Lines end in `\n` or `\r\n` (a lone `\r` is not treated as a line end: no OpenAI-style server
//! sends one). An event is complete at a blank line; its data is its `data:` lines (one space
//! after the colon dropped) joined with `\n`. Comment lines (`:` first) and other fields (`event:`,
//! `id:`, `retry:`) are ignored. Events with no `data:` line are not reported.

use thiserror::Error;

/// What went wrong while parsing an event stream.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SseError {
    /// A line grew past the limit without a line end.
    #[error("an SSE line is longer than {limit} bytes")]
    LineTooLong {
        /// The limit, in bytes.
        limit: usize,
    },
    /// A line was not valid UTF-8.
    #[error("an SSE line is not UTF-8: {0}")]
    NotUtf8(String),
}

/// The longest line (and event data) accepted: 16 MiB.
pub const MAX_LINE: usize = 16 << 20;

/// Incremental SSE parser: [`push`](Self::push) bytes in, complete events' data out.
///
/// ```
/// use cuda_async_examples::load::SseParser;
/// let mut p = SseParser::default();
/// assert!(p.push(b"data: {\"a\"").unwrap().is_empty());
/// assert_eq!(p.push(b":1}\n\ndata: [DONE]\n\n").unwrap(), vec!["{\"a\":1}", "[DONE]"]);
/// ```
#[derive(Debug, Default)]
pub struct SseParser {
    line: Vec<u8>,
    data: Option<String>,
}

impl SseParser {
    /// Feeds the next bytes of the stream and returns the data of every event they complete, in
    /// order.
    ///
    /// # Errors
    ///
    /// [`SseError::LineTooLong`] past [`MAX_LINE`] bytes without a line end (or of data in one
    /// event), [`SseError::NotUtf8`] for a line that is not UTF-8. The parser should not be used
    /// after an error.
    pub fn push(&mut self, bytes: &[u8]) -> Result<Vec<String>, SseError> {
        let mut events = Vec::new();
        let mut rest = bytes;
        while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
            self.extend(&rest[..nl])?;
            rest = &rest[nl + 1..];
            let mut line = std::mem::take(&mut self.line);
            if line.last() == Some(&b'\r') {
                line.pop();
            }
            if let Some(event) = self.line_done(&line)? {
                events.push(event);
            }
        }
        self.extend(rest)?;
        Ok(events)
    }

    /// Whether bytes of an unfinished line or event are pending (a stream that ends here was cut).
    pub fn is_mid_event(&self) -> bool {
        !self.line.is_empty() || self.data.is_some()
    }

    fn extend(&mut self, bytes: &[u8]) -> Result<(), SseError> {
        if self.line.len() + bytes.len() > MAX_LINE {
            return Err(SseError::LineTooLong { limit: MAX_LINE });
        }
        self.line.extend_from_slice(bytes);
        Ok(())
    }

    fn line_done(&mut self, line: &[u8]) -> Result<Option<String>, SseError> {
        if line.is_empty() {
            return Ok(self.data.take());
        }
        let line = std::str::from_utf8(line).map_err(|e| SseError::NotUtf8(e.to_string()))?;
        if line.starts_with(':') {
            return Ok(None);
        }
        let (field, value) = match line.split_once(':') {
            Some((f, v)) => (f, v.strip_prefix(' ').unwrap_or(v)),
            None => (line, ""),
        };
        if field == "data" {
            let data = self.data.get_or_insert_with(String::new);
            if data.len() + value.len() + 1 > MAX_LINE {
                return Err(SseError::LineTooLong { limit: MAX_LINE });
            }
            if !data.is_empty() {
                data.push('\n');
            }
            data.push_str(value);
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STREAM: &str =
        ": keep-alive\n\ndata: {\"x\":\"日本語🙂\"}\r\n\r\nevent: message\ndata: a\ndata:b\n\n\
                          id: 7\n\ndata:\n\ndata: [DONE]\n\n";
    const EVENTS: [&str; 4] = ["{\"x\":\"日本語🙂\"}", "a\nb", "", "[DONE]"];

    #[test]
    fn whole_stream() {
        let mut p = SseParser::default();
        assert_eq!(p.push(STREAM.as_bytes()).unwrap(), EVENTS);
        assert!(!p.is_mid_event());
    }

    /// Split at every byte (also inside a multi-byte character and between `\r` and `\n`), and
    /// fed one byte at a time: always the same events.
    #[test]
    fn split_at_every_byte() {
        let b = STREAM.as_bytes();
        for cut in 0..=b.len() {
            let mut p = SseParser::default();
            let mut got = p.push(&b[..cut]).unwrap();
            got.extend(p.push(&b[cut..]).unwrap());
            assert_eq!(got, EVENTS, "cut at {cut}");
        }
        let mut p = SseParser::default();
        let got: Vec<String> = b.iter().flat_map(|c| p.push(std::slice::from_ref(c)).unwrap()).collect();
        assert_eq!(got, EVENTS);
    }

    #[test]
    fn cut_streams_and_bad_input() {
        let mut p = SseParser::default();
        assert!(p.push(b"data: {\"a\":1}\n").unwrap().is_empty());
        assert!(p.is_mid_event(), "no blank line yet");
        let mut p = SseParser::default();
        assert!(p.push(&[b'd', b':', 0xff, b'\n']).is_err());
        let mut p = SseParser::default();
        assert_eq!(p.push(&vec![b'x'; MAX_LINE + 1]), Err(SseError::LineTooLong { limit: MAX_LINE }));
    }
}
