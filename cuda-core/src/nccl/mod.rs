//! NCCL collectives over the devices of one process (feature `nccl`, on by default).
//!
//! `libnccl.so` is loaded at run time, like the driver: the crate builds with no NCCL installed,
//! and [`Communicator::init_all`] returns [`Error::LibraryMissing`] naming the library where it
//! is absent (NCCL 2.14 or newer is required; an older one is an [`Error::Library`]).
//!
//! - [`Communicator::init_all`] makes one communicator per device of a list (`ncclCommInitAll`):
//!   rank `i` is `devices[i]`, and the devices must be distinct.
//! - Each communicator queues collectives on a stream of its device: [`Communicator::all_reduce`],
//!   [`Communicator::all_gather`], [`Communicator::reduce_scatter`], [`Communicator::broadcast`],
//!   on [`DeviceBuffer`]s of [`NcclScalar`] elements (`f32`, `f64`, `half::f16`, `half::bf16`, and
//!   integers). Each is ordered like a kernel launch with every other use of its buffers (inputs
//!   read, output written: see [`crate::memory`]) and, on a stream this thread captures, recorded
//!   into the graph, which then keeps the buffers **and the communicators** alive.
//! - [`grouped`] issues one collective on every rank inside `ncclGroupStart`/`ncclGroupEnd`, so one
//!   thread can drive all the devices.
//!
//! **One thread per rank, or grouped.** A collective over several devices completes only once every
//! rank has issued it, and NCCL may block the issuing thread until the other ranks have (e.g. to
//! connect on first use). A single thread issuing the ranks one after another could therefore hang
//! forever. So a thread that has issued a per-rank collective on one rank of a group of several
//! is refused ([`Error::InvalidArgument`]) on the other ranks of that group: drive each rank from
//! its own thread, or issue all ranks at once with [`grouped`].
//!
//! **Matching across ranks.** NCCL pairs the k-th collective of every rank; if their kinds, element
//! types, lengths or roots disagree, the result is undefined (wrong data, a hang, or peers writing
//! past a buffer). Every collective issued through this module is checked against the k-th one
//! already issued by the other ranks of its group and refused ([`Error::InvalidArgument`]) on
//! disagreement, before NCCL sees it. What this cannot check: a rank that never issues its part
//! (the other ranks' collectives then never complete), and graph replays (each rank's captured
//! graph must be replayed as many times, and in the same order relative to other collectives, as
//! the other ranks' graphs).
//!
//! **NVLink multicast (NVLS) is never enabled**, NCCL's registration of user buffers for captured
//! collectives stays off, and so does NCCL's connection on first use: creating a communicator is
//! refused unless the environment has `NCCL_NVLS_ENABLE=0`, `NCCL_GRAPH_REGISTER=0` and
//! `NCCL_RUNTIME_CONNECT=0` ([`POLICY_VARS`]). Without registration, peers never write into a
//! rank's own buffers, so a graph replayed out of step with its peers cannot make a peer write past
//! the end of a buffer. Without connection on first use (the default since NCCL 2.22),
//! `ncclCommInitAll` connects the ranks; otherwise the first collective does, and if that one is
//! being captured the driver refuses the peer mappings and the capture fails (found on two H200s:
//! `ncclInternalError`, NCCL's log "failed to peer with device 0: 900 operation not permitted
//! when stream is capturing"; `gpu_multi::captured_all_reduce_two_devices`). The crate does not
//! set the variables itself (changing the environment while other threads read it with C `getenv`
//! is a data race): set them in the environment the process starts with, or at the top of `main`
//! before any thread starts. `NCCL_GRAPH_MIXING_SUPPORT` must be set to `1` (NCCL's default, set
//! explicitly so that an NCCL configuration file cannot turn it off): with it off NCCL no longer orders a replayed captured collective and an eager one of the same
//! communicator, which this crate orders only through their buffers ([`MIXING_VAR`]).
//!
//! **Two groups over the same devices** are not ordered with each other: two threads that drive
//! them in opposite orders (group 1 then group 2 on device 0's stream, group 2 then group 1 on
//! device 1's) make the GPUs wait for each other for ever, as raw NCCL does. Drive every group
//! in one order, or keep one group per set of devices. **`Device::synchronize`** (and other
//! device-wide calls) hold the process's capture gate while they wait: a thread that synchronises
//! a device while its peer rank's collective is yet to be captured on another thread waits for
//! ever (raw CUDA would not). Synchronise streams, not devices, around collectives.
//!
//! **Lifetime.** The communicators of one [`Communicator::init_all`] are destroyed together, once
//! every [`Communicator`] handle and every graph holding one of them is gone:
//! `ncclCommFinalize` on all of them (grouped; it waits for their queued work), then
//! `ncclCommDestroy`. Dropping the last handle therefore blocks until the queued collectives have
//! completed.
//!
//! ```no_run
//! use cuda_core::nccl::{Communicator, ReduceOp};
//! use cuda_core::{Device, DeviceBuffer};
//! # fn main() -> cuda_core::Result<()> {
//! // Started with NCCL_NVLS_ENABLE=0 NCCL_GRAPH_REGISTER=0 NCCL_RUNTIME_CONNECT=0 in the environment.
//! let dev = Device::new(0)?;
//! let comms = Communicator::init_all(&[dev])?; // one rank: all-reduce is a copy
//! let s = dev.new_stream()?;
//! let x = DeviceBuffer::from_host(&s, &[1.0f32, 2.0, 3.0])?;
//! let mut y = DeviceBuffer::<f32>::zeros(&s, 3)?;
//! comms[0].all_reduce(&s, &x, &mut y, ReduceOp::Sum)?;
//! assert_eq!(y.to_vec()?, vec![1.0, 2.0, 3.0]);
//! # Ok(()) }
//! ```
//!
//! [`DeviceBuffer`]: crate::memory::DeviceBuffer

