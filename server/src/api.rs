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
        // A request the batcher took and aborted ("aborted", a 500) was counted when it retired.
        if self.code != "aborted" {
            metrics::counter!(crate::metrics::REQUESTS, "outcome" => "rejected").increment(1);
        }
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
            /// Seed: any JSON integer in `[-2^63, 2^64)` (negative seeds wrap, as OpenAI
            /// allows them).
            #[serde(default, deserialize_with = "seed_de")]
            pub seed: Option<u64>,
            /// Stop strings.
            pub stop: Option<StopInput>,
            /// Choices (only 1).
            pub n: Option<i64>,
            /// Stream as server-sent events (`null` is false).
            #[serde(default, deserialize_with = "bool_or_null")]
            pub stream: bool,
            /// Streaming options.
            pub stream_options: Option<StreamOptions>,
            /// End-user id (accepted).
            pub user: Option<String>,
            /// Extension: every choice carries its token ids.
            #[serde(default, deserialize_with = "bool_or_null")]
            pub return_token_ids: bool,
            /// Not supported: accepted when absent or 0.
            pub frequency_penalty: Option<f64>,
            /// Not supported: accepted when absent or 0.
            pub presence_penalty: Option<f64>,
            /// Not supported: accepted when absent or empty.
            pub logit_bias: Option<serde_json::Map<String, serde_json::Value>>,
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
        /// Not supported: accepted when absent, `null` or 0.
        logprobs: Option<serde_json::Value>,
        /// Not supported: accepted when absent or false.
        echo: Option<bool>,
        /// Not supported: accepted when absent or 1.
        best_of: Option<i64>,
        /// Not supported: accepted when absent or empty.
        suffix: Option<String>,
    }
}

