//! A tokio server for the Llama decoder with continuous batching and cancellation.
//!
//! One batcher task owns the model. Clients send requests (prompt, number of tokens) on a
//! channel and receive tokens as they are generated. Before every step the batcher admits waiting
//! requests into free KV-cache slots; each step feeds every active sequence one token (a prompt
//! token, or the last generated one) as one graph replay of the smallest bucket that holds them,
//! awaited without blocking an executor thread. A client that drops its receiver cancels its
//! request: the batcher notices on the next token it sends, frees the slot, and the next request
//! reuses it from position 0.
//!
//! 64 client tasks each make two requests; a quarter of them cancel the first one after a few
//! tokens. Afterwards every completed request is checked: replayed alone, position by position in
//! the same batch-size buckets it was served in (`LlamaModel::step_in_bucket`), it must give the
//! served tokens exactly — a row's result depends only on the row and its bucket's kernels, so any
//! difference is a batching bug (another row's data, a wrong slot or position, a stale cache
//! entry). That each bucket's kernels are accurate is checked separately, against Hugging Face
//! (`gpu_llama`). The program also reports how many served tokens equal the batch-1 greedy
//! choice; the rest differ from it by bf16 rounding between two kernel paths. All slots must be
//! free again.

use anyhow::{ensure, Context, Result};
use clap::Parser;
use cuda_core::Device;
use models::llama::{DeviceWeights, LlamaConfig, LlamaModel, ModelOptions, Row};
use std::collections::VecDeque;
use std::time::Instant;
use tokio::sync::mpsc;

#[derive(Parser)]
#[command(about = "Serve Llama decode to many tokio tasks with continuous batching")]
struct Args {
    /// Client tasks (each makes two requests).
    #[arg(long, default_value_t = 64)]
    clients: usize,
    /// Tokens generated per request.
    #[arg(long, default_value_t = 32)]
    tokens: usize,
    /// Use the Llama-3.2-1B shape (random weights) instead of the small one.
    #[arg(long)]
    llama_1b: bool,
}

struct Request {
    prompt: Vec<u32>,
    max_new: usize,
    /// Each generated token; the last one also carries the bucket every position was fed in.
    tx: mpsc::UnboundedSender<(u32, Option<Vec<usize>>)>,
}

struct Active {
    slot: u32,
    req: Request,
    pos: usize,
    last: u32,
    generated: usize,
    /// The bucket each fed position ran in.
    buckets: Vec<usize>,
}

#[derive(Default, Debug)]
struct Stats {
    steps: u64,
    rows: u64,
    cancelled: u64,
    completed: u64,
}

/// The batcher: runs until the request channel closes and no sequence is active.
async fn batcher(mut m: LlamaModel, mut rx: mpsc::Receiver<Request>) -> Result<(LlamaModel, Stats)> {
    let mut free: Vec<u32> = (0..m.options().slots as u32).rev().collect();
    let mut active: Vec<Active> = Vec::new();
    let mut waiting: VecDeque<Request> = VecDeque::new();
    let max_rows = *m.options().buckets.last().context("no buckets")?;
    let mut stats = Stats::default();
    let mut open = true;
    loop {
        // Admit: block only when nothing is running.
        if active.is_empty() && waiting.is_empty() {
            match rx.recv().await {
                Some(r) => waiting.push_back(r),
                None => break,
            }
        }
        while open {
            match rx.try_recv() {
                Ok(r) => waiting.push_back(r),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => open = false,
            }
        }
        while active.len() < max_rows {
            let (Some(slot), Some(req)) = (free.last().copied(), waiting.pop_front()) else { break };
            free.pop();
            m.release_slot(slot)?;
            active.push(Active { slot, last: req.prompt[0], req, pos: 0, generated: 0, buckets: Vec::new() });
        }
        if active.is_empty() {
            if !open {
                break;
            }
            continue;
        }
        let rows: Vec<Row> = active
            .iter()
            .map(|a| {
                let token = if a.pos < a.req.prompt.len() { a.req.prompt[a.pos] } else { a.last };
                Row { slot: a.slot, position: a.pos as u32, token }
            })
            .collect();
        let bucket = m.bucket_of(rows.len())?;
        let next = m.step_async(&rows).await?;
        stats.steps += 1;
        stats.rows += rows.len() as u64;
        // Advance every sequence; retire the finished and the cancelled.
        let mut keep = Vec::with_capacity(active.len());
        for (mut a, tok) in active.drain(..).zip(next) {
            a.pos += 1;
            a.buckets.push(bucket);
            let mut done = false;
            if a.pos >= a.req.prompt.len() {
                a.last = tok;
                a.generated += 1;
                let last = a.generated == a.req.max_new;
                if a.req.tx.send((tok, last.then(|| a.buckets.clone()))).is_err() {
                    stats.cancelled += 1;
                    done = true;
                } else if a.generated == a.req.max_new {
                    stats.completed += 1;
                    done = true;
                }
            }
            if done {
                free.push(a.slot);
            } else {
                keep.push(a);
            }
        }
        active = keep;
    }
    ensure!(free.len() == m.options().slots, "{} slots leaked", m.options().slots - free.len());
    Ok((m, stats))
}

