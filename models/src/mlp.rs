//! A multi-layer perceptron (4 layers of width 1024 in the examples) on the `linear` kernel, two
//! ways:
//!
//! - [`EagerMlp`]: every forward pass is one lazy chain, `from_host(input)` → `linear` → … →
//!   `to_host`, run with `.sync_on(&stream)` (or awaited): fresh activations each pass, one kernel
//!   launch per layer.
//! - [`GraphMlp`]: the layer launches over preallocated buffers are captured once into a
//!   [`CudaGraph`]; a pass is a copy into the input buffer, one graph replay and a copy out, through
//!   page-locked staging buffers owned by the model. It implements [`cuda_async::Module`].
//!
//! Both share one [`MlpWeights`] (device buffers plus the host copy they were made from), which
//! also gives an `f64` host reference ([`MlpWeights::host_forward_f64`]). Layout as PyTorch's
//! `nn.Linear`: `w[out][in]`, `b[out]`, activations row-major `[batch][features]`; ReLU after every
//! layer but the last.

use cuda_async::combinators::BoxedOp;
use cuda_async::memory::{from_host, to_host, zeros};
use cuda_async::{value, CudaGraph, DeviceError, DeviceOp, DeviceOpExt, Module, Op, Result};
use cuda_core::{DeviceBuffer, PinnedBuffer, Stream};
use kernels::ops::{self, LinearShape};
use kernels::Kernels;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::sync::Arc;

/// The width of every layer of the example model.
pub const WIDTH: usize = 1024;

/// The example model's layer sizes: 1024 → 1024 → 1024 → 1024 → 1024 (4 layers).
pub const DIMS: [usize; 5] = [WIDTH; 5];

fn invalid(msg: String) -> DeviceError {
    cuda_core::Error::InvalidArgument(msg).into()
}

/// The weights of an MLP: per layer `w[out][in]` and `b[out]` on the device, and the host copy
/// they were uploaded from (for references).
pub struct MlpWeights {
    layers: Vec<(DeviceBuffer<f32>, DeviceBuffer<f32>)>,
    host: Vec<(Vec<f32>, Vec<f32>)>,
    dims: Vec<usize>,
}

impl std::fmt::Debug for MlpWeights {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MlpWeights").field("dims", &self.dims).finish_non_exhaustive()
    }
}

/// One layer's random host weights and biases (see [`MlpWeights::random`]). The host copies are
/// reserved fallibly: sizes whose element counts fit `usize` may still be beyond what the
/// allocator grants (past `isize::MAX` bytes or the address space), which is an error, not a
/// panic or an aborted process. (A size the allocator grants but the machine cannot back is the
/// operating system's to refuse.)
fn host_layer(rng: &mut StdRng, din: usize, dout: usize) -> Result<(Vec<f32>, Vec<f32>)> {
    let lens = LinearShape { batch: 1, in_dim: din, out_dim: dout, relu: false }.lens()?;
    let wb = (6.0 / din as f64).sqrt() as f32;
    let bb = (1.0 / din as f64).sqrt() as f32;
    let mut w: Vec<f32> = Vec::new();
    let mut b: Vec<f32> = Vec::new();
    if w.try_reserve_exact(lens.w).is_err() || b.try_reserve_exact(lens.b).is_err() {
        return Err(invalid(format!(
            "MLP layer {din} -> {dout}: {} weights cannot be allocated in host memory",
            lens.w
        )));
    }
    w.extend((0..lens.w).map(|_| rng.random_range(-wb..wb)));
    b.extend((0..lens.b).map(|_| rng.random_range(-bb..bb)));
    Ok((w, b))
}

