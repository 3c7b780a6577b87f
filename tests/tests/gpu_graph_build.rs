//! GPU suite for explicitly built graphs: every node kind, dependencies, child graphs, host
//! closures, exec updates, conditional IF/WHILE nodes, DOT export and shared graph memory.

use cuda_async::graph::{GraphBodyExt, GraphPool};
use cuda_async::{CaptureOptions, CudaGraph, DeviceOpExt};
use cuda_async_tests::graph_kernels::graph_kernels;
use cuda_async_tests::{assert_close, ensure, random_f32, rng, Suite, TestResult, POISON_F32};
use cuda_core::{Device, DeviceBuffer, Event, ExecUpdate, Graph, LaunchConfig, NodeType, Stream};
use kernels::{ops, Kernels};
use rand::Rng;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Arc;

fn setup() -> Result<(Device, Stream), cuda_core::Error> {
    let d = Device::new(0)?;
    // Kernels are compiled before any capture or graph building.
    Kernels::get(&d)?;
    graph_kernels(&d)?;
    Ok((d, Stream::new(&d)?))
}

fn one_thread() -> LaunchConfig {
    LaunchConfig { grid: (1, 1, 1), block: (1, 1, 1), shared_mem_bytes: 0 }
}

fn every_node_kind() -> TestResult {
    let (d, s) = setup()?;
    let gk = graph_kernels(&d)?;
    let mut r = rng();
    let n = 10_000;
    let xh = random_f32(&mut r, n);
    let staging = DeviceBuffer::from_host(&s, &xh)?;
    let mut x = DeviceBuffer::<f32>::filled(&s, n, POISON_F32)?;
    let mut y = DeviceBuffer::<f32>::filled(&s, n, POISON_F32)?;
    let mut z = DeviceBuffer::<f32>::filled(&s, n, POISON_F32)?;
    let mut flags = DeviceBuffer::<u32>::filled(&s, 4, 0)?;
    let hits = Arc::new(AtomicUsize::new(0));
    let ev = Arc::new(Event::new(&d, false)?);
    let mut g = Graph::new(&d)?;
    {
        let mut b = g.builder();
        let copy = b.add_copy(&staging, &mut x, &[])?;
        let (_, scale) = b.add_op(ops::scale(&x, 2.0f32, &mut y), &[copy])?;
        let memset = b.add_memset(&mut flags, 7u32, &[])?;
        let join = b.add_empty(&[scale, memset])?;
        let h = hits.clone();
        // SAFETY: the closure only increments an atomic: no CUDA call, returns at once.
        let host = unsafe {
            b.add_host(
                move || {
                    h.fetch_add(1, SeqCst);
                },
                &[join],
            )?
        };
        let rec = b.add_event_record(&ev, &[host])?;
        let wait = b.add_event_wait(&ev, &[rec])?;
        // Graph-owned memory: alloc, fill with iota by a raw kernel, copy out into z, free.
        let (alloc, mem) = b.add_mem_alloc(n * 4, &[wait])?;
        let cfg = LaunchConfig::for_elements(n, 256);
        // SAFETY: iota_raw(float* dst, u64 n, float base) writes dst[0..n); `mem` holds n floats and
        // is valid between its alloc and free nodes, which order this node.
        let iota = unsafe { b.add_kernel(&gk.iota_raw, cfg, (mem.ptr, n as u64, 0.5f32), &[alloc])? };
        // SAFETY: copy_raw(const float*, float*, u64) reads mem[0..n) and writes z[0..n).
        let out = unsafe { b.add_kernel(&gk.copy_raw, cfg, (mem.ptr, &mut z, n as u64), &[iota])? };
        // SAFETY: the two kernels using `mem` (iota, then out) come before the free.
        unsafe { b.add_mem_free(mem, &[out])? };
    }
    let types = g.node_types()?;
    for t in [
        NodeType::Memcpy,
        NodeType::Kernel,
        NodeType::Memset,
        NodeType::Empty,
        NodeType::Host,
        NodeType::EventRecord,
        NodeType::EventWait,
        NodeType::MemAlloc,
        NodeType::MemFree,
    ] {
        ensure(types.contains(&t), format!("missing node type {t:?} in {types:?}"))?;
    }
    // copy, scale, memset, empty, host, record, wait, alloc, iota, copy-out, free
    ensure(g.node_count()? == 11, format!("11 nodes, got {}", g.node_count()?))?;
    let graph = CudaGraph::from_graph(&s, g, CaptureOptions::default())?;
    for _ in 0..3 {
        graph.launch().sync_on(&s)?;
    }
    assert_close(&y.to_vec()?, &xh.iter().map(|&v| 2.0 * v as f64).collect::<Vec<_>>(), 1e-6)?;
    ensure(flags.to_vec()? == vec![7; 4], "memset node")?;
    assert_close(&z.to_vec()?, &(0..n).map(|i| 0.5 + i as f64).collect::<Vec<_>>(), 0.0)?;
    ensure(hits.load(SeqCst) == 3, format!("host closure ran {} times for 3 launches", hits.load(SeqCst)))?;
    ensure(ev.query()?, "event recorded")
}

