//! `GraphPool`: graphs that are never replayed concurrently and so share graph memory.

use super::CudaGraph;
use crate::Result;
use cuda_core::{Device, PoolStats, Stream};

impl<T> CudaGraph<T> {
    /// Joins this graph to `pool`: every later replay is ordered after every earlier replay of
    /// every graph of the pool (whatever streams and threads they run on), so the pool's graphs
    /// never run concurrently and may share graph-owned memory. The ordering is atomic: each
    /// replay's wait on the pool, launch and join back are queued under the pool stream's enqueue
    /// lock (`cuda-core`'s serial streams), so two threads' replays cannot both wait on the same
    /// earlier state.
    ///
    /// A graph may join several pools; it stays in each, also across `recapture` and
    /// `reset_and_recapture`.
    pub fn join_pool(&mut self, pool: &GraphPool) {
        self.exec.serialize_through(&pool.stream);
        if !self.pools.contains(&pool.stream) {
            self.pools.push(pool.stream.clone());
        }
    }
}

/// A set of graphs that are never replayed concurrently, so the device's graph memory (the memory
/// of mem-alloc nodes) can be shared between them: the peak is that of the largest, not the sum
/// (PyTorch's `graph_pool_handle`, flodl's `MemPoolId`). Graph memory returns to the device pool
/// when the graphs are dropped; [`GraphPool::trim`] gives it back to the system.
#[derive(Clone)]
pub struct GraphPool {
    stream: Stream,
}

impl GraphPool {
    /// A new pool on `device`.
    ///
    /// # Errors
    /// Driver errors creating the pool's stream.
    ///
    /// ```no_run
    /// # fn demo(mut a: cuda_async::CudaGraph<()>, mut b: cuda_async::CudaGraph<()>) -> cuda_async::Result<()> {
    /// let pool = cuda_async::GraphPool::new(&cuda_core::Device::new(0)?)?;
    /// a.join_pool(&pool);
    /// b.join_pool(&pool); // replays of `a` and `b` never overlap, from any thread or stream
    /// # Ok(()) }
    /// ```
    pub fn new(device: &Device) -> Result<Self> {
        Ok(GraphPool { stream: Stream::new(device)? })
    }

    /// Usage of the device's graph memory (current and high-water marks).
    pub fn stats(&self) -> Result<PoolStats> {
        Ok(self.stream.device().graph_mem_stats()?)
    }

    /// Resets the high-water marks.
    pub fn reset_high_water_marks(&self) -> Result<()> {
        Ok(self.stream.device().reset_graph_mem_high()?)
    }

    /// Returns unused graph memory to the system (`cuDeviceGraphMemTrim`).
    pub fn trim(&self) -> Result<()> {
        Ok(self.stream.device().graph_mem_trim()?)
    }
}
