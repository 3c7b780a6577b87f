//! The HTTP side: the clients' streamed completions, the gauges of `/metrics`, and the replay
//! check through `POST /debug/replay`.

use super::plan::{check_loopback, plan, LoadOptions, Planned};
use super::report::{LoadReport, MetricsAfter, VerifyReport};
use super::sse::SseParser;
use super::stats::Summary;
use super::stream::StreamState;
use anyhow::{bail, Context, Result};
use futures::StreamExt;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How one request ended.
#[derive(Debug)]
enum End {
    /// Ran to `[DONE]` and passed the checks.
    Completed,
    /// Dropped on purpose after the planned number of tokens.
    Cancelled,
    /// Failed, with the reason.
    Failed(String),
}

/// Runs the load described by `o` against the server at `o.url` (then the gauges, then the
/// replay check with `o.verify`) and returns the report; `command` is recorded in it. Every
/// request and replay is bounded by `o.timeout_s`, the wait for the gauges by `o.settle_s`.
///
/// # Errors
///
/// Bad options (a URL that is not loopback among them), an HTTP client that cannot be built, or
/// a model name that cannot be read from `/v1/models` when none is given. Failed requests are not
/// errors here: they are counted in the report (see [`LoadReport::failures`]).
pub async fn run_load(o: &LoadOptions, command: String) -> Result<LoadReport> {
    o.validate()?;
    let base = check_loopback(&o.url)?.as_str().trim_end_matches('/').to_string();
    let timeout = Duration::from_secs_f64(o.timeout_s);
    // No proxy (the environment's must not divert loopback traffic) and no redirects (which could
    // lead off loopback).
    let client = reqwest::Client::builder()
        .no_proxy()
        .redirect(reqwest::redirect::Policy::none())
        .connect_timeout(Duration::from_secs(10))
        // Below the server's header timeout (30 s by default), which also closes idle keep-alive
        // connections: a pooled connection is never reused just as the server closes it.
        .pool_idle_timeout(Duration::from_secs(20))
        .build()
        .context("building the HTTP client")?;
    let model = match &o.model {
        Some(m) => m.clone(),
        None => first_model(&client, &base, timeout).await?,
    };
    let shared = Arc::new((client.clone(), base.clone(), model, o.clone()));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for requests in plan(o) {
        let shared = Arc::clone(&shared);
        tasks.push(tokio::spawn(async move {
            let (client, base, model, o) = &*shared;
            let mut out = Vec::with_capacity(requests.len());
            for p in &requests {
                let mut st = StreamState::new(Instant::now());
                let end = match tokio::time::timeout(timeout, one(client, base, model, o, p, &mut st)).await {
                    Ok(Ok(end)) => end,
                    Ok(Err(e)) => End::Failed(e),
                    Err(_) => End::Failed(format!("timed out after {} s", o.timeout_s)),
                };
                out.push((end, st));
            }
            out
        }));
    }
    let mut results = Vec::new();
    for t in tasks {
        results.extend(t.await.context("a client task panicked")?);
    }
    let wall_s = start.elapsed().as_secs_f64();

    let (mut ttft, mut tpot, mut failures) = (Vec::new(), Vec::new(), Vec::new());
    let (mut completed, mut cancelled, mut tokens) = (0, 0, 0u64);
    let mut to_verify = Vec::new();
    for (end, st) in results {
        tokens += st.ids.len() as u64;
        match end {
            End::Failed(e) => {
                failures.push(e);
                continue;
            }
            End::Completed => {
                completed += 1;
                to_verify.push((st.id.clone(), st.ids.clone()));
            }
            End::Cancelled => cancelled += 1,
        }
        ttft.extend(st.ttft.map(|d| d.as_secs_f64() * 1e3));
        tpot.extend(st.gaps.iter().map(|d| d.as_secs_f64() * 1e3));
    }
    for (i, f) in failures.iter().take(10).enumerate() {
        eprintln!("llama-load: request error {}: {f}", i + 1);
    }
    let metrics_after = settled_gauges(&client, &base, Duration::from_secs_f64(o.settle_s)).await;
    let verify = if o.verify {
        Some(verify(&client, &base, to_verify, timeout, o.verify_concurrency).await)
    } else {
        None
    };
    Ok(LoadReport {
        mode: "http".into(),
        clients: o.clients,
        requests: o.requests(),
        prompt_tokens: o.prompt_tokens,
        max_tokens: o.max_tokens,
        sampled_fraction: o.sampled_fraction,
        cancel_fraction: o.cancel_fraction,
        completed,
        cancelled,
        errors: failures.len(),
        generated_tokens: tokens,
        wall_s,
        tokens_per_s: if wall_s > 0.0 { tokens as f64 / wall_s } else { 0.0 },
        ttft_ms: Summary::of(&ttft),
        tpot_ms: Summary::of(&tpot),
        verify,
        metrics_after,
        command,
    })
}