fn diamond_dependencies() -> TestResult {
    let (d, s) = setup()?;
    let mut r = rng();
    let n = 1 << 20;
    let xh = random_f32(&mut r, n);
    let staging = DeviceBuffer::from_host(&s, &xh)?;
    let mut x = DeviceBuffer::<f32>::filled(&s, n, POISON_F32)?;
    let mut y = DeviceBuffer::<f32>::filled(&s, n, POISON_F32)?;
    let mut z = DeviceBuffer::<f32>::filled(&s, n, POISON_F32)?;
    let mut w = DeviceBuffer::<f32>::filled(&s, n, POISON_F32)?;
    let mut g = Graph::new(&d)?;
    {
        let mut b = g.builder();
        let a = b.add_copy(&staging, &mut x, &[])?;
        let (_, left) = b.add_op(ops::scale(&x, 2.0f32, &mut y), &[a])?;
        let (_, right) = b.add_op(ops::scale(&x, 3.0f32, &mut z), &[a])?;
        b.add_op(ops::add(&y, &z, &mut w), &[left, right])?;
        // A node of another graph is refused as a dependency.
        let mut other = Graph::new(&d)?;
        let foreign = other.builder().add_empty(&[])?;
        ensure(b.add_empty(&[foreign]).is_err(), "foreign dependency must be refused")?;
    }
    let graph = CudaGraph::from_graph(&s, g, CaptureOptions::default())?;
    graph.launch().sync_on(&s)?;
    assert_close(&w.to_vec()?, &xh.iter().map(|&v| 5.0 * v as f64).collect::<Vec<_>>(), 1e-6)
}

/// A memset or a copy of empty buffers is an empty node joining its dependencies (the driver
/// refuses memset and copy nodes of width 0), as the eager memsets and copies skip empty buffers:
/// building succeeds, and the nodes still order what depends on them.
fn empty_memset_and_copy_nodes() -> TestResult {
    let (d, s) = setup()?;
    let mut empty = DeviceBuffer::<u32>::zeros(&s, 0)?;
    let empty_src = DeviceBuffer::<u32>::zeros(&s, 0)?;
    let mut x = DeviceBuffer::<u32>::filled(&s, 4096, 0)?;
    let mut g = Graph::new(&d)?;
    {
        let mut b = g.builder();
        let first = b.add_memset(&mut x, 1u32, &[])?;
        let set = b.add_memset(&mut empty, 9u32, &[first])?;
        let copy = b.add_copy(&empty_src, &mut empty, &[set])?;
        b.add_memset(&mut x, 2u32, &[copy])?;
    }
    let types = g.node_types()?;
    let empties = types.iter().filter(|t| **t == NodeType::Empty).count();
    ensure(empties == 2, format!("two empty nodes for the empty memset and copy, got {types:?}"))?;
    let graph = CudaGraph::from_graph(&s, g, CaptureOptions::default())?;
    for _ in 0..3 {
        graph.launch().sync_on(&s)?;
    }
    // The chain 1 -> (empty) -> (empty) -> 2 is ordered: the last memset wins every replay.
    ensure(x.to_vec()?.iter().all(|&v| v == 2), "the memset after the empty nodes ran last")
}

