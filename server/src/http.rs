//! The axum routes: `/v1/completions`, `/v1/chat/completions` (streamed as server-sent events
//! or not), `/v1/models`, `/health`, `/metrics`, and `/debug/replay` when enabled.

use crate::api::{max_tokens, ApiError, ChatRequest, CompletionRequest, Params, PromptInput};
use crate::batcher::{BatcherHandle, GenRequest, SubmitError};
use crate::engine::EngineError;
use crate::generation::{Chunk, Generation};
use crate::tokenizer::TextTokenizer;
use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// The server's settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerConfig {
    /// The name `/v1/models` lists and responses carry.
    pub model_name: String,
    /// A bearer key required on `/v1/*` (and `/debug/*`), if set.
    pub api_key: Option<String>,
    /// Largest request body.
    pub max_body_bytes: usize,
    /// Serve `POST /debug/replay`.
    pub debug_replay: bool,
    /// Bounds on connections (see [`crate::listen`]).
    pub conn: crate::listen::ConnLimits,
}

/// What the handlers share.
#[derive(Debug)]
pub struct AppState {
    /// The batcher.
    pub batcher: BatcherHandle,
    /// The tokenizer.
    pub tok: Arc<TextTokenizer>,
    /// Settings.
    pub cfg: ServerConfig,
    /// The metrics recorder's handle.
    pub metrics: metrics_exporter_prometheus::PrometheusHandle,
}

/// The router over `state`.
///
/// ```no_run
/// # async fn f(state: std::sync::Arc<server::http::AppState>) {
/// let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
/// axum::serve(listener, server::http::router(state)).await.unwrap();
/// # }
/// ```
pub fn router(state: Arc<AppState>) -> Router {
    let limit = state.cfg.max_body_bytes;
    let mut r = Router::new()
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/metrics", get(metrics_text));
    if state.cfg.debug_replay {
        r = r.route("/debug/replay", post(replay));
    }
    r.fallback(|| async {
        ApiError::new(StatusCode::NOT_FOUND, "invalid_request_error", "not_found", "no such route")
    })
    .method_not_allowed_fallback(|| async {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method_not_allowed",
            "this route does not take that method",
        )
    })
    .layer(DefaultBodyLimit::max(limit))
    .layer(axum::middleware::from_fn_with_state(state.clone(), body_deadline))
    // Outermost: the key is checked on every /v1 and /debug path (routes, wrong methods and
    // unknown routes alike) before any body is read.
    .layer(axum::middleware::from_fn_with_state(state.clone(), auth))
    .with_state(state)
}

/// Bounds the time a request's body may take to arrive (`ConnLimits::body_read_timeout`).
async fn body_deadline(
    State(st): State<Arc<AppState>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let (parts, body) = req.into_parts();
    let body = Body::new(crate::listen::DeadlineBody::new(body, st.cfg.conn.body_read_timeout));
    next.run(axum::extract::Request::from_parts(parts, body)).await
}

async fn auth(
    State(st): State<Arc<AppState>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let p = req.uri().path();
    if p.starts_with("/v1") || p.starts_with("/debug") {
        if let Err(e) = check_key(&st, req.headers()) {
            return e.into_response();
        }
    }
    next.run(req).await
}

/// Compares in time independent of where the first difference is.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Serves `state` on `listener`, within its connection limits, until `shutdown` resolves (then
/// drains as axum does: see [`crate::listen`]).
///
/// # Errors
/// I/O errors of the listener.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: Arc<AppState>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = state.cfg.conn;
    crate::listen::serve(listener, router(state), limits, shutdown).await
}

fn now_secs() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn new_id(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    static BASE: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(rand::random);
    format!("{prefix}-{base:08x}{:08x}", N.fetch_add(1, Ordering::Relaxed))
}

