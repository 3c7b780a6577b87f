//! The load's options, the loopback check of the target URL, and the per-request plan drawn from
//! the seed (prompt ids, greedy or sampled, where to cancel).

use anyhow::{bail, Context, Result};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

/// The options of `llama-load` (and of [`super::run_load`]).
#[derive(clap::Args, Serialize, Debug, Clone)]
pub struct LoadOptions {
    /// The server's base URL (loopback only: 127.0.0.0/8, ::1 or localhost)
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    pub url: String,
    /// The model name sent in requests (default: the first of GET /v1/models)
    #[arg(long)]
    pub model: Option<String>,
    /// Concurrent clients (streams)
    #[arg(long, default_value_t = 64)]
    pub clients: usize,
    /// Requests each client sends, one after another
    #[arg(long, default_value_t = 2)]
    pub requests_per_client: usize,
    /// Prompt length in tokens (random ids below --vocab)
    #[arg(long, default_value_t = 128)]
    pub prompt_tokens: usize,
    /// max_tokens of every request
    #[arg(long, default_value_t = 256)]
    pub max_tokens: usize,
    /// Share of requests sampled (temperature 0.8, top_p 0.95, own seed); the rest are greedy
    #[arg(long, default_value_t = 0.5)]
    pub sampled_fraction: f64,
    /// Share of requests cancelled (connection dropped) after a random number of tokens
    #[arg(long, default_value_t = 0.1)]
    pub cancel_fraction: f64,
    /// Seed of the plan (prompts, which requests are sampled/cancelled, their seeds)
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Vocabulary size: prompt ids are drawn in 2..vocab, generated ids must be below it
    #[arg(long, default_value_t = 2048)]
    pub vocab: u32,
    /// After the load, replay every completed stream (POST /debug/replay) and compare token ids
    #[arg(long)]
    pub verify: bool,
    /// Replays in flight at once during --verify (at most the server's queue of replays, 16: more
    /// are answered 503)
    #[arg(long, default_value_t = 4)]
    pub verify_concurrency: usize,
    /// Time limit of each request (and of each replay), in seconds
    #[arg(long, default_value_t = 120.0)]
    pub timeout_s: f64,
    /// How long to wait, after the load, for the gauges of /metrics to drop back to 0, in seconds
    #[arg(long, default_value_t = 10.0)]
    pub settle_s: f64,
}

impl LoadOptions {
    /// Total requests: clients × requests per client.
    pub fn requests(&self) -> usize {
        self.clients.saturating_mul(self.requests_per_client)
    }

    /// Checks the options (URL on loopback, counts and fractions in range).
    ///
    /// # Errors
    ///
    /// A message naming the bad option.
    pub fn validate(&self) -> Result<()> {
        check_loopback(&self.url)?;
        let frac = |f: f64, name: &str| {
            if (0.0..=1.0).contains(&f) {
                Ok(())
            } else {
                Err(anyhow::anyhow!("--{name} {f} is not in 0..=1"))
            }
        };
        frac(self.sampled_fraction, "sampled-fraction")?;
        frac(self.cancel_fraction, "cancel-fraction")?;
        if self.clients == 0 || self.requests_per_client == 0 || self.max_tokens == 0 {
            bail!("--clients, --requests-per-client and --max-tokens must be at least 1");
        }
        if self.prompt_tokens == 0 || self.vocab < 3 {
            bail!("--prompt-tokens must be at least 1 and --vocab at least 3");
        }
        if self.requests() > 1_000_000 || self.max_tokens > 1_000_000 || self.prompt_tokens > 1_000_000 {
            bail!("at most 1,000,000 requests, max tokens and prompt tokens");
        }
        let timeout_ok = self.timeout_s > 0.0 && self.timeout_s <= 86_400.0;
        if !timeout_ok || !(0.0..=3600.0).contains(&self.settle_s) {
            bail!("--timeout-s must be in (0, 86400] and --settle-s in [0, 3600]");
        }
        // The server's `server::batcher::MAX_QUEUED_REPLAYS` (this crate does not depend on it).
        const MAX_QUEUED_REPLAYS: usize = 16;
        if self.verify_concurrency == 0 || self.verify_concurrency > MAX_QUEUED_REPLAYS {
            bail!(
                "--verify-concurrency must be in 1..={MAX_QUEUED_REPLAYS} (the server queues at most that many replays)"
            );
        }
        Ok(())
    }
}

/// Accepts only `http://` URLs whose host is loopback (127.0.0.0/8, `[::1]`, `localhost`).
///
/// ```
/// use cuda_async_examples::load::check_loopback;
/// assert!(check_loopback("http://127.0.0.1:8000").is_ok());
/// assert!(check_loopback("http://10.0.0.1:8000").is_err());
/// ```
///
/// # Errors
///
/// An unparsable URL, another scheme, or a host that is not loopback.
pub fn check_loopback(url: &str) -> Result<reqwest::Url> {
    let u = reqwest::Url::parse(url).with_context(|| format!("parsing the URL {url:?}"))?;
    if u.scheme() != "http" {
        bail!("{url}: only http:// URLs are accepted (the load generator talks to a local server)");
    }
    let ok = match u.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    };
    if !ok {
        bail!("{url}: not a loopback address (only 127.0.0.0/8, [::1] and localhost are accepted)");
    }
    Ok(u)
}

