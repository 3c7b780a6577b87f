//! Ordering of buffer uses across streams.
//!
//! Every buffer has a *home stream*: the stream it was allocated on, on which it will also be
//! freed (stream-ordered). Each use of a buffer is ordered against the earlier uses that conflict
//! with it, through the allocation's access state (see `track::access`): a read waits for the last
//! write, a write waits for the last write and the reads since. Uses on the home stream are ordered
//! by the stream itself and record nothing; a use on another stream records one event behind its
//! work (shared by all the allocations it touches). So the final free, on the home stream, is
//! ordered after every use, whichever stream it ran on; readers on several streams run
//! concurrently; and work on independent buffers is never ordered by a shared home stream.
//!
//! **Atomic uses.** Each use — the waits before, the work, the marks after — is queued while
//! holding the enqueue lock of the stream it runs on and of every home stream involved (taken in
//! increasing stream-id order, released before any host wait). The access state of an allocation
//! is only touched under its home stream's lock. So every use is one atomic step, also when several
//! threads queue work at once, and no capture can begin or end on any of these streams in the
//! middle of it.
//!
//! **Serial streams** (graph pools): a replay waits for everything queued on each serial stream
//! so far, and the serial stream waits for the replay.
//!
//! **Captures.** While the stream the work runs on is being captured (by this thread), the uses
//! are recorded into the capture's keep-alive set instead and nothing is waited for or marked (a
//! cross-stream wait would fork the capture); every replay of the graph is then ordered as a write
//! of each allocation it keeps. Work on a stream that another thread is capturing, or that uses a
//! buffer whose home stream is being captured from another stream, is refused with
//! [`crate::error::Error::Capture`].

use super::access::{Access, Mark};
use super::alloc::Allocation;
use super::keep::KeepAlive;
use super::state::{Locked, Mode};
use super::stream::Stream;
use crate::error::{Error, Result};
use crate::event::{Event, PooledEvent};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// One entry of a use list: an allocation and how the work touches it, or nothing (kernel
/// parameters that are not buffers), so callers can pass their arrays without building a `Vec`.
pub(crate) trait UseRef {
    fn get(&self) -> Option<(&Arc<Allocation>, Access)>;
}

impl UseRef for (&Arc<Allocation>, Access) {
    #[inline]
    fn get(&self) -> Option<(&Arc<Allocation>, Access)> {
        Some((self.0, self.1))
    }
}

impl UseRef for Option<(&Arc<Allocation>, Access)> {
    #[inline]
    fn get(&self) -> Option<(&Arc<Allocation>, Access)> {
        *self
    }
}