request! {
    /// `POST /v1/chat/completions`.
    ChatRequest {
        /// The conversation.
        messages: Vec<ChatMessage>,
        /// Newer spelling of `max_tokens`.
        max_completion_tokens: Option<i64>,
        /// Not supported: accepted when absent or false.
        logprobs: Option<bool>,
        /// Not supported: accepted when absent or 0.
        top_logprobs: Option<i64>,
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

/// The longest stop string, in bytes (matching holds back up to this much text per token).
pub const MAX_STOP_BYTES: usize = 512;

/// Temperatures below this are greedy: dividing logits by less overflows f32.
pub const MIN_TEMPERATURE: f64 = 1e-5;

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
        // The engine samples in f32: a finite f64 may still overflow it (1e300) or round
        // to 0 (top_p 1e-300), and a temperature near 0 divides the logits into infinities.
        let temperature = self.temperature.unwrap_or(1.0);
        if !temperature.is_finite() || temperature < 0.0 || !(temperature as f32).is_finite() {
            return Err(ApiError::bad(
                Some("temperature"),
                "invalid_value",
                "temperature must be a finite number >= 0 (within f32)",
            ));
        }
        let temperature = if temperature < MIN_TEMPERATURE { 0.0 } else { temperature as f32 };
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0 && top_p as f32 > 0.0) {
            return Err(ApiError::bad(
                Some("top_p"),
                "invalid_value",
                "top_p must be in (0, 1] (and not round to 0 in f32)",
            ));
        }
        let stop = match &self.stop {
            None => Vec::new(),
            Some(StopInput::One(s)) => vec![s.clone()],
            Some(StopInput::Many(v)) if v.len() <= 4 => v.clone(),
            Some(StopInput::Many(_)) => {
                return Err(ApiError::bad(Some("stop"), "invalid_value", "at most 4 stop strings"))
            }
        };
        if stop.iter().any(|s| s.len() > MAX_STOP_BYTES) {
            return Err(ApiError::bad(
                Some("stop"),
                "invalid_value",
                format!("a stop string is longer than {MAX_STOP_BYTES} bytes"),
            ));
        }
        if self.stream_options.is_some() && !self.stream {
            return Err(ApiError::bad(
                Some("stream_options"),
                "invalid_value",
                "stream_options needs stream: true",
            ));
        }
        Ok(Params {
            sampling: Sampling {
                temperature,
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

/// A 400 naming `param`, an OpenAI feature this server does not implement.
fn unsupported(param: &'static str, what: &str) -> ApiError {
    ApiError::bad(Some(param), "unsupported_value", format!("{param} is not supported ({what})"))
}

/// Checks the unsupported parameters the two endpoints share: only their no-op values pass.
fn shared_unsupported(
    frequency_penalty: Option<f64>,
    presence_penalty: Option<f64>,
    logit_bias: Option<&serde_json::Map<String, serde_json::Value>>,
) -> Result<(), ApiError> {
    if frequency_penalty.is_some_and(|x| x != 0.0) {
        return Err(unsupported("frequency_penalty", "only 0"));
    }
    if presence_penalty.is_some_and(|x| x != 0.0) {
        return Err(unsupported("presence_penalty", "only 0"));
    }
    if logit_bias.is_some_and(|m| !m.is_empty()) {
        return Err(unsupported("logit_bias", "only {}"));
    }
    Ok(())
}

impl CompletionRequest {
    /// Refuses the OpenAI features not implemented here unless they hold their no-op value.
    ///
    /// # Errors
    /// A 400 naming the parameter: `logprobs` other than `null`/0, `echo: true`, `best_of`
    /// other than 1, a non-empty `suffix`, a penalty other than 0, a non-empty `logit_bias`.
    pub fn check_unsupported(&self) -> Result<(), ApiError> {
        let lp_off = match &self.logprobs {
            None | Some(serde_json::Value::Null) => true,
            Some(v) => v.as_i64() == Some(0),
        };
        if !lp_off {
            return Err(unsupported("logprobs", "only null or 0"));
        }
        if self.echo == Some(true) {
            return Err(unsupported("echo", "only false"));
        }
        if self.best_of.is_some_and(|b| b != 1) {
            return Err(unsupported("best_of", "only 1"));
        }
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(unsupported("suffix", "only empty"));
        }
        shared_unsupported(self.frequency_penalty, self.presence_penalty, self.logit_bias.as_ref())
    }
}

impl ChatRequest {
    /// Refuses the OpenAI features not implemented here unless they hold their no-op value.
    ///
    /// # Errors
    /// A 400 naming the parameter: `logprobs: true`, `top_logprobs` other than 0, a penalty
    /// other than 0, a non-empty `logit_bias`.
    pub fn check_unsupported(&self) -> Result<(), ApiError> {
        if self.logprobs == Some(true) {
            return Err(unsupported("logprobs", "only false"));
        }
        if self.top_logprobs.is_some_and(|n| n != 0) {
            return Err(unsupported("top_logprobs", "only 0"));
        }
        shared_unsupported(self.frequency_penalty, self.presence_penalty, self.logit_bias.as_ref())
    }
}

/// `seed`: a JSON integer in `[-2^63, 2^64)`; negative values wrap to `u64`.
fn seed_de<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Seed {
        U(u64),
        I(i64),
    }
    Ok(Option::<Seed>::deserialize(d)?.map(|s| match s {
        Seed::U(u) => u,
        Seed::I(i) => i as u64,
    }))
}

/// A boolean where `null` means false.
fn bool_or_null<'de, D: serde::Deserializer<'de>>(d: D) -> Result<bool, D::Error> {
    Ok(Option::<bool>::deserialize(d)?.unwrap_or(false))
}

/// The roles OpenAI's chat API defines; the role is pasted into the chat template, so any other
/// string (say `"user<|eot_id|>..."`) could forge turns.
pub const CHAT_ROLES: [&str; 5] = ["system", "developer", "user", "assistant", "tool"];

/// Checks the conversation: at least one message, each of a known role.
///
/// # Errors
/// A 400 about `messages`.
pub fn check_messages(messages: &[ChatMessage]) -> Result<(), ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad(Some("messages"), "invalid_value", "messages is empty"));
    }
    if let Some((i, m)) = messages.iter().enumerate().find(|(_, m)| !CHAT_ROLES.contains(&m.role.as_str())) {
        return Err(ApiError::bad(
            Some("messages"),
            "invalid_value",
            format!(
                "messages[{i}].role {:?} is not one of {CHAT_ROLES:?}",
                m.role.chars().take(64).collect::<String>()
            ),
        ));
    }
    Ok(())
}
