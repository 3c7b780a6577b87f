//! Cross-stream ordering of buffer uses.
//!
//! Every buffer has a *home stream*: the stream it was allocated on, on which it will also be
//! freed (stream-ordered). Work that uses the buffer on its home stream is ordered by the stream
//! itself. Work on any other stream is *joined*: before it, the other stream waits for everything
//! queued so far on the home stream; after it, the home stream waits for it. So every later use,
//! and the final free, is ordered after it, whichever stream it ran on. This costs nothing for
//! same-stream use and two pooled event records and waits per foreign home stream otherwise.
//!
//! **Atomic uses.** Each use — the wait before, the work, the join after — is queued while holding
//! the enqueue lock of the stream it runs on and of every home stream involved (taken in a fixed
//! order, released before any host wait). So every use of a buffer is one step in its home
//! stream's order, also when several threads queue work at once, and no capture can begin or end
//! on any of these streams in the middle of it.
//!
//! **Captures.** While the stream the work runs on is being captured (by this thread), the uses
//! are recorded into the capture's keep-alive set instead and no join is made (a join would fork
//! the capture); replays of the graph make the joins. Work on a stream that another thread is
//! capturing, or that uses a buffer whose home stream is being captured from another stream, is
//! refused with [`crate::Error::Capture`].

use super::alloc::Allocation;
use crate::capture::{keep_allocs, Locked, Mode};
use crate::error::{Error, Result};
use crate::event::Event;
use crate::keep::KeepAlive;
use crate::stream::Stream;
use std::sync::Arc;

/// What an enqueue does on a stream that this thread is capturing.
#[derive(Clone, Copy)]
pub(crate) enum InCapture {
    /// Record it (keeping the allocations alive).
    Record,
    /// Refuse it with [`Error::Capture`] naming the operation.
    Refuse(&'static str),
}

/// Runs `enqueue` (which queues work on `on` using the allocations `uses`) so that it is ordered
/// after all work queued so far on each allocation's home stream, and each home stream after it.
/// Homes equal to `on` cost nothing. The join back to the homes is queued even if `enqueue` fails.
///
/// Crate-private: `enqueue` runs under stream locks, so it must be this crate's own code (a user
/// closure could drop a buffer or call a stream method there and deadlock on the lock).
///
/// Errors: [`Error::Capture`] if another thread is capturing `on`, or a home stream other than
/// `on` is being captured; the error of `enqueue`; driver errors of the joins (if a join after the
/// work fails, `on` is synchronised before returning, so the work cannot outlive its buffers).
pub(crate) fn ordered_on<R>(
    on: &Stream,
    uses: &[&Arc<Allocation>],
    enqueue: impl FnOnce() -> Result<R>,
) -> Result<R> {
    ordered_with(on, uses, InCapture::Record, enqueue)
}

/// [`ordered_on`] with an explicit capture policy.
pub(crate) fn ordered_with<R>(
    on: &Stream,
    uses: &[&Arc<Allocation>],
    in_capture: InCapture,
    enqueue: impl FnOnce() -> Result<R>,
) -> Result<R> {
    let homes: Vec<&Stream> = uses.iter().map(|a| &a.stream).collect();
    joined(on, &homes, in_capture, |keep| keep_allocs(keep, uses), enqueue)
}

/// The core of every ordered enqueue: locks `on` and `homes`, then either records (`keep` adds to
/// the capture's keep-alive set) or joins `on` with every home around `enqueue`.
pub(crate) fn joined<R>(
    on: &Stream,
    homes: &[&Stream],
    in_capture: InCapture,
    keep: impl FnOnce(&mut KeepAlive),
    enqueue: impl FnOnce() -> Result<R>,
) -> Result<R> {
    if homes.iter().all(|h| *h == on) {
        // Fast path: one stream, one lock.
        let mut state = on.lock();
        return match state.mode()? {
            Mode::Eager => enqueue(),
            Mode::Captured(k) => captured(k, in_capture, keep, enqueue),
        };
    }
    let mut locked = Locked::new(std::iter::once(on).chain(homes.iter().copied()));
    for h in homes.iter().filter(|h| **h != on) {
        if locked.state(h).capture.is_some() {
            return Err(Error::Capture(
                "using a buffer from another stream while its home stream is being captured",
            ));
        }
    }
    if let Mode::Captured(k) = locked.state(on).mode()? {
        return captured(k, in_capture, keep, enqueue);
    }
    let mut distinct: Vec<&Stream> = Vec::with_capacity(homes.len());
    for h in homes.iter().filter(|h| **h != on) {
        if !distinct.contains(h) {
            distinct.push(h);
        }
    }
    for h in &distinct {
        join_unchecked(on, h)?;
    }
    let out = enqueue();
    let mut joined_back = Ok(());
    for h in &distinct {
        if let Err(e) = join_unchecked(h, on) {
            joined_back = Err(e);
        }
    }
    if let Err(e) = joined_back {
        // The home's later uses and its free are not ordered after the work: finish the work now.
        drop(locked);
        on.sync_unchecked()?;
        out?;
        return Err(e);
    }
    out
}

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

/// `waiter` waits for everything queued on `target` so far (a private pooled event). The caller
/// holds both streams' locks and has checked that neither is being captured.
pub(crate) fn join_unchecked(waiter: &Stream, target: &Stream) -> Result<()> {
    let ev = Event::pooled(target.device())?;
    target.device().bind()?;
    ev.record_unchecked(target)?;
    waiter.wait_unchecked(&ev)
}