/// What an enqueue does on a stream that this thread is capturing.
#[derive(Clone, Copy)]
pub(crate) enum InCapture {
    /// Record it (keeping the allocations alive).
    Record,
    /// Refuse it with [`Error::Capture`] naming the operation.
    Refuse(&'static str),
}

/// Runs `enqueue` (which queues work on `on` touching the allocations of `uses` as stated) ordered
/// after the earlier conflicting uses of each allocation, recorded if `on` is being captured.
///
/// Crate-private: `enqueue` runs under stream locks, so it must be this crate's own code (a user
/// closure could drop a buffer or call a stream method there and deadlock on the lock).
///
/// Errors: [`Error::Capture`] if another thread is capturing `on`, or a home stream other than
/// `on` is being captured; the error of `enqueue`; driver errors of the waits and marks (if the
/// mark after the work cannot be recorded, `on` is synchronised before returning, so the work
/// cannot outlive its buffers).
pub(crate) fn ordered_on<R, U: UseRef>(
    on: &Stream,
    uses: &[U],
    enqueue: impl FnOnce() -> Result<R>,
) -> Result<R> {
    ordered_with(on, uses, InCapture::Record, enqueue)
}

/// [`ordered_on`] with an explicit capture policy.
pub(crate) fn ordered_with<R, U: UseRef>(
    on: &Stream,
    uses: &[U],
    in_capture: InCapture,
    enqueue: impl FnOnce() -> Result<R>,
) -> Result<R> {
    ordered(
        on,
        uses,
        &[],
        in_capture,
        |keep| keep.add_allocs(&uses.iter().filter_map(|u| u.get().map(|(a, _)| a)).collect::<Vec<_>>()),
        enqueue,
    )
}

/// The core of every ordered enqueue (see the module docs): locks `on`, the home streams of `uses`
/// and the `serial` streams; then either records (`keep` adds to the capture's keep-alive set) or
/// waits, enqueues and marks.
pub(crate) fn ordered<R, U: UseRef>(
    on: &Stream,
    uses: &[U],
    serial: &[&Stream],
    in_capture: InCapture,
    keep: impl FnOnce(&mut KeepAlive),
    enqueue: impl FnOnce() -> Result<R>,
) -> Result<R> {
    let uses = || uses.iter().filter_map(UseRef::get);
    if serial.is_empty() && uses().all(|(a, _)| a.stream == *on) {
        // Fast path: one stream, one lock; nothing to record unless another stream used the memory.
        // Marks that are done with are dropped after the lock (declared before it): see `Retired`.
        let mut retired = Retired::default();
        let mut state = on.lock();
        if let Mode::Captured(k) = state.mode()? {
            return captured(k, in_capture, keep, enqueue);
        }
        for (a, kind) in uses() {
            // No mark of another stream: the home stream's order covers every earlier use (and
            // `home_read` only matters once a foreign write mark exists).
            if !a.foreign.load(Ordering::Relaxed) {
                continue;
            }
            let mut st = a.access();
            // A mark is dropped only once its wait is enqueued: a failed wait leaves it in place
            // for the next use (and the last free) to wait on.
            if let Some(m) = &st.write {
                on.wait_unchecked(&m.event)?;
                retired.0.extend(st.write.take());
            }
            match kind {
                Access::Read => st.home_read = true,
                Access::Write => {
                    for m in &st.reads {
                        on.wait_unchecked(&m.event)?;
                    }
                    retired.0.append(&mut st.reads);
                    st.home_read = false;
                }
            }
            a.foreign.store(st.write.is_some() || !st.reads.is_empty(), Ordering::Relaxed);
        }
        return enqueue();
    }
    let homes = uses().map(|(a, _)| &a.stream);
    let mut retired = Retired::default();
    let mut locked = Locked::new(std::iter::once(on).chain(homes).chain(serial.iter().copied()));
    for h in uses().map(|(a, _)| &a.stream).chain(serial.iter().copied()).filter(|h| *h != on) {
        if locked.state(h).capture.is_some() {
            return Err(Error::Capture(
                "using a buffer (or graph pool) from another stream while its home stream is being captured",
            ));
        }
    }
    if let Mode::Captured(k) = locked.state(on).mode()? {
        return captured(k, in_capture, keep, enqueue);
    }
    wait_before(on, uses(), &mut retired)?;
    for s in serial.iter().filter(|s| **s != on) {
        join_unchecked(on, s)?;
    }
    let out = enqueue();
    // Marks after the work (also if `enqueue` failed part-way: conservative).
    let foreign = uses().any(|(a, _)| a.stream != *on) || serial.iter().any(|s| *s != on);
    let mark = if foreign {
        match record(on) {
            Ok(ev) => Some(Arc::new(ev)),
            Err(e) => {
                // No mark: finish the work now so nothing can outlive it (counted in as a waiter
                // before the locks go, so that no capture of `on` begins before the wait).
                let waiting = on.waiting_locked();
                drop(locked);
                on.sync_for_copy()?;
                drop(waiting);
                out?;
                return Err(e);
            }
        }
    } else {
        None
    };
    mark_after(on, uses(), mark.as_ref(), &mut retired);
    if let Some(ev) = &mark {
        for s in serial.iter().filter(|s| **s != on) {
            s.wait_unchecked(ev)?;
        }
    }
    out
}

/// The capture branch of [`ordered`]: `k` is the capture's keep-alive set (held by the stream's
/// state).
fn captured<R>(
    k: &mut KeepAlive,
    in_capture: InCapture,
    keep: impl FnOnce(&mut KeepAlive),
    enqueue: impl FnOnce() -> Result<R>,
) -> Result<R> {
    match in_capture {
        InCapture::Refuse(what) => Err(Error::Capture(what)),
        InCapture::Record => {
            keep(k);
            enqueue()
        }
    }
}

/// The waits before a use on `on` (see the module docs): for each allocation, the last write
/// (and, for a write, the reads since), each event waited for once. The caller holds the locks of
/// `on` and of every home stream of `uses`, and has checked that none of them is being captured.
fn wait_before<'u>(
    on: &Stream,
    uses: impl Iterator<Item = (&'u Arc<Allocation>, Access)>,
    retired: &mut Retired,
) -> Result<()> {
    // The events waited for, held (not their addresses): a mark dropped in this loop could free
    // an event whose address a new `Arc` then reuses, and its wait would be skipped as done
    // (found by review: a copy read its source before the source's upload on another stream).
    let mut waited: Vec<Arc<PooledEvent>> = Vec::new();
    let mut home_marks: Vec<(Stream, Arc<PooledEvent>)> = Vec::new();
    let mut wait = |ev: &Arc<PooledEvent>| -> Result<()> {
        if !waited.iter().any(|w| Arc::ptr_eq(w, ev)) {
            waited.push(ev.clone());
            on.wait_unchecked(ev)?;
        }
        Ok(())
    };
    for (a, kind) in uses {
        let mut st = a.access();
        let home = &a.stream;
        let needs_home = home != on && (st.write.is_none() || (kind == Access::Write && st.home_read));
        if needs_home {
            // Everything queued on the home stream so far (the last write, or home reads).
            let ev = match home_marks.iter().find(|(s, _)| s == home) {
                Some((_, ev)) => ev.clone(),
                None => {
                    let ev = Arc::new(record(home)?);
                    home_marks.push((home.clone(), ev.clone()));
                    ev
                }
            };
            wait(&ev)?;
        }
        if let Some(m) = &st.write {
            if m.stream != *on {
                wait(&m.event)?;
            }
        }
        if kind == Access::Write {
            for m in st.reads.iter().filter(|m| m.stream != *on) {
                wait(&m.event)?;
            }
        }
        if home == on && st.write.is_some() {
            // The home stream now waits for the foreign write: its order covers it from here on.
            retired.0.extend(st.write.take());
        }
    }
    Ok(())
}

/// Updates each allocation's access state after a use on `on`; `mark` is the event recorded
/// behind the work, present whenever some allocation's home stream is not `on`. Same locks as
/// [`wait_before`].
fn mark_after<'u>(
    on: &Stream,
    uses: impl Iterator<Item = (&'u Arc<Allocation>, Access)>,
    mark: Option<&Arc<PooledEvent>>,
    retired: &mut Retired,
) {
    for (a, kind) in uses {
        let mut st = a.access();
        let on_home = a.stream == *on;
        match (kind, on_home, mark) {
            (Access::Write, true, _) => {
                retired.0.extend(st.write.take());
                retired.0.append(&mut st.reads);
                st.home_read = false;
            }
            (Access::Read, true, _) => st.home_read = true,
            (Access::Write, false, Some(ev)) => {
                retired.0.extend(st.write.replace(Mark { stream: on.clone(), event: ev.clone() }));
                retired.0.append(&mut st.reads);
                st.home_read = false;
            }
            (Access::Read, false, Some(ev)) => {
                retired.0.extend(st.add_read(Mark { stream: on.clone(), event: ev.clone() }))
            }
            (_, false, None) => {} // unreachable: a foreign use always records a mark
        }
        a.foreign.store(st.write.is_some() || !st.reads.is_empty(), Ordering::Relaxed);
    }
}

/// One part of a grouped enqueue: the stream the part's work goes to, and what it touches.
#[cfg_attr(not(feature = "nccl"), allow(dead_code))]
pub(crate) type GroupPart<'a> = (&'a Stream, Vec<(&'a Arc<Allocation>, Access)>);

/// Several uses on several streams (possibly of several devices) queued by one `enqueue`, for
/// work that a library only puts on the streams at the end of a group (NCCL's
/// `ncclGroupStart`/`ncclGroupEnd`): all the locks are taken at once (in stream-id order), every
/// part's waits are queued before `enqueue`, and every part's marks after it. Eager only: refused
/// with [`Error::Capture`] (naming `what`) if any stream involved is being captured.
#[cfg_attr(not(feature = "nccl"), allow(dead_code))]
pub(crate) fn ordered_group<R>(
    parts: &[GroupPart<'_>],
    what: &'static str,
    enqueue: impl FnOnce() -> Result<R>,
) -> Result<R> {
    let streams =
        parts.iter().flat_map(|(on, uses)| std::iter::once(*on).chain(uses.iter().map(|(a, _)| &a.stream)));
    let mut retired = Retired::default();
    let mut locked = Locked::new(streams.clone());
    for s in streams {
        if locked.state(s).capture.is_some() {
            return Err(Error::Capture(what));
        }
    }
    for (on, uses) in parts {
        on.device().bind()?;
        wait_before(on, uses.iter().copied(), &mut retired)?;
    }
    let out = enqueue();
    // Marks after the work (also if `enqueue` failed part-way: conservative).
    let mut marks = Vec::with_capacity(parts.len());
    for (on, uses) in parts {
        let foreign = uses.iter().any(|(a, _)| a.stream != **on);
        let mark = if foreign { record(on).map(|ev| Some(Arc::new(ev))) } else { Ok(None) };
        match mark {
            Ok(m) => marks.push(m),
            Err(e) => {
                // No mark: finish the work now so nothing can outlive it (counted in as waiters
                // before the locks go, so that no capture of these streams begins before the waits).
                let waiting: Vec<_> = parts.iter().map(|(on, _)| on.waiting_locked()).collect();
                drop(locked);
                // Every stream is waited for, even after one wait fails: the first error is kept.
                let synced = parts.iter().map(|(on, _)| on.sync_for_copy()).fold(Ok(()), Result::and);
                drop(waiting);
                synced?;
                out?;
                return Err(e);
            }
        }
    }
    for ((on, uses), mark) in parts.iter().zip(&marks) {
        mark_after(on, uses.iter().copied(), mark.as_ref(), &mut retired);
    }
    out
}

/// Marks an ordered enqueue is done with, dropped only after its stream locks: a mark holds a
/// handle of its stream, and dropping the last handle of a stream that is being captured abandons
/// the capture, which takes that stream's lock and drops the capture's keep-alive set (whose
/// allocations take their home streams' locks). Dropped under locks, that deadlocked on a lock
/// the thread held, or against a thread capturing (found by review). Each function declares its
/// `Retired` before its lock guards, so it is dropped after them.
#[derive(Default)]
pub(crate) struct Retired(pub(crate) Vec<Mark>);

/// A private pooled event recorded behind everything queued on `s` so far. The caller holds `s`'s
/// lock and has checked that it is not being captured.
pub(crate) fn record(s: &Stream) -> Result<PooledEvent> {
    let ev = Event::pooled(s.device())?;
    s.device().bind()?;
    ev.record_locked(s)?;
    Ok(ev)
}

/// `waiter` waits for everything queued on `target` so far (a private pooled event). The caller
/// holds both streams' locks and has checked that neither is being captured.
pub(crate) fn join_unchecked(waiter: &Stream, target: &Stream) -> Result<()> {
    let ev = record(target)?;
    waiter.wait_unchecked(&ev)
}
