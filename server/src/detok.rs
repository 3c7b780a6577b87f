//! Incremental detokenisation ([`Detokenizer`]) and stop strings matched across token
//! boundaries ([`StopMatcher`]).

use crate::tokenizer::TextTokenizer;

/// The most tokens one character can span: a UTF-8 character is at most 4 bytes, and every token
/// adds at least one.
const MAX_CHAR_TOKENS: usize = 4;

/// Turns generated tokens into text deltas, never emitting half a UTF-8 character: while the
/// decoded tail ends in an incomplete character (U+FFFD), it is held back (at most
/// `MAX_CHAR_TOKENS` tokens: bytes beyond that can never complete a character and come out as
/// U+FFFD, as the full decode has them).
#[derive(Debug, Default)]
pub struct Detokenizer {
    ids: Vec<u32>,
    prefix: usize,
    read: usize,
}

impl Detokenizer {
    /// A decoder with no tokens yet.
    pub fn new() -> Detokenizer {
        Detokenizer::default()
    }

    /// Adds `id` and returns the text it completes (possibly empty).
    ///
    /// # Errors
    /// The tokenizer's decoding errors (an id outside the vocabulary).
    pub fn push(&mut self, tok: &TextTokenizer, id: u32) -> Result<String, tokenizers::Error> {
        self.ids.push(id);
        let before = tok.decode(&self.ids[self.prefix..self.read])?;
        let all = tok.decode(&self.ids[self.prefix..])?;
        if all.len() > before.len() && !all.ends_with('\u{FFFD}') && all.is_char_boundary(before.len()) {
            let delta = all[before.len()..].to_string();
            self.prefix = self.read;
            self.read = self.ids.len();
            Ok(delta)
        } else {
            // Tokens since `read` that add no text at all (special tokens decode to nothing) are
            // dropped from the window: otherwise it grew with every such token, and each push
            // decoded the whole window twice (found by review: quadratic CPU on a long stream of
            // them). The window keeps its context (`prefix..read`), so a following token decodes
            // as in the full text (moving `prefix` instead lost a SentencePiece leading space).
            if all == before {
                self.ids.truncate(self.read);
            } else if self.ids.len() - self.read > MAX_CHAR_TOKENS {
                // More tokens held than one character can span, and the text still ends in
                // U+FFFD: its first ones are bytes that no later token can complete (a run of
                // invalid UTF-8 would otherwise grow the window for ever, each push decoding all
                // of it: quadratic CPU, found by review). Their text (U+FFFD, as the full decode
                // has it) is emitted; the last `MAX_CHAR_TOKENS - 1` stay held, since they may be
                // the start of a character still arriving (an earlier cap that emitted the whole
                // tail broke such a character: see `server/tests/text.rs`).
                let cut = self.ids.len() - (MAX_CHAR_TOKENS - 1);
                let upto = tok.decode(&self.ids[self.prefix..cut])?;
                if upto.len() >= before.len() && upto.is_char_boundary(before.len()) {
                    let delta = upto[before.len()..].to_string();
                    self.prefix = self.read;
                    self.read = cut;
                    return Ok(delta);
                }
            }
            Ok(String::new())
        }
    }

    /// How many tokens the next push decodes besides the new one (the window), for tests.
    pub fn window(&self) -> usize {
        self.ids.len() - self.prefix
    }

    /// The text held back (an incomplete character at the end), for the end of generation.
    ///
    /// # Errors
    /// As [`Detokenizer::push`].
    pub fn flush(&mut self, tok: &TextTokenizer) -> Result<String, tokenizers::Error> {
        let before = tok.decode(&self.ids[self.prefix..self.read])?;
        let all = tok.decode(&self.ids[self.prefix..])?;
        self.prefix = self.ids.len();
        self.read = self.ids.len();
        Ok(if all.len() > before.len() && all.is_char_boundary(before.len()) {
            all[before.len()..].to_string()
        } else {
            String::new()
        })
    }
}

/// Finds stop strings in a stream of text deltas; text that may begin a stop string is held
/// back until it is known not to, and a stop string itself is never emitted.
///
/// ```
/// use server::detok::StopMatcher;
/// let mut m = StopMatcher::new(vec!["END".into()]);
/// assert_eq!(m.push("abcE"), ("abc".to_string(), false));
/// assert_eq!(m.push("Nzz"), ("ENzz".to_string(), false));
/// assert_eq!(m.push("!EN"), ("!".to_string(), false));
/// let mut m = StopMatcher::new(vec!["END".into()]);
/// assert_eq!(m.push("xE"), ("x".to_string(), false));
/// assert_eq!(m.push("ND tail"), (String::new(), true));
/// ```
#[derive(Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    held: String,
    stopped: bool,
}

impl StopMatcher {
    /// A matcher of `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> StopMatcher {
        StopMatcher {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            held: String::new(),
            stopped: false,
        }
    }

    /// Whether a stop string was found.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Adds `delta`; returns the text safe to emit and whether a stop string was found (then
    /// the text is everything before it and nothing more is emitted).
    pub fn push(&mut self, delta: &str) -> (String, bool) {
        if self.stopped {
            return (String::new(), true);
        }
        self.held.push_str(delta);
        let first = self.stops.iter().filter_map(|s| self.held.find(s.as_str())).min();
        if let Some(at) = first {
            self.stopped = true;
            let out = self.held[..at].to_string();
            self.held.clear();
            return (out, true);
        }
        // Hold back the longest suffix that is a proper prefix of a stop string.
        let mut keep = 0;
        for s in &self.stops {
            for (i, _) in s.char_indices().skip(1) {
                if i > keep && self.held.ends_with(&s[..i]) {
                    keep = i;
                }
            }
        }
        let cut = self.held.len() - keep;
        let out = self.held[..cut].to_string();
        self.held.drain(..cut);
        (out, false)
    }

    /// The text still held back, emitted at the end of generation (no stop string was found).
    pub fn flush(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        std::mem::take(&mut self.held)
    }
}
