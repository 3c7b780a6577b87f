//! The OpenAI request bodies, their validation, and OpenAI-style errors.

use crate::engine::Sampling;
use crate::tokenizer::ChatMessage;
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

/// An OpenAI-style error: `{"error": {"message", "type", "param", "code"}}` with a status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{status}: {message}")]
pub struct ApiError {
    /// The HTTP status.
    pub status: StatusCode,
    /// What went wrong.
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `server_error`, ...
    pub kind: &'static str,
    /// The offending parameter, if any.
    pub param: Option<&'static str>,
    /// A short machine-readable code.
    pub code: &'static str,
    /// Seconds for a `Retry-After` header (503s).
    pub retry_after: Option<u32>,
}

impl ApiError {
    /// A 400 `invalid_request_error` about `param`.
    pub fn bad(param: Option<&'static str>, code: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            kind: "invalid_request_error",
            param,
            code,
            retry_after: None,
        }
    }

    /// An error of another status.
    pub fn new(
        status: StatusCode,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> ApiError {
        ApiError { status, message: message.into(), kind, param: None, code, retry_after: None }
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        metrics::counter!(crate::metrics::ERRORS, "kind" => self.code).increment(1);
        metrics::counter!(crate::metrics::REQUESTS, "outcome" => "rejected").increment(1);
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

/// `prompt`: a string or an array of token ids.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum PromptInput {
    /// Text, tokenised by the server.
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
}

/// `stop`: a string or up to 4 strings.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(untagged)]
pub enum StopInput {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    /// Send a last chunk with `usage`.
    #[serde(default)]
    pub include_usage: bool,
}

macro_rules! request {
    ($(#[$m:meta])* $name:ident { $($(#[$fm:meta])* $field:ident : $ty:ty,)* }) => {
        $(#[$m])*
        #[derive(Debug, Clone, PartialEq, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $($(#[$fm])* pub $field: $ty,)*
            /// The model name (accepted, not checked).
            pub model: Option<String>,
            /// Tokens to generate at most.
            pub max_tokens: Option<i64>,
            /// Temperature (`>= 0`; default 1).
            pub temperature: Option<f64>,
            /// Nucleus mass in `(0, 1]`.
            pub top_p: Option<f64>,
            /// Top-k (extension; 0 = off).
            pub top_k: Option<u32>,
            /// Seed.
            pub seed: Option<u64>,
            /// Stop strings.
            pub stop: Option<StopInput>,
            /// Choices (only 1).
            pub n: Option<i64>,
            /// Stream as server-sent events.
            #[serde(default)]
            pub stream: bool,
            /// Streaming options.
            pub stream_options: Option<StreamOptions>,
            /// End-user id (accepted).
            pub user: Option<String>,
            /// Extension: every choice carries its token ids.
            #[serde(default)]
            pub return_token_ids: bool,
        }

        impl $name {
            /// The shared parameters.
            pub fn common(&self) -> Common {
                Common {
                    temperature: self.temperature,
                    top_p: self.top_p,
                    top_k: self.top_k,
                    seed: self.seed,
                    stop: self.stop.clone(),
                    n: self.n,
                    stream: self.stream,
                    stream_options: self.stream_options.clone(),
                    return_token_ids: self.return_token_ids,
                }
            }
        }
    };
}

request! {
    /// `POST /v1/completions`.
    CompletionRequest {
        /// The prompt.
        prompt: PromptInput,
    }
}

request! {
    /// `POST /v1/chat/completions`.
    ChatRequest {
        /// The conversation.
        messages: Vec<ChatMessage>,
        /// Newer spelling of `max_tokens`.
        max_completion_tokens: Option<i64>,
    }
}

/// The sampling and streaming parameters both endpoints share.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Common {
    /// Temperature.
    pub temperature: Option<f64>,
    /// Nucleus mass.
    pub top_p: Option<f64>,
    /// Top-k.
    pub top_k: Option<u32>,
    /// Seed.
    pub seed: Option<u64>,
    /// Stop strings.
    pub stop: Option<StopInput>,
    /// Choices.
    pub n: Option<i64>,
    /// Stream.
    pub stream: bool,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Token ids in every choice.
    pub return_token_ids: bool,
}

/// Validated generation parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// Sampling.
    pub sampling: Sampling,
    /// Stop strings.
    pub stop: Vec<String>,
    /// Stream.
    pub stream: bool,
    /// A usage chunk at the end of a stream.
    pub include_usage: bool,
    /// Token ids in every choice.
    pub return_token_ids: bool,
}

