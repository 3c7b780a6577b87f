//! One streamed completion as the client sees it: the chunks' token ids and timings, and the
//! consistency checks of a finished stream (usage against ids received, finish reason against
//! `max_tokens`).

use serde::Deserialize;
use std::time::{Duration, Instant};

/// One `data:` chunk of a streamed completion (only the fields the checks read).
#[derive(Debug, Deserialize)]
pub struct Chunk {
    /// The response id (the same in every chunk of a stream).
    #[serde(default)]
    pub id: Option<String>,
    /// The choices of this chunk (empty in the final usage chunk).
    #[serde(default)]
    pub choices: Vec<Choice>,
    /// Token counts, in the usage chunk (`stream_options.include_usage`).
    #[serde(default)]
    pub usage: Option<Usage>,
    /// An error reported inside the stream.
    #[serde(default)]
    pub error: Option<serde_json::Value>,
}

/// One choice of a chunk.
#[derive(Debug, Deserialize)]
pub struct Choice {
    /// The choice's index (0: the load generator asks for one).
    #[serde(default)]
    pub index: u32,
    /// The tokens generated since the last chunk (`return_token_ids`).
    #[serde(default)]
    pub token_ids: Option<Vec<u32>>,
    /// `null` until the last chunk of the choice: `"stop"` (EOS or a stop string) or `"length"`.
    #[serde(default)]
    pub finish_reason: Option<String>,
}

/// The usage object of the final chunk.
#[derive(Debug, Deserialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u64,
    /// Generated tokens.
    pub completion_tokens: u64,
}

/// What one stream delivered, filled in chunk by chunk by [`StreamState::on_data`].
#[derive(Debug)]
pub struct StreamState {
    start: Instant,
    last_token_at: Option<Instant>,
    /// The response id.
    pub id: Option<String>,
    /// Every token id received, in order.
    pub ids: Vec<u32>,
    /// Request sent -> first chunk with a token.
    pub ttft: Option<Duration>,
    /// The gaps between tokens (a chunk of `k` tokens arriving `dt` after the previous token
    /// counts as `k` gaps of `dt / k`).
    pub gaps: Vec<Duration>,
    /// The finish reason, once a chunk gave one.
    pub finish: Option<String>,
    /// The usage chunk's counts: (prompt, completion).
    pub usage: Option<(u64, u64)>,
    /// `data: [DONE]` seen.
    pub done: bool,
}

impl StreamState {
    /// A stream whose request was sent at `start`.
    pub fn new(start: Instant) -> StreamState {
        StreamState {
            start,
            last_token_at: None,
            id: None,
            ids: Vec::new(),
            ttft: None,
            gaps: Vec::new(),
            finish: None,
            usage: None,
            done: false,
        }
    }

    /// Takes one event's data received at `now`; returns the number of new tokens.
    ///
    /// # Errors
    ///
    /// A message for: data after `[DONE]`, data that is not a chunk, an error chunk, a choice
    /// other than 0, a second finish reason, a token after the finish reason, a second usage
    /// chunk, a change of response id.
    pub fn on_data(&mut self, data: &str, now: Instant) -> Result<usize, String> {
        if self.done {
            return Err(format!("data after [DONE]: {data:.200}"));
        }
        if data.trim() == "[DONE]" {
            self.done = true;
            return Ok(0);
        }
        let chunk: Chunk = serde_json::from_str(data).map_err(|e| format!("bad chunk ({e}): {data:.200}"))?;
        if let Some(e) = chunk.error {
            return Err(format!("error in the stream: {e}"));
        }
        match (&self.id, chunk.id) {
            (None, id) => self.id = id,
            (Some(a), Some(b)) if *a != b => return Err(format!("response id changed from {a} to {b}")),
            _ => {}
        }
        let mut new = 0;
        for c in chunk.choices {
            if c.index != 0 {
                return Err(format!("choice index {} (one choice was asked for)", c.index));
            }
            let ids = c.token_ids.unwrap_or_default();
            if !ids.is_empty() && self.finish.is_some() {
                return Err("tokens after the finish reason".into());
            }
            new += ids.len();
            self.ids.extend_from_slice(&ids);
            if let Some(f) = c.finish_reason {
                if let Some(old) = &self.finish {
                    return Err(format!("a second finish reason {f:?} after {old:?}"));
                }
                self.finish = Some(f);
            }
        }
        if let Some(u) = chunk.usage {
            if self.usage.is_some() {
                return Err("a second usage chunk".into());
            }
            self.usage = Some((u.prompt_tokens, u.completion_tokens));
        }
        if new > 0 {
            match self.last_token_at {
                None => self.ttft = Some(now.saturating_duration_since(self.start)),
                Some(prev) => {
                    let gap = now.saturating_duration_since(prev) / new as u32;
                    self.gaps.extend(std::iter::repeat_n(gap, new));
                }
            }
            self.last_token_at = Some(now);
        }
        Ok(new)
    }