mod collective;
mod comm;
pub mod grouped;
mod matching;
mod result;

pub use collective::{Collective, NcclScalar, ReduceOp};
pub use comm::Communicator;

use crate::error::{Error, Result};

/// The oldest NCCL this module accepts (`ncclCommFinalize` appeared in 2.14).
pub const MIN_NCCL_VERSION: (u32, u32) = (2, 14);

/// Loads `libnccl` once and checks its version, or says what is missing.
fn library() -> Result<()> {
    static LOADED: std::sync::OnceLock<Result<()>> = std::sync::OnceLock::new();
    LOADED.get_or_init(load_once).clone()
}

/// [`library`], then the environment policy of the module docs: what creating a communicator needs.
fn load() -> Result<()> {
    library()?;
    policy_env()
}

fn load_once() -> Result<()> {
    if !result::library_present() {
        return Err(Error::LibraryMissing {
            library: "libnccl.so (NCCL)",
            searched: cudarc::get_lib_name_candidates("nccl").join(", "),
        });
    }
    let (major, minor, patch) = raw_version()?;
    if (major, minor) < MIN_NCCL_VERSION {
        return Err(Error::Library {
            library: "NCCL",
            status: format!("version {major}.{minor}.{patch} is older than the 2.14 this crate needs"),
            during: "loading libnccl",
        });
    }
    // NCCL's destructors run at exit after every `atexit` handler registered before its load:
    // the reaper's exit drain is registered again, so that a communicator a graph kept is
    // destroyed before NCCL tears itself down.
    crate::track::reaper::drain_before_exit();
    Ok(())
}

/// The environment variables the module docs require, each set to `0`.
pub const POLICY_VARS: [&str; 3] = ["NCCL_NVLS_ENABLE", "NCCL_GRAPH_REGISTER", "NCCL_RUNTIME_CONNECT"];

/// NCCL's ordering of captured and eager collectives of one communicator, which must be set to
/// `1` (NCCL's default, set explicitly so that no NCCL configuration file can turn it off: the
/// module docs).
pub const MIXING_VAR: &str = "NCCL_GRAPH_MIXING_SUPPORT";

