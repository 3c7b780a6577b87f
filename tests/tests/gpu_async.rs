//! GPU suite for `cuda-async`: laziness, combinators, the execution lock, futures on tokio and
//! block_on, cancellation, concurrency, scheduling and cross-stream ordering.

use cuda_async::memory::{copy, dup, from_host, full, ones, to_host, zeros};
use cuda_async::scheduling::{self, SchedulingPolicy};
use cuda_async::{join_all, value, zip, DeviceError, DeviceOpExt, SingleStream, StreamPoolRoundRobin};
use cuda_async_tests::ops::{AddScalar, SpinWrite};
use cuda_async_tests::{assert_close, ensure, random_f32, rng, Suite, TestResult, POISON_F32};
use cuda_core::{Device, DeviceBuffer, MemPool, Stream};
use rand::Rng;
use std::future::IntoFuture;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn dev() -> Result<Device, cuda_core::Error> {
    Device::new(0)
}

fn laziness() -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let pool = MemPool::device_default(&d)?;
    let calls = AtomicUsize::new(0);
    let n = 1 << 24;
    // A buffer that an executed op would write (and the default policy's streams, which `.sync()`
    // and `.await` would use): built and dropped unexecuted, the ops must leave it poisoned.
    cuda_async_tests::ops::test_kernels(&d)?;
    cuda_async::scheduling::default_policy()?;
    let mut probe = DeviceBuffer::filled(&s, 4096, POISON_F32)?;
    d.synchronize()?;
    let before = pool.stats()?.used_current;
    {
        let op3 = AddScalar { buf: &mut probe, v: 1.0 }.into_op().then(|b| AddScalar { buf: b, v: 2.0 });
        drop(op3);
        let op = zeros::<f32>(n).map(|b| {
            calls.fetch_add(1, SeqCst);
            b
        });
        let op2 = from_host(vec![1.0f32; 1024]).then(dup).inspect(|_| {
            calls.fetch_add(1, SeqCst);
        });
        let t = Instant::now();
        drop((op, op2));
        ensure(t.elapsed() < Duration::from_millis(5), "dropping ops must not wait for anything")?;
    }
    d.synchronize()?;
    ensure(calls.load(SeqCst) == 0, "closures of unexecuted ops must not run")?;
    ensure(probe.to_vec()?.iter().all(|v| v.is_nan()), "an unexecuted op wrote its buffer")?;
    let after = pool.stats()?.used_current;
    ensure(after == before, format!("device memory changed by building ops: {before} -> {after}"))
}

fn then_order_map_inspect() -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let seq = AtomicUsize::new(0);
    let mut r = rng();
    let xh = random_f32(&mut r, 100_000);
    let v: f32 = r.random_range(1.0..2.0);
    let out = from_host(xh.clone())
        .inspect(|b| {
            assert_eq!(seq.fetch_add(1, SeqCst), 0);
            assert_eq!(b.len(), 100_000);
        })
        .then(|b| AddScalar { buf: b, v })
        .map(|b| {
            assert_eq!(seq.fetch_add(1, SeqCst), 1);
            b
        })
        .then(|b| AddScalar { buf: b, v: 2.0 * v })
        .then(to_host)
        .sync_on(&s)?;
    ensure(seq.load(SeqCst) == 2, "closures ran in chain order")?;
    let want: Vec<f64> = xh.iter().map(|&x| x as f64 + 3.0 * v as f64).collect();
    assert_close(out.as_slice()?, &want, 1e-6)
}