fn main() -> Result<()> {
    let args = Args::parse();
    let dev = Device::new(0).context("no GPU")?;
    let stream = dev.new_stream()?;
    let cfg = if args.llama_1b { LlamaConfig::llama_3_2_1b() } else { LlamaConfig::small() };
    let w = DeviceWeights::random(&stream, &cfg, 99, 0.05)?;
    let max_seq = 16 + args.tokens + 1;
    let mut m =
        LlamaModel::new(&stream, cfg.clone(), w, ModelOptions { slots: 64, max_seq, ..Default::default() })?;
    m.capture_all()?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build()?;
    let (results, stats, mut m, secs) = rt.block_on(async {
        let (tx, rx) = mpsc::channel::<Request>(256);
        let server = tokio::spawn(batcher(m, rx));
        let t = Instant::now();
        let mut clients = Vec::new();
        for c in 0..args.clients {
            let tx = tx.clone();
            let (vocab, n) = (cfg.vocab as u32, args.tokens);
            clients.push(tokio::spawn(async move {
                let mut done = Vec::new();
                for round in 0..2u32 {
                    let plen = 1 + (c + round as usize) % 12;
                    let prompt: Vec<u32> =
                        (0..plen as u32).map(|i| (c as u32 * 131 + round * 17 + i * 7 + 2) % vocab).collect();
                    let (ttx, mut trx) = mpsc::unbounded_channel();
                    tx.send(Request { prompt: prompt.clone(), max_new: n, tx: ttx }).await.ok()?;
                    let cancel_after = if round == 0 && c % 4 == 1 { Some(1 + c % 5) } else { None };
                    let (mut got, mut buckets) = (Vec::new(), Vec::new());
                    while let Some((tok, b)) = trx.recv().await {
                        got.push(tok);
                        buckets = b.unwrap_or(buckets);
                        if Some(got.len()) == cancel_after {
                            break; // drop the receiver: cancels the request
                        }
                    }
                    drop(trx);
                    if cancel_after.is_none() {
                        done.push((prompt, got, buckets));
                    }
                }
                Some(done)
            }));
        }
        drop(tx);
        let mut results = Vec::new();
        for c in clients {
            results.extend(c.await?.context("the server went away")?);
        }
        let secs = t.elapsed().as_secs_f64();
        let (m, stats) = server.await??;
        anyhow::Ok((results, stats, m, secs))
    })?;
    let tokens: usize = results.iter().map(|r| r.1.len()).sum();
    println!(
        "served {} completed + {} cancelled requests from {} tasks in {:.3} s: {} steps, {:.1} rows per step, {:.0} generated tokens/s",
        stats.completed,
        stats.cancelled,
        args.clients,
        secs,
        stats.steps,
        stats.rows as f64 / stats.steps as f64,
        tokens as f64 / secs
    );
    for b in m.buckets() {
        println!("bucket {:>2}: {} replays", b.batch, b.replays);
    }
    // Check every completed request alone: the same tokens through the same buckets, exactly;
    // and count how many are also the batch-1 replay's greedy choice.
    let (mut greedy1, mut total) = (0usize, 0usize);
    for (prompt, got, buckets) in &results {
        ensure!(got.len() == args.tokens, "a request got {} tokens, not {}", got.len(), args.tokens);
        let seq: Vec<u32> = prompt.iter().chain(&got[..got.len() - 1]).copied().collect();
        ensure!(buckets.len() == seq.len(), "{} buckets recorded for {} positions", buckets.len(), seq.len());
        m.release_slot(0)?;
        for (p, (&tok, &bucket)) in seq.iter().zip(buckets).enumerate() {
            let next = m.step_in_bucket(&[Row { slot: 0, position: p as u32, token: tok }], bucket)?[0];
            if let Some(k) = (p + 1).checked_sub(prompt.len()) {
                ensure!(
                    next == got[k],
                    "token {k} of a request: served {} but replayed alone in bucket {bucket} {next}",
                    got[k]
                );
            }
        }
        let logits = m.forced_logits(0, &seq)?;
        for (k, &tok) in got.iter().enumerate() {
            let l = &logits[prompt.len() - 1 + k];
            let max = l.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            greedy1 += usize::from(l[tok as usize] == max);
            total += 1;
        }
    }
    println!(
        "check: all {total} generated tokens of {} completed requests equal the same rows replayed alone in their buckets ({greedy1} also the batch-1 greedy choice); all 64 slots free again: ok",
        results.len()
    );
    Ok(())
}
