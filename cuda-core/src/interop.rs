//! Interop with [`cudarc`] and raw driver handles: wrap memory that another library allocated as
//! a [`DeviceBuffer`] (and hand it back), and order this crate's streams with cudarc's.
//!
//! This crate uses each device's **primary context** (as cudarc's [`CudaContext::new`] does), so
//! pointers and streams of the two libraries on the same device are interchangeable; memory of
//! another context (cudarc's `new_non_primary`, a green context) is not, and is refused where it
//! can be detected.
//!
//! - [`DeviceBuffer::from_cudarc`] / [`DeviceBuffer::into_cudarc`]: a cudarc [`CudaSlice`] as a
//!   buffer of this crate and back, ordered with cudarc's stream on both sides;
//! - [`DeviceBuffer::from_raw_parts`] / [`DeviceBuffer::into_owner`]: any device pointer, with a
//!   value that owns it (kept alive as long as any use or graph may touch the memory, and handed
//!   back only once every use has completed; [`DeviceBuffer::into_owner_unsynced`] hands it back
//!   at once with an event, `unsafe`);
//! - [`Stream::wait_for_cudarc`], [`Stream::order_cudarc_after`]: event joins between a stream of
//!   this crate and a cudarc stream; [`Stream::as_cudarc`]: this crate's stream as a (borrowed)
//!   cudarc stream.
//!
//! **What this crate cannot guard.** Its promise covers its own calls. cudarc's safe API can make
//! calls that this crate orders around itself but cannot see: `CudaContext::synchronize`
//! (`cuCtxSynchronize`) and global-mode stream captures. Made while this crate captures a stream
//! on another thread, they break that capture; such races crashed the driver library (SIGSEGV) in
//! this project's probes, which is why the crate's own device-wide calls wait at an internal gate
//! that open captures close (`gpu_capture_races`). Mixing the two libraries, keep such calls out
//! of the time this crate's captures (`CudaGraph::scope`, `graph_on`, a model's bucket capture)
//! may run (found by review).
//!
//! ```no_run
//! # fn main() -> cuda_core::Result<()> {
//! use cuda_core::{Device, DeviceBuffer};
//! use cudarc::driver::CudaContext;
//! let ctx = CudaContext::new(0).map_err(|e| cuda_core::Error::InvalidArgument(e.to_string()))?;
//! let cs = ctx.default_stream();
//! let slice = cs.clone_htod(&[1.0f32, 2.0, 3.0]).map_err(|e| cuda_core::Error::InvalidArgument(e.to_string()))?;
//! let s = Device::new(0)?.new_stream()?;
//! // SAFETY: nothing else uses `slice` while it is wrapped; its context is device 0's primary one.
//! let mut buf = unsafe { DeviceBuffer::from_cudarc(slice, &s)? };
//! buf.fill(&s, 7.0)?;
//! let slice = buf.into_cudarc()?; // cudarc's stream now waits for the fill
//! # Ok(()) }
//! ```

use crate::device::Device;
use crate::driver::result;
use crate::error::{Error, Result};
use crate::event::PooledEvent;
use crate::memory::{Allocation, DeviceBuffer, DeviceRepr};
use crate::stream::Stream;
use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtrMut};
use std::sync::Arc;

/// A cudarc error as this crate's.
fn cudarc_err(during: &'static str) -> impl FnOnce(cudarc::driver::DriverError) -> Error {
    move |e| Error::InvalidArgument(format!("{during}: {e}"))
}

/// `Ok` when cudarc's context `ctx` is the primary context of `device`.
fn same_context(ctx: &CudaContext, device: &Device, during: &'static str) -> Result<()> {
    if ctx.ordinal() != device.ordinal() {
        return Err(Error::DeviceMismatch { during, expected: device.ordinal(), actual: ctx.ordinal() });
    }
    if !ctx.is_primary() {
        return Err(Error::InvalidArgument(format!(
            "{during}: the cudarc context is not the device's primary context"
        )));
    }
    Ok(())
}