fn zip_join_first_last() -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let t = zip!(value(1u8), value(2u16), value(3u32), value(4u64), value(5i32), value(6i64), value(7.0f32))
        .sync_on(&s)?;
    ensure(t == (1, 2, 3, 4, 5, 6, 7.0), "zip of 7 values")?;
    let (a, b, c, e, f, g) = zip!(
        zeros::<f32>(10),
        ones::<f32>(11),
        full(12, 2.5f64),
        from_host(vec![1u32, 2, 3]),
        value("x"),
        ones::<u8>(5)
    )
    .sync_on(&s)?;
    ensure(
        a.to_vec()? == vec![0.0; 10] && b.to_vec()? == vec![1.0; 11] && c.to_vec()? == vec![2.5; 12],
        "zip of allocations",
    )?;
    ensure(e.to_vec()? == vec![1, 2, 3] && f == "x" && g.to_vec()? == vec![1; 5], "zip of mixed ops")?;
    let v = join_all((0..50).map(|i| full(i + 1, i as f32))).sync_on(&s)?;
    for (i, b) in v.iter().enumerate() {
        ensure(b.len() == i + 1 && b.to_vec()?.iter().all(|&x| x == i as f32), "join_all element")?;
    }
    ensure(zip!(value(1), value(2), value(3)).first().sync_on(&s)? == 1, "first")?;
    ensure(zip!(value(1), value(2), value(3)).last().sync_on(&s)? == 3, "last")?;
    let boxed: Vec<cuda_async::Op<cuda_async::combinators::BoxedOp<'_, usize>>> =
        vec![value(1usize).boxed(), zeros::<f32>(7).map(|b| b.len()).boxed()];
    ensure(join_all(boxed).sync_on(&s)? == vec![1, 7], "boxed ops of different types")
}

fn shared_and_unzip_run_once() -> TestResult {
    let d = dev()?;
    let (a, b) = (Stream::new(&d)?, Stream::new(&d)?);
    let runs = Arc::new(AtomicUsize::new(0));
    let r2 = runs.clone();
    let sh = zeros::<f32>(1 << 20)
        .map(move |buf| {
            r2.fetch_add(1, SeqCst);
            buf
        })
        .then(|buf| SpinWrite { buf, ns: 20_000_000, v: 4.0 })
        .shared();
    // Producer on A (20 ms of GPU spin before the write), queued without any host wait; then at
    // once consumers on A and on B: B must be ordered after the producer's GPU work by the shared
    // op's event alone.
    // SAFETY: the outputs (`Arc`s of the buffer) are read only by the consumers below, whose
    // ordering after the producer is what this test checks; the host reads wait for everything.
    let (x, y, z) = unsafe { zip!(sh.clone(), sh.clone(), sh.clone()).async_on(&a)? };
    ensure(Arc::ptr_eq(&x, &y) && Arc::ptr_eq(&y, &z), "one output for every clone")?;
    ensure(!a.query()?, "the producer's 20 ms kernel is still running when B consumes")?;
    let copied = sh.clone().then(dup).sync_on(&b)?;
    ensure(
        copied.to_vec()?.iter().all(|&v| v == 4.0),
        "consumer on another stream saw the producer's write",
    )?;
    ensure(runs.load(SeqCst) == 1, format!("producer ran {} times", runs.load(SeqCst)))?;

    // Two threads consume a fresh shared op at the same time.
    let runs2 = Arc::new(AtomicUsize::new(0));
    let r3 = runs2.clone();
    let sh2 = from_host(vec![1.5f32; 1000])
        .inspect(move |_| {
            r3.fetch_add(1, SeqCst);
            std::thread::sleep(Duration::from_millis(20));
        })
        .shared();
    let outs: Vec<_> = std::thread::scope(|sc| {
        let hs: Vec<_> = (0..2)
            .map(|_| {
                let op = sh2.clone();
                sc.spawn(move || -> Result<Vec<f32>, String> {
                    let s = Stream::new(&Device::new(0).map_err(|e| e.to_string())?)
                        .map_err(|e| e.to_string())?;
                    let buf = op.sync_on(&s).map_err(|e| e.to_string())?;
                    buf.to_vec().map_err(|e| e.to_string())
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().map_err(|_| "panic".to_string()).and_then(|r| r)).collect()
    });
    for o in outs {
        ensure(o? == vec![1.5f32; 1000], "shared output from a thread")?;
    }
    ensure(runs2.load(SeqCst) == 1, format!("producer ran {} times across threads", runs2.load(SeqCst)))?;

    let runs3 = Arc::new(AtomicUsize::new(0));
    let r4 = runs3.clone();
    let (l, r) = value((7u32, "seven"))
        .inspect(move |_| {
            r4.fetch_add(1, SeqCst);
        })
        .unzip();
    ensure(zip!(r, l).sync_on(&a)? == ("seven", 7), "unzip halves")?;
    ensure(runs3.load(SeqCst) == 1, "unzip runs its producer once")?;
    let failing = copy(DeviceBuffer::<f32>::zeros(&a, 3)?, DeviceBuffer::<f32>::zeros(&a, 4)?).shared();
    let e1 = failing.clone().sync_on(&a).err();
    let e2 = failing.sync_on(&a).err();
    ensure(
        matches!(e1, Some(DeviceError::Shared(_))) && matches!(e2, Some(DeviceError::Shared(_))),
        "failure reaches every consumer",
    )
}

fn nested_execution_and_panic() -> TestResult {
    let d = dev()?;
    let s = Stream::new(&d)?;
    let s2 = s.clone();
    let inner = value(1).map(move |_| value(2).sync_on(&s2)).sync_on(&s)?;
    ensure(matches!(inner, Err(DeviceError::Lock(_))), format!("nested sync_on must be refused: {inner:?}"))?;
    let inner = value(1).map(|_| value(2).sync()).sync_on(&s)?;
    ensure(matches!(inner, Err(DeviceError::Lock(_))), "nested sync must be refused")?;
    let inner = value(1).map(|_| futures::executor::block_on(value(3).into_future())).sync_on(&s)?;
    ensure(matches!(inner, Err(DeviceError::Lock(_))), "nested await must be refused")?;
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = zeros::<f32>(16).map(|_| -> u32 { panic!("boom inside an op") }).sync_on(&s);
    }));
    ensure(caught.is_err(), "the panic propagates")?;
    ensure(!cuda_async::is_executing(), "lock released by the panic")?;
    ensure(full(8, 3.0f32).sync_on(&s)?.to_vec()? == vec![3.0; 8], "thread usable after the panic")?;
    ensure(s.capture_status()? == cuda_core::CaptureStatus::None && s.query().is_ok(), "stream usable")
}