impl MlpWeights {
    /// Random weights for layer sizes `dims` (`dims.len() - 1` layers; `[1024; 5]` gives the
    /// example's 4 layers), uploaded on `stream` (their home stream; use the model on it too, so
    /// no cross-stream joins are needed).
    ///
    /// Kaiming-uniform initialisation: `w ~ U(-sqrt(6 / in), sqrt(6 / in))` keeps the second
    /// moment of the activations constant through ReLU layers, and `b ~ U(-1/sqrt(in), 1/sqrt(in))`
    /// (PyTorch's default), so outputs stay O(1) for inputs in `[-1, 1)`. Deterministic in `seed`.
    ///
    /// Errors: fewer than two sizes, a zero size, an overflowing size, or weights the host
    /// allocator cannot grant ([`cuda_core::Error::InvalidArgument`]); allocation and copy errors.
    pub fn random(stream: &Stream, seed: u64, dims: &[usize]) -> Result<MlpWeights> {
        if dims.len() < 2 || dims.contains(&0) {
            return Err(invalid(format!("an MLP needs at least two non-zero layer sizes, got {dims:?}")));
        }
        let mut rng = StdRng::seed_from_u64(seed);
        let mut layers = Vec::with_capacity(dims.len() - 1);
        let mut host = Vec::with_capacity(dims.len() - 1);
        for pair in dims.windows(2) {
            let (din, dout) = (pair[0], pair[1]);
            let (w, b) = host_layer(&mut rng, din, dout)?;
            layers.push((DeviceBuffer::from_host(stream, &w)?, DeviceBuffer::from_host(stream, &b)?));
            host.push((w, b));
        }
        Ok(MlpWeights { layers, host, dims: dims.to_vec() })
    }

    /// The layer sizes, input first.
    pub fn dims(&self) -> &[usize] {
        &self.dims
    }

    /// The number of layers (`dims().len() - 1`).
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Features per input row.
    pub fn in_dim(&self) -> usize {
        self.dims[0]
    }

    /// Features per output row.
    pub fn out_dim(&self) -> usize {
        self.dims[self.dims.len() - 1]
    }

    /// Layer `i`'s device weights `(w, b)`. Panics if `i >= num_layers()`.
    pub fn layer(&self, i: usize) -> (&DeviceBuffer<f32>, &DeviceBuffer<f32>) {
        let (w, b) = &self.layers[i];
        (w, b)
    }

    /// Layer `i`'s host weights `(w, b)`, as uploaded. Panics if `i >= num_layers()`.
    pub fn host_layer(&self, i: usize) -> (&[f32], &[f32]) {
        let (w, b) = &self.host[i];
        (w, b)
    }

    /// The shape of layer `i` for `batch` rows: ReLU on all layers but the last. Panics if
    /// `i >= num_layers()`.
    pub fn shape(&self, i: usize, batch: usize) -> LinearShape {
        LinearShape {
            batch,
            in_dim: self.dims[i],
            out_dim: self.dims[i + 1],
            relu: i + 1 < self.num_layers(),
        }
    }

    /// The batch size of an input of `len` elements, or a [`DeviceError::Shape`] from `op` when
    /// `len` is not a positive multiple of [`MlpWeights::in_dim`].
    pub fn batch_of(&self, len: usize, op: &'static str) -> Result<usize> {
        let batch = len / self.in_dim();
        if batch == 0 || batch * self.in_dim() != len {
            return Err(DeviceError::shape(
                op,
                format!("the input holds {len} values, not a positive multiple of {}", self.in_dim()),
            ));
        }
        Ok(batch)
    }

    /// One activation buffer per layer for `batch` rows (the outputs of the layers), zeroed, on
    /// `stream`.
    pub fn alloc_activations(&self, stream: &Stream, batch: usize) -> Result<Vec<DeviceBuffer<f32>>> {
        (0..self.num_layers())
            .map(|i| Ok(DeviceBuffer::zeros(stream, self.shape(i, batch).lens()?.y)?))
            .collect()
    }

