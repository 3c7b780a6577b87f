//! GPU suite for user kernels as lazy ops (`cuda_async::kernel`): a kernel from CUDA C (NVRTC),
//! from hand-written PTX and from a cubin image, checked against `f64` host references on random
//! inputs with NaN-poisoned outputs; lengths refused by the check function (nothing launched);
//! devices refused; graph capture and replay; awaited from tokio; ordering after a write on
//! another stream; and the general `KernelOp` form.
//! Ignored without a GPU; fails without one when CUDA_ASYNC_REQUIRE_GPU=1.

use cuda_async::kernel::{Kernel, KernelOp, Launcher, Lens};
use cuda_async::memory::{from_host, to_host, zeros};
use cuda_async::{value, BufferMut, BufferRef, CudaGraph, DeviceError, DeviceOpExt, GraphNode};
use cuda_async_tests::ops::SpinWrite;
use cuda_async_tests::{assert_close, ensure, random_f32, rng, Suite, TestResult, POISON_F32};
use cuda_core::{Device, DeviceAttribute, DeviceBuffer, LaunchConfig, Stream};

/// Sizes: one element, a partial block, and a grid of several thousand blocks.
const SIZES: [usize; 3] = [1, 4097, (1 << 20) + 3];

/// `y = a*x + b*y + bias` (fused), and a two-output kernel with outputs of two element types.
const FUSED_SRC: &str = r#"
extern "C" __global__ void fused_axpby(const float* x, const float* bias, float* y, float a, float b,
                                       unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) y[i] = a * x[i] + b * y[i] + bias[i];
}
extern "C" __global__ void split(const float* x, float* half_x, double* square, unsigned long long n) {
    unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
    if (i < n) { half_x[i] = 0.5f * x[i]; square[i] = (double)x[i] * (double)x[i]; }
}
"#;

/// `twice(const float* x, float* y, u64 n)`: `y[i] = 2 x[i]` for `i < n`, hand-written PTX.
const TWICE_PTX: &str = r#"
.version 7.0
.target sm_70
.address_size 64

.visible .entry twice(
    .param .u64 p_x,
    .param .u64 p_y,
    .param .u64 p_n
)
{
    .reg .pred %p<2>;
    .reg .f32 %f<3>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<10>;

    ld.param.u64 %rd1, [p_x];
    ld.param.u64 %rd2, [p_y];
    ld.param.u64 %rd3, [p_n];
    mov.u32 %r1, %ctaid.x;
    mov.u32 %r2, %ntid.x;
    mov.u32 %r3, %tid.x;
    mul.wide.u32 %rd4, %r1, %r2;
    cvt.u64.u32 %rd5, %r3;
    add.u64 %rd6, %rd4, %rd5;
    setp.ge.u64 %p1, %rd6, %rd3;
    @%p1 bra DONE;
    cvta.to.global.u64 %rd1, %rd1;
    cvta.to.global.u64 %rd2, %rd2;
    shl.b64 %rd7, %rd6, 2;
    add.u64 %rd8, %rd1, %rd7;
    add.u64 %rd9, %rd2, %rd7;
    ld.global.f32 %f1, [%rd8];
    add.f32 %f2, %f1, %f1;
    st.global.f32 [%rd9], %f2;
DONE:
    ret;
}
"#;

/// The launch of `n` elements if every length is `n`, else the refusal.
fn all_n(lens: &[&[usize]], n: u64) -> Result<LaunchConfig, String> {
    let all: Vec<usize> = lens.iter().flat_map(|l| l.iter().copied()).collect();
    if all.iter().any(|&l| l as u64 != n) {
        return Err(format!("every buffer must hold n = {n} elements; got {all:?}"));
    }
    Ok(LaunchConfig::for_elements(n as usize, 256))
}

type Fused = Launcher<(f32, f32), (f32,), (f32, f32, u64)>;
type Twice = Launcher<(f32,), (f32,), (u64,)>;