/// Checks the policy of the module docs: [`POLICY_VARS`] must be `0` in the environment. This
/// crate does not set them itself: changing the environment while other threads read it (the
/// driver, NVRTC and NCCL call C `getenv`) is a data race, so the process must set them before it
/// starts threads (or in the environment it is started with).
fn policy_env() -> Result<()> {
    policy(|var| std::env::var(var).ok())
}

/// [`policy_env`] over any lookup of variables (a pure function, tested without a GPU).
fn policy(get: impl Fn(&str) -> Option<String>) -> Result<()> {
    for var in POLICY_VARS {
        match get(var) {
            Some(v) if v.trim() == "0" => {}
            v => {
                return Err(Error::InvalidArgument(format!(
                    "{var} is {v:?}: set {var}=0 in the environment before starting threads (this crate never enables NVLink multicast, keeps NCCL from registering user buffers in graphs, and has NCCL connect its ranks when the communicators are created, never inside a capture)"
                )))
            }
        }
    }
    // Found by review: with graph mixing off, NCCL does not order a replayed captured collective
    // and an eager one of the same communicator; this crate orders them only through their
    // buffers, so two with distinct buffers could run at once (wrong data or a hang). NCCL's
    // default (on) is required.
    // Set explicitly: NCCL sets variables absent from the environment from its configuration
    // files (`~/.nccl.conf`, `/etc/nccl.conf`), which could turn it off behind this check.
    match get(MIXING_VAR) {
        Some(v) if v.trim() == "1" => Ok(()),
        v => Err(Error::InvalidArgument(format!(
            "{MIXING_VAR} is {v:?}: set {MIXING_VAR}=1 in the environment before starting threads (NCCL then orders captured and eager collectives of one communicator)"
        ))),
    }
}

fn raw_version() -> Result<(u32, u32, u32)> {
    // SAFETY: the library is present.
    let v = unsafe { result::get_version() }? as u32;
    // Since 2.9 the code is major * 10000 + minor * 100 + patch (before: * 1000 + * 100).
    Ok(if v >= 20900 {
        (v / 10000, (v % 10000) / 100, v % 100)
    } else {
        (v / 1000, (v % 1000) / 100, v % 100)
    })
}

/// The version of the NCCL library found, as `(major, minor, patch)`.
///
/// ```no_run
/// # fn main() -> cuda_core::Result<()> {
/// let (major, minor, patch) = cuda_core::nccl::version()?;
/// println!("NCCL {major}.{minor}.{patch}");
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::LibraryMissing`] without `libnccl`; [`Error::Library`] for one older than
/// [`MIN_NCCL_VERSION`].
pub fn version() -> Result<(u32, u32, u32)> {
    library()?;
    raw_version()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_needs_every_variable_at_zero() {
        let all = |var: &str| match var {
            MIXING_VAR => Some("1".to_string()),
            v => POLICY_VARS.contains(&v).then(|| "0".to_string()),
        };
        assert!(policy(all).is_ok());
        let no_mixing = |var: &str| POLICY_VARS.contains(&var).then(|| "0".to_string());
        assert!(policy(no_mixing).unwrap_err().to_string().contains(MIXING_VAR));
        let mixing = |on: &'static str| {
            move |var: &str| match var {
                MIXING_VAR => Some(on.to_string()),
                v => POLICY_VARS.contains(&v).then(|| "0".to_string()),
            }
        };
        assert!(policy(mixing("1")).is_ok());
        assert!(policy(mixing("0")).unwrap_err().to_string().contains(MIXING_VAR));
        for missing in POLICY_VARS {
            let without = |var: &str| match var {
                MIXING_VAR => Some("1".to_string()),
                v => (v != missing).then(|| "0".to_string()),
            };
            let e = policy(without).unwrap_err().to_string();
            assert!(e.contains(missing), "{e}");
            let one =
                |var: &str| Some(if var == missing || var == MIXING_VAR { "1" } else { "0" }.to_string());
            assert!(policy(one).is_err());
        }
    }
}