    /// The forward pass as one lazy chain over existing buffers: layer `i` reads `input` (for
    /// `i = 0`) or `acts[i - 1]` and writes `acts[i]`; yields the last activation. Nothing is
    /// allocated or copied to or from the host, so this is exactly the device work of a pass (the
    /// work a [`GraphMlp`] replays, launched eagerly). `acts` as from
    /// [`MlpWeights::alloc_activations`]; lengths are checked when it runs
    /// ([`DeviceError::Shape`]).
    pub fn layers_into<'a>(
        &'a self,
        input: &'a DeviceBuffer<f32>,
        acts: &'a mut [DeviceBuffer<f32>],
        batch: usize,
    ) -> Result<Op<BoxedOp<'a, &'a mut DeviceBuffer<f32>>>> {
        if acts.len() != self.num_layers() {
            return Err(DeviceError::shape(
                "MlpWeights::layers_into",
                format!("{} activation buffers for {} layers", acts.len(), self.num_layers()),
            ));
        }
        let mut acts = acts.iter_mut();
        let (Some(first), (w, b)) = (acts.next(), self.layer(0)) else {
            return Err(invalid("an MLP without layers".into()));
        };
        let mut op = ops::linear(input, w, b, first, self.shape(0, batch)).boxed();
        for (i, act) in acts.enumerate().map(|(i, a)| (i + 1, a)) {
            let (w, b) = self.layer(i);
            let shape = self.shape(i, batch);
            op = op.then(move |x: &'a mut DeviceBuffer<f32>| ops::linear(x, w, b, act, shape)).boxed();
        }
        Ok(op)
    }

    /// The forward pass on the host in `f64` (from the same `f32` weights): the reference the
    /// device results are checked against.
    ///
    /// # Panics
    /// If `input.len() != batch * in_dim()`.
    pub fn host_forward_f64(&self, input: &[f32], batch: usize) -> Vec<f64> {
        assert_eq!(
            Some(input.len()),
            batch.checked_mul(self.in_dim()),
            "host_forward_f64: input length vs batch * in_dim"
        );
        let mut x: Vec<f64> = input.iter().map(|&v| f64::from(v)).collect();
        for (l, (w, b)) in self.host.iter().enumerate() {
            let (din, dout) = (self.dims[l], self.dims[l + 1]);
            let relu = l + 1 < self.host.len();
            let mut y = Vec::with_capacity(batch * dout);
            for xr in x.chunks_exact(din) {
                for (wr, &bo) in w.chunks_exact(din).zip(b) {
                    let dot: f64 = xr.iter().zip(wr).map(|(&xi, &wi)| xi * f64::from(wi)).sum();
                    let v = f64::from(bo) + dot;
                    y.push(if relu { v.max(0.0) } else { v });
                }
            }
            x = y;
        }
        x
    }
}

/// The error of `out` against `reference`, relative to the reference's scale:
/// `max_i |out[i] - reference[i]| / max(1, max_i |reference[i]|)`. Infinite when the lengths differ
/// or any value is not finite (so a NaN never passes a bound).
pub fn max_rel_error(out: &[f32], reference: &[f64]) -> f64 {
    if out.len() != reference.len() {
        return f64::INFINITY;
    }
    let (mut diff, mut scale) = (0.0f64, 1.0f64);
    for (&o, &r) in out.iter().zip(reference) {
        let d = (f64::from(o) - r).abs();
        if !d.is_finite() {
            return f64::INFINITY;
        }
        diff = diff.max(d);
        scale = scale.max(r.abs());
    }
    diff / scale
}

/// The largest `|a[i] - b[i]|` (infinite when the lengths differ or a value is not finite).
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    a.iter().zip(b).fold(0.0f64, |m, (&x, &y)| {
        let d = (f64::from(x) - f64::from(y)).abs();
        if d.is_finite() {
            m.max(d)
        } else {
            f64::INFINITY
        }
    })
}

/// The eager model: each forward pass is one lazy op chain that allocates its activations.
#[derive(Debug, Clone)]
pub struct EagerMlp {
    weights: Arc<MlpWeights>,
    stream: Stream,
}

impl EagerMlp {
    /// The eager model over `weights`, running on `stream`.
    pub fn new(weights: Arc<MlpWeights>, stream: Stream) -> EagerMlp {
        EagerMlp { weights, stream }
    }

    /// The weights.
    pub fn weights(&self) -> &Arc<MlpWeights> {
        &self.weights
    }

    /// The stream passes run on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The pass up to the device output: `from_host(input)` → `linear` → … (each layer's output a
    /// fresh `zeros` buffer), yielding the last activation. The batch is
    /// `input.len() / in_dim` (else [`DeviceError::Shape`]).
    pub fn device_op<'a>(&'a self, input: &'a [f32]) -> Result<Op<BoxedOp<'a, DeviceBuffer<f32>>>> {
        let batch = self.weights.batch_of(input.len(), "EagerMlp::forward")?;
        let mut op = from_host::<f32, _>(input).boxed();
        for i in 0..self.weights.num_layers() {
            let (w, b) = self.weights.layer(i);
            let shape = self.weights.shape(i, batch);
            let out_len = shape.lens()?.y;
            op = op
                .then(move |x: DeviceBuffer<f32>| ops::linear(x, w, b, zeros::<f32>(out_len), shape))
                .boxed();
        }
        Ok(op)
    }

