//! Copies between buffers of two devices (or of one), stream-ordered on both sides.
//!
//! [`DeviceBuffer::copy_from_peer`] is the one operation of this crate that may touch buffers of
//! two devices. It is ordered like every other use: a **read** of the source and a **write** of
//! the destination, through the same per-allocation access tracking (see [`crate::memory`]), with
//! cross-device event waits where the two sides are on different devices. So the copy waits for
//! the source's last write and the destination's last write and reads, whatever device and stream
//! they ran on, and later uses of either buffer (and both stream-ordered frees) wait for the copy.
//!
//! Three paths, chosen per call ([`PeerPath`]):
//! - **same device**: a plain device-to-device copy;
//! - **peer**: `cuMemcpyPeerAsync` on the destination's stream, when the two devices can access
//!   each other (peer access is enabled on first use, see [`crate::device::Device::enable_peer_access`]);
//! - **staged**: through a page-locked host bounce buffer: a device-to-host copy on a stream of
//!   the source's device (its home stream, made to wait for everything the copy waits for), then a
//!   host-to-device copy on the destination's stream, ordered by an event. The bounce buffer is
//!   freed by a library thread once an event behind the second copy has completed, so the calling
//!   thread never blocks.
//!
//! A copy between devices cannot be recorded into a graph: on a capturing stream it is refused
//! with [`Error::Capture`] (a capture must stay on one stream; the staged path uses two).

use super::buffer::DeviceBuffer;
use super::host_alloc::HostAlloc;
use super::repr::DeviceRepr;
use crate::device::Device;
use crate::driver::result;
use crate::error::{Error, Result};
use crate::event::PooledEvent;
use crate::stream::Stream;
use crate::track::order::{ordered_with, record, InCapture};
use crate::track::Access;
use std::sync::Arc;

/// How a [`DeviceBuffer::copy_from_peer`] moved the data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerPath {
    /// Both buffers are on one device: a device-to-device copy.
    SameDevice,
    /// `cuMemcpyPeerAsync` between two devices with peer access.
    Peer,
    /// Through page-locked host memory (no peer access between the devices, or forced).
    Staged,
}

/// Options of [`DeviceBuffer::copy_from_peer_with`]; for tests and benchmarks.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerCopyOptions {
    /// Take the staged path even where a direct copy is possible (so that it can be tested on one
    /// device).
    pub force_staged: bool,
}

/// Whether `a` and `b` can copy directly; enables peer access both ways on first use. Any failure
/// to enable means "no" (the staged path is always correct).
fn peer_ready(a: &Device, b: &Device) -> Result<bool> {
    if a.peer_access_enabled(b) && b.peer_access_enabled(a) {
        return Ok(true);
    }
    if !(a.can_access_peer(b)? && b.can_access_peer(a)?) {
        return Ok(false);
    }
    Ok(a.enable_peer_access(b).is_ok() && b.enable_peer_access(a).is_ok())
}

impl<T: DeviceRepr> DeviceBuffer<T> {
    /// Queues a copy of `src` — a buffer of **any** device — into `self` on `stream`, a stream of
    /// `self`'s device, and returns the path taken. Ordered on both devices (see the module docs);
    /// does not block the host. Lengths must match.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, DeviceBuffer};
    /// let (s0, s1) = (Device::new(0)?.new_stream()?, Device::new(1)?.new_stream()?);
    /// let a = DeviceBuffer::from_host(&s0, &[1.0f32, 2.0, 3.0])?;
    /// let mut b = DeviceBuffer::<f32>::zeros(&s1, 3)?;
    /// b.copy_from_peer(&s1, &a)?; // device 0 -> device 1
    /// assert_eq!(b.to_vec()?, vec![1.0, 2.0, 3.0]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::LengthMismatch`]; [`Error::DeviceMismatch`] for a stream of another device than
    /// `self`'s; [`Error::Capture`] on a capturing stream (or a home stream captured elsewhere),
    /// and on the staged path while the calling thread captures any stream (its bounce buffer is
    /// page-locked memory); driver errors (e.g. out of page-locked memory on the staged path).
    pub fn copy_from_peer(&mut self, stream: &Stream, src: &DeviceBuffer<T>) -> Result<PeerPath> {
        self.copy_from_peer_with(stream, src, PeerCopyOptions::default())
    }