fn child_graph_and_extra_edges() -> TestResult {
    let (d, s) = setup()?;
    let mut r = rng();
    let n = 50_000;
    let xh = random_f32(&mut r, n);
    let x = DeviceBuffer::from_host(&s, &xh)?;
    let mut y = DeviceBuffer::<f32>::zeros(&s, n)?;
    let child = ops::axpy(1.5f32, &x, &mut y).graph_on(&s)?;
    let mut g = Graph::new(&d)?;
    {
        let mut b = g.builder();
        let first = b.add_child(child.graph(), &[])?;
        let second = b.add_child(child.graph(), &[])?;
        b.add_dependencies(&[first], &[second])?;
    }
    ensure(g.node_types()? == vec![NodeType::ChildGraph, NodeType::ChildGraph], "two child nodes")?;
    let parent = CudaGraph::from_graph(&s, g, CaptureOptions::default())?;
    drop(child);
    parent.launch().sync_on(&s)?;
    parent.launch().sync_on(&s)?;
    assert_close(&y.to_vec()?, &xh.iter().map(|&v| 6.0 * v as f64).collect::<Vec<_>>(), 1e-5)
}

fn exec_update_success_and_refusal() -> TestResult {
    let (d, s) = setup()?;
    let mut r = rng();
    let n = 4096;
    let xh = random_f32(&mut r, n);
    let x = DeviceBuffer::from_host(&s, &xh)?;
    let mut y = DeviceBuffer::<f32>::filled(&s, n, POISON_F32)?;
    let build = |alpha: f32, y: &mut DeviceBuffer<f32>, extra: bool| -> cuda_async::Result<Graph> {
        let mut g = Graph::new(&d)?;
        let mut b = g.builder();
        let (_, k) = b.add_op(ops::scale(&x, alpha, &mut *y), &[])?;
        if extra {
            b.add_empty(&[k])?;
        }
        Ok(g)
    };
    let mut graph = CudaGraph::from_graph(&s, build(2.0, &mut y, false)?, CaptureOptions::default())?;
    graph.launch().sync_on(&s)?;
    assert_close(&y.to_vec()?, &xh.iter().map(|&v| 2.0 * v as f64).collect::<Vec<_>>(), 1e-6)?;
    let verdict = graph.update_from(build(-3.0, &mut y, false)?)?;
    ensure(verdict == ExecUpdate::Updated, format!("same topology: {verdict:?}"))?;
    graph.launch().sync_on(&s)?;
    assert_close(&y.to_vec()?, &xh.iter().map(|&v| -3.0 * v as f64).collect::<Vec<_>>(), 1e-6)?;
    let verdict = graph.update_from(build(9.0, &mut y, true)?)?;
    eprintln!("refused update reported as: {verdict:?}");
    match &verdict {
        ExecUpdate::Refused { reason, .. } => {
            ensure(reason.contains("TOPOLOGY"), format!("reason: {reason}"))?
        }
        other => return Err(format!("a topology change must be refused, got {other:?}").into()),
    }
    graph.launch().sync_on(&s)?;
    assert_close(&y.to_vec()?, &xh.iter().map(|&v| -3.0 * v as f64).collect::<Vec<_>>(), 1e-6)
}

/// Found by review: the builder ordered nodes by the buffers they touch only, so an IF node whose
/// set-conditional node was not among its dependencies was a root of the graph and read its
/// handle (still false) before the set ran: the body was skipped. A conditional handle is now
/// tracked as a buffer is (the set-conditional node writes it, the conditional node reads it), and
/// the IF comes after the set. Mutation: `handle-untracked` (the handle's use left out). Not yet
/// run on a GPU.
fn set_conditional_orders_before_its_if() -> TestResult {
    let (d, s) = setup()?;
    for round in 0..5 {
        let one = DeviceBuffer::<u32>::from_host(&s, &[1])?;
        let mut x = DeviceBuffer::<u32>::zeros(&s, 1 << 16)?;
        s.synchronize()?;
        let mut g = Graph::new(&d)?;
        {
            let mut b = g.builder();
            let c = b.conditional(Some(false))?;
            b.add_set_conditional(&c, &one, &[])?; // no explicit dependency on purpose
            b.add_if::<cuda_core::Error>(&c, &[], |body| body.add_memset(&mut x, 7u32, &[]).map(drop))?;
        }
        CudaGraph::from_graph(&s, g, CaptureOptions::default())?.launch().sync_on(&s)?;
        ensure(
            x.to_vec()?.iter().all(|&v| v == 7),
            format!("round {round}: the IF read its handle before the set-conditional node set it"),
        )?;
    }
    Ok(())
}