    /// The whole pass as one chain: [`EagerMlp::device_op`] then `to_host`. Run it with
    /// `.sync_on(stream)` or `.on(stream).await`.
    pub fn forward_op<'a>(&'a self, input: &'a [f32]) -> Result<Op<BoxedOp<'a, PinnedBuffer<f32>>>> {
        Ok(self.device_op(input)?.then(|y: DeviceBuffer<f32>| to_host::<f32, _>(y)).boxed())
    }

    /// Runs one pass on the model's stream and returns the output (`batch * out_dim` values,
    /// row-major), blocking until it is complete.
    pub fn forward(&self, input: &[f32]) -> Result<Vec<f32>> {
        let host = self.forward_op(input)?.sync_on(&self.stream)?;
        Ok(host.as_slice()?.to_vec())
    }

    /// Runs one pass on the model's stream; resolves once the output is ready, without blocking
    /// the executor thread.
    pub async fn forward_async(&self, input: &[f32]) -> Result<Vec<f32>> {
        let host = self.forward_op(input)?.on(&self.stream).await?;
        Ok(host.as_slice()?.to_vec())
    }
}

/// The graph-backed model: the layer launches over preallocated buffers, captured once.
///
/// A pass copies the input into a page-locked staging buffer (host memcpy), then queues on the
/// model's stream: an async copy into the device input buffer, one replay of the graph, and an
/// async copy of the last activation into a second staging buffer; it waits for (or awaits) that
/// work and returns a copy of the staging buffer. Nothing is allocated per pass. The graph keeps
/// the buffers it uses alive on its own; `&mut self` serialises passes over them.
pub struct GraphMlp {
    weights: Arc<MlpWeights>,
    batch: usize,
    stream: Stream,
    input: DeviceBuffer<f32>,
    acts: Vec<DeviceBuffer<f32>>,
    staging_in: PinnedBuffer<f32>,
    staging_out: PinnedBuffer<f32>,
    graph: CudaGraph<()>,
}

impl std::fmt::Debug for GraphMlp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GraphMlp")
            .field("dims", &self.weights.dims())
            .field("batch", &self.batch)
            .field("graph", &self.graph)
            .finish_non_exhaustive()
    }
}

impl GraphMlp {
    /// Allocates the input, activation and staging buffers for `batch` rows on `stream`, loads the
    /// kernels, and captures one launch of every layer into a graph on `stream` (use the weights'
    /// stream to avoid cross-stream joins).
    ///
    /// Errors: `batch == 0` ([`cuda_core::Error::InvalidArgument`]), kernel compilation,
    /// allocation and capture errors.
    pub fn new(weights: Arc<MlpWeights>, stream: &Stream, batch: usize) -> Result<GraphMlp> {
        if batch == 0 {
            return Err(invalid("GraphMlp: the batch must hold at least one row".into()));
        }
        // Compile and load before recording: the capture must contain only the launches.
        Kernels::get(stream.device())?;
        let in_len = weights.shape(0, batch).lens()?.x;
        let out_len = weights.shape(weights.num_layers() - 1, batch).lens()?.y;
        let input = DeviceBuffer::zeros(stream, in_len)?;
        let mut acts = weights.alloc_activations(stream, batch)?;
        let staging_in = PinnedBuffer::new(stream.device(), in_len, 0.0f32)?;
        let staging_out = PinnedBuffer::new(stream.device(), out_len, 0.0f32)?;
        stream.synchronize()?;
        let graph = CudaGraph::scope(stream, |s| {
            let mut x: &DeviceBuffer<f32> = &input;
            for (i, act) in acts.iter_mut().enumerate() {
                let (w, b) = weights.layer(i);
                x = s.record(ops::linear(x, w, b, act, weights.shape(i, batch)))?;
            }
            Ok(())
        })?;
        Ok(GraphMlp { weights, batch, stream: stream.clone(), input, acts, staging_in, staging_out, graph })
    }

    /// Rows per pass.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Values per input (`batch * in_dim`).
    pub fn input_len(&self) -> usize {
        self.input.len()
    }

    /// Values per output (`batch * out_dim`).
    pub fn output_len(&self) -> usize {
        self.staging_out.len()
    }

    /// The weights.
    pub fn weights(&self) -> &Arc<MlpWeights> {
        &self.weights
    }

    /// The stream passes run on (the graph's stream).
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// The captured graph (e.g. `graph().launch().sync_on(stream)` replays the layers alone, on
    /// whatever the input buffer holds).
    pub fn graph(&self) -> &CudaGraph<()> {
        &self.graph
    }