    /// [`DeviceBuffer::copy_from_peer`] with options (to force the staged path in tests).
    ///
    /// # Errors
    /// As for [`DeviceBuffer::copy_from_peer`].
    #[doc(hidden)]
    pub fn copy_from_peer_with(
        &mut self,
        stream: &Stream,
        src: &DeviceBuffer<T>,
        options: PeerCopyOptions,
    ) -> Result<PeerPath> {
        const DURING: &str = "copying between devices";
        if src.len() != self.len() {
            return Err(Error::LengthMismatch { during: DURING, expected: self.len(), actual: src.len() });
        }
        if stream.device() != self.device() {
            return Err(Error::DeviceMismatch {
                during: "a peer copy on a stream of another device than the destination's",
                expected: self.device().ordinal(),
                actual: stream.device().ordinal(),
            });
        }
        let (sd, dd) = (*src.device(), *self.device());
        let path = if options.force_staged {
            PeerPath::Staged
        } else if sd == dd {
            PeerPath::SameDevice
        } else if peer_ready(&sd, &dd)? {
            PeerPath::Peer
        } else {
            PeerPath::Staged
        };
        if self.is_empty() {
            return Ok(path);
        }
        if path != PeerPath::SameDevice {
            // Checked again, atomically, when the copy is queued; this early check keeps the
            // bounce-buffer allocation (which a capture may not contain) out of a capture.
            let what = "a copy between devices (or staged) on a stream being captured";
            crate::track::state::refuse_if_capturing(&stream.lock(), what)?;
        }
        match path {
            PeerPath::SameDevice => self.copy_from_device(stream, src)?,
            PeerPath::Peer => self.copy_peer_direct(stream, src)?,
            PeerPath::Staged => self.copy_staged(stream, src)?,
        }
        Ok(path)
    }

    fn copy_peer_direct(&mut self, stream: &Stream, src: &DeviceBuffer<T>) -> Result<()> {
        let (dst_ptr, src_ptr, bytes) = (self.device_ptr(), src.device_ptr(), self.size_bytes());
        let (dst_ctx, src_ctx) = (self.device().cu_context(), src.device().cu_context());
        let refuse = InCapture::Refuse("a copy between two devices on a stream being captured");
        let uses = [(self.allocation(), Access::Write), (src.allocation(), Access::Read)];
        stream.device().bind()?;
        ordered_with(stream, &uses, refuse, || {
            stream.device().bind()?;
            // SAFETY: two distinct live allocations (`&mut self` excludes aliasing `src`) of
            // `bytes` bytes each, on the devices whose retained primary contexts are named; the
            // stream belongs to the destination's device. Ordered against both buffers' other
            // uses by `ordered_with`; both stay allocated until their frees, which wait for it.
            unsafe { result::memcpy_peer_async(dst_ptr, dst_ctx, src_ptr, src_ctx, bytes, stream.raw()) }
        })
    }

    fn copy_staged(&mut self, stream: &Stream, src: &DeviceBuffer<T>) -> Result<()> {
        let (dst_ptr, src_ptr, bytes) = (self.device_ptr(), src.device_ptr(), self.size_bytes());
        let staging = HostAlloc::new(
            stream.device(),
            bytes,
            "allocating the page-locked bounce buffer of a staged copy",
            "freeing the bounce buffer of a staged copy",
        )?;
        let host = staging.ptr;
        // The device-to-host half runs on a stream of the source's device: `stream` itself when
        // it is one, else the source's home stream (locked by `ordered_with`, as every home stream
        // of the uses is, and checked not to be capturing).
        let src_stream = if src.device() == stream.device() { stream } else { src.home_stream() };
        let refuse = InCapture::Refuse("a staged copy between devices on a stream being captured");
        let uses = [(self.allocation(), Access::Write), (src.allocation(), Access::Read)];
        let mut done: Option<Arc<PooledEvent>> = None;
        let mut started = false;
        stream.device().bind()?;
        let queued = ordered_with(stream, &uses, refuse, || {
            if src_stream != stream {
                // `stream` now waits for everything the copy must wait for (the source's last
                // write included): make the source's stream wait for that point too.
                let ready = record(stream)?;
                src_stream.wait_unchecked(&ready)?;
            }
            src_stream.device().bind()?;
            started = true;
            let during = "copying a source buffer to page-locked host memory (staged peer copy)";
            // SAFETY: `host` is a live page-locked allocation of `bytes` bytes, freed only after
            // the event behind the second copy; `src` is a live allocation of `bytes` bytes on
            // `src_stream`'s device, ordered by the waits above.
            unsafe { result::memcpy_dtoh_async(host, src_ptr, bytes, src_stream.raw(), during) }?;
            if src_stream != stream {
                let read = record(src_stream)?;
                stream.wait_unchecked(&read)?;
            }
            stream.device().bind()?;
            let during = "copying page-locked host memory to the destination (staged peer copy)";
            // SAFETY: `dst_ptr` is our live allocation of `bytes` bytes (exclusive through
            // `&mut self`); the host buffer was filled by the copy this stream now waits for.
            unsafe { result::memcpy_htod_async(dst_ptr, host, bytes, stream.raw(), during) }?;
            done = Some(Arc::new(record(stream)?));
            Ok(())
        });
        match (queued, done) {
            (Ok(()), Some(ev)) => {
                // Freed on the reaper thread once the second copy has completed.
                crate::track::reaper::drop_after(ev, Box::new(staging));
                Ok(())
            }
            (res, _) => {
                // Part of the copy may be queued: the bounce buffer may only be freed once both
                // streams have finished it; if that cannot be established, it is leaked.
                if started && src_stream.synchronize().and(stream.synchronize()).is_err() {
                    std::mem::forget(staging);
                }
                res
            }
        }
    }
}