fn conditional_if() -> TestResult {
    let (d, s) = setup()?;
    for take in [false, true] {
        let mut flag = DeviceBuffer::<u32>::zeros(&s, 1)?;
        let mut acc = DeviceBuffer::<f32>::filled(&s, 1000, 1.0)?;
        let twos_half = DeviceBuffer::<f32>::filled(&s, 1000, 1.0)?;
        let mut g = Graph::new(&d)?;
        {
            let mut b = g.builder();
            let cond = b.conditional(Some(false))?;
            let set = b.add_memset(&mut flag, take as u32, &[])?;
            let apply = b.add_set_conditional(&cond, &flag, &[set])?;
            b.add_if::<cuda_async::DeviceError>(&cond, &[apply], |body| {
                // A body built by capture: two ops recorded as one child-graph node.
                body.add_recorded(&[], |sc| {
                    let a = sc.record(ops::fill(&mut acc, 40.0f32))?;
                    sc.record(ops::axpy(2.0f32, &twos_half, a))?;
                    Ok(())
                })?;
                Ok(())
            })?;
        }
        ensure(g.node_types()?.contains(&NodeType::Conditional), "a conditional node")?;
        CudaGraph::from_graph(&s, g, CaptureOptions::default())?.launch().sync_on(&s)?;
        let want = if take { 42.0 } else { 1.0 };
        ensure(acc.to_vec()?.iter().all(|&v| v == want), format!("IF taken={take}: expected {want}"))?;
    }
    // A body that fails leaves no node: the conditional node with its partial body is removed,
    // so nothing of it can run unordered beside the parent's later nodes (found by review: it
    // stayed, without the implicit edges that order the parent's later use of the same buffer).
    // Its conditional handle is left without a node, which the driver refuses at instantiation
    // (`CUDA_ERROR_INVALID_VALUE`, seen on the H100): the graph is refused first, with a clear
    // error.
    let mut x = DeviceBuffer::<u32>::zeros(&s, 4096)?;
    let mut g = Graph::new(&d)?;
    {
        let mut b = g.builder();
        let cond = b.conditional(Some(true))?;
        let r = b.add_if::<cuda_core::Error>(&cond, &[], |body| {
            body.add_memset(&mut x, 1u32, &[])?;
            Err(cuda_core::Error::InvalidArgument("a body that fails (on purpose)".into()))
        });
        ensure(r.is_err(), "the body's error is returned")?;
        b.add_memset(&mut x, 2u32, &[])?;
    }
    only_the_parents_memset_is_left(&g, &x)
}

/// After a conditional body failed or panicked (`conditional_if`, `panicking_body_leaves_no_node`):
/// only the parent's memset is left in `g`, the graph is refused for its orphaned conditional
/// handle, and nothing wrote `x`.
fn only_the_parents_memset_is_left(g: &Graph, x: &DeviceBuffer<u32>) -> TestResult {
    let types = g.node_types()?;
    ensure(
        !types.contains(&NodeType::Conditional) && types.len() == 1,
        format!("only the parent's memset is left: {types:?}"),
    )?;
    let r = g.instantiate(cuda_core::InstantiateFlags::default());
    ensure(
        matches!(&r, Err(cuda_core::Error::InvalidArgument(m)) if m.contains("conditional node of this graph was removed")),
        format!("a graph whose conditional node was removed is refused: {:?}", r.as_ref().err()),
    )?;
    ensure(x.to_vec()?.iter().all(|&v| v == 0), "nothing ran")
}

