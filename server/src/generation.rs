//! One request's generation as text chunks: tokens from the batcher through the
//! [`Detokenizer`] and the [`StopMatcher`].

use crate::batcher::{Event, Finish};
use crate::detok::{Detokenizer, StopMatcher};
use crate::tokenizer::TextTokenizer;
use std::sync::Arc;
use tokio::sync::mpsc;

/// A piece of output: text, the token ids it covers, and the finish reason on the last one.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Chunk {
    /// Text (may be empty).
    pub text: String,
    /// Token ids covered.
    pub ids: Vec<u32>,
    /// `Some("stop" | "length")` on the last chunk.
    pub finish: Option<&'static str>,
}

/// Turns a request's [`Event`]s into [`Chunk`]s. Dropping it (or [`Generation::close`]) drops
/// the receiver, which cancels the request in the batcher; after a stop string, call
/// `BatcherHandle::truncate_served` first, then `close`.
#[derive(Debug)]
pub struct Generation {
    rx: Option<mpsc::UnboundedReceiver<Event>>,
    tok: Arc<TextTokenizer>,
    detok: Detokenizer,
    stop: StopMatcher,
    every_token: bool,
    /// Tokens received from the batcher.
    pub completion_tokens: usize,
    done: bool,
}

impl Generation {
    /// Wraps `rx`; with `every_token` a chunk comes for every token even when its text is
    /// empty (for `return_token_ids`).
    pub fn new(
        rx: mpsc::UnboundedReceiver<Event>,
        tok: Arc<TextTokenizer>,
        stop: Vec<String>,
        every_token: bool,
    ) -> Generation {
        Generation {
            rx: Some(rx),
            tok,
            detok: Detokenizer::new(),
            stop: StopMatcher::new(stop),
            every_token,
            completion_tokens: 0,
            done: false,
        }
    }

    /// The next chunk; `None` after the last. `Err` when the server aborted the request.
    pub async fn next(&mut self) -> Option<Result<Chunk, String>> {
        if self.done {
            return None;
        }
        let mut pending = Chunk::default();
        loop {
            let rx = self.rx.as_mut()?;
            let ev = rx.recv().await;
            match ev {
                Some(Event::Token(t)) => {
                    self.completion_tokens += 1;
                    pending.ids.push(t);
                    let delta = match self.detok.push(&self.tok, t) {
                        Ok(d) => d,
                        Err(e) => return Some(self.abort(e.to_string())),
                    };
                    let (text, stopped) = self.stop.push(&delta);
                    pending.text.push_str(&text);
                    if stopped {
                        // The receiver stays open until `close` (or drop): the caller first tells
                        // the batcher how much was served, so the batcher sees a stop, not a
                        // cancellation.
                        self.done = true;
                        pending.finish = Some("stop");
                        return Some(Ok(pending));
                    }
                    if self.every_token || !pending.text.is_empty() {
                        return Some(Ok(pending));
                    }
                }
                Some(Event::Done(Finish::Aborted(why))) => return Some(self.abort(why)),
                Some(Event::Done(f)) => {
                    self.done = true;
                    self.rx = None;
                    let tail = self.detok.flush(&self.tok).unwrap_or_default();
                    let (text, stopped) = self.stop.push(&tail);
                    pending.text.push_str(&text);
                    if !stopped {
                        pending.text.push_str(&self.stop.flush());
                    }
                    pending.finish = Some(if stopped || f == Finish::Eos { "stop" } else { "length" });
                    return Some(Ok(pending));
                }
                None => {
                    // The batcher ended without a `Done` for this request (it failed, or stopped
                    // with the request still queued): it never counted it, so it is counted here.
                    metrics::counter!(crate::metrics::REQUESTS, "outcome" => "aborted").increment(1);
                    return Some(self.abort("the batcher stopped".into()));
                }
            }
        }
    }

    /// Whether a stop string ended the generation (the batcher may have generated more tokens
    /// than the [`Generation::completion_tokens`] the client was sent).
    pub fn stopped_by_string(&self) -> bool {
        self.stop.stopped()
    }

    /// Drops the receiver: the batcher ends the request at its next step (a cancellation, unless
    /// `truncate_served` said how much was served).
    pub fn close(&mut self) {
        self.rx = None;
    }

    fn abort(&mut self, why: String) -> Result<Chunk, String> {
        self.done = true;
        self.rx = None;
        Err(why)
    }

    /// Runs to the end: all text, all ids, the finish reason.
    ///
    /// # Errors
    /// The server aborted the request.
    pub async fn collect(&mut self) -> Result<Chunk, String> {
        let mut all = Chunk::default();
        while let Some(c) = self.next().await {
            let c = c?;
            all.text.push_str(&c.text);
            all.ids.extend(c.ids);
            all.finish = c.finish.or(all.finish);
        }
        Ok(all)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Found by red-team review: the receiver was dropped the moment a stop string matched, before
    /// the caller could tell the batcher how much was served, so the batcher could count the
    /// request as cancelled. It stays open until `close`.
    #[tokio::test(flavor = "current_thread")]
    async fn a_stop_string_leaves_the_receiver_open_until_close() {
        let tok = Arc::new(TextTokenizer::fixture().unwrap());
        let ids = tok.encode("hello world, hello again", false).unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        for &t in &ids {
            tx.send(Event::Token(t)).unwrap();
        }
        let mut g = Generation::new(rx, tok, vec!["world".into()], false);
        let all = g.collect().await.unwrap();
        assert_eq!(all.finish, Some("stop"));
        assert!(g.stopped_by_string());
        assert!(!tx.is_closed(), "the receiver was dropped before close()");
        g.close();
        assert!(tx.is_closed());
    }

    /// Found by review: a request whose batcher ended without a `Done` (it failed, or stopped with
    /// the request queued) got a 500 but was counted under no outcome. Counted "aborted" here.
    #[test]
    fn a_request_the_batcher_dropped_is_counted_aborted() {
        let recorder = metrics_exporter_prometheus::PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let got = metrics::with_local_recorder(&recorder, || {
            let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
            rt.block_on(async {
                let tok = Arc::new(TextTokenizer::fixture().unwrap());
                let (tx, rx) = mpsc::unbounded_channel();
                drop(tx);
                let mut g = Generation::new(rx, tok, vec![], false);
                g.collect().await
            })
        });
        assert_eq!(got, Err("the batcher stopped".to_string()));
        assert!(
            handle.render().contains("llama_requests_total{outcome=\"aborted\"} 1"),
            "{}",
            handle.render()
        );
    }
}