/// One planned request.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// The prompt's token ids (exactly `prompt_tokens`, each in `2..vocab`).
    pub prompt: Vec<u32>,
    /// `Some(seed)` for a sampled request, `None` for greedy.
    pub sampled: Option<u64>,
    /// Drop the connection after this many tokens (`1..max_tokens`; `None`: run to the end).
    pub cancel_after: Option<usize>,
}

/// The plan of every request, `plan[client][i]`, drawn from `o.seed`: exactly
/// `round(requests × sampled_fraction)` sampled and `round(requests × cancel_fraction)` cancelled
/// (none when `max_tokens` is 1: there is no point before the end to cancel at).
pub fn plan(o: &LoadOptions) -> Vec<Vec<Planned>> {
    let n = o.requests();
    let mut rng = StdRng::seed_from_u64(o.seed);
    let count = |f: f64| ((n as f64 * f).round() as usize).min(n);
    let mut sampled: Vec<bool> = (0..n).map(|i| i < count(o.sampled_fraction)).collect();
    let mut cancelled: Vec<bool> = (0..n).map(|i| i < count(o.cancel_fraction) && o.max_tokens > 1).collect();
    sampled.shuffle(&mut rng);
    cancelled.shuffle(&mut rng);
    let mut all = Vec::with_capacity(n);
    for i in 0..n {
        let prompt = (0..o.prompt_tokens).map(|_| rng.random_range(2..o.vocab)).collect();
        let seed = rng.random::<u32>();
        let cut = rng.random_range(1..o.max_tokens.max(2));
        all.push(Planned {
            prompt,
            sampled: sampled[i].then_some(u64::from(seed)),
            cancel_after: cancelled[i].then_some(cut),
        });
    }
    let mut it = all.into_iter();
    (0..o.clients).map(|_| it.by_ref().take(o.requests_per_client).collect()).collect()
}

/// Options parsed from a command line, for the tests of the module.
#[cfg(test)]
pub(crate) mod tests_support {
    use super::LoadOptions;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        o: LoadOptions,
    }

    /// `llama-load ARGS` parsed.
    pub(crate) fn options(args: &[&str]) -> LoadOptions {
        Cli::parse_from(std::iter::once("llama-load").chain(args.iter().copied())).o
    }
}

#[cfg(test)]
mod tests {
    use super::tests_support::options;
    use super::*;

    #[test]
    fn loopback_only() {
        for ok in [
            "http://127.0.0.1:8000",
            "http://127.9.9.9/",
            "http://localhost:1",
            "http://LOCALHOST",
            "http://[::1]:80",
        ] {
            assert!(check_loopback(ok).is_ok(), "{ok}");
        }
        for bad in [
            "http://10.0.0.1:8000",
            "http://192.168.1.1",
            "http://8.8.8.8",
            "https://127.0.0.1:8000",
            "http://localhost.example.com",
            "http://[::2]",
            "http://0.0.0.0:8000",
            "file:///etc/passwd",
            "127.0.0.1:8000",
        ] {
            assert!(check_loopback(bad).is_err(), "{bad}");
        }
        assert!(options(&["--url", "http://10.1.1.1:8000"]).validate().is_err());
        assert!(options(&[]).validate().is_ok());
        assert!(options(&["--cancel-fraction", "1.5"]).validate().is_err());
    }

    #[test]
    fn plans_are_exact_and_reproducible() {
        let o = options(&[
            "--clients",
            "8",
            "--requests-per-client",
            "5",
            "--prompt-tokens",
            "13",
            "--max-tokens",
            "9",
            "--sampled-fraction",
            "0.5",
            "--cancel-fraction",
            "0.1",
            "--vocab",
            "50",
            "--seed",
            "3",
        ]);
        let p = plan(&o);
        assert_eq!(p, plan(&o), "same seed, same plan");
        assert_eq!(p.len(), 8);
        let all: Vec<&Planned> = p.iter().flatten().collect();
        assert_eq!(all.len(), 40);
        assert_eq!(all.iter().filter(|r| r.sampled.is_some()).count(), 20);
        assert_eq!(all.iter().filter(|r| r.cancel_after.is_some()).count(), 4);
        assert!(all.iter().all(|r| r.prompt.len() == 13 && r.prompt.iter().all(|&t| (2..50).contains(&t))));
        assert!(all.iter().filter_map(|r| r.cancel_after).all(|c| (1..9).contains(&c)));
        let mut o2 = o.clone();
        o2.seed = 4;
        assert_ne!(plan(&o2), p);
    }
}