fn tokio_current_thread_ticker() -> TestResult {
    let d = dev()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
    rt.block_on(async {
        let ticks = Arc::new(AtomicUsize::new(0));
        let t2 = ticks.clone();
        let ticker = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(1)).await;
                t2.fetch_add(1, SeqCst);
            }
        });
        let s = Stream::new(&d)?;
        let start = Instant::now();
        let buf =
            zeros::<f32>(1 << 16).then(|b| SpinWrite { buf: b, ns: 200_000_000, v: 9.0 }).on(&s).await?;
        let elapsed = start.elapsed();
        let n = ticks.load(SeqCst);
        ticker.abort();
        eprintln!("awaited a 200 ms kernel in {elapsed:?}; the ticker ticked {n} times meanwhile");
        ensure(elapsed >= Duration::from_millis(190), "resolved before the GPU work finished")?;
        ensure(n >= 50, format!("ticker stalled during GPU work: {n} ticks"))?;
        ensure(buf.to_vec()?.iter().all(|&v| v == 9.0), "result")?;
        // Default policy .await, and an op that failed before submission.
        let v = full(1000, 2.0f64).await?;
        ensure(v.to_vec()? == vec![2.0; 1000], "default-policy await")?;
        let e = copy(&DeviceBuffer::<f32>::zeros(&s, 3)?, DeviceBuffer::<f32>::zeros(&s, 4)?).await.err();
        ensure(matches!(e, Some(DeviceError::Shape { .. })), format!("shape error: {e:?}"))
    })?;
    let b = futures::executor::block_on(from_host(vec![5u32; 10]).then(to_host).into_future())?;
    ensure(b.as_slice()? == &[5u32; 10][..], "futures::executor::block_on")
}