/// `stream` waits (stream-ordered, not the host) for everything queued on the raw `other` so far.
///
/// Refused while `other` is being captured (through cudarc's safe `begin_capture`): waiting for an
/// event recorded inside a capture would pull `stream` into that capture behind this crate's back,
/// and its allocations, launches and frees would be recorded into cudarc's graph instead of run.
/// `other`'s capture status is read before and after the event is recorded (see the body).
fn wait_raw(stream: &Stream, other: &CudaStream, during: &'static str) -> Result<()> {
    let state = stream.lock();
    crate::track::state::refuse_if_capturing(&state, during)?;
    stream.device().bind()?;
    // A wait on an event recorded inside cudarc's capture would pull this stream into that
    // capture, unknown to this crate. `cuStreamIsCapturing` is legal during a capture (an event
    // query is not: it would invalidate the caller's capture), so the status is read before and
    // after the record: a capture that began before the record and is still open is seen by the
    // second read, one that begins after it cannot have captured the event. (A capture begun and
    // ended by another thread between the two reads is not seen: the event is then one of an
    // ended capture, and the wait below is left to the driver to refuse.)
    refuse_if_foreign_capture(other)?;
    let ev = other.record_event(None).map_err(cudarc_err(during))?;
    refuse_if_foreign_capture(other)?;
    // SAFETY: live stream (its lock held) and a live event of the same (primary) context,
    // recorded while no capture that is still open held `other` (checked after the record).
    unsafe { result::stream_wait_event(stream.raw(), ev.cu_event(), during) }
}

/// [`Error::Capture`] while cudarc's stream `other` is being captured (read with
/// `cuStreamIsCapturing`, which never disturbs the capture).
fn refuse_if_foreign_capture(other: &CudaStream) -> Result<()> {
    // SAFETY: `other` is a live stream (borrowed for the call).
    let status = unsafe { result::stream_is_capturing(other.cu_stream()) }?;
    if status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE {
        Ok(())
    } else {
        Err(Error::Capture("waiting for or ordering a cudarc stream that is being captured"))
    }
}

/// The owner of a wrapped cudarc slice ([`DeviceBuffer::from_cudarc`]): the slice, dropped on the
/// reaper once our last use of it has completed (the buffer's last drop, or a hand-back refused
/// while cudarc captures the slice's stream). cudarc's drop queues a free (and waits) on the
/// slice's stream; queued into a capture the user opened there through cudarc, that would
/// invalidate it, or record a free of memory the graph did not allocate. So at the drop the
/// stream's capture status is read again: still capturing, the slice is leaked (counted as a drop
/// error) rather than freed into the capture. This narrows the window, not closes it: a capture
/// begun through cudarc between that check and cudarc's drop still records the free (as any
/// cudarc slice dropped during a capture of its stream does).
/// The slice is type-erased so that [`DeviceBuffer::into_owner`] can hand back a `CudaSlice<T>`
/// from it (see `take_owner`).
struct DropOutsideCapture {
    stream: Arc<CudaStream>,
    slice: Option<Box<dyn std::any::Any + Send>>,
}

impl Drop for DropOutsideCapture {
    fn drop(&mut self) {
        let Some(slice) = self.slice.take() else { return };
        if refuse_if_foreign_capture(&self.stream).is_err() {
            crate::error::note_drop(Err(Error::Capture(
                "a wrapped cudarc slice whose stream is being captured through cudarc (leaked, not freed into that capture)",
            )));
            std::mem::forget(slice);
            return;
        }
        drop(slice);
    }
}

/// The raw `other` waits for `ev` (already recorded).
fn raw_waits(other: &CudaStream, ev: &PooledEvent, during: &'static str) -> Result<()> {
    // SAFETY: `other` is a live stream of the primary context the event belongs to (checked by
    // the callers); the event lives across the call.
    unsafe { result::stream_wait_event(other.cu_stream(), ev.raw(), during) }
}

/// The alignment, in bytes, that [`DeviceBuffer::from_raw_parts`] requires of a wrapped pointer:
/// this crate's kernels load 16 bytes at a time from the start of a buffer (as the driver's own
/// allocations, 256-byte aligned, allow). Found by review: a 2-byte-aligned `bf16` buffer wrapped
/// from foreign memory made the decoder's vectorised loads fault, poisoning the context.
pub const WRAP_ALIGN: usize = 16;