/// A conditional body that panics leaves no node, as one that fails does: a caller that catches
/// the panic and goes on building gets a graph without the IF node (whose body wrote `x`
/// unordered with the parent's later write of `x`), refused at instantiation for its orphaned
/// conditional handle. Found by review: only an `Err` from the body removed the node.
fn panicking_body_leaves_no_node() -> TestResult {
    let (d, s) = setup()?;
    let mut x = DeviceBuffer::<u32>::zeros(&s, 4096)?;
    let mut g = Graph::new(&d)?;
    {
        let mut b = g.builder();
        let cond = b.conditional(Some(true))?;
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            b.add_if::<cuda_core::Error>(&cond, &[], |body| {
                body.add_memset(&mut x, 1u32, &[])?;
                panic!("a body that panics (on purpose)")
            })
        }));
        ensure(r.is_err(), "the body's panic goes on")?;
        b.add_memset(&mut x, 2u32, &[])?;
    }
    only_the_parents_memset_is_left(&g, &x)
}

/// A graph that created conditional handles is not embedded in another (`add_child`,
/// `add_captured`, also inside a conditional body): its set-conditional kernel would set the
/// first graph's handle from the second. Found by review: only the graph id of a handle was
/// compared, and copies of a graph's nodes kept their handles.
fn graphs_with_handles_are_not_embedded() -> TestResult {
    let (d, s) = setup()?;
    let flag = DeviceBuffer::<u32>::zeros(&s, 1)?;
    let mut a = Graph::new(&d)?;
    {
        let mut b = a.builder();
        let c = b.conditional(Some(false))?;
        b.add_set_conditional(&c, &flag, &[])?; // a's only node: one kernel node
    }
    let refused = |r: Result<cuda_core::graph::Node, cuda_core::Error>| matches!(&r, Err(cuda_core::Error::InvalidArgument(m)) if m.contains("conditional handles"));
    let mut outer = Graph::new(&d)?;
    {
        let mut b = outer.builder();
        ensure(refused(b.add_child(&a, &[])), "add_child of a graph with a conditional handle")?;
        ensure(refused(b.add_captured(&a, &[])), "add_captured of a graph with a conditional handle")?;
        let c = b.conditional(Some(true))?;
        let mut seen = false;
        let r = b.add_while::<cuda_core::Error>(&c, &[], |body| {
            seen = refused(body.add_captured(&a, &[]));
            Err(cuda_core::Error::InvalidArgument("stop".into()))
        });
        ensure(r.is_err() && seen, "add_captured inside a body")?;
    }
    ensure(outer.node_count()? == 0, "nothing was added")?;
    // A graph without handles still embeds, and runs.
    let mut x = DeviceBuffer::<u32>::zeros(&s, 1024)?;
    let mut plain = Graph::new(&d)?;
    plain.builder().add_memset(&mut x, 9u32, &[])?;
    let mut host = Graph::new(&d)?;
    host.builder().add_child(&plain, &[])?;
    host.instantiate(cuda_core::InstantiateFlags::default())?.launch(&s)?;
    ensure(x.to_vec()?.iter().all(|&v| v == 9), "the embedded memset ran")
}

/// A graph captured from programmatic dependent launches (`launch_overlapped`, whose edges carry
/// data) can be built on: the builder reads its edges (found by review: without room for edge
/// data the driver answered `CUDA_ERROR_LOSSY_QUERY`, and every node touching a buffer was
/// refused). The node added after the captured kernels runs after them.
fn building_on_overlapped_launches() -> TestResult {
    let (d, s) = setup()?;
    let src = r#"extern "C" __global__ void add_one_pdl(unsigned* x, unsigned n) {
#if __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] += 1u;
}"#;
    let f = d.compile_module("add_one_pdl.cu", src, &[])?.function("add_one_pdl")?;
    let n = 4096u32;
    let mut x = DeviceBuffer::<u32>::zeros(&s, n as usize)?;
    let mut y = DeviceBuffer::<u32>::zeros(&s, n as usize)?;
    s.begin_capture(cuda_core::CaptureMode::ThreadLocal)?;
    let launched = (0..3).try_for_each(|_| {
        // SAFETY: `add_one_pdl(unsigned*, unsigned)` with (x, n); it touches x[i] for i < n only,
        // after `griddepcontrol.wait`.
        unsafe { f.launch_overlapped(&s, LaunchConfig::for_elements(n as usize, 256), (&mut x, n)) }
    });
    let mut g = s.end_capture()?;
    launched?;
    let kernels = g.nodes()?;
    ensure(kernels.len() == 3, format!("three captured kernel nodes: {}", kernels.len()))?;
    let mut z = DeviceBuffer::<u32>::zeros(&s, n as usize)?;
    {
        let mut b = g.builder();
        // An implicit dependency (x was written by the captured kernels: the graph's edges are
        // read) with an explicit one on a captured node.
        let copy = b.add_copy(&x, &mut y, &kernels[..1])?;
        // Explicit dependencies on every captured kernel, and an implicit one on a node that is
        // none of their ancestors (z's memset): the search for it reads the dependencies of the
        // kernels, whose incoming edges are programmatic.
        b.add_memset(&mut z, 7u32, &[])?;
        let copy_z = b.add_copy(&x, &mut z, &kernels)?;
        b.add_memset(&mut x, 100u32, &[copy, copy_z])?;
    }
    g.instantiate(cuda_core::InstantiateFlags::default())?.launch(&s)?;
    ensure(y.to_vec()?.iter().all(|&v| v == 3), "the copy ran after the three captured kernels")?;
    ensure(z.to_vec()?.iter().all(|&v| v == 3), "the second copy ran after the kernels and z's memset")?;
    ensure(x.to_vec()?.iter().all(|&v| v == 100), "the memset ran last")
}

