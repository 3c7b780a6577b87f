//! One sweep of the completion engine over its pending ops: which ops it checks, and in what order
//! (CUDA-free, so the rules are unit-tested here).
//!
//! `pending` is in hand-over order, close to the order in which the GPU finishes the work.
//! * A **partial** sweep checks only the first pending op of each stream (hand-over order is
//!   usually the stream's own order, whose work finishes in order) and stops checking once
//!   [`PARTIAL_MISSES`] streams were found unfinished.
//! * A **full** sweep checks every op. The engine runs one at least every 50 µs, so whatever the
//!   hand-over order — two threads may hand over one stream's ops out of order, and a later op
//!   may wait on another process, as NCCL collectives do — no finished op waits longer than that
//!   to be seen, and none is ever skipped for good.

/// A partial sweep stops after finding this many streams with unfinished work.
pub(crate) const PARTIAL_MISSES: usize = 4;

/// Sweeps `pending`: `check` answers `None` for an op still running and `Some(outcome)` for a
/// finished or failed one (the outcome says which, e.g. the error that found the failure), which
/// is removed and handed to `complete` **by value** with its outcome; `stream_of` names an op's
/// stream. `blocked` is scratch space (cleared here). Returns whether any op was completed.
///
/// A completed op is never dropped here: its record may hold user code (a waker whose `Drop` is
/// the user's), which the engine runs only under its watchdog, after the sweep (found by review:
/// dropped inside the sweep, a panicking `Drop` ended the engine thread and every later await of
/// its shard hung).
pub(crate) fn sweep<T, S>(
    pending: &mut Vec<T>,
    full: bool,
    blocked: &mut Vec<usize>,
    stream_of: impl Fn(&T) -> usize,
    mut check: impl FnMut(&T) -> Option<S>,
    mut complete: impl FnMut(T, S),
) -> bool {
    let before = pending.len();
    blocked.clear();
    // The outcome of the op the predicate removed, for the loop body (a `Cell`: the predicate
    // and the body both reach it while `extract_if` runs).
    let outcome = std::cell::Cell::new(None);
    let removed = pending.extract_if(.., |p| {
        let stream = stream_of(p);
        if !full && (blocked.len() >= PARTIAL_MISSES || blocked.contains(&stream)) {
            return false;
        }
        match check(p) {
            None => {
                if !full {
                    blocked.push(stream);
                }
                false
            }
            Some(o) => {
                outcome.set(Some(o));
                true
            }
        }
    });
    for p in removed {
        if let Some(o) = outcome.take() {
            complete(p, o);
        }
    }
    pending.len() < before
}

#[cfg(test)]
mod tests {
    use super::*;

    /// (stream, finished)
    type Op = (usize, bool);

    fn run(pending: &mut Vec<Op>, full: bool) -> (Vec<Op>, usize) {
        let (mut done, mut checks, mut blocked) = (Vec::new(), 0, Vec::new());
        sweep(
            pending,
            full,
            &mut blocked,
            |p| p.0,
            |p| {
                checks += 1;
                p.1.then_some(0)
            },
            |p, _| done.push(p),
        );
        (done, checks)
    }

    #[test]
    fn a_finished_op_behind_an_unfinished_one_of_its_stream_is_seen_by_the_full_sweep() {
        // Stream 7: op B (enqueued later, never finishing, e.g. a collective waiting on another
        // rank) was handed over before op A (finished).
        let mut pending = vec![(7, false), (7, true)];
        let (done, _) = run(&mut pending, false);
        assert!(done.is_empty(), "a partial sweep checks one op per stream");
        let (done, _) = run(&mut pending, true);
        assert_eq!(done, vec![(7, true)], "the full sweep completes A whatever the order");
        assert_eq!(pending, vec![(7, false)]);
    }

    #[test]
    fn a_partial_sweep_stops_after_four_unfinished_streams() {
        let mut pending = vec![(1, false), (2, false), (3, false), (4, false), (5, true), (1, true)];
        let (done, checks) = run(&mut pending, false);
        assert!(done.is_empty());
        assert_eq!(checks, 4);
        let (done, checks) = run(&mut pending, true);
        assert_eq!(done, vec![(5, true), (1, true)]);
        assert_eq!(checks, 6);
    }

    #[test]
    fn finished_ops_do_not_count_as_misses() {
        let mut pending = vec![(1, true), (2, true), (3, false), (3, true), (4, true), (5, true), (6, true)];
        let (done, _) = run(&mut pending, false);
        assert_eq!(done, vec![(1, true), (2, true), (4, true), (5, true), (6, true)]);
        assert_eq!(pending, vec![(3, false), (3, true)]);
    }
}