fn cancellation_is_safe() -> TestResult {
    let d = dev()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
    let s = Stream::new(&d)?;
    let n = 1 << 22;
    rt.block_on(async {
        let op = zeros::<f32>(n).then(|b| SpinWrite { buf: b, ns: 150_000_000, v: 1.0 });
        let r = tokio::time::timeout(Duration::from_millis(5), op.on(&s)).await;
        ensure(r.is_err(), "the timeout fired first")
    })?;
    // The future (and its buffer) is gone while the kernel still runs. New allocations — on
    // another stream, so the first stream's order cannot hide an early free, and on the same
    // stream — must not see the kernel's late write.
    let other = Stream::new(&d)?;
    let fresh: Vec<DeviceBuffer<f32>> = (0..4)
        .map(|i| full(n, 5.0f32).sync_on(if i % 2 == 0 { &other } else { &s }))
        .collect::<Result<_, _>>()?;
    s.synchronize()?;
    for f in &fresh {
        ensure(f.to_vec()?.iter().all(|&v| v == 5.0), "cancelled op wrote into memory reused after it")?;
    }
    // The completion machinery survives: more futures resolve.
    rt.block_on(async {
        for i in 0..10 {
            let b = full(100, i as f32).on(&s).await?;
            ensure(b.to_vec()? == vec![i as f32; 100], "after cancellation")?;
        }
        Ok::<_, cuda_async_tests::Failed>(())
    })
}

/// Found by review: a cancelled await whose op ends in a copy to page-locked memory dropped that
/// buffer on the executor thread, and its drop waited for the copy, i.e. for the rest of the
/// stream's queued work (150 ms here): the 5 ms timeout bounded nothing. Now the buffer is freed
/// on the reaper thread after the copy, and the timeout returns on time. Not yet run on a GPU.
fn cancelled_copy_out_does_not_block_the_executor() -> TestResult {
    let d = dev()?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_time().build()?;
    let s = Stream::new(&d)?;
    let n = 1 << 20;
    // Warm up first (the kernels' compilation, the engine, the pools, a first page-locked
    // buffer), so that only the cancellation is timed (found by review: a cold first poll alone
    // could pass the bound, and take as long as the spin, hiding the mutation).
    rt.block_on(async {
        let w =
            zeros::<f32>(n).then(|b| SpinWrite { buf: b, ns: 1_000, v: 1.0 }).then(to_host).on(&s).await?;
        ensure(w.as_slice()?.iter().all(|&v| v == 1.0), "warm-up")
    })?;
    let t = Instant::now();
    rt.block_on(async {
        let op = zeros::<f32>(n).then(|b| SpinWrite { buf: b, ns: 150_000_000, v: 1.0 }).then(to_host);
        let r = tokio::time::timeout(Duration::from_millis(5), op.on(&s)).await;
        ensure(r.is_err(), "the timeout fired first")
    })?;
    let took = t.elapsed();
    ensure(
        took < Duration::from_millis(75),
        format!("the cancelled await took {took:?}: its drop waited for the copy"),
    )?;
    s.synchronize()?;
    // The stream and the completion machinery go on.
    let b = rt.block_on(full(100, 3.0f32).then(to_host).on(&s))?;
    ensure(b.as_slice()? == &[3.0f32; 100][..], "after the cancelled copy")
}

/// Found by review: a page-locked buffer's next transfer waited on the host for its previous one,
/// so the pass after a cancelled one (whose copy-out sat behind its whole replay) blocked its
/// executor thread for about a pass. The next copy is now queued behind the previous one on the
/// GPU: queueing returns at once, and the copies land in order (the second one's values stay).
/// Mutations: `pinned-transfer-host-wait` (the host wait back: too slow) and
/// `pinned-transfer-no-wait` (no wait at all: the first copy lands last). Not yet run on a GPU.
fn a_transfer_queues_behind_the_previous_one_on_the_gpu() -> TestResult {
    let d = dev()?;
    let (a, b) = (Stream::new(&d)?, Stream::new(&d)?);
    let n = 1 << 20;
    let mut x = DeviceBuffer::<f32>::filled(&a, n, 0.0)?;
    let y = DeviceBuffer::<f32>::filled(&b, n, 2.0)?;
    let mut host = cuda_core::PinnedBuffer::new(&d, n, 0f32)?;
    // Warm-up: the kernels, a copy on each stream.
    // SAFETY: `x` is read only through the ordered copy below.
    unsafe { SpinWrite { buf: &mut x, ns: 1_000, v: 0.5 }.async_on(&a)? };
    host.copy_from_device_async(&a, &x)?;
    host.copy_from_device_async(&b, &y)?;
    ensure(host.as_slice()?.iter().all(|&v| v == 2.0), "warm-up")?;
    // SAFETY: `x` is not read on the host while the spin writes it.
    unsafe { SpinWrite { buf: &mut x, ns: 150_000_000, v: 1.0 }.async_on(&a)? };
    host.copy_from_device_async(&a, &x)?; // lands in about 150 ms: 1.0
    let t = Instant::now();
    host.copy_from_device_async(&b, &y)?; // must land after it: 2.0
    let took = t.elapsed();
    ensure(
        took < Duration::from_millis(75),
        format!("queueing the second copy took {took:?}: it waited on the host"),
    )?;
    // Both copies done (the first one's stream too), then the contents: the second copy's.
    a.synchronize()?;
    b.synchronize()?;
    let got = host.as_slice()?;
    ensure(got.iter().all(|&v| v == 2.0), format!("the first copy landed after the second: {}", got[0]))
}