fn conditional_while_counts_to_n() -> TestResult {
    let (d, s) = setup()?;
    let gk = graph_kernels(&d)?;
    let mut r = rng();
    let n_elems = 3000;
    let mut limit = DeviceBuffer::<u32>::zeros(&s, 1)?;
    let mut counter = DeviceBuffer::<u32>::filled(&s, 1, 12345)?;
    let mut flag = DeviceBuffer::<u32>::zeros(&s, 1)?;
    let mut acc = DeviceBuffer::<f32>::zeros(&s, n_elems)?;
    let ones = DeviceBuffer::<f32>::filled(&s, n_elems, 1.0)?;
    let mut acc2 = DeviceBuffer::<f32>::zeros(&s, n_elems)?;
    let mut g = Graph::new(&d)?;
    {
        let mut b = g.builder();
        let cond = b.conditional(None)?;
        let z1 = b.add_memset(&mut counter, 0u32, &[])?;
        let z2 = b.add_memset(&mut acc, 0.0f32, &[])?;
        let z3 = b.add_memset(&mut acc2, 0.0f32, &[])?;
        // SAFETY: loop_init(const unsigned* limit, unsigned* flag): one thread, 1-element buffers.
        let init = unsafe { b.add_kernel(&gk.loop_init, one_thread(), (&limit, &mut flag), &[z1, z2, z3])? };
        let set = b.add_set_conditional(&cond, &flag, &[init])?;
        b.add_while::<cuda_async::DeviceError>(&cond, &[set], |body| {
            let step_cfg = LaunchConfig { grid: (1, 1, 1), block: (256, 1, 1), shared_mem_bytes: 0 };
            // SAFETY: loop_step(counter, limit, flag, acc, n) with one block: 1-element counter,
            // limit and flag, and acc of n floats.
            let step = unsafe {
                body.add_kernel(
                    &gk.loop_step,
                    step_cfg,
                    (&mut counter, &limit, &mut flag, &mut acc, n_elems as u64),
                    &[],
                )?
            };
            let (_, typed) = body.add_op(ops::axpy(1.0f32, &ones, &mut acc2), &[step])?;
            body.add_set_conditional(&cond, &flag, &[typed])?;
            Ok(())
        })?;
    }
    // Progress on stderr. Under racecheck, with another sanitizer process on the same GPU, this
    // test's process dies in its first replay: a SIGSEGV at address 0x1b on a thread of the tool's
    // own library (libsanitizer-collection.so; a core dump's backtrace has no frame of this
    // process's code), no hazard reported. Alone on the GPU it is racecheck-clean (19 of 19 runs);
    // a plain CUDA C graph of the same shape (scripts/repro/while_racecheck.cu) is clean either way.
    // See docs/results/gpu-runs-2026-11-27d.md.
    eprintln!("graph built");
    let graph = CudaGraph::from_graph(&s, g, CaptureOptions::default())?;
    eprintln!("graph instantiated");
    for round in 0..3 {
        let n: u32 = if round == 2 { 0 } else { r.random_range(5..60) };
        limit.copy_from_host(&s, &[n])?;
        graph.launch().sync_on(&s)?;
        eprintln!("round {round}: replayed");
        let c = counter.to_vec()?[0];
        // A WHILE loop checks before each iteration: N = 0 runs no iteration.
        let expect = n;
        ensure(c == expect, format!("round {round}: counter {c}, expected {expect}"))?;
        ensure(acc.to_vec()?.iter().all(|&v| v == expect as f32), format!("round {round}: acc"))?;
        ensure(
            acc2.to_vec()?.iter().all(|&v| v == expect as f32),
            format!("round {round}: typed op in body"),
        )?;
        eprintln!("round {round}: WHILE ran {c} iterations on the device (N = {n})");
    }
    Ok(())
}