impl Common {
    /// Checks the shared parameters (all but `max_tokens`, checked against the prompt by
    /// [`max_tokens`]).
    ///
    /// # Errors
    /// A 400 naming the parameter: `n` other than 1, a negative or non-finite temperature,
    /// `top_p` outside `(0, 1]`, more than 4 stop strings, `stream_options` without `stream`.
    pub fn params(&self) -> Result<Params, ApiError> {
        if self.n.is_some_and(|n| n != 1) {
            return Err(ApiError::bad(Some("n"), "invalid_value", "only n = 1 is supported"));
        }
        let temperature = self.temperature.unwrap_or(1.0);
        if !temperature.is_finite() || temperature < 0.0 {
            return Err(ApiError::bad(
                Some("temperature"),
                "invalid_value",
                "temperature must be a finite number >= 0",
            ));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::bad(Some("top_p"), "invalid_value", "top_p must be in (0, 1]"));
        }
        let stop = match &self.stop {
            None => Vec::new(),
            Some(StopInput::One(s)) => vec![s.clone()],
            Some(StopInput::Many(v)) if v.len() <= 4 => v.clone(),
            Some(StopInput::Many(_)) => {
                return Err(ApiError::bad(Some("stop"), "invalid_value", "at most 4 stop strings"))
            }
        };
        if self.stream_options.is_some() && !self.stream {
            return Err(ApiError::bad(
                Some("stream_options"),
                "invalid_value",
                "stream_options needs stream: true",
            ));
        }
        Ok(Params {
            sampling: Sampling {
                temperature: temperature as f32,
                top_p: top_p as f32,
                top_k: self.top_k.unwrap_or(0),
                seed: self.seed.unwrap_or_else(rand::random),
            },
            stop,
            stream: self.stream,
            include_usage: self.stream_options.as_ref().is_some_and(|o| o.include_usage),
            return_token_ids: self.return_token_ids,
        })
    }
}

/// Checks `prompt_len` against the context and returns the tokens to generate: `requested`, or
/// `default` (capped by the room left) when absent.
///
/// # Errors
/// A 400: an empty prompt, a prompt that fills the context (`prompt`,
/// `context_length_exceeded`), `max_tokens` below 1 or beyond the room left (`max_tokens`).
pub fn max_tokens(
    requested: Option<i64>,
    default: Option<u32>,
    prompt_len: usize,
    max_seq: u32,
) -> Result<u32, ApiError> {
    if prompt_len == 0 {
        return Err(ApiError::bad(Some("prompt"), "invalid_value", "the prompt is empty"));
    }
    let room = (max_seq as usize).saturating_sub(prompt_len);
    if room == 0 {
        return Err(ApiError::bad(
            Some("prompt"),
            "context_length_exceeded",
            format!("the prompt has {prompt_len} tokens; the context holds {max_seq}"),
        ));
    }
    match requested {
        Some(n) if n < 1 => {
            Err(ApiError::bad(Some("max_tokens"), "invalid_value", "max_tokens must be at least 1"))
        }
        Some(n) if n as u64 > room as u64 => Err(ApiError::bad(
            Some("max_tokens"),
            "context_length_exceeded",
            format!("the prompt ({prompt_len} tokens) plus max_tokens ({n}) exceeds the context ({max_seq})"),
        )),
        Some(n) => Ok(n as u32),
        None => Ok(default.map_or(room, |d| (d as usize).min(room)) as u32),
    }
}
