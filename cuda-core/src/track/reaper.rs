//! Deferred drops: values released only once the GPU has passed a point in a stream.
//!
//! Executable graphs own host-node closures and events that a queued replay will still use, but
//! that are not freed stream-ordered the way device memory is. When such a graph is dropped or
//! updated while a replay may still be queued, what it kept goes here with an event recorded
//! behind its last replay. A library-owned thread (`cuda-core-reaper`) waits for each event in
//! turn and only then drops the value. The dropping thread never blocks, and no value is ever
//! dropped inside a driver callback.

use crate::event::PooledEvent;
use std::any::Any;
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, OnceLock};

/// Type-erased on purpose: the values are genuinely heterogeneous — graphs' keep-alive sets, staging
/// buffers of copies between devices, and the foreign owners of wrapped memory (any user type, see
/// `crate::interop`) — and are only ever dropped.
type Item = (Arc<PooledEvent>, Box<dyn Any + Send>);

fn sender() -> Option<Sender<Item>> {
    static TX: OnceLock<Option<Mutex<Sender<Item>>>> = OnceLock::new();
    let tx = TX.get_or_init(|| {
        let (tx, rx) = channel::<Item>();
        std::thread::Builder::new()
            .name("cuda-core-reaper".into())
            .spawn(move || {
                // Exempt this thread from other threads' global-mode captures: its event waits are
                // on events no capture records into.
                crate::driver::relax_thread_capture_mode();
                for (event, item) in rx {
                    // If the wait fails the context is unusable and nothing will run any more:
                    // dropping is safe either way.
                    let _ = event.sync_unchecked();
                    drop(item);
                }
            })
            .ok()
            .map(|_| Mutex::new(tx))
    });
    tx.as_ref().map(|m| m.lock().unwrap_or_else(|e| e.into_inner()).clone())
}

/// Drops `item` once `event` has completed, on the reaper thread. If that thread cannot be
/// started, waits for the event here instead (blocking) and drops the item.
pub(crate) fn drop_after(event: Arc<PooledEvent>, item: Box<dyn Any + Send>) {
    match sender() {
        Some(tx) => {
            if let Err(std::sync::mpsc::SendError((event, item))) = tx.send((event, item)) {
                let _ = event.sync_unchecked();
                drop(item);
            }
        }
        None => {
            let _ = event.sync_unchecked();
            drop(item);
        }
    }
}
