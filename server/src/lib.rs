//! `llama-serve`: an OpenAI-compatible streaming HTTP server over the Llama decoder.
//!
//! - [`engine`]: the model behind a trait ([`engine::Engine`]); [`fake::FakeEngine`] for tests,
//!   [`llama_engine::LlamaEngine`] over `models::llama::LlamaModel`;
//! - [`batcher`]: continuous batching, one task owning the engine;
//! - [`tokenizer`], [`detok`]: text in and out;
//! - [`api`], [`http`]: the OpenAI request and response bodies, the axum routes;
//! - [`metrics`]: Prometheus metrics;
//! - [`shutdown`]: serving until a signal, then a bounded graceful shutdown.

#![warn(missing_docs)]

pub mod api;
pub mod batcher;
pub mod detok;
pub mod engine;
pub mod fake;
pub mod generation;
pub mod http;
pub mod listen;
pub mod llama_engine;
pub mod loadgen;
pub mod metrics;
pub mod paths;
pub mod shutdown;
pub mod tokenizer;
