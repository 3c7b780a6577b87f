//! `llama-load`: a load generator and checker for an OpenAI-compatible completion server
//! (`llama-serve`), from outside, over HTTP on loopback only.
//!
//! Each of `clients` tasks sends its `requests_per_client` streamed completions one after another
//! (prompt: random token ids, `return_token_ids`, `stream_options.include_usage`); a share of them
//! is sampled (temperature 0.8, top-p 0.95, a seed of its own), the rest greedy, and a share is
//! cancelled by dropping the connection after a random number of tokens. Every stream's time to
//! first token, gaps between tokens and consistency are recorded ([`stream`]); with `verify`
//! every completed stream is replayed through `POST /debug/replay` and the ids compared. The
//! result is a [`LoadReport`] (the JSON schema of `--json`).

pub mod plan;
pub mod report;
pub mod run;
pub mod sse;
pub mod stats;
pub mod stream;

#[cfg(test)]
mod e2e_tests;

pub use plan::{check_loopback, plan, LoadOptions, Planned};
pub use report::{LoadReport, MetricsAfter, VerifyReport};
pub use run::{run_load, scrape_gauges};
pub use sse::{SseError, SseParser};
pub use stats::{percentile, Summary};
pub use stream::StreamState;