/// The body of one planned request.
fn body(model: &str, o: &LoadOptions, p: &Planned) -> Value {
    let mut b = json!({
        "model": model,
        "prompt": p.prompt,
        "max_tokens": o.max_tokens,
        "temperature": 0.0,
        "stream": true,
        "stream_options": {"include_usage": true},
        "return_token_ids": true,
    });
    if let Some(seed) = p.sampled {
        b["temperature"] = json!(0.8);
        b["top_p"] = json!(0.95);
        b["seed"] = json!(seed);
    }
    b
}

/// One streamed completion, its chunks recorded into `st`.
async fn one(
    client: &reqwest::Client,
    base: &str,
    model: &str,
    o: &LoadOptions,
    p: &Planned,
    st: &mut StreamState,
) -> Result<End, String> {
    *st = StreamState::new(Instant::now());
    let mut resp = client
        .post(format!("{base}/v1/completions"))
        .json(&body(model, o, p))
        .send()
        .await
        .map_err(|e| format!("sending the request: {e}"))?;
    if !resp.status().is_success() {
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        return Err(format!("HTTP {status}: {text:.300}"));
    }
    let mut parser = SseParser::default();
    loop {
        let Some(bytes) = resp.chunk().await.map_err(|e| format!("reading the stream: {e}"))? else { break };
        let now = Instant::now();
        for data in parser.push(&bytes).map_err(|e| e.to_string())? {
            st.on_data(&data, now)?;
            if p.cancel_after.is_some_and(|c| st.ids.len() >= c) && st.finish.is_none() {
                return Ok(End::Cancelled); // dropping `resp` closes the connection
            }
        }
    }
    if parser.is_mid_event() {
        return Err("the stream was cut in the middle of an event".into());
    }
    st.check_complete(p.prompt.len(), o.max_tokens, o.vocab)?;
    Ok(End::Completed)
}

/// The first model id of `GET /v1/models`.
async fn first_model(client: &reqwest::Client, base: &str, timeout: Duration) -> Result<String> {
    let get = async {
        let v: Value =
            client.get(format!("{base}/v1/models")).send().await?.error_for_status()?.json().await?;
        Ok::<_, reqwest::Error>(v)
    };
    let v = tokio::time::timeout(timeout, get)
        .await
        .context("GET /v1/models timed out")?
        .context("GET /v1/models (give --model to skip it)")?;
    match v["data"][0]["id"].as_str() {
        Some(id) => Ok(id.to_string()),
        None => bail!("GET /v1/models lists no model: {v}"),
    }
}

