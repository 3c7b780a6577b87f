//! `KeepAlive`: everything a graph's nodes refer to, owned for as long as the graph can run.

use super::alloc::Allocation;
use crate::error::{Error, Result};
use crate::stream::Stream;
use std::any::Any;
use std::collections::HashSet;
use std::sync::Arc;

/// What a graph (or an open capture) keeps alive for as long as it, or an executable graph made
/// from it, can run:
/// - every [`Allocation`] its nodes use (so no replay touches freed memory; every replay is ordered
///   as a write of each, so the final stream-ordered free comes after the last replay);
/// - *extras* that are not stream-ordered (host-node closures, events of event nodes): an
///   executable graph holding any extra releases them only after an event behind its last queued
///   replay has completed (see `GraphExec`);
/// - *serial* streams: every replay is ordered after everything queued on them and they after it
///   (a graph pool's stream), like a home stream with no memory.
#[derive(Default, Clone)]
pub(crate) struct KeepAlive {
    pub(crate) allocs: Vec<Arc<Allocation>>,
    seen: HashSet<usize>,
    pub(crate) extras: Vec<Arc<dyn Any + Send + Sync>>,
    pub(crate) serial: Vec<Stream>,
}

impl KeepAlive {
    /// Adds an allocation (once; empty allocations are not kept).
    pub(crate) fn add_alloc(&mut self, a: &Arc<Allocation>) {
        if a.ptr != 0 && self.seen.insert(Arc::as_ptr(a) as usize) {
            self.allocs.push(a.clone());
        }
    }

    /// Adds a value that must outlive every replay.
    pub(crate) fn add_extra(&mut self, x: Arc<dyn Any + Send + Sync>) {
        self.extras.push(x);
    }

    /// Adds a stream every replay is serialised through.
    pub(crate) fn add_serial(&mut self, s: &Stream) {
        if !self.serial.contains(s) {
            self.serial.push(s.clone());
        }
    }

    /// Adds everything `other` keeps.
    pub(crate) fn merge(&mut self, other: &KeepAlive) {
        for a in &other.allocs {
            self.add_alloc(a);
        }
        self.extras.extend(other.extras.iter().cloned());
        for s in &other.serial {
            self.add_serial(s);
        }
    }

    /// Whether anything must be kept until replays have *completed* (not just been ordered).
    pub(crate) fn has_extras(&self) -> bool {
        !self.extras.is_empty()
    }

    /// Records `allocs` (and nothing else).
    pub(crate) fn add_allocs(&mut self, allocs: &[&Arc<Allocation>]) {
        for a in allocs {
            self.add_alloc(a);
        }
    }

    /// The keep-alive set of an open capture, which the stream's state holds type-erased (the
    /// stream layer is below this one). Every capture is begun with a `KeepAlive`
    /// (`Stream::begin_capture`), so this cannot fail; if it ever did, the caller refuses the
    /// work rather than record it without keeping what it uses.
    pub(crate) fn of_capture(keep: &mut (dyn Any + Send)) -> Result<&mut KeepAlive> {
        keep.downcast_mut::<KeepAlive>().ok_or(Error::Capture(NOT_A_KEEP_ALIVE))
    }

    /// [`KeepAlive::of_capture`] for the set of a capture that has ended.
    pub(crate) fn from_capture(keep: Box<dyn Any + Send>) -> Result<KeepAlive> {
        keep.downcast::<KeepAlive>().map(|k| *k).map_err(|_| Error::Capture(NOT_A_KEEP_ALIVE))
    }
}

const NOT_A_KEEP_ALIVE: &str = "the capture's keep-alive set has an unexpected type (a bug of cuda-core)";