fn fused() -> Fused {
    let k = Kernel::from_cuda("user_fused.cu", FUSED_SRC, "fused_axpby", &[]);
    // SAFETY: fused_axpby(const float* x, const float* bias, float* y, float a, float b, u64 n)
    // reads x[..n], bias[..n], y[..n] and writes y[..n]; the check accepts only n equal to every
    // length.
    unsafe { k.vouch(|l: &Lens<'_, (f32, f32, u64)>| all_n(&[l.inputs, l.outputs], l.scalars.2)) }
}

fn split() -> Launcher<(f32,), (f32, f64), (u64,)> {
    let k = Kernel::from_cuda("user_fused.cu", FUSED_SRC, "split", &[]);
    // SAFETY: split(const float* x, float* half_x, double* square, u64 n) reads x[..n] and writes
    // half_x[..n] and square[..n]; the check accepts only n equal to every length.
    unsafe { k.vouch(|l: &Lens<'_, (u64,)>| all_n(&[l.inputs, l.outputs], l.scalars.0)) }
}

fn twice_from(k: Kernel) -> Twice {
    // SAFETY: twice(const float* x, float* y, u64 n) reads x[..n] and writes y[..n]; the check
    // accepts only n equal to both lengths.
    unsafe { k.vouch(|l: &Lens<'_, (u64,)>| all_n(&[l.inputs, l.outputs], l.scalars.0)) }
}

fn twice() -> Twice {
    twice_from(Kernel::from_ptx(TWICE_PTX, "twice"))
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&e| e as f64).collect()
}

fn dev() -> Result<Device, cuda_core::Error> {
    Device::new(0)
}

/// The fused kernel from CUDA C on random data, in place in `y`, against an `f64` reference.
fn cuda_c_fused() -> TestResult {
    let s = Stream::new(&dev()?)?;
    let (mut r, k) = (rng(), fused());
    for n in SIZES {
        let (xh, bh, yh, ab) =
            (random_f32(&mut r, n), random_f32(&mut r, n), random_f32(&mut r, n), random_f32(&mut r, 2));
        let (x, bias) = (DeviceBuffer::from_host(&s, &xh)?, DeviceBuffer::from_host(&s, &bh)?);
        let mut y = DeviceBuffer::from_host(&s, &yh)?;
        let (yref,) = k.op((&x, &bias), (&mut y,), (ab[0], ab[1], n as u64)).sync_on(&s)?;
        ensure(yref.len() == n, "the op yields the output handle")?;
        let want: Vec<f64> = (0..n)
            .map(|i| ab[0] as f64 * xh[i] as f64 + ab[1] as f64 * yh[i] as f64 + bh[i] as f64)
            .collect();
        assert_close(&y.to_vec()?, &want, 1e-6)?;
    }
    Ok(())
}

/// Two outputs of two element types, NaN-poisoned, lazy input and owned outputs.
fn cuda_c_two_outputs() -> TestResult {
    let s = Stream::new(&dev()?)?;
    let (mut r, k) = (rng(), split());
    for n in SIZES {
        let xh = random_f32(&mut r, n);
        let half = DeviceBuffer::filled(&s, n, POISON_F32)?;
        let sq = DeviceBuffer::filled(&s, n, f64::NAN)?;
        let (half, sq) = k.op((from_host(xh.clone()),), (half, sq), (n as u64,)).sync_on(&s)?;
        assert_close(&half.to_vec()?, &f64s(&xh).iter().map(|v| 0.5 * v).collect::<Vec<_>>(), 1e-7)?;
        assert_close(&sq.to_vec()?, &f64s(&xh).iter().map(|v| v * v).collect::<Vec<_>>(), 1e-15)?;
    }
    Ok(())
}

/// Hand-written PTX, JIT-compiled by the driver; outputs poisoned first.
fn ptx_kernel() -> TestResult {
    let s = Stream::new(&dev()?)?;
    let (mut r, k) = (rng(), twice());
    for n in SIZES {
        let xh = random_f32(&mut r, n);
        let x = DeviceBuffer::from_host(&s, &xh)?;
        let mut y = DeviceBuffer::filled(&s, n, POISON_F32)?;
        k.op((&x,), (&mut y,), (n as u64,)).sync_on(&s)?;
        assert_close(&y.to_vec()?, &f64s(&xh).iter().map(|v| 2.0 * v).collect::<Vec<_>>(), 0.0)?;
    }
    Ok(())
}

/// A cubin built ahead of the launch (here by NVRTC, as `nvcc -cubin` would offline) and loaded
/// from its bytes.
fn cubin_kernel() -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let major = d.attribute(DeviceAttribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = d.attribute(DeviceAttribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let src = r#"extern "C" __global__ void twice(const float* x, float* y, unsigned long long n) {
        unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
        if (i < n) y[i] = 2.0f * x[i];
    }"#;
    let image = cuda_core::nvrtc::compile_cubin("twice.cu", src, &format!("sm_{major}{minor}"), &[])?;
    let k = twice_from(Kernel::from_cubin(&image, "twice"));
    let n = 70_001;
    let xh = random_f32(&mut rng(), n);
    let x = DeviceBuffer::from_host(&s, &xh)?;
    let mut y = DeviceBuffer::filled(&s, n, POISON_F32)?;
    k.op((&x,), (&mut y,), (n as u64,)).sync_on(&s)?;
    assert_close(&y.to_vec()?, &f64s(&xh).iter().map(|v| 2.0 * v).collect::<Vec<_>>(), 0.0)
}

/// Bad code fails at the launch with the loader's or compiler's error, and launches nothing.
/// Images the loader would read past the end of (a truncated cubin, garbage with no NUL for its
/// PTX fallback, ELF magic passed as PTX) are refused before it sees them.
fn load_errors() -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let major = d.attribute(DeviceAttribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
    let minor = d.attribute(DeviceAttribute::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
    let src = r#"extern "C" __global__ void twice(const float* x, float* y, unsigned long long n) {
        unsigned long long i = blockIdx.x * (unsigned long long)blockDim.x + threadIdx.x;
        if (i < n) y[i] = 2.0f * x[i];
    }"#;
    let image = cuda_core::nvrtc::compile_cubin("twice.cu", src, &format!("sm_{major}{minor}"), &[])?;
    let x = DeviceBuffer::from_host(&s, &[1.0f32; 8])?;
    let mut y = DeviceBuffer::filled(&s, 8, POISON_F32)?;
    // Not an ELF or fatbin image, NUL-terminated so that the loader's fallback (reading it as PTX
    // text) stays within it.
    let mut garbage = vec![0xabu8; 255];
    garbage.push(0);
    let cases = [
        ("empty cubin", Kernel::from_cubin(&[], "twice")),
        ("garbage cubin", Kernel::from_cubin(&garbage, "twice")),
        ("garbage without a NUL", Kernel::from_cubin(&[0xab; 256], "twice")),
        ("truncated cubin", Kernel::from_cubin(&image[..image.len() / 2], "twice")),
        ("cubin cut before its last byte", Kernel::from_cubin(&image[..image.len() - 1], "twice")),
        ("ELF magic as PTX", Kernel::from_ptx("\u{7f}ELF\u{2}\u{1}\u{1}", "twice")),
        ("missing name", Kernel::from_ptx(TWICE_PTX, "thrice")),
        ("bad CUDA C", Kernel::from_cuda("bad.cu", "this is not CUDA", "twice", &[])),
    ];
    for (what, k) in cases {
        let e = twice_from(k).op((&x,), (&mut y,), (8,)).sync_on(&s).err();
        ensure(matches!(e, Some(DeviceError::Core(_))), format!("{what}: expected a load error, got {e:?}"))?;
    }
    ensure(y.to_vec()?.iter().all(|v| v.is_nan()), "nothing was launched")
}

/// Lengths the check function refuses are a shape error, and nothing runs.
fn lengths_refused() -> TestResult {
    let s = Stream::new(&dev()?)?;
    let k = fused();
    let x = DeviceBuffer::from_host(&s, &[1.0f32; 64])?;
    let short = DeviceBuffer::from_host(&s, &[1.0f32; 63])?;
    let mut y = DeviceBuffer::filled(&s, 64, POISON_F32)?;
    for (what, e) in [
        ("short bias", k.op((&x, &short), (&mut y,), (1.0, 1.0, 64)).sync_on(&s).err()),
        ("n past the lengths", k.op((&x, &x), (&mut y,), (1.0, 1.0, 65)).sync_on(&s).err()),
        ("n short of the lengths", k.op((&x, &x), (&mut y,), (1.0, 1.0, 63)).sync_on(&s).err()),
    ] {
        ensure(
            matches!(e, Some(DeviceError::Shape { .. })),
            format!("{what}: expected a shape error, got {e:?}"),
        )?;
    }
    ensure(y.to_vec()?.iter().all(|v| v.is_nan()), "nothing was launched")
}

/// A buffer of another device than the stream's is refused before anything is launched.
fn device_mismatch() -> TestResult {
    let (s0, s1) = (Stream::new(&Device::new(0)?)?, Stream::new(&Device::new(1)?)?);
    let k = twice();
    let x1 = DeviceBuffer::from_host(&s1, &[1.0f32; 16])?;
    let mut y0 = DeviceBuffer::filled(&s0, 16, POISON_F32)?;
    let e = k.op((&x1,), (&mut y0,), (16,)).sync_on(&s0).err();
    ensure(
        matches!(e, Some(DeviceError::Core(cuda_core::Error::DeviceMismatch { .. }))),
        format!("expected a device mismatch, got {e:?}"),
    )?;
    ensure(y0.to_vec()?.iter().all(|v| v.is_nan()), "nothing was launched")
}

/// Recorded with `CudaGraph::scope` (kernel loaded first), replayed three times, each replay
/// awaited from tokio: `y` follows three applications of the fused update.
fn graph_replay() -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let k = fused();
    k.kernel().function(&d)?; // compile before recording
    let n = 100_003;
    let mut r = rng();
    let (xh, bh, yh) = (random_f32(&mut r, n), random_f32(&mut r, n), random_f32(&mut r, n));
    let (a, b) = (0.75f32, -0.5f32);
    let (x, bias) = (DeviceBuffer::from_host(&s, &xh)?, DeviceBuffer::from_host(&s, &bh)?);
    let y = DeviceBuffer::from_host(&s, &yh)?;
    let op = k.op((&x, &bias), (y,), (a, b, n as u64));
    fn node<O: GraphNode>(o: O) -> O {
        o
    }
    let mut graph = CudaGraph::scope(&s, |scope| scope.record(node(op)))?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(async {
        for _ in 0..3 {
            graph.launch().await?;
        }
        Ok::<_, DeviceError>(())
    })?;
    let (y,) = graph.take_output().ok_or("the graph's output")?;
    let mut want = f64s(&yh);
    for _ in 0..3 {
        for i in 0..n {
            want[i] = a as f64 * xh[i] as f64 + b as f64 * want[i] + bh[i] as f64;
        }
    }
    assert_close(&y.to_vec()?, &want, 1e-5)
}

/// Awaited from tokio tasks, with lazy arguments (an upload, a fresh output) and a chain.
fn awaited_from_tokio() -> TestResult {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build()?;
    let (k, n) = (twice(), 50_000);
    let mut r = rng();
    let inputs: Vec<Vec<f32>> = (0..8).map(|_| random_f32(&mut r, n)).collect();
    rt.block_on(async {
        let tasks: Vec<_> = inputs
            .iter()
            .cloned()
            .map(|xh| {
                let k = k.clone();
                tokio::spawn(async move {
                    let op = k
                        .op((from_host(xh),), (zeros::<f32>(n),), (n as u64,))
                        .then(move |(y,)| k.op((y,), (zeros::<f32>(n),), (n as u64,)))
                        .then(|(z,)| to_host(z));
                    op.await
                })
            })
            .collect();
        for (t, xh) in tasks.into_iter().zip(&inputs) {
            let got = t.await.map_err(|e| e.to_string())??;
            assert_close(got.as_slice()?, &f64s(xh).iter().map(|v| 4.0 * v).collect::<Vec<_>>(), 0.0)?;
        }
        Ok(())
    })
}

/// A user op on one stream reads a buffer that a slow kernel on another stream writes: the launch
/// is ordered after the write.
fn ordered_after_other_stream() -> TestResult {
    let d = dev()?;
    let (s1, s2) = (Stream::new(&d)?, Stream::new(&d)?);
    let (k, n) = (twice(), 1 << 16);
    let mut x = DeviceBuffer::<f32>::zeros(&s1, n)?;
    s1.synchronize()?;
    // SAFETY: `x` is read on the host only after `s1` and `s2` are synchronised below.
    unsafe { SpinWrite { buf: &mut x, ns: 50_000_000, v: 3.0 }.async_on(&s1)? };
    let mut y = DeviceBuffer::filled(&s2, n, POISON_F32)?;
    k.op((&x,), (&mut y,), (n as u64,)).sync_on(&s2)?;
    ensure(y.to_vec()?.iter().all(|&v| v == 6.0), "the user op ran after the write on the other stream")?;
    s1.synchronize()?;
    Ok(())
}

/// The general form: a `KernelOp` whose closure launches the PTX kernel itself.
fn kernel_op_closure() -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let f = Kernel::from_ptx(TWICE_PTX, "twice").function(&d)?;
    let n = 9_999;
    let xh = random_f32(&mut rng(), n);
    let x = DeviceBuffer::from_host(&s, &xh)?;
    let mut y = DeviceBuffer::filled(&s, n, POISON_F32)?;
    // SAFETY: the closure checks equal lengths, then launches only `twice`, which reads x[..n] and
    // writes y[..n]; it allocates nothing and does not synchronise. This block also covers the
    // closure's `f.launch`: (const float*, float*, u64) matches the kernel's signature.
    let op = unsafe {
        KernelOp::new("twice", (&x,), (&mut y,), move |ctx, (x,), (y,)| {
            if x.len() != y.len() {
                return Err(DeviceError::shape("twice", "lengths differ"));
            }
            f.launch(ctx.stream(), LaunchConfig::for_elements(x.len(), 128), (x, y, x.len() as u64))?;
            Ok(())
        })
    };
    op.sync_on(&s)?;
    assert_close(&y.to_vec()?, &f64s(&xh).iter().map(|v| 2.0 * v).collect::<Vec<_>>(), 0.0)
}

/// An output handle of the user's whose `buffer()` shows another (shared) buffer than the one
/// its `buffer_mut()` lends: safe code, so the launch must write only what `buffer_mut` lends.
struct TwoFaced<'a> {
    shown: &'a DeviceBuffer<f32>,
    lent: DeviceBuffer<f32>,
}

impl BufferRef<f32> for TwoFaced<'_> {
    fn buffer(&self) -> &DeviceBuffer<f32> {
        self.shown
    }
}

impl BufferMut<f32> for TwoFaced<'_> {
    fn buffer_mut(&mut self) -> &mut DeviceBuffer<f32> {
        &mut self.lent
    }
}

