//! Cross-stream ordering of buffer uses.
//!
//! Every buffer has a *home stream*: the stream it was allocated on, on which it will also be
//! freed (stream-ordered). Work that uses the buffer on its home stream is ordered by the stream
//! itself. Work on any other stream is *joined*: before it, the other stream waits for everything
//! queued so far on the home stream; after it, the home stream waits for it. So every later use,
//! and the final free, is ordered after it, whichever stream it ran on. This costs nothing for
//! same-stream use and two event records and waits per foreign home stream otherwise.

use crate::error::Result;
use crate::stream::Stream;

/// Runs `enqueue` (which queues work on `on`) so that it is ordered after all work queued so far on
/// each stream in `homes`, and that each of them is ordered after it. Homes equal to `on` cost
/// nothing. The join back to the homes is queued even if `enqueue` fails.
pub fn ordered_on<R>(on: &Stream, homes: &[&Stream], enqueue: impl FnOnce() -> Result<R>) -> Result<R> {
    let foreign = |h: &&&Stream| **h != on;
    for h in homes.iter().filter(foreign) {
        on.wait_stream(h)?;
    }
    let out = enqueue();
    for h in homes.iter().filter(foreign) {
        h.wait_stream(on)?;
    }
    out
}
