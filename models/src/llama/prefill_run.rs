//! The prefill API of [`LlamaModel`] (a child of the `prefill` module, itself a child of `model`:
//! it reaches both's private items): capture of the chunk buckets under the shared graph budget,
//! staging, replay and the results.

use super::{
    bucket_for, estimate_bytes, logit_rows, plan, refuse, PrefillBucket, PrefillBuffers, PrefillSeq,
    PrefillStep,
};
use crate::llama::model::{BucketInfo, LlamaModel};
use crate::llama::sampling::Sampling;
use cuda_async::{value, CudaGraph, DeviceOp, DeviceOpExt, Result};
use cuda_core::PinnedBuffer;
use kernels::llama::INACTIVE;
use kernels::sample::SampleParams;
use std::time::Instant;

impl LlamaModel {
    /// Device memory the captured decode and prefill buckets take together.
    pub(in crate::llama::model) fn graph_bytes_used(&self) -> usize {
        let decode = self.buckets.values().map(|b| b.info.buffer_bytes.saturating_add(b.info.graph_bytes));
        let prefill =
            self.prefill.buckets.values().map(|b| b.info.buffer_bytes.saturating_add(b.info.graph_bytes));
        decode.chain(prefill).fold(0, usize::saturating_add)
    }

    /// Evicts the least recently used bucket, decode or prefill; `false` when none is captured.
    pub(in crate::llama::model) fn evict_lru(&mut self) -> bool {
        let decode = self.buckets.iter().min_by_key(|(_, b)| b.last_used).map(|(&k, b)| (b.last_used, k));
        let prefill =
            self.prefill.buckets.iter().min_by_key(|(_, b)| b.last_used).map(|(&k, b)| (b.last_used, k));
        // The last step's or prefill's results live in the evicted bucket's buffers: they are
        // gone with it, also if a bucket of the same size is captured again later (found by
        // review: `last_logits`/`last_prefill_logits` then read the new bucket's warm-up output).
        let mut evict_prefill = |chunk: usize| {
            if self.prefill.last.is_some_and(|(c, _)| c == chunk) {
                self.prefill.last = None;
            }
            self.prefill.buckets.remove(&chunk).is_some()
        };
        let evicted = match (decode, prefill) {
            (Some(d), Some(p)) if p.0 < d.0 => evict_prefill(p.1),
            (None, Some(p)) => evict_prefill(p.1),
            (Some(d), _) => {
                if self.last_rows.is_some_and(|(batch, _)| batch == d.1) {
                    self.last_rows = None;
                }
                self.buckets.remove(&d.1).is_some()
            }
            (None, None) => false,
        };
        self.evictions += u64::from(evicted);
        evicted
    }

    /// Makes sure prefill bucket `chunk` is captured (after an eager warm-up with every row
    /// inactive), evicting least recently used buckets first if the budget needs it.
    pub(in crate::llama::model) fn ensure_prefill(&mut self, chunk: usize) -> Result<()> {
        self.tick += 1;
        if let Some(b) = self.prefill.buckets.get_mut(&chunk) {
            b.last_used = self.tick;
            return Ok(());
        }
        let l = logit_rows(chunk, self.opts.slots);
        let need = estimate_bytes(&self.cfg, chunk, l);
        while self.graph_bytes_used().saturating_add(need) > self.opts.graph_budget_bytes {
            if !self.evict_lru() {
                break;
            }
        }
        let LlamaModel { cfg, weights, inv_freq, kv, blas, kernels, sampler, stream, .. } = self;
        let sampler = *sampler;
        let mut buf = PrefillBuffers::new(stream, cfg, chunk, l)?;
        let dev = stream.device();
        PrefillStep { cfg, w: weights, inv_freq, kv, buf: &mut buf, blas, kernels, sampler }
            .sync_on(stream)?;
        let free_before = dev.memory_info()?.0;
        let t = Instant::now();
        let graph = CudaGraph::scope(stream, |s| {
            s.record(PrefillStep { cfg, w: weights, inv_freq, kv, buf: &mut buf, blas, kernels, sampler })?;
            Ok(())
        })?;
        let capture_ms = t.elapsed().as_secs_f64() * 1e3;
        let free_after = dev.memory_info()?.0;
        let info = BucketInfo {
            batch: chunk,
            buffer_bytes: buf.bytes(),
            graph_bytes: free_before.saturating_sub(free_after),
            capture_ms,
            replays: 0,
        };
        let bucket = PrefillBucket {
            buf,
            graph,
            in_tokens: PinnedBuffer::new(dev, chunk, 0u32)?,
            in_slots: PinnedBuffer::new(dev, chunk, INACTIVE)?,
            in_positions: PinnedBuffer::new(dev, chunk, 0u32)?,
            in_logit_idx: PinnedBuffer::new(dev, l, INACTIVE)?,
            in_params: PinnedBuffer::new(dev, l, SampleParams::GREEDY)?,
            out_next: PinnedBuffer::new(dev, l, 0u32)?,
            info,
            last_used: self.tick,
        };
        self.prefill.buckets.insert(chunk, bucket);
        Ok(())
    }

