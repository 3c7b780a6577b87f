//! Per-allocation access tracking: which GPU work a new use of an allocation must wait for.
//!
//! Every allocation remembers, since its last write:
//! - the **last write**: either ordered on its home stream (the common case: nothing to record),
//!   or a [`Mark`] — an event recorded right behind the write on another stream;
//! - the **reads** on other streams (a mark per stream, the latest), and whether a read happened
//!   on the home stream.
//!
//! A **read** waits only for the last write; a **write** waits for the last write and every read
//! since. So readers on several streams run concurrently (they never serialise on the home
//! stream), and independent buffers never order each other. The final free waits for everything
//! (see `Allocation::drop`). A wait is only ever on an event recorded behind work that was already
//! queued, so the waits form no cycle: they cannot deadlock the GPU.
//!
//! The state of an allocation is only read or changed while its home stream's enqueue lock is held
//! (see `track::order`), which makes each use one atomic step.

use super::stream::Stream;
use crate::event::PooledEvent;
use std::sync::Arc;

/// How a use touches an allocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The work only reads the memory.
    Read,
    /// The work may write the memory.
    Write,
}

/// An event recorded behind a use on a stream other than the allocation's home stream.
#[derive(Clone)]
pub(crate) struct Mark {
    pub(crate) stream: Stream,
    pub(crate) event: Arc<PooledEvent>,
}

/// What a new use must wait for (see the module docs).
#[derive(Default)]
pub(crate) struct AccessState {
    /// The last write, if it was made on another stream than the home stream.
    pub(crate) write: Option<Mark>,
    /// Reads since the last write on other streams than the home stream, the latest per stream.
    pub(crate) reads: Vec<Mark>,
    /// Whether the home stream read the memory since the last write.
    pub(crate) home_read: bool,
}

impl AccessState {
    /// Every event the final free (on the home stream) must wait for.
    pub(crate) fn all_marks(&self) -> impl Iterator<Item = &Arc<PooledEvent>> {
        self.write.iter().chain(self.reads.iter()).map(|m| &m.event)
    }

    /// Records a read on a foreign stream (`mark`), replacing that stream's earlier read mark,
    /// which is returned (for the caller to drop after its locks, see `order::Retired`).
    #[must_use]
    pub(crate) fn add_read(&mut self, mark: Mark) -> Option<Mark> {
        match self.reads.iter_mut().find(|m| m.stream == mark.stream) {
            Some(m) => Some(std::mem::replace(m, mark)),
            None => {
                self.reads.push(mark);
                None
            }
        }
    }
}