/// Several `AddScalar` launches queued by one op (so one await covers several kernels).
struct AddMany<'a> {
    buf: &'a mut DeviceBuffer<f32>,
    vs: Vec<f32>,
}

impl cuda_async::DeviceOp for AddMany<'_> {
    type Output = ();
    fn execute(self, ctx: &cuda_async::ExecutionContext<'_>) -> cuda_async::Result<()> {
        for v in self.vs {
            AddScalar { buf: &mut *self.buf, v }.execute(ctx)?;
        }
        Ok(())
    }
}

fn many_tasks_many_ops() -> TestResult {
    let d = dev()?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(8).enable_all().build()?;
    let mut r = rng();
    let inits: Vec<Vec<f32>> =
        (0..64).map(|_| (0..256).map(|_| r.random_range(0..1000) as f32).collect()).collect();
    let t = Instant::now();
    let (rounds, per_await) = (40, 5);
    let results = rt.block_on(async {
        let hs: Vec<_> = inits
            .iter()
            .cloned()
            .map(|init| {
                tokio::spawn(async move {
                    let mut buf = from_host(init).await?;
                    for round in 0..rounds {
                        // Several ops queued back to back per await (a chain on the task's
                        // stream), different values so a skipped or reordered op shows.
                        let vs: Vec<f32> =
                            (0..per_await).map(|k| ((round * per_await + k) % 3) as f32).collect();
                        AddMany { buf: &mut buf, vs }.into_op().await?;
                    }
                    Ok::<_, DeviceError>(buf.to_vec()?)
                })
            })
            .collect();
        let mut out = Vec::new();
        for h in hs {
            out.push(h.await.map_err(|e| e.to_string())?);
        }
        Ok::<_, String>(out)
    })?;
    eprintln!("64 tasks x {} ops ({rounds} awaits each): {:?}", rounds * per_await, t.elapsed());
    let add: f64 = (0..rounds * per_await).map(|i| (i % 3) as f64).sum();
    let _ = d;
    for (init, got) in inits.iter().zip(results) {
        let want: Vec<f64> = init.iter().map(|&v| v as f64 + add).collect();
        assert_close(&got?, &want, 0.0)?;
    }
    Ok(())
}

fn round_robin_streams() -> TestResult {
    let d = dev()?;
    ensure(matches!(StreamPoolRoundRobin::new(&d, 0), Err(DeviceError::Scheduling(_))), "pool size 0")?;
    let pool = StreamPoolRoundRobin::new(&d, 4)?;
    let streams = pool.streams().to_vec();
    for i in 0..4 {
        for j in 0..i {
            ensure(streams[i] != streams[j], "distinct streams")?;
        }
    }
    let policy: Arc<dyn SchedulingPolicy> = Arc::new(pool);
    let used: Vec<Stream> = (0..8)
        .map(|_| {
            futures::executor::block_on(
                value(()).and_then_with_context(|_, ctx| Ok(ctx.stream().clone())).schedule(&policy),
            )
        })
        .collect::<Result<_, _>>()?;
    for (i, s) in used.iter().enumerate() {
        ensure(*s == streams[i % 4], format!("op {i} ran on the wrong stream"))?;
    }
    Ok(())
}