impl<T: DeviceRepr> DeviceBuffer<T> {
    /// Wraps `len` elements of `T` at the device address `ptr`, memory this crate did not allocate,
    /// as a buffer homed on `stream`. `owner` is what keeps the memory allocated (a handle of the
    /// library that owns it, or `()` when the caller keeps it alive otherwise): it is dropped, on a
    /// library thread, once every use of the buffer queued before its last handle's drop (the
    /// buffer and every graph that recorded work on it) has completed — never earlier. The memory
    /// is never freed by this crate. Get the owner back with [`DeviceBuffer::into_owner`] (which
    /// returns it only once every use has completed).
    ///
    /// Uses of the buffer are ordered like those of any buffer of this crate; work queued on
    /// `stream` before the wrap comes before them. Work of other libraries on other streams is not
    /// seen: order it yourself (e.g. [`Stream::wait_for_cudarc`]) before the first use.
    ///
    /// # Safety
    /// - `ptr` is a device allocation (or part of one) **in the primary context of `stream`'s
    ///   device**, valid for `len * size_of::<T>()` bytes;
    /// - it stays allocated until `owner` is dropped (or handed back) — if `owner` does not own
    ///   it, the caller keeps it allocated until then;
    /// - while wrapped, nothing touches it except through this buffer (no other library, no second
    ///   wrap of overlapping memory), and every bit pattern of its bytes is a valid `T` (as for
    ///   any [`DeviceRepr`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] for a null pointer with `len > 0`, a pointer not aligned to
    /// [`WRAP_ALIGN`] bytes (nor to `T`'s alignment, if larger), or a size that overflows the
    /// address space.
    pub unsafe fn from_raw_parts<O: Send + 'static>(
        ptr: sys::CUdeviceptr,
        len: usize,
        stream: &Stream,
        owner: O,
    ) -> Result<DeviceBuffer<T>> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())
            .filter(|&b| ptr.checked_add(b as u64).is_some())
            .ok_or_else(|| {
                Error::InvalidArgument(format!("{len} elements at {ptr:#x} overflow the address space"))
            })?;
        if bytes > 0 && ptr == 0 {
            return Err(Error::InvalidArgument("wrapping a null device pointer".into()));
        }
        let align = std::mem::align_of::<T>().max(WRAP_ALIGN) as u64;
        if !ptr.is_multiple_of(align) {
            return Err(Error::InvalidArgument(format!(
                "device pointer {ptr:#x} is not {align}-byte aligned (wrapped memory must be, for {})",
                std::any::type_name::<T>(),
            )));
        }
        let alloc = Allocation::external(ptr, stream.clone(), Box::new(owner));
        Ok(DeviceBuffer::from_allocation(Arc::new(alloc), len))
    }

    /// Takes the owner back out of a buffer made by [`DeviceBuffer::from_raw_parts`], once every
    /// use of the buffer queued so far (on any stream) has **completed**: this blocks the calling
    /// thread until then, so the owner may be dropped (freeing the memory) or used at once. For a
    /// hand-back that does not block, ordered by an event instead, see
    /// [`DeviceBuffer::into_owner_unsynced`] (or [`DeviceBuffer::into_cudarc`] for cudarc slices).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (and the buffer is dropped, releasing the owner after its uses)
    /// if the buffer was not wrapped with an owner of type `O`, or a graph that recorded work on it
    /// is still alive; [`Error::Capture`] while its home stream is being captured; driver errors
    /// (the owner is then released after its uses, or leaked if that cannot be ordered).
    pub fn into_owner<O: Send + 'static>(self) -> Result<O> {
        let alloc = self.into_allocation();
        let ev = Self::hand_back_event(&alloc)?;
        ev.synchronize()?;
        Self::take_owner(alloc)
    }

    /// [`DeviceBuffer::into_owner`] without the wait: the owner comes back at once, with an event
    /// behind every use of the buffer queued so far (on any stream).
    ///
    /// # Safety
    /// Until the event has completed, the memory must stay allocated and untouched except by
    /// stream-ordered work queued behind the event (e.g. after `cuStreamWaitEvent(their_stream,
    /// ev.raw(), 0)`): in particular, dropping the owner before then must not free the memory (a
    /// cudarc `CudaSlice` frees it on its own stream, which does not wait for the event).
    ///
    /// # Errors
    /// As for [`DeviceBuffer::into_owner`].
    pub unsafe fn into_owner_unsynced<O: Send + 'static>(self) -> Result<(O, PooledEvent)> {
        let alloc = self.into_allocation();
        let ev = Self::hand_back_event(&alloc)?;
        Ok((Self::take_owner(alloc)?, ev))
    }

    /// The event behind every use of wrapped memory, refused while a graph keeps it.
    fn hand_back_event(alloc: &Arc<Allocation>) -> Result<PooledEvent> {
        if Arc::strong_count(alloc) != 1 {
            return Err(Error::InvalidArgument(
                "handing wrapped memory back while a graph that recorded work on it is alive".into(),
            ));
        }
        alloc.event_after_uses()
    }

    /// The owner out of the (only) handle of wrapped memory: an `O`, or an `O` (a cudarc slice)
    /// inside the [`DropOutsideCapture`] that [`DeviceBuffer::from_cudarc`] keeps.
    fn take_owner<O: Send + 'static>(alloc: Arc<Allocation>) -> Result<O> {
        let accept = |o: &(dyn std::any::Any + Send)| {
            o.is::<O>()
                || o.downcast_ref::<DropOutsideCapture>()
                    .is_some_and(|w| w.slice.as_ref().is_some_and(|s| s.is::<O>()))
        };
        let refused = || {
            Error::InvalidArgument(format!(
                "the buffer was not wrapped with an owner of type {}",
                std::any::type_name::<O>()
            ))
        };
        let owner = alloc.take_owner_if(accept).ok_or_else(refused)?;
        let owner = match owner.downcast::<DropOutsideCapture>() {
            // Checked by `accept`: the wrapper holds an `O`, taken out (its drop then frees nothing).
            Ok(mut w) => w.slice.take().ok_or_else(refused)?,
            Err(owner) => owner,
        };
        owner.downcast::<O>().map(|o| *o).map_err(|_| refused())
    }

    /// Wraps a cudarc [`CudaSlice`] as a buffer homed on `stream`. `stream` first waits for the
    /// work cudarc has queued on the slice (its stream, and the slice's read/write events). The
    /// slice is owned by the buffer: it is dropped once every use has completed, or handed back
    /// by [`DeviceBuffer::into_cudarc`].
    ///
    /// # Safety
    /// While wrapped, the memory is touched only through this buffer (no copy of the slice's
    /// address is used by other code). The element layouts agree by construction (`T` is the
    /// slice's element type).
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] for a slice of another device than `stream`'s;
    /// [`Error::InvalidArgument`] for a slice of a non-primary context, or an error cudarc recorded
    /// while ordering the slice's earlier uses; [`Error::Capture`] while `stream` or the slice's
    /// stream is being captured; driver errors.
    pub unsafe fn from_cudarc(mut slice: CudaSlice<T>, stream: &Stream) -> Result<DeviceBuffer<T>>
    where
        T: cudarc::driver::DeviceRepr,
    {
        const DURING: &str = "wrapping a cudarc slice";
        same_context(slice.context(), stream.device(), DURING)?;
        let len = slice.len();
        let theirs = slice.stream().clone();
        let ptr = {
            // Makes `theirs` wait for the slice's earlier reads and writes on any cudarc stream.
            let (ptr, _record) = slice.device_ptr_mut(&theirs);
            ptr
        };
        // cudarc records the errors of those waits in the context instead of returning them: a
        // failed wait would leave cudarc's work on the slice unordered before ours.
        slice.context().check_err().map_err(cudarc_err(DURING))?;
        wait_raw(stream, &theirs, DURING)?;
        // The owner drops the slice only while its stream is not being captured (see
        // `DropOutsideCapture`): the buffer's last drop hands it to the reaper at any moment.
        let owner = DropOutsideCapture { stream: theirs, slice: Some(Box::new(slice)) };
        // SAFETY: the caller's promise (exclusive use while wrapped); the slice's pointer is a
        // live allocation of `len` elements of `T` (cudarc allocates aligned) in the primary
        // context of `stream`'s device (checked), owned by the slice kept in the owner.
        unsafe { DeviceBuffer::from_raw_parts(ptr, len, stream, owner) }
    }

    /// Hands a buffer made by [`DeviceBuffer::from_cudarc`] back as its [`CudaSlice`]. The
    /// slice's stream waits (stream-ordered) for every use of the buffer queued so far, so cudarc
    /// work queued afterwards sees its results.
    ///
    /// # Errors
    /// As for [`DeviceBuffer::into_owner`]; [`Error::Capture`] also while the slice's cudarc
    /// stream is being captured (the wait would invalidate that capture): the slice is then
    /// dropped once every use of the buffer has completed, as a dropped buffer's owner is.
    pub fn into_cudarc(self) -> Result<CudaSlice<T>>
    where
        T: cudarc::driver::DeviceRepr,
    {
        const DURING: &str = "handing a buffer back to cudarc";
        // SAFETY: the slice's stream waits for the event before anything else it queues (the
        // slice's own free included); while that stream is being captured, the slice is dropped
        // only once the event has completed (the reaper); if the wait cannot be queued, the host
        // waits for the event before the slice may be dropped, or the slice is leaked.
        let (mut slice, ev) = unsafe { self.into_owner_unsynced::<CudaSlice<T>>()? };
        let theirs = slice.stream().clone();
        // A wait queued into cudarc's capture on an event recorded outside it would invalidate
        // that capture (and not order the stream's later work): refused instead.
        if let Err(e) = refuse_if_foreign_capture(&theirs) {
            let owner = DropOutsideCapture { stream: theirs, slice: Some(Box::new(slice)) };
            crate::track::reaper::drop_after(Arc::new(ev), Box::new(owner));
            return Err(e);
        }
        if let Err(e) = raw_waits(&theirs, &ev, DURING) {
            if ev.synchronize().is_err() {
                std::mem::forget(slice);
            }
            return Err(e);
        }
        // Re-records the slice's write event behind the wait, for cudarc users on other streams.
        drop(slice.device_ptr_mut(&theirs));
        Ok(slice)
    }
}