    /// The checks of a stream that ran to its end: `[DONE]` seen, a finish reason, usage present
    /// with `prompt_tokens == prompt_len` and `completion_tokens ==` ids received, `"length"`
    /// exactly at `max_tokens`, `"stop"` at or before it, no other reason, every id below `vocab`.
    ///
    /// # Errors
    ///
    /// A message naming the first check that failed.
    pub fn check_complete(&self, prompt_len: usize, max_tokens: usize, vocab: u32) -> Result<(), String> {
        let n = self.ids.len();
        if !self.done {
            return Err("the stream ended without data: [DONE]".into());
        }
        let (p, c) = self.usage.ok_or("no usage chunk (stream_options.include_usage was set)")?;
        if c != n as u64 {
            return Err(format!("usage.completion_tokens {c} but {n} token ids received"));
        }
        if p != prompt_len as u64 {
            return Err(format!("usage.prompt_tokens {p} but the prompt had {prompt_len} tokens"));
        }
        match self.finish.as_deref() {
            Some("length") if n != max_tokens => {
                Err(format!("finish_reason length after {n} tokens, max_tokens {max_tokens}"))
            }
            Some("stop") if n > max_tokens => Err(format!("{n} tokens, more than max_tokens {max_tokens}")),
            Some("length" | "stop") => match self.ids.iter().find(|&&t| t >= vocab) {
                Some(t) => Err(format!("token id {t} not below the vocabulary size {vocab}")),
                None => Ok(()),
            },
            Some(other) => Err(format!("unexpected finish_reason {other:?}")),
            None => Err("no finish_reason".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(ids: &[u32], finish: Option<&str>) -> String {
        serde_json::json!({"id": "cmpl-1", "object": "text_completion",
            "choices": [{"index": 0, "text": "", "token_ids": ids, "finish_reason": finish}]})
        .to_string()
    }

    const USAGE: &str =
        r#"{"id":"cmpl-1","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}"#;

    #[test]
    fn timings_and_a_consistent_stream() {
        let t0 = Instant::now();
        let ms = |k: u64| t0 + Duration::from_millis(k);
        let mut s = StreamState::new(t0);
        assert_eq!(s.on_data(&chunk(&[], None), ms(5)), Ok(0), "a chunk without tokens is no first token");
        assert_eq!(s.on_data(&chunk(&[5], None), ms(10)), Ok(1));
        assert_eq!(s.on_data(&chunk(&[6, 7], None), ms(14)), Ok(2));
        assert_eq!(s.on_data(&chunk(&[8], Some("length")), ms(17)), Ok(1));
        assert_eq!(s.on_data(USAGE, ms(17)), Ok(0));
        assert_eq!(s.on_data("[DONE]", ms(18)), Ok(0));
        assert_eq!(s.ttft, Some(Duration::from_millis(10)));
        assert_eq!(s.gaps, [2, 2, 3].map(Duration::from_millis));
        assert_eq!((s.ids.as_slice(), s.id.as_deref()), ([5, 6, 7, 8].as_slice(), Some("cmpl-1")));
        assert_eq!(s.check_complete(3, 4, 100), Ok(()));
        // Each check can fail.
        assert!(s.check_complete(3, 5, 100).unwrap_err().contains("length after 4"));
        assert!(s.check_complete(2, 4, 100).unwrap_err().contains("prompt_tokens"));
        assert!(s.check_complete(3, 4, 8).unwrap_err().contains("not below"));
        assert!(s.on_data(&chunk(&[1], None), ms(19)).unwrap_err().contains("after [DONE]"));
    }

    #[test]
    fn inconsistent_streams() {
        let t0 = Instant::now();
        let mut s = StreamState::new(t0);
        s.on_data(&chunk(&[1, 2, 3], Some("stop")), t0).unwrap();
        assert!(s.on_data(&chunk(&[4], None), t0).unwrap_err().contains("after the finish"));
        assert!(s.check_complete(3, 4, 100).unwrap_err().contains("[DONE]"));
        s.on_data(USAGE, t0).unwrap();
        s.on_data("[DONE]", t0).unwrap();
        // usage says 4, 3 ids arrived: the count mismatch is caught.
        assert!(s.check_complete(3, 4, 100).unwrap_err().contains("completion_tokens 4 but 3"));
        let mut s = StreamState::new(t0);
        assert!(s.on_data(r#"{"error":{"message":"boom"}}"#, t0).unwrap_err().contains("boom"));
        assert!(s.on_data("not json", t0).unwrap_err().contains("bad chunk"));
        s.on_data(&chunk(&[1], None), t0).unwrap();
        let other = chunk(&[2], None).replace("cmpl-1", "cmpl-2");
        assert!(s.on_data(&other, t0).unwrap_err().contains("id changed"));
        let mut s = StreamState::new(t0);
        s.on_data(&chunk(&[1, 2, 3, 4], Some("stop")), t0).unwrap();
        s.on_data(USAGE, t0).unwrap();
        s.on_data("[DONE]", t0).unwrap();
        assert_eq!(s.check_complete(3, 4, 100), Ok(()), "stop at max_tokens (EOS last) is allowed");
        assert!(s.check_complete(3, 3, 100).unwrap_err().contains("more than max_tokens"));
    }
}
