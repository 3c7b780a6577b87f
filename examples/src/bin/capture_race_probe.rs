//! Diagnostic: does the raw driver (no cuda-core in between) survive `cuCtxSynchronize` on one
//! thread while another thread begins and ends stream captures in a loop? This is the driver-level
//! behaviour behind `cuda_core`'s capture gate (`driver::device_wide`): run it on a GPU host, under
//! `cuda-gdb` for a backtrace if it crashes.
//!
//! ```text
//! capture-race-probe [global|thread-local|relaxed] [SECONDS] [sync|host-alloc|module|pool|meminfo]
//! ```
//!
//! The last argument picks what the second thread does in its loop: `cuCtxSynchronize` (default),
//! `cuMemHostAlloc` + `cuMemFreeHost`, `cuModuleLoadData` + `cuModuleUnload` (of a tiny PTX), or
//! `cuMemPoolCreate` + `cuMemPoolTrimTo` + `cuMemPoolDestroy`.
//!
//! Prints how many captures and synchronisations ran and which driver errors they returned; a
//! crash ends the process with a signal instead.

use cudarc::driver::sys;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

fn check(r: sys::CUresult, what: &str) {
    if r != sys::CUresult::CUDA_SUCCESS {
        eprintln!("{what}: {r:?}");
        std::process::exit(2);
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mode = match args.get(1).map(String::as_str) {
        Some("global") => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        Some("relaxed") => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED,
        _ => sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL,
    };
    let secs: u64 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3);
    let what = args.get(3).cloned().unwrap_or_else(|| "sync".into());
    // SAFETY: raw driver calls with valid out-pointers (likewise below, on the primary context of
    // device 0 made current on each thread before use; handles are used only while alive).
    let ctx = unsafe {
        check(sys::cuInit(0), "cuInit");
        let mut dev = 0;
        check(sys::cuDeviceGet(&mut dev, 0), "cuDeviceGet");
        let mut ctx = std::ptr::null_mut();
        check(sys::cuDevicePrimaryCtxRetain(&mut ctx, dev), "retain");
        ctx as usize
    };
    let stop = AtomicBool::new(false);
    let errors: Mutex<BTreeMap<String, usize>> = Mutex::new(BTreeMap::new());
    let note = |what: &str, r: sys::CUresult| {
        if r != sys::CUresult::CUDA_SUCCESS {
            *errors.lock().unwrap().entry(format!("{what}: {r:?}")).or_default() += 1;
        }
    };
    let (mut captures, mut syncs) = (0u64, 0u64);
    std::thread::scope(|sc| {
        // SAFETY: as above.
        let cap = sc.spawn(|| unsafe {
            check(sys::cuCtxSetCurrent(ctx as sys::CUcontext), "set current");
            let mut s = std::ptr::null_mut();
            check(sys::cuStreamCreate(&mut s, sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32), "stream");
            let mut p = 0;
            check(sys::cuMemAlloc_v2(&mut p, 1 << 16), "alloc");
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let r = sys::cuStreamBeginCapture_v2(s, mode);
                note("begin capture", r);
                if r != sys::CUresult::CUDA_SUCCESS {
                    continue;
                }
                note("memset in capture", sys::cuMemsetD32Async(p, n as u32, 1 << 14, s));
                let mut g = std::ptr::null_mut();
                note("end capture", sys::cuStreamEndCapture(s, &mut g));
                if !g.is_null() {
                    let mut e = std::ptr::null_mut();
                    let r = sys::cuGraphInstantiateWithFlags(&mut e, g, 0);
                    note("instantiate", r);
                    if r == sys::CUresult::CUDA_SUCCESS {
                        note("launch", sys::cuGraphLaunch(e, s));
                        note("exec destroy", sys::cuGraphExecDestroy(e));
                    }
                    note("graph destroy", sys::cuGraphDestroy(g));
                }
                n += 1;
            }
            note("stream sync", sys::cuStreamSynchronize(s));
            n
        });
        // SAFETY: as above.
        let sync = sc.spawn(|| unsafe {
            check(sys::cuCtxSetCurrent(ctx as sys::CUcontext), "set current");
            let mut dev = 0;
            check(sys::cuDeviceGet(&mut dev, 0), "cuDeviceGet");
            let ptx = std::ffi::CString::new(PTX).unwrap_or_default();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                match what.as_str() {
                    "host-alloc" => {
                        let mut p = std::ptr::null_mut();
                        let r = sys::cuMemHostAlloc(&mut p, 1 << 20, 0);
                        note("host alloc", r);
                        if r == sys::CUresult::CUDA_SUCCESS {
                            note("free host", sys::cuMemFreeHost(p));
                        }
                    }
                    "module" => {
                        let mut m = std::ptr::null_mut();
                        let r = sys::cuModuleLoadData(&mut m, ptx.as_ptr().cast());
                        note("module load", r);
                        if r == sys::CUresult::CUDA_SUCCESS {
                            note("module unload", sys::cuModuleUnload(m));
                        }
                    }
                    "pool" => {
                        let mut props: sys::CUmemPoolProps = std::mem::zeroed();
                        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
                        props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
                        props.location.id = dev;
                        let mut pool = std::ptr::null_mut();
                        let r = sys::cuMemPoolCreate(&mut pool, &props);
                        note("pool create", r);
                        if r == sys::CUresult::CUDA_SUCCESS {
                            note("pool trim", sys::cuMemPoolTrimTo(pool, 0));
                            note("pool destroy", sys::cuMemPoolDestroy(pool));
                        }
                    }
                    "meminfo" => {
                        let (mut free, mut total) = (0, 0);
                        note("mem get info", sys::cuMemGetInfo_v2(&mut free, &mut total));
                    }
                    _ => note("ctx synchronize", sys::cuCtxSynchronize()),
                }
                n += 1;
            }
            n
        });
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(secs) {
            std::thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::Relaxed);
        captures = cap.join().unwrap_or(0);
        syncs = sync.join().unwrap_or(0);
    });
    println!("PROBE-DONE mode={:?} what={what} captures={captures} other_calls={syncs}", args.get(1));
    for (e, n) in errors.lock().unwrap().iter() {
        println!("  {n} x {e}");
    }
}

/// A kernel that does nothing, for the module load/unload loop.
const PTX: &str = ".version 7.0\n.target sm_50\n.address_size 64\n.visible .entry noop() { ret; }\n";
