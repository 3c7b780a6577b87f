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
//! a lock of every home stream involved (taken in a fixed order, released before any host wait).
//! So every use of a buffer is one step in its home stream's order, also when several threads
//! queue work at once. That matters for work that writes through a shared handle (graph replays,
//! `DeviceScalar::set`): without it, a use queued by another thread on the home stream between the
//! work and its join-back could run concurrently with the work.
//!
//! While the stream is being captured into a graph, the uses are recorded instead (the graph keeps
//! the allocations alive) and no join is made; replays of the graph make the joins.

use super::alloc::Allocation;
use crate::capture::{self, Uses};
use crate::error::Result;
use crate::stream::Stream;
use std::sync::Arc;

/// Runs `enqueue` (which queues work on `on` using the allocations `uses`) so that it is ordered
/// after all work queued so far on each allocation's home stream, and each home stream after it.
/// Homes equal to `on` cost nothing. The join back to the homes is queued even if `enqueue` fails.
pub fn ordered_on<R>(
    on: &Stream,
    uses: &[&Arc<Allocation>],
    enqueue: impl FnOnce() -> Result<R>,
) -> Result<R> {
    if let Uses::Captured = capture::note_uses(on, uses)? {
        return enqueue();
    }
    join_homes(on, uses.iter().map(|a| &a.stream), enqueue)
}

/// The join of [`ordered_on`] over explicit home streams (no capture bookkeeping).
pub(crate) fn join_homes<'a, R>(
    on: &Stream,
    homes: impl Iterator<Item = &'a Stream> + Clone,
    enqueue: impl FnOnce() -> Result<R>,
) -> Result<R> {
    let mut distinct: Vec<&Stream> = Vec::with_capacity(2);
    for h in homes {
        if !distinct.contains(&h) {
            distinct.push(h);
        }
    }
    distinct.sort_by_key(|h| h.id());
    let _guards: Vec<_> = distinct.iter().map(|h| h.lock_uses()).collect();
    for h in distinct.iter().filter(|h| **h != on) {
        on.wait_stream(h)?;
    }
    let out = enqueue();
    for h in distinct.iter().filter(|h| **h != on) {
        h.wait_stream(on)?;
    }
    out
}