fn default_device_and_policy() -> TestResult {
    let d = dev()?;
    let n = cuda_core::device_count()?;
    ensure(
        matches!(
            scheduling::set_default_device(n + 5),
            Err(DeviceError::Core(cuda_core::Error::InvalidDevice { .. }))
        ),
        "bad ordinal",
    )?;
    ensure(scheduling::default_device()? == d, "default unchanged")?;
    scheduling::set_default_device(0)?;
    let mine = Stream::new(&d)?;
    scheduling::set_policy(Arc::new(SingleStream::new(mine.clone())));
    let got = value(()).and_then_with_context(|_, ctx| Ok(ctx.stream().clone())).sync()?;
    let got2 = futures::executor::block_on(
        value(()).and_then_with_context(|_, ctx| Ok(ctx.stream().clone())).into_future(),
    )?;
    scheduling::set_policy(Arc::new(StreamPoolRoundRobin::new(&d, 4)?));
    ensure(got == mine && got2 == mine, "sync and await use the policy that was set")?;
    let got3 = value(()).and_then_with_context(|_, ctx| Ok(ctx.stream().clone())).sync()?;
    ensure(got3 != mine, "policy replaced again")
}

fn cross_stream_same_buffer_never_races() -> TestResult {
    // A buffer homed on A is written on B by a slow kernel (queued without waiting), then read on C.
    let d = dev()?;
    let (a, b, c) = (Stream::new(&d)?, Stream::new(&d)?, Stream::new(&d)?);
    let n = 1 << 20;
    let mut buf = DeviceBuffer::<f32>::filled(&a, n, POISON_F32)?;
    // SAFETY: the output (a `&mut` handle) is not used until after the reads below, which the
    // framework orders after the write anyway.
    unsafe { SpinWrite { buf: &mut buf, ns: 30_000_000, v: 6.0 }.async_on(&b)? };
    let copy_on_c = dup(&buf).sync_on(&c)?;
    ensure(copy_on_c.to_vec()?.iter().all(|&v| v == 6.0), "read on C raced the write on B")?;
    // And a write on C after a read on B: the read must see the old value.
    let mut target = DeviceBuffer::<f32>::filled(&a, n, POISON_F32)?;
    // SAFETY: as above.
    unsafe { SpinWrite { buf: &mut target, ns: 20_000_000, v: 1.0 }.async_on(&b)? };
    // SAFETY: as above.
    let before = unsafe { dup(&target).async_on(&b)? };
    // SAFETY: as above.
    unsafe { SpinWrite { buf: &mut target, ns: 0, v: 2.0 }.async_on(&c)? };
    ensure(before.to_vec()?.iter().all(|&v| v == 1.0), "the read saw the later write")?;
    ensure(target.to_vec()?.iter().all(|&v| v == 2.0), "final value")
}

fn main() {
    let mut s = Suite::new();
    // Alone: it compares the device pool's memory in use before and after, which the other tests'
    // allocations would change.
    s.gpu_alone("laziness", laziness)
        .gpu("then_order_map_inspect", then_order_map_inspect)
        .gpu("zip_join_first_last", zip_join_first_last)
        .gpu("shared_and_unzip_run_once", shared_and_unzip_run_once)
        .gpu("nested_execution_and_panic", nested_execution_and_panic)
        .gpu("tokio_current_thread_ticker", tokio_current_thread_ticker)
        .gpu("cancellation_is_safe", cancellation_is_safe)
        .gpu("cancelled_copy_out_does_not_block_the_executor", cancelled_copy_out_does_not_block_the_executor)
        .gpu(
            "a_transfer_queues_behind_the_previous_one_on_the_gpu",
            a_transfer_queues_behind_the_previous_one_on_the_gpu,
        )
        .gpu("many_tasks_many_ops", many_tasks_many_ops)
        .gpu("round_robin_streams", round_robin_streams)
        .gpu("default_device_and_policy", default_device_and_policy)
        .gpu("cross_stream_same_buffer_never_races", cross_stream_same_buffer_never_races);
    s.run()
}