fn dot_export() -> TestResult {
    let (d, s) = setup()?;
    let x = DeviceBuffer::<f32>::filled(&s, 1024, 1.0)?;
    let mut y = DeviceBuffer::<f32>::zeros(&s, 1024)?;
    let mut g = Graph::new(&d)?;
    {
        let mut b = g.builder();
        let (_, a) = b.add_op(ops::axpy(2.0f32, &x, &mut y), &[])?;
        let e = b.add_empty(&[a])?;
        b.add_op(ops::scale(&x, 3.0f32, &mut y), &[e])?;
    }
    let dir = std::env::temp_dir().join(format!("cuda-async-dot-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    for verbose in [false, true] {
        let path = dir.join(format!("g{verbose}.dot"));
        g.write_dot(&path, verbose)?;
        let text = std::fs::read_to_string(&path)?;
        ensure(text.trim_start().starts_with("digraph"), "DOT starts with digraph")?;
        let edges = text.lines().filter(|l| l.contains("->")).count();
        ensure(edges == 2, format!("2 edges expected, found {edges}"))?;
        ensure(text.contains("axpy_f32") && text.contains("scale_f32"), "kernel names in the picture")?;
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

fn shared_graph_memory_pool() -> TestResult {
    let (d, s) = setup()?;
    let gk = graph_kernels(&d)?;
    let pool = GraphPool::new(&d)?;
    let bytes = 256 << 20;
    let n = bytes / 4;
    let mut outs = [DeviceBuffer::<f32>::zeros(&s, 16)?, DeviceBuffer::<f32>::zeros(&s, 16)?];
    let mut graphs = Vec::new();
    for (i, out) in outs.iter_mut().enumerate() {
        let mut g = Graph::new(&d)?;
        {
            let mut b = g.builder();
            let (alloc, mem) = b.add_mem_alloc(bytes, &[])?;
            let cfg = LaunchConfig::for_elements(n, 256);
            // SAFETY: iota_raw writes mem[0..n); mem holds n floats between alloc and free.
            let fill = unsafe { b.add_kernel(&gk.iota_raw, cfg, (mem.ptr, n as u64, i as f32), &[alloc])? };
            // SAFETY: copy_raw reads mem[0..16) and writes out[0..16).
            let cp = unsafe {
                b.add_kernel(
                    &gk.copy_raw,
                    LaunchConfig::for_elements(16, 32),
                    (mem.ptr, &mut *out, 16u64),
                    &[fill],
                )?
            };
            // SAFETY: the two kernels using `mem` come before `cp` (inclusive).
            unsafe { b.add_mem_free(mem, &[cp])? };
        }
        let mut cg = CudaGraph::from_graph(&s, g, CaptureOptions::default())?;
        cg.join_pool(&pool);
        graphs.push(cg);
    }
    s.synchronize()?;
    pool.trim()?;
    pool.reset_high_water_marks()?;
    let other = Stream::new(&d)?;
    for _ in 0..3 {
        graphs[0].launch().sync_on(&s)?;
        graphs[1].launch().sync_on(&other)?;
    }
    let st = pool.stats()?;
    eprintln!(
        "two graphs of {} MiB each: graph memory reserved high {} MiB, used high {} MiB",
        bytes >> 20,
        st.reserved_high >> 20,
        st.used_high >> 20
    );
    ensure(
        st.reserved_high < 2 * bytes as u64,
        format!("peak {} not below the sum {}", st.reserved_high, 2 * bytes),
    )?;
    for (i, out) in outs.iter().enumerate() {
        ensure(
            out.to_vec()? == (0..16).map(|j| i as f32 + j as f32).collect::<Vec<_>>(),
            "graph memory contents",
        )?;
    }
    drop(graphs);
    d.synchronize()?;
    pool.trim()?;
    let st = pool.stats()?;
    ensure(st.reserved_current == 0, format!("graph memory released after drop + trim: {st:?}"))
}

/// A value whose drop is slow (300 ms) and says when it is done, on stdout.
struct SlowDrop;

impl Drop for SlowDrop {
    fn drop(&mut self) {
        use std::io::Write;
        std::thread::sleep(std::time::Duration::from_millis(300));
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "DROPPED");
        let _ = out.flush();
    }
}

const EXIT_CHILD: &str = "CUDA_ASYNC_TEST_EXIT_DRAIN_CHILD";

/// The child of [`deferred_drops_finish_before_exit`]: an executable graph whose host node keeps a
/// [`SlowDrop`], replayed and dropped right before `main` returns. Its keep-alive set goes to
/// the reaper thread (a replay may still be queued), which drops it after the replay's event.
fn exit_drain_child() -> TestResult {
    let (d, s) = setup()?;
    let mut g = Graph::new(&d)?;
    {
        let mut b = g.builder();
        let slow = SlowDrop;
        // SAFETY: the closure makes no CUDA call and returns at once.
        unsafe {
            b.add_host(
                move || {
                    std::hint::black_box(&slow);
                },
                &[],
            )?
        };
    }
    let exec = g.instantiate(cuda_core::InstantiateFlags::NONE)?;
    drop(g);
    exec.launch(&s)?;
    drop(exec);
    println!("RETURNING");
    Ok(())
}

/// A deferred drop (a graph's keep-alive set on the reaper thread) completes before the process
/// exits: the exit waits for it (bounded) instead of tearing the libraries down under it. Found
/// under memcheck: `gpu_multi::one_rank_smoke_captured` passed, then its process did not exit
/// cleanly (exit 11), the reaper presumably still destroying the NCCL communicator the graph
/// kept while the process ended. Run in a child process; the child's last value takes 300 ms
/// to drop. Mutation caught: no exit drain registered (the child exits before `DROPPED`).
fn deferred_drops_finish_before_exit() -> TestResult {
    setup()?;
    let out = std::process::Command::new(std::env::current_exe()?).env(EXIT_CHILD, "1").output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("child: {} {}", stdout.trim().replace('\n', " "), String::from_utf8_lossy(&out.stderr).trim());
    ensure(out.status.success(), format!("the child failed: {:?}", out.status))?;
    ensure(stdout.contains("RETURNING"), "the child did not get to the end of main")?;
    ensure(stdout.contains("DROPPED"), "the process exited before the deferred drop ran")
}

fn main() {
    if std::env::var_os(EXIT_CHILD).is_some() {
        match exit_drain_child() {
            Ok(()) => return,
            Err(e) => {
                eprintln!("exit-drain child: {e:?}");
                std::process::exit(1)
            }
        }
    }
    let mut s = Suite::new();
    s.gpu("every_node_kind", every_node_kind)
        .gpu("diamond_dependencies", diamond_dependencies)
        .gpu("empty_memset_and_copy_nodes", empty_memset_and_copy_nodes)
        .gpu("child_graph_and_extra_edges", child_graph_and_extra_edges)
        .gpu("exec_update_success_and_refusal", exec_update_success_and_refusal)
        .gpu("conditional_if", conditional_if)
        .gpu("set_conditional_orders_before_its_if", set_conditional_orders_before_its_if)
        .gpu("panicking_body_leaves_no_node", panicking_body_leaves_no_node)
        .gpu("graphs_with_handles_are_not_embedded", graphs_with_handles_are_not_embedded)
        .gpu("building_on_overlapped_launches", building_on_overlapped_launches)
        .gpu("conditional_while_counts_to_n", conditional_while_counts_to_n)
        .gpu("dot_export", dot_export)
        .gpu("shared_graph_memory_pool", shared_graph_memory_pool)
        .gpu("deferred_drops_finish_before_exit", deferred_drops_finish_before_exit);
    s.run()
}
