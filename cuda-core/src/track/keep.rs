//! `KeepAlive`: everything a graph's nodes refer to, owned for as long as the graph can run.

use super::alloc::Allocation;
use super::stream::Stream;
use crate::error::{Error, Result};
use crate::event::Event;
use crate::module::Function;
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
/// - the kernels (and so the modules) its kernel nodes launch;
/// - *serial* streams: every replay is ordered after everything queued on them and they after it
///   (a graph pool's stream), like a home stream with no memory.
#[derive(Default, Clone)]
pub(crate) struct KeepAlive {
    pub(crate) allocs: Vec<Arc<Allocation>>,
    seen: HashSet<usize>,
    /// Type-erased on purpose: the extras are genuinely heterogeneous — host-node closures of any
    /// user type (`GraphBody::add_host`) and, with NCCL, communicator groups — and are only
    /// ever kept and dropped, never read back.
    pub(crate) extras: Vec<Arc<dyn Any + Send + Sync>>,
    /// The events of event-record and event-wait nodes (also kept until replays complete). Typed,
    /// because their capture membership is checked before every instantiation and launch
    /// ([`KeepAlive::lock_events`]).
    pub(crate) events: Vec<Arc<Event>>,
    /// The kernels of kernel nodes (each keeps its module loaded): a replay must never run code
    /// whose module was unloaded because the user dropped it after the capture.
    functions: Vec<Function>,
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

    /// Adds the kernel of a kernel node (keeping its module loaded).
    pub(crate) fn add_function(&mut self, f: &Function) {
        if !self.functions.iter().any(|k| k.raw() == f.raw()) {
            self.functions.push(f.clone());
        }
    }

    /// Adds the event of an event node.
    pub(crate) fn add_event(&mut self, e: &Arc<Event>) {
        if !self.events.iter().any(|k| Arc::ptr_eq(k, e)) {
            self.events.push(e.clone());
        }
    }

    /// Locks the capture tags of every event this graph's nodes record or wait on (in address
    /// order, each once) and checks that none was last recorded inside a stream capture: an
    /// event-wait node on such an event would join the capture when the graph is instantiated or
    /// launched, and an event-record node would re-record an event that belongs to it. The guards
    /// are held across the driver call, so no capture can record one of them in between.
    ///
    /// Errors: [`Error::Capture`] if one is tagged.
    pub(crate) fn lock_events(&self, during: &'static str) -> Result<Vec<std::sync::MutexGuard<'_, u64>>> {
        let mut events: Vec<&Arc<Event>> = self.events.iter().collect();
        events.sort_by_key(|e| Arc::as_ptr(e) as usize);
        events.dedup_by_key(|e| Arc::as_ptr(e) as usize);
        let mut guards = Vec::with_capacity(events.len());
        for e in events {
            let tag = e.lock_tag();
            if *tag != 0 {
                return Err(Error::Capture(during));
            }
            guards.push(tag);
        }
        Ok(guards)
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
        for e in &other.events {
            self.add_event(e);
        }
        for f in &other.functions {
            self.add_function(f);
        }
        for s in &other.serial {
            self.add_serial(s);
        }
    }

    /// Whether anything must be kept until replays have *completed* (not just been ordered).
    pub(crate) fn has_extras(&self) -> bool {
        !self.extras.is_empty() || !self.events.is_empty()
    }

    /// Records `allocs` (and nothing else).
    pub(crate) fn add_allocs(&mut self, allocs: &[&Arc<Allocation>]) {
        for a in allocs {
            self.add_alloc(a);
        }
    }

    /// How many handles of `s` this set (an open capture's) holds alone: one per allocation homed
    /// on `s` that only this set keeps (each allocation holds a handle of its home stream), one per
    /// serial entry `s`. A capture keeps what its work uses, so a capturing stream whose user
    /// handles are all gone would otherwise be kept alive by its own capture (allocation -> stream
    /// -> capture -> allocation), and the capture would never end (`Stream`'s drop).
    pub(crate) fn refs_of_capture(&self, s: &Stream) -> usize {
        self.allocs.iter().filter(|a| a.stream == *s && Arc::strong_count(a) == 1).count()
            + self.serial.iter().filter(|x| *x == s).count()
    }
}