    /// Checks the pieces, captures their bucket if needed, stages them and returns (chunk
    /// bucket, wanting pieces) with the op (copies in, replay, copy out of the next tokens).
    /// Forgets the last prefill's results until this one completes (`prefill_finish`):
    /// a failed or dropped prefill leaves nothing that [`LlamaModel::last_prefill_logits`] would
    /// show as its own. (The slots need no shortening: a piece writes only positions from
    /// `slot_len` on, which no later step reads before feeding them again.)
    fn prefill_stage(
        &mut self,
        seqs: &[PrefillSeq<'_>],
        sampling: Option<&[Sampling]>,
        bucket: Option<usize>,
    ) -> Result<((usize, usize), impl DeviceOp<Output = ()> + '_)> {
        // Forgotten first, so that a refused prefill does not leave the previous one's logits
        // readable as its own (found by review).
        self.prefill.last = None;
        let plan = plan(seqs, sampling, &self.opts, &self.filled, self.cfg.vocab, bucket)?;
        self.ensure_prefill(plan.chunk)?;
        let ran = (plan.chunk, plan.wanted);
        let b = self.prefill.buckets.get_mut(&plan.chunk).ok_or_else(|| refuse("bucket vanished".into()))?;
        b.write(&plan)?;
        let PrefillBucket {
            buf,
            graph,
            in_tokens,
            in_slots,
            in_positions,
            in_logit_idx,
            in_params,
            out_next,
            ..
        } = b;
        let op = value(())
            .and_then_with_context(move |(), ctx| {
                let s = ctx.stream();
                in_tokens.copy_to_device_async(s, &mut buf.tokens)?;
                in_slots.copy_to_device_async(s, &mut buf.slots)?;
                in_positions.copy_to_device_async(s, &mut buf.positions)?;
                in_logit_idx.copy_to_device_async(s, &mut buf.logit_idx)?;
                in_params.copy_to_device_async(s, &mut buf.params)?;
                Ok(&buf.next)
            })
            .then(move |next| graph.launch().map(move |()| next))
            .and_then_with_context(move |next, ctx| Ok(out_next.copy_from_device_async(ctx.stream(), next)?));
        Ok((ran, op))
    }

    /// After the work of `ran` (chunk bucket, wanting pieces) completed: advances the slots,
    /// records it as the last prefill and reads the next tokens of the wanted pieces.
    fn prefill_finish(&mut self, seqs: &[PrefillSeq<'_>], ran: (usize, usize)) -> Result<Vec<Option<u32>>> {
        for p in seqs {
            self.filled[p.slot as usize] = p.start + p.tokens.len() as u32;
        }
        self.prefill.last = Some(ran);
        let (chunk, wanted) = ran;
        let b = self.prefill.buckets.get(&chunk).ok_or_else(|| refuse("bucket evicted".into()))?;
        let got = &b.out_next.as_slice()?[..wanted];
        crate::llama::model::in_vocab(got.iter().copied(), self.cfg.vocab)?;
        let mut next = got.iter().copied();
        Ok(seqs.iter().map(|p| if p.want_next { next.next() } else { None }).collect())
    }

    /// Runs the pieces `seqs` as one replay of the smallest prefill bucket holding all their
    /// tokens ([`ModelOptions::prefill_buckets`](crate::llama::ModelOptions::prefill_buckets)), packed one piece after another (padding rows
    /// inactive), and returns one entry per piece: the greedy next token after the piece's last
    /// token for pieces with [`PrefillSeq::want_next`], `None` for the others. Blocks until done.
    /// Each slot's length ([`LlamaModel::slot_len`]) advances by its piece only after the work
    /// ran (a failed prefill leaves the slots as they were).
    ///
    /// A piece's result depends only on the piece (and the cache its sequence wrote before) and
    /// the bucket, not on the pieces packed beside it: a sequence replayed alone in the same
    /// buckets ([`LlamaModel::prefill_in_bucket`]) gives the same tokens bit for bit.
    ///
    /// ```no_run
    /// use models::llama::{DeviceWeights, LlamaConfig, LlamaModel, ModelOptions, PrefillSeq, Row};
    /// # fn main() -> cuda_async::Result<()> {
    /// let stream = cuda_core::Device::new(0)?.new_stream()?;
    /// let cfg = LlamaConfig::small();
    /// let w = DeviceWeights::random(&stream, &cfg, 7, 0.02)?;
    /// let mut m = LlamaModel::new(&stream, cfg, w, ModelOptions { slots: 4, max_seq: 64, ..Default::default() })?;
    /// let prompt = [1, 5, 9, 13, 2];
    /// let next = m.prefill(&[PrefillSeq { slot: 0, start: 0, tokens: &prompt, want_next: true }])?;
    /// let token = next[0].expect("wanted");
    /// // Decoding continues at the prompt's length.
    /// m.step(&[Row { slot: 0, position: prompt.len() as u32, token }])?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`DeviceError::Shape`](cuda_async::DeviceError::Shape) naming the problem: no piece, a piece without tokens, a slot out
    /// of range or in two pieces, `start != slot_len(slot)`, `start + len > max_seq`, a token
    /// outside the vocabulary, more tokens than the largest prefill bucket, more wanting pieces
    /// than the bucket's `min(bucket, slots)` logit rows; capture, copy and driver errors.
    pub fn prefill(&mut self, seqs: &[PrefillSeq<'_>]) -> Result<Vec<Option<u32>>> {
        let stream = self.stream.clone();
        let (ran, op) = self.prefill_stage(seqs, None, None)?;
        op.sync_on(&stream)?;
        self.prefill_finish(seqs, ran)
    }

    /// [`LlamaModel::prefill`] in a given prefill bucket instead of the smallest holding the
    /// tokens (for replaying a sequence alone in the buckets it was served in).
    ///
    /// # Errors
    /// `bucket` not one of [`ModelOptions::prefill_buckets`](crate::llama::ModelOptions::prefill_buckets) or smaller than the tokens
    /// ([`DeviceError::Shape`](cuda_async::DeviceError::Shape)); as for [`LlamaModel::prefill`].
    pub fn prefill_in_bucket(&mut self, seqs: &[PrefillSeq<'_>], bucket: usize) -> Result<Vec<Option<u32>>> {
        let stream = self.stream.clone();
        let (ran, op) = self.prefill_stage(seqs, None, Some(bucket))?;
        op.sync_on(&stream)?;
        self.prefill_finish(seqs, ran)
    }

    /// [`LlamaModel::prefill`] that resolves once the tokens are ready, without blocking the
    /// executor thread. Dropped before it finishes, it leaves the slots' lengths as they were.
    ///
    /// # Errors
    /// As for [`LlamaModel::prefill`].
    pub async fn prefill_async(&mut self, seqs: &[PrefillSeq<'_>]) -> Result<Vec<Option<u32>>> {
        let stream = self.stream.clone();
        let (ran, op) = self.prefill_stage(seqs, None, None)?;
        op.on(&stream).await?;
        self.prefill_finish(seqs, ran)
    }

    /// [`LlamaModel::prefill`] with per-piece sampling parameters (`sampling[i]` for `seqs[i]`;
    /// only pieces that want a next token use theirs): a wanted piece's token is drawn on the GPU
    /// inside the chunk's graph, with the random counter at the position of the piece's last
    /// token, exactly as a decode step ([`LlamaModel::step_sampled`]) draws the token after that
    /// position; greedy parameters give the argmax.
    ///
    /// ```no_run
    /// use models::llama::{DeviceWeights, LlamaConfig, LlamaModel, ModelOptions, PrefillSeq, Sampling};
    /// # fn main() -> cuda_async::Result<()> {
    /// let stream = cuda_core::Device::new(0)?.new_stream()?;
    /// let cfg = LlamaConfig::small();
    /// let w = DeviceWeights::random(&stream, &cfg, 7, 0.02)?;
    /// let mut m = LlamaModel::new(&stream, cfg, w, ModelOptions { slots: 4, max_seq: 64, ..Default::default() })?;
    /// let hot = Sampling { temperature: 0.8, top_p: 0.95, top_k: 0, seed: 42 };
    /// let next = m.prefill_sampled(&[PrefillSeq { slot: 0, start: 0, tokens: &[1, 5, 9], want_next: true }], &[hot])?;
    /// assert!(next[0].is_some());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// `sampling.len() != seqs.len()` or invalid parameters ([`Sampling::validate`]) as
    /// [`DeviceError::Shape`](cuda_async::DeviceError::Shape); as for [`LlamaModel::prefill`].
    pub fn prefill_sampled(
        &mut self,
        seqs: &[PrefillSeq<'_>],
        sampling: &[Sampling],
    ) -> Result<Vec<Option<u32>>> {
        let stream = self.stream.clone();
        let (ran, op) = self.prefill_stage(seqs, Some(sampling), None)?;
        op.sync_on(&stream)?;
        self.prefill_finish(seqs, ran)
    }

    /// [`LlamaModel::prefill_sampled`] in a given prefill bucket (for replaying a sequence alone
    /// in the buckets it was served in: draws depend only on the seed and the position).
    ///
    /// # Errors
    /// As for [`LlamaModel::prefill_sampled`] and [`LlamaModel::prefill_in_bucket`].
    pub fn prefill_sampled_in_bucket(
        &mut self,
        seqs: &[PrefillSeq<'_>],
        sampling: &[Sampling],
        bucket: usize,
    ) -> Result<Vec<Option<u32>>> {
        let stream = self.stream.clone();
        let (ran, op) = self.prefill_stage(seqs, Some(sampling), Some(bucket))?;
        op.sync_on(&stream)?;
        self.prefill_finish(seqs, ran)
    }

    /// [`LlamaModel::prefill_sampled`] that resolves once the tokens are ready, without blocking
    /// the executor thread.
    ///
    /// # Errors
    /// As for [`LlamaModel::prefill_sampled`].
    pub async fn prefill_sampled_async(
        &mut self,
        seqs: &[PrefillSeq<'_>],
        sampling: &[Sampling],
    ) -> Result<Vec<Option<u32>>> {
        let stream = self.stream.clone();
        let (ran, op) = self.prefill_stage(seqs, Some(sampling), None)?;
        op.on(&stream).await?;
        self.prefill_finish(seqs, ran)
    }

    /// The prefill bucket a call of `tokens` tokens (all pieces together) runs in: the smallest
    /// configured prefill bucket holding them.
    ///
    /// # Errors
    /// More tokens than the largest prefill bucket ([`DeviceError::Shape`](cuda_async::DeviceError::Shape)).
    pub fn prefill_bucket_of(&self, tokens: usize) -> Result<usize> {
        bucket_for(&self.opts.prefill_buckets, tokens)
    }

    /// The logits (`f32`, `[wanting pieces][vocab]`, in the pieces' order) behind the tokens of
    /// the last prefill.
    ///
    /// # Errors
    /// No prefill has completed yet (or the last one failed, or its future was dropped before
    /// it finished), or its bucket was evicted since; copy errors.
    pub fn last_prefill_logits(&self) -> Result<Vec<f32>> {
        let (chunk, wanted) = self.prefill.last.ok_or_else(|| refuse("no prefill has completed".into()))?;
        let b = self.prefill.buckets.get(&chunk).ok_or_else(|| refuse("bucket evicted".into()))?;
        let mut all = vec![0f32; b.buf.logits.len()];
        b.buf.logits.copy_to_host(&self.stream, &mut all)?;
        all.truncate(wanted * self.cfg.vocab);
        Ok(all)
    }

    /// The captured prefill buckets, smallest first ([`BucketInfo::batch`] is the chunk size).
    pub fn prefill_buckets(&self) -> Vec<BucketInfo> {
        self.prefill.buckets.values().map(|b| BucketInfo { replays: b.graph.replays(), ..b.info }).collect()
    }
}