fn check_key(st: &AppState, headers: &HeaderMap) -> Result<(), ApiError> {
    let Some(key) = &st.cfg.api_key else { return Ok(()) };
    // The scheme is case-insensitive (RFC 7235); the key is compared in constant time.
    let got = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or("");
    let token = got.split_once(' ').filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"));
    if token.is_some_and(|(_, t)| same_secret(t.as_bytes(), key.as_bytes())) {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "invalid_api_key",
            "a valid bearer key is required",
        ))
    }
}

/// Checks the content type and the body, and parses the JSON (the key was checked by
/// [`auth`]).
fn parse<T: serde::de::DeserializeOwned>(
    st: &AppState,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<T, ApiError> {
    if st.batcher.is_draining() {
        let mut e = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "server_error",
            "shutting_down",
            "the server is shutting down",
        );
        e.retry_after = Some(1);
        return Err(e);
    }
    let ct = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    // The media type's essence, parameters (`; charset=utf-8`) aside.
    let essence = ct.split(';').next().unwrap_or("").trim();
    if !essence.eq_ignore_ascii_case("application/json") {
        return Err(ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            "unsupported_media_type",
            "Content-Type must be application/json",
        ));
    }
    let body = body.map_err(|r| {
        if r.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                "body_too_large",
                format!("the body exceeds {} bytes", st.cfg.max_body_bytes),
            )
        } else {
            ApiError::bad(None, "invalid_body", r.body_text())
        }
    })?;
    serde_json::from_slice(&body).map_err(|e| {
        let code = if e.is_data() { "invalid_request" } else { "invalid_json" };
        ApiError::bad(None, code, format!("invalid request body: {e}"))
    })
}