impl Stream {
    /// This stream waits (stream-ordered, not the host) for everything queued on cudarc's stream
    /// `other` so far.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] / [`Error::InvalidArgument`] for a stream of another device or a
    /// non-primary context; [`Error::Capture`] while this stream, or `other` (a capture begun
    /// through cudarc, which the wait would pull this stream into), is being captured; driver
    /// errors.
    pub fn wait_for_cudarc(&self, other: &CudaStream) -> Result<()> {
        const DURING: &str = "waiting for a cudarc stream";
        same_context(other.context(), self.device(), DURING)?;
        wait_raw(self, other, DURING)
    }

    /// cudarc's stream `other` waits (stream-ordered) for everything queued on this stream so far.
    ///
    /// # Errors
    /// As for [`Stream::wait_for_cudarc`].
    pub fn order_cudarc_after(&self, other: &CudaStream) -> Result<()> {
        const DURING: &str = "ordering a cudarc stream after a stream";
        same_context(other.context(), self.device(), DURING)?;
        let ev = {
            let state = self.lock();
            crate::track::state::refuse_if_capturing(&state, DURING)?;
            let ev = crate::event::Event::pooled(self.device())?;
            self.device().bind()?;
            ev.record_locked(self)?;
            ev
        };
        // A wait queued into cudarc's capture on an event recorded outside it would invalidate
        // that capture: refused instead.
        refuse_if_foreign_capture(other)?;
        raw_waits(other, &ev, DURING)
    }

    /// This stream as a cudarc stream of `ctx` (which must be the primary context of its device),
    /// not destroyed by cudarc.
    ///
    /// # Safety
    /// Keep `self` (or a clone) alive while the returned stream or anything retaining it may be
    /// used. Do not begin a capture on it through cudarc (this crate would not know the stream is
    /// capturing). Work queued through cudarc is plain stream order: it is not tracked by this crate's
    /// buffer ordering (order it with [`Stream::wait_for_cudarc`] and friends where buffers are
    /// shared), and must not be queued while this stream is being captured unless it is meant to
    /// be recorded.
    ///
    /// # Errors
    /// [`Error::DeviceMismatch`] / [`Error::InvalidArgument`] for a context of another device or
    /// a non-primary one.
    pub unsafe fn as_cudarc(&self, ctx: &Arc<CudaContext>) -> Result<Arc<CudaStream>> {
        same_context(ctx, self.device(), "using a stream through cudarc")?;
        // SAFETY: a live stream of `ctx` (checked: the primary context of its device); the
        // caller keeps it alive while the wrapper is used.
        Ok(unsafe { ctx.wrap_borrowed_stream(self.raw()) })
    }
}
