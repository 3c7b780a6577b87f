//! `DeviceFuture`: an op as a Rust future that never blocks the executor thread.
//!
//! The first poll takes the execution lock, picks the stream, executes the op (enqueueing its
//! work), and then, for at most the spin budget (default 5 µs, [`scheduling::set_await_spin`]),
//! queries an event behind the work: tiny ops finish within it and resolve on the first poll with
//! no cross-thread wake-up. Otherwise it hands that event to the completion engine
//! (`crate::engine`), whose library-owned thread completes a lock-free
//! [`Completion`](crate::completion::Completion) when the work has finished — or failed — and wakes
//! the task from there (never from a driver callback). No thread is spawned per op and no executor
//! thread spins or blocks.
//!
//! **Cancellation.** Dropping the future after submission drops the output. That is sound: the
//! buffers in it are freed stream-ordered after the queued work (see `cuda-core`'s `DeviceBuffer`),
//! and pinned host buffers wait for their transfer before release. The callback holds its own
//! reference to the completion, so it completes an orphaned completion harmlessly.

use crate::completion::Completion;
use crate::error::{DeviceError, Result};
use crate::lock::execute_locked;
use crate::op::{DeviceOp, Op};
use crate::scheduling::{self, SchedulingPolicy};
use cuda_core::{Event, Stream, StreamStatus};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

enum Target {
    Default,
    Policy(Arc<dyn SchedulingPolicy>),
    Stream(Stream),
}

enum State<O: DeviceOp> {
    NotSubmitted(O, Target),
    Submitted(O::Output, Arc<Completion>),
    /// Completed within the spin budget of the first poll (transient, never stored).
    Ready(O::Output),
    Finished,
}

/// A future that runs an op and resolves to its output once the op's GPU work has completed.
/// Built by `.await` on an [`Op`](crate::Op), [`DeviceOpExt::on`](crate::DeviceOpExt::on) and
/// [`DeviceOpExt::schedule`](crate::DeviceOpExt::schedule). Nothing happens until it is polled.
#[must_use = "futures do nothing unless polled"]
pub struct DeviceFuture<O: DeviceOp> {
    state: State<O>,
}

// The op is moved out on first poll and never pinned in place (no structural pinning), so the
// future may be moved freely.
impl<O: DeviceOp> Unpin for DeviceFuture<O> {}

impl<O: DeviceOp> DeviceFuture<O> {
    pub(crate) fn with_default_policy(op: O) -> Self {
        DeviceFuture { state: State::NotSubmitted(op, Target::Default) }
    }
    pub(crate) fn with_policy(op: O, policy: Arc<dyn SchedulingPolicy>) -> Self {
        DeviceFuture { state: State::NotSubmitted(op, Target::Policy(policy)) }
    }
    pub(crate) fn on_stream(op: O, stream: Stream) -> Self {
        DeviceFuture { state: State::NotSubmitted(op, Target::Stream(stream)) }
    }

    /// Whether the op has been submitted to the GPU (the first poll happened).
    pub fn is_submitted(&self) -> bool {
        !matches!(self.state, State::NotSubmitted(..))
    }

    /// Executes the op; then waits on the executor thread for at most the spin budget (see
    /// [`scheduling::set_await_spin`]) and otherwise queues the completion callback.
    fn submit(op: O, target: Target) -> Result<State<O>> {
        let stream = match target {
            Target::Default => scheduling::default_policy()?.next_stream()?,
            Target::Policy(p) => p.next_stream()?,
            Target::Stream(s) => s,
        };
        if stream.is_being_captured() {
            // Nothing would run: the work would be recorded, and no completion could ever fire.
            return Err(cuda_core::Error::Capture("awaiting an op on a stream being captured").into());
        }
        let output =
            execute_locked(op, &stream, "an op future was first polled inside another op's execution")?;
        let ev = Event::pooled(stream.device())?;
        ev.record(&stream)?;
        let budget = scheduling::await_spin();
        if !budget.is_zero() {
            let start = Instant::now();
            loop {
                if ev.query().map_err(DeviceError::Async)? {
                    return Ok(State::Ready(output));
                }
                if start.elapsed() >= budget {
                    break;
                }
                std::hint::spin_loop();
            }
        }
        let completion = Completion::new();
        crate::engine::watch(ev, completion.clone());
        Ok(State::Submitted(output, completion))
    }
}

impl<O: DeviceOp> Future for DeviceFuture<O> {
    type Output = Result<O::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        if let State::NotSubmitted(..) = this.state {
            let State::NotSubmitted(op, target) = std::mem::replace(&mut this.state, State::Finished) else {
                return Poll::Pending;
            };
            match Self::submit(op, target) {
                Ok(State::Ready(out)) => return Poll::Ready(Ok(out)),
                Ok(st) => this.state = st,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        let State::Submitted(_, completion) = &this.state else {
            return Poll::Ready(Err(DeviceError::Misuse("DeviceFuture polled after completion".into())));
        };
        if completion.poll_complete(cx).is_pending() {
            return Poll::Pending;
        }
        let State::Submitted(out, completion) = std::mem::replace(&mut this.state, State::Finished) else {
            return Poll::Pending;
        };
        match completion.status() {
            0 => Poll::Ready(Ok(out)),
            code => Poll::Ready(Err(DeviceError::Async(
                StreamStatus::from_code(code)
                    .into_result("running an awaited op's GPU work")
                    .err()
                    .unwrap_or(cuda_core::Error::InvalidArgument("unknown asynchronous failure".into())),
            ))),
        }
    }
}

impl<T: DeviceOp> std::future::IntoFuture for Op<T> {
    type Output = Result<T::Output>;
    type IntoFuture = DeviceFuture<T>;
    /// Runs on a stream chosen by the default policy of the default device, when first polled.
    fn into_future(self) -> DeviceFuture<T> {
        DeviceFuture::with_default_policy(self.0)
    }
}