fn submit(
    st: &AppState,
    req: GenRequest,
) -> Result<tokio::sync::mpsc::UnboundedReceiver<crate::batcher::Event>, ApiError> {
    st.batcher.submit(req).map_err(|e| match e {
        SubmitError::Invalid(m) => ApiError::bad(None, "invalid_value", m),
        SubmitError::QueueFull(_) | SubmitError::ShuttingDown => {
            let code = if matches!(e, SubmitError::QueueFull(_)) { "queue_full" } else { "shutting_down" };
            let mut a = ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", code, e.to_string());
            a.retry_after = Some(1);
            a
        }
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Completion,
    Chat,
}

struct Reply {
    id: String,
    created: u64,
    model: String,
    kind: Kind,
    params: Params,
    prompt_tokens: usize,
}

impl Reply {
    fn choice(&self, c: &Chunk, stream: bool, first: bool) -> Value {
        let mut v = match (self.kind, stream) {
            (Kind::Completion, _) => {
                json!({"index": 0, "text": c.text, "logprobs": null, "finish_reason": c.finish})
            }
            (Kind::Chat, false) => {
                json!({"index": 0, "message": {"role": "assistant", "content": c.text}, "logprobs": null, "finish_reason": c.finish})
            }
            (Kind::Chat, true) => {
                let mut delta = serde_json::Map::new();
                if first {
                    delta.insert("role".into(), "assistant".into());
                }
                if !c.text.is_empty() || first {
                    delta.insert("content".into(), c.text.clone().into());
                }
                json!({"index": 0, "delta": delta, "logprobs": null, "finish_reason": c.finish})
            }
        };
        if self.params.return_token_ids {
            v["token_ids"] = json!(c.ids);
        }
        v
    }

    fn object(&self, stream: bool) -> &'static str {
        match (self.kind, stream) {
            (Kind::Completion, _) => "text_completion",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
        }
    }

    fn usage(&self, completion: usize) -> Value {
        json!({"prompt_tokens": self.prompt_tokens, "completion_tokens": completion, "total_tokens": self.prompt_tokens + completion})
    }

    fn envelope(&self, stream: bool, choices: Value) -> Value {
        let mut v = json!({"id": self.id, "object": self.object(stream), "created": self.created, "model": self.model, "choices": choices});
        if stream && self.params.include_usage {
            // OpenAI: with include_usage every chunk carries `usage`, null but on the last.
            v["usage"] = Value::Null;
        }
        v
    }
}

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

async fn respond(
    st: Arc<AppState>,
    reply: Reply,
    rx: tokio::sync::mpsc::UnboundedReceiver<crate::batcher::Event>,
) -> Response {
    let every = reply.params.return_token_ids;
    let mut generation = Generation::new(rx, st.tok.clone(), reply.params.stop.clone(), every);
    if !reply.params.stream {
        return match generation.collect().await {
            Ok(all) => {
                if generation.stopped_by_string() {
                    st.batcher.truncate_served(&reply.id, generation.completion_tokens);
                }
                generation.close();
                let mut v = reply.envelope(false, json!([reply.choice(&all, false, true)]));
                v["usage"] = reply.usage(generation.completion_tokens);
                Json(v).into_response()
            }
            Err(why) => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "aborted", why)
                .into_response(),
        };
    }
    // A stream of SSE frames; dropping it (client gone) drops `generation`, which cancels.
    let state = (generation, reply, 0u8, st);
    let stream = futures::stream::unfold(state, |(mut g, reply, phase, st)| async move {
        let frame = match phase {
            0 if reply.kind == Kind::Chat => {
                let first = Chunk::default();
                (sse(&reply.envelope(true, json!([reply.choice(&first, true, true)]))), 1)
            }
            0 | 1 => match g.next().await {
                Some(Ok(c)) => {
                    if c.finish.is_some() && g.stopped_by_string() {
                        st.batcher.truncate_served(&reply.id, g.completion_tokens);
                        g.close();
                    }
                    (sse(&reply.envelope(true, json!([reply.choice(&c, true, false)]))), 1)
                }
                Some(Err(why)) => {
                    let e = ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "aborted", why);
                    (sse(&e.body()), 3)
                }
                None if reply.params.include_usage => {
                    let mut v = reply.envelope(true, json!([]));
                    v["usage"] = reply.usage(g.completion_tokens);
                    (sse(&v), 3)
                }
                None => (Bytes::from_static(b"data: [DONE]\n\n"), 4),
            },
            3 => (Bytes::from_static(b"data: [DONE]\n\n"), 4),
            _ => return None,
        };
        Some((Ok::<_, std::convert::Infallible>(frame.0), (g, reply, frame.1, st)))
    });
    Response::builder()
        .header(header::CONTENT_TYPE, "text/event-stream")
        .header(header::CACHE_CONTROL, "no-cache")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

async fn completions(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let run = async {
        let req: CompletionRequest = parse(&st, &headers, body)?;
        req.check_unsupported()?;
        let params = req.common().params()?;
        let max_tokens_asked = req.max_tokens;
        let prompt = match req.prompt {
            PromptInput::Text(t) => {
                let tok = st.tok.clone();
                off_runtime(move || tok.encode(&t, true))
                    .await?
                    .map_err(|e| ApiError::bad(Some("prompt"), "invalid_value", e.to_string()))?
            }
            PromptInput::Tokens(ids) => ids,
        };
        let limits = st.batcher.limits();
        if let Some(t) = prompt.iter().find(|&&t| t >= limits.vocab) {
            return Err(ApiError::bad(
                Some("prompt"),
                "invalid_value",
                format!("token {t} is outside the vocabulary ({})", limits.vocab),
            ));
        }
        let n = max_tokens(max_tokens_asked, Some(16), prompt.len(), limits.max_seq)?;
        Ok((params, prompt, n))
    };
    match run.await {
        Ok((params, prompt, n)) => start(st, Kind::Completion, params, prompt, n).await,
        Err(e) => e.into_response(),
    }
}