/// A two-faced output handle showing the input `x` cannot make the kernel write `x` (an output
/// aliasing an input, written through `&`): the kernel writes the buffer `buffer_mut` lends, `x`
/// keeps its values. Mutation caught: outputs passed by `BufferRef::buffer` (x doubled in place,
/// the lent buffer left NaN).
fn two_faced_output_writes_only_lent() -> TestResult {
    let s = Stream::new(&dev()?)?;
    let (k, n) = (twice(), 4097);
    let xh = random_f32(&mut rng(), n);
    let x = DeviceBuffer::from_host(&s, &xh)?;
    let lent = DeviceBuffer::filled(&s, n, POISON_F32)?;
    let (out,) = k.op((&x,), (value(TwoFaced { shown: &x, lent }),), (n as u64,)).sync_on(&s)?;
    ensure(x.to_vec()? == xh, "the input was not written")?;
    assert_close(&out.lent.to_vec()?, &f64s(&xh).iter().map(|v| 2.0 * v).collect::<Vec<_>>(), 0.0)?;
    // The general form checks devices on, and hands the closure, the same lent buffers.
    let lent = DeviceBuffer::filled(&s, n, POISON_F32)?;
    let f = k.kernel().function(s.device())?;
    // SAFETY: the closure checks equal lengths, then launches only `twice`, which reads x[..n] and
    // writes y[..n]; it allocates nothing and does not synchronise; (const float*, float*, u64)
    // matches the kernel's signature.
    let op = unsafe {
        KernelOp::new("twice", (&x,), (value(TwoFaced { shown: &x, lent }),), move |ctx, (x,), (y,)| {
            if x.len() != y.len() {
                return Err(DeviceError::shape("twice", "lengths differ"));
            }
            f.launch(ctx.stream(), LaunchConfig::for_elements(x.len(), 128), (x, y, x.len() as u64))?;
            Ok(())
        })
    };
    let (out,) = op.sync_on(&s)?;
    ensure(x.to_vec()? == xh, "KernelOp: the input was not written")?;
    assert_close(&out.lent.to_vec()?, &f64s(&xh).iter().map(|v| 2.0 * v).collect::<Vec<_>>(), 0.0)
}

fn main() {
    let mut s = Suite::new();
    s.gpu("cuda_c_fused", cuda_c_fused)
        .gpu("cuda_c_two_outputs", cuda_c_two_outputs)
        .gpu("ptx_kernel", ptx_kernel)
        .gpu("cubin_kernel", cubin_kernel)
        .gpu("load_errors", load_errors)
        .gpu("lengths_refused", lengths_refused)
        .gpus(2, "device_mismatch", device_mismatch)
        .gpu("graph_replay", graph_replay)
        .gpu("awaited_from_tokio", awaited_from_tokio)
        .gpu("ordered_after_other_stream", ordered_after_other_stream)
        .gpu("kernel_op_closure", kernel_op_closure)
        .gpu("two_faced_output_writes_only_lent", two_faced_output_writes_only_lent);
    s.run()
}