/// Polls `/metrics` until the gauges are 0 or `settle` has passed; the last scrape (all `None`
/// when `/metrics` could not be read).
async fn settled_gauges(client: &reqwest::Client, base: &str, settle: Duration) -> MetricsAfter {
    let until = Instant::now() + settle;
    loop {
        let text = async {
            let r = client.get(format!("{base}/metrics")).timeout(Duration::from_secs(10)).send().await?;
            r.error_for_status()?.text().await
        };
        let m = match text.await {
            Ok(t) => scrape_gauges(&t),
            Err(e) => {
                eprintln!("llama-load: GET /metrics: {e}");
                MetricsAfter::default()
            }
        };
        if m.not_idle().is_none() || Instant::now() >= until {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The gauges of a Prometheus text exposition: samples whose name (lower case, without
/// `_total`/`_count`/`_sum`/`_bucket`/`_created` endings, which are counters and histograms)
/// contains `running` (requests running), `queue` or `waiting` (queued), or `kv` with `used`,
/// `in_use` or `usage` (KV slots used). Several samples of one kind are added up.
///
/// ```
/// use cuda_async_examples::load::scrape_gauges;
/// let m = scrape_gauges("# TYPE llama_requests_running gauge\nllama_requests_running 0\nllama_kv_slots_used 3\n");
/// assert_eq!((m.running, m.queued, m.kv_slots_used), (Some(0.0), None, Some(3.0)));
/// ```
pub fn scrape_gauges(text: &str) -> MetricsAfter {
    let mut m = MetricsAfter::default();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')) {
        let (series, rest) = match line.find('}') {
            Some(i) => (&line[..=i], &line[i + 1..]),
            None => line.split_once(char::is_whitespace).unwrap_or((line, "")),
        };
        let Some(Ok(value)) = rest.split_whitespace().next().map(str::parse::<f64>) else { continue };
        let name = series.split('{').next().unwrap_or("").to_ascii_lowercase();
        if ["_total", "_count", "_sum", "_bucket", "_created"].iter().any(|s| name.ends_with(s)) {
            continue;
        }
        let slot = if name.contains("running") {
            &mut m.running
        } else if name.contains("queue") || name.contains("waiting") {
            &mut m.queued
        } else if name.contains("kv") && ["used", "in_use", "usage"].iter().any(|s| name.contains(s)) {
            &mut m.kv_slots_used
        } else {
            continue;
        };
        *slot = Some(slot.unwrap_or(0.0) + value);
        m.gauges.insert(series.to_string(), value);
    }
    m
}

/// Replays every completed stream and compares its token ids with the replay's.
async fn verify(
    client: &reqwest::Client,
    base: &str,
    streams: Vec<(Option<String>, Vec<u32>)>,
    timeout: Duration,
    concurrency: usize,
) -> VerifyReport {
    let results: Vec<(u64, u64, bool)> = futures::stream::iter(streams)
        .map(|(id, ids)| async move {
            let replay = match &id {
                None => Err("the stream had no response id".to_string()),
                Some(id) => tokio::time::timeout(timeout, replay(client, base, id))
                    .await
                    .unwrap_or_else(|_| Err("timed out".into())),
            };
            let (equal, same) = match replay {
                Ok(r) => (ids.iter().zip(&r).filter(|(a, b)| a == b).count() as u64, r == ids),
                Err(e) => {
                    eprintln!("llama-load: replay of {id:?}: {e}");
                    (0, false)
                }
            };
            (ids.len() as u64, equal, same)
        })
        .buffer_unordered(concurrency)
        .collect()
        .await;
    VerifyReport {
        streams: results.len(),
        tokens_checked: results.iter().map(|r| r.0).sum(),
        tokens_equal: results.iter().map(|r| r.1).sum(),
        mismatched_streams: results.iter().filter(|r| !r.2).count(),
    }
}

/// `POST /debug/replay {"id"}` -> its `token_ids`.
async fn replay(client: &reqwest::Client, base: &str, id: &str) -> Result<Vec<u32>, String> {
    let resp = client
        .post(format!("{base}/debug/replay"))
        .json(&json!({ "id": id }))
        .send()
        .await
        .map_err(|e| format!("sending: {e}"))?;
    let status = resp.status();
    let v: Value = resp.json().await.map_err(|e| format!("HTTP {status}, reading the answer: {e}"))?;
    if !status.is_success() {
        return Err(format!("HTTP {status}: {v}"));
    }
    if v["id"].as_str() != Some(id) {
        return Err(format!("the replay answered for id {} (asked {id})", v["id"]));
    }
    serde_json::from_value(v["token_ids"].clone()).map_err(|e| format!("token_ids: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gauges_from_prometheus_text() {
        let text = "# HELP llama_requests_running Requests running\n# TYPE llama_requests_running gauge\n\
                    llama_requests_running 0\nllama_requests_queued{model=\"m\"} 2\n\
                    llama_requests_running_total 55\nllama_kv_slots_used 0 1700000000\nllama_kv_slots_total 64\n\
                    bogus_line\nllama_tokens_generated_total 1e6\n";
        let m = scrape_gauges(text);
        assert_eq!((m.running, m.queued, m.kv_slots_used), (Some(0.0), Some(2.0), Some(0.0)));
        assert_eq!(m.gauges.len(), 3, "{:?}", m.gauges);
        assert_eq!(m.gauges["llama_requests_queued{model=\"m\"}"], 2.0);
        assert_eq!(m.not_idle().as_deref(), Some("queued = 2"));
        assert_eq!(
            scrape_gauges("").not_idle().as_deref(),
            Some("running: not found, queued: not found, kv slots used: not found")
        );
    }

    #[test]
    fn request_bodies() {
        let o = super::super::plan::tests_support::options(&["--max-tokens", "7"]);
        let greedy = Planned { prompt: vec![5, 6], sampled: None, cancel_after: None };
        let b = body("m", &o, &greedy);
        assert_eq!(b["temperature"], 0.0);
        assert_eq!(b["prompt"], json!([5, 6]));
        assert!(
            b.get("seed").is_none()
                && b["return_token_ids"] == true
                && b["stream_options"]["include_usage"] == true
        );
        let b = body("m", &o, &Planned { sampled: Some(9), ..greedy });
        assert_eq!(
            (b["temperature"].as_f64(), b["top_p"].as_f64(), b["seed"].as_u64()),
            (Some(0.8), Some(0.95), Some(9))
        );
        assert_eq!(b["max_tokens"], 7);
    }
}