async fn chat(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let run = async {
        let req: ChatRequest = parse(&st, &headers, body)?;
        req.check_unsupported()?;
        let params = req.common().params()?;
        crate::api::check_messages(&req.messages)?;
        // Control tokens come from the template only: a message carrying their text would
        // forge turns (`...<|eot_id|><|start_header_id|>system<|end_header_id|>...`).
        for (i, m) in req.messages.iter().enumerate() {
            let found = st
                .tok
                .special_in(&m.content)
                .or_else(|| m.name.as_deref().and_then(|n| st.tok.special_in(n)));
            if let Some(sp) = found {
                return Err(ApiError::bad(
                    Some("messages"),
                    "invalid_value",
                    format!("messages[{i}] contains the special token {sp:?}"),
                ));
            }
        }
        let (tok, messages) = (st.tok.clone(), req.messages);
        let prompt =
            off_runtime(move || tok.render_chat(&messages, true).and_then(|t| tok.encode(&t, false)))
                .await?
                .map_err(|e| ApiError::bad(Some("messages"), "invalid_value", e.to_string()))?;
        // A chat request has no `prompt`: an over-long conversation is the `messages`' fault.
        let n = max_tokens(
            req.max_tokens.or(req.max_completion_tokens),
            None,
            prompt.len(),
            st.batcher.limits().max_seq,
        )
        .map_err(|mut e| {
            if e.param == Some("prompt") {
                e.param = Some("messages");
            }
            e
        })?;
        Ok::<_, ApiError>((params, prompt, n))
    };
    match run.await {
        Ok((params, prompt, n)) => start(st, Kind::Chat, params, prompt, n).await,
        Err(e) => e.into_response(),
    }
}

/// Runs `f` (tokenising or rendering up to a whole body: seconds for a megabyte) on the
/// blocking pool, so that it stalls neither the streams nor the batcher sharing the runtime.
async fn off_runtime<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", "tokenizer_failed", e.to_string())
    })
}

async fn start(st: Arc<AppState>, kind: Kind, params: Params, prompt: Vec<u32>, n: u32) -> Response {
    let id = new_id(if kind == Kind::Chat { "chatcmpl" } else { "cmpl" });
    let prompt_tokens = prompt.len();
    let req = GenRequest { id: id.clone(), prompt, max_tokens: n, sampling: params.sampling };
    let rx = match submit(&st, req) {
        Ok(rx) => rx,
        Err(e) => return e.into_response(),
    };
    let reply =
        Reply { id, created: now_secs(), model: st.cfg.model_name.clone(), kind, params, prompt_tokens };
    respond(st, reply, rx).await
}

async fn models(State(st): State<Arc<AppState>>) -> Response {
    Json(json!({"object": "list", "data": [{"id": st.cfg.model_name, "object": "model", "created": 0, "owned_by": "llama-serve", "max_model_len": st.batcher.limits().max_seq}]})).into_response()
}

async fn health(State(st): State<Arc<AppState>>) -> Response {
    if st.batcher.is_draining() {
        (StatusCode::SERVICE_UNAVAILABLE, Json(json!({"status": "shutting_down"}))).into_response()
    } else {
        Json(json!({"status": "ok"})).into_response()
    }
}

async fn metrics_text(State(st): State<Arc<AppState>>) -> Response {
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], st.metrics.render()).into_response()
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ReplayBody {
    id: String,
}

async fn replay(
    State(st): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let run = async {
        let b: ReplayBody = parse(&st, &headers, body)?;
        let out = st.batcher.replay(&b.id).await.map_err(|e| match e {
            EngineError::Busy(_) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", "replays_busy", e.to_string())
            }
            e => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "server_error",
                "replay_failed",
                e.to_string(),
            ),
        })?;
        let o = out.ok_or_else(|| {
            ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                "not_found",
                format!("no recorded path for {}", b.id),
            )
        })?;
        Ok::<_, ApiError>(Json(
            json!({"id": b.id, "token_ids": o.replayed, "served_token_ids": o.served, "equal": o.replayed == o.served}),
        ))
    };
    match run.await {
        Ok(j) => j.into_response(),
        Err(e) => e.into_response(),
    }
}