    /// The device buffer the graph reads its input from.
    pub fn input_buffer(&self) -> &DeviceBuffer<f32> {
        &self.input
    }

    /// The device buffer the graph writes its output to (the last activation).
    pub fn output_buffer(&self) -> &DeviceBuffer<f32> {
        // `new` allocates one activation per layer, and there is at least one layer.
        &self.acts[self.acts.len() - 1]
    }

    /// Stages `input` and returns the pass: copy in, replay, copy out (see the type's docs).
    fn pass(&mut self, input: &[f32]) -> Result<impl DeviceOp<Output = ()> + '_> {
        if input.len() != self.input.len() {
            return Err(DeviceError::shape(
                "GraphMlp::forward",
                format!("the input holds {} values; this model takes {}", input.len(), self.input.len()),
            ));
        }
        let GraphMlp { input: dev_in, acts, graph, staging_in, staging_out, .. } = self;
        // Waits for the previous pass's copy out of this buffer, if one is still in flight.
        staging_in.as_mut_slice()?.copy_from_slice(input);
        let last: &DeviceBuffer<f32> =
            acts.last().ok_or_else(|| invalid("GraphMlp without layers".into()))?;
        Ok(value(())
            .and_then_with_context(move |(), ctx| {
                staging_in.copy_to_device_async(ctx.stream(), dev_in).map_err(DeviceError::from)
            })
            .then(move |()| graph.launch())
            .and_then_with_context(move |(), ctx| {
                staging_out.copy_from_device_async(ctx.stream(), last).map_err(DeviceError::from)
            }))
    }

    fn read_output(&self) -> Result<Vec<f32>> {
        Ok(self.staging_out.as_slice()?.to_vec())
    }

    /// One pass over a borrowed input (`batch * in_dim` values, else [`DeviceError::Shape`]),
    /// blocking until the output is ready. [`Module::forward`] without the move of the input.
    pub fn run(&mut self, input: &[f32]) -> Result<Vec<f32>> {
        let stream = self.stream.clone();
        self.pass(input)?.sync_on(&stream)?;
        self.read_output()
    }

    /// One pass over a borrowed input; resolves once the output is ready, without blocking the
    /// executor thread. [`Module::forward_async`] without the move of the input.
    pub async fn run_async(&mut self, input: &[f32]) -> Result<Vec<f32>> {
        let stream = self.stream.clone();
        self.pass(input)?.on(&stream).await?;
        self.read_output()
    }
}

impl Module for GraphMlp {
    /// `batch * in_dim` values, row-major.
    type Input = Vec<f32>;
    /// `batch * out_dim` values, row-major.
    type Output = Vec<f32>;

    fn forward(&mut self, input: Vec<f32>) -> Result<Vec<f32>> {
        self.run(&input)
    }

    // The trait's `impl Future + Send` is met by an `async fn`: the compiler checks that its
    // future is `Send` (it holds `&mut GraphMlp`, the staged op and a `DeviceFuture`, all `Send`).
    async fn forward_async(&mut self, input: Vec<f32>) -> Result<Vec<f32>> {
        self.run_async(&input).await
    }
}

/// A pass reads only its input and the weights (the activation buffers are overwritten by every
/// pass before they are read), so any replica answers any input alike: `GraphMlp` can be served by
/// [`cuda_async::Replicas`].
impl cuda_async::graph::Replicable for GraphMlp {}

#[cfg(test)]
mod tests {
    use super::*;

    /// Element counts that fit `usize` but not memory are refused with an error: past
    /// `isize::MAX` bytes, and 4 EiB (past any address space). Small layers are generated.
    #[test]
    fn host_layers_beyond_memory_are_refused() {
        let mut rng = StdRng::seed_from_u64(1);
        for (din, dout) in [((1usize << 31) - 1, (1usize << 31) - 1), (1 << 30, 1 << 30)] {
            let e = host_layer(&mut rng, din, dout).unwrap_err().to_string();
            assert!(e.contains("cannot be allocated in host memory"), "{din} -> {dout}: {e}");
        }
        let (w, b) = host_layer(&mut rng, 3, 2).unwrap();
        assert_eq!((w.len(), b.len()), (6, 2));
        assert!(w.iter().all(|v| v.abs() < (2.0f32).sqrt()));
    }
}
