//! `Replicas`: serve one [`Module`](super::Module) from many tasks through `&self`.

use super::Replicable;
use crate::Result;
use futures::lock::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A pool of model replicas behind one `&self` entry point, so that serving from many tasks needs
/// no hand-written `Arc<Mutex<_>>` plumbing.
///
/// Each replica owns its graph and activation buffers (weights may be shared between replicas,
/// e.g. through `Arc`); [`Replicas::forward`] runs one pass on a free replica, or waits (without
/// blocking the executor thread) for the least recently picked one. Passes on different replicas
/// run concurrently on their own streams, unless they share buffers: a graph replay counts as a
/// write of every buffer its graph keeps, so replicas sharing weights replay one after the other
/// (give each its own copy to overlap them). Passes on one replica are serialised by its async
/// mutex, which is what `Module::forward_async(&mut self)` requires.
///
/// Only [`Replicable`] modules can be served: since any replica may run any pass, a module that
/// keeps state between passes (a decoder's per-sequence KV cache) would see a sequence's steps
/// land on replicas that do not hold its state. `Replicas<models::llama::LlamaModel>` is
/// therefore refused at compile time.
///
/// ```no_run
/// # use cuda_async::{graph::Replicable, Result};
/// # async fn demo<M: Replicable + Send>(models: Vec<M>, inputs: Vec<M::Input>) -> Result<()>
/// # where M::Input: Send, M::Output: Send {
/// use cuda_async::Replicas; // also `cuda_async::graph::Replicas`
/// use std::sync::Arc;
/// let served = Arc::new(Replicas::new(models)?);
/// let tasks: Vec<_> = inputs
///     .into_iter()
///     .map(|x| {
///         let served = served.clone();
///         async move { served.forward(x).await } // many tasks, one `&self`
///     })
///     .collect();
/// for out in futures::future::join_all(tasks).await {
///     let _ = out?;
/// }
/// # Ok(()) }
/// ```
pub struct Replicas<M> {
    models: Vec<Mutex<M>>,
    next: AtomicUsize,
}

impl<M: Replicable> Replicas<M> {
    /// Serves `models` (at least one).
    ///
    /// # Errors
    /// [`crate::DeviceError::Misuse`] for an empty list.
    pub fn new(models: Vec<M>) -> Result<Self> {
        if models.is_empty() {
            return Err(crate::DeviceError::Misuse("Replicas::new needs at least one model".into()));
        }
        Ok(Replicas { models: models.into_iter().map(Mutex::new).collect(), next: AtomicUsize::new(0) })
    }

    /// How many replicas serve.
    pub fn len(&self) -> usize {
        self.models.len()
    }

    /// Always `false` (construction refuses an empty list).
    pub fn is_empty(&self) -> bool {
        self.models.is_empty()
    }

    /// Runs one forward pass on a free replica (or waits for one) and resolves once its result is
    /// ready, without blocking the executor thread.
    ///
    /// # Errors
    /// The replica's [`Module::forward_async`](super::Module::forward_async) errors.
    pub async fn forward(&self, input: M::Input) -> Result<M::Output> {
        let n = self.models.len();
        let start = self.next.fetch_add(1, Ordering::Relaxed) % n;
        for i in 0..n {
            if let Some(mut m) = self.models[(start + i) % n].try_lock() {
                return m.forward_async(input).await;
            }
        }
        self.models[start].lock().await.forward_async(input).await
    }

    /// Exclusive access to every replica (e.g. to update weights between passes).
    pub fn replicas_mut(&mut self) -> impl Iterator<Item = &mut M> {
        self.models.iter_mut().map(|m| m.get_mut())
    }
}
