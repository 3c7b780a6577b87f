//! `DeviceFuture`: an op as a Rust future that never blocks the executor thread.
//!
//! The first poll takes the execution lock, picks the stream, executes the op (enqueueing its
//! work), and then, for at most the spin budget of the [`AwaitSpin`](scheduling::AwaitSpin) policy
//! (5 µs by default, longer for a lone awaiter whose ops are predicted to finish within 100 µs,
//! none while other awaits of the device are pending), queries an event behind the work: such ops
//! resolve on the first poll with no cross-thread wake-up. Otherwise it hands that event to the completion engine
//! (`runtime::engine`), whose library-owned thread completes a lock-free
//! [`Completion`](super::completion::Completion) when the work has finished — or failed — and wakes
//! the task from there (never from a driver callback). A lone awaiter of an op predicted to take
//! longer than the spin is also woken shortly before the predicted end and spins for that last
//! stretch (the policy's early wake), so its thread is awake when the work finishes instead of
//! paying the operating system's wake-up latency. No thread is spawned per op, and an executor
//! thread spins only within the policy's bound and never blocks (except when the engine's thread
//! could not be started, or when a waker running on an engine thread awaits again: then the op is
//! waited for on the calling thread).
//!
//! **Cancellation.** Dropping the future after submission drops the output. That is sound: the
//! buffers in it are freed stream-ordered after the queued work (see `cuda-core`'s `DeviceBuffer`),
//! and pinned host buffers wait for their transfer before release. The completion engine holds its
//! own reference to the completion, so it completes an orphaned completion harmlessly.
//!
//! **Errors.** A failure of the op's GPU work resolves the future to
//! [`DeviceError::Async`] holding the typed [`cuda_core::Error`] exactly as it was detected (the
//! driver error and the call that found it: the event query, the synchronisation, or the engine's
//! fault probe), handed over through the completion without being reduced to a code.

use super::await_spin::await_spin_policy;
use super::engine::{OpCompletion, Wait};
use super::lock::execute_locked;
use crate::error::{DeviceError, Result};
use crate::op::{DeviceOp, Op};
use crate::scheduling::{self, SchedulingPolicy};
use cuda_core::{Event, Stream};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

enum Target {
    Default,
    Policy(Arc<dyn SchedulingPolicy>),
    Stream(Stream),
}

enum State<O: DeviceOp> {
    NotSubmitted(O, Target),
    /// Handed to the completion engine; `Solo` if the device had no other pending awaits then,
    /// and the early wake's spin window if the engine was asked to wake the task early.
    Submitted(O::Output, Arc<OpCompletion>, Option<Solo>, Option<EarlySpin>),
    /// Completed within the spin budget of the first poll (transient, never stored).
    Ready(O::Output),
    Finished,
}

/// An await submitted while its device had no other pending awaits: its duration (submission to
/// observed completion) becomes the engine's prediction for the first-poll spin policy.
struct Solo {
    engine: &'static super::engine::Engine,
    start: Instant,
}

impl Solo {
    /// Records the await's duration as the next prediction. `unused_alarm` is the time of an
    /// early wake that never came into play (the engine saw the op complete first): then the
    /// recorded duration is at most the alarm's offset (see [`solo_duration`]).
    fn record(&self, unused_alarm: Option<Instant>) {
        self.engine.record_solo(solo_duration(self.start, Instant::now(), unused_alarm));
    }
}

/// The duration a solo await records for the next prediction: from `start` to `observed` (when the
/// task saw the op complete), but no more than the offset of an early-wake alarm that did not
/// fire before the op completed.
///
/// The observed duration includes how late the completion was noticed (an engine napping past the
/// end, the operating system waking the task). Recorded as is after a missed alarm, it would put
/// the next alarm after the op's end as well, and every later one too: the early wake would stay
/// off for good (found on the H100: `gpu_completion::early_wake_before_the_end` saw 0 or 1 of 5
/// early wakes once a first prediction had been long). Capped at the unused alarm's offset, the
/// next alarm comes at least one lead (`AwaitSpin::early_wake`) earlier than the missed one, until
/// one fires before the end; its spin then sees the true end and the prediction is exact again.
fn solo_duration(start: Instant, observed: Instant, unused_alarm: Option<Instant>) -> Duration {
    let took = observed.saturating_duration_since(start);
    match unused_alarm {
        Some(at) => took.min(at.saturating_duration_since(start)),
        None => took,
    }
}

/// The window of an early wake (see [`AwaitSpin::early_wake`](scheduling::AwaitSpin::early_wake)):
/// a poll from `from` on spins until the op completes, but not past `until`.
#[derive(Clone, Copy)]
struct EarlySpin {
    from: Instant,
    until: Instant,
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
    /// [`scheduling::AwaitSpin`]) and otherwise hands the op to the completion engine.
    fn submit(op: O, target: Target, waker: &std::task::Waker) -> Result<State<O>> {
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
        let ordinal = stream.device().ordinal();
        let engine = super::engine::engine(ordinal);
        // A progress mark behind the work where the engine can watch marks (one load per check,
        // no driver call); otherwise, or if marking fails, an event.
        let marks = super::policy::completion_policy().marks;
        let mark = engine
            .filter(|e| marks && e.uses_marks() && !super::engine::on_engine_thread())
            .and_then(|_| stream.mark_progress().ok());
        let wait = match mark {
            Some(mark) => Wait::Mark(mark),
            None => {
                let ev = Event::pooled(stream.device())?;
                ev.record(&stream)?;
                Wait::Event(ev)
            }
        };
        let start = Instant::now();
        let policy = await_spin_policy();
        // The spin policy's inputs: how many other awaited ops of the device are pending, and how
        // long the last uncontended one took. Without an engine (its thread could not start) the
        // op is waited for on this thread anyway, so there is nothing to predict.
        let (others, predicted) = engine.map_or((0, None), |e| (e.pending(), e.predicted()));
        // Only an await that had the device to itself is a fair prediction for the next one.
        let solo = engine.filter(|_| others == 0).map(|e| Solo { engine: e, start });
        let budget = policy.budget(others, predicted);
        if !budget.is_zero() {
            loop {
                match wait.poll() {
                    Ok(true) => {
                        if let Some(solo) = &solo {
                            solo.record(None);
                        }
                        return Ok(State::Ready(output));
                    }
                    Ok(false) => {}
                    Err(err) => return Err(DeviceError::Async(err)),
                }
                if start.elapsed() >= budget {
                    break;
                }
                std::hint::spin_loop();
            }
        }
        // A lone awaiter of an op predicted to outlast the spin: the engine wakes the task
        // shortly before the predicted end, so that its thread is awake when the work finishes.
        let early = engine
            .and_then(|_| policy.early_wake_after(others, predicted, budget))
            .map(|after| EarlySpin { from: start + after, until: start + after + policy.early_wake * 2 });
        let alarm = early.map(|e| super::engine::Alarm { at: e.from, waker: waker.clone() });
        let completion = OpCompletion::new();
        super::engine::watch(engine, &stream, wait, completion.clone(), alarm);
        Ok(State::Submitted(output, completion, solo, early))
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
            match Self::submit(op, target, cx.waker()) {
                Ok(State::Ready(out)) => return Poll::Ready(Ok(out)),
                Ok(st) => this.state = st,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        let State::Submitted(_, completion, _, early) = &mut this.state else {
            return Poll::Ready(Err(DeviceError::Misuse("DeviceFuture polled after completion".into())));
        };
        if completion.poll_complete(cx).is_pending() {
            // Woken by the early-wake alarm (or polled after it was due): spin for the last
            // stretch until the engine sees the work complete, within the window, once.
            match early.take() {
                Some(window) if Instant::now() >= window.from => {
                    while !completion.is_complete() && Instant::now() < window.until {
                        std::hint::spin_loop();
                    }
                    if !completion.is_complete() {
                        // Still running: the engine wakes the task (registered above) when done.
                        super::engine::EARLY_SPIN_MISSES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        return Poll::Pending;
                    }
                }
                not_yet => {
                    *early = not_yet;
                    return Poll::Pending;
                }
            }
        }
        let State::Submitted(out, completion, solo, early) =
            std::mem::replace(&mut this.state, State::Finished)
        else {
            return Poll::Pending;
        };
        // The error as the engine found it (the query or synchronisation that saw the failure).
        match completion.failure().cloned() {
            None => {
                if let Some(solo) = solo {
                    // `early` is still here only if the alarm never woke this task before the
                    // completion did.
                    solo.record(early.map(|w| w.from));
                }
                Poll::Ready(Ok(out))
            }
            Some(err) => Poll::Ready(Err(DeviceError::Async(err))),
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

#[cfg(test)]
mod tests {
    use super::solo_duration;
    use std::time::{Duration, Instant};

    #[test]
    fn a_missed_alarm_caps_the_next_prediction() {
        let start = Instant::now();
        let ms = |n: u64| start + Duration::from_micros(n);
        // Seen 3.16 ms after submission; the alarm for 3.06 ms never fired: record 3.06 ms, so
        // that the next alarm (100 µs before) comes at 2.96 ms.
        assert_eq!(solo_duration(start, ms(3160), Some(ms(3060))), Duration::from_micros(3060));
        // No alarm, or an alarm that fired (consumed): the observed duration.
        assert_eq!(solo_duration(start, ms(3160), None), Duration::from_micros(3160));
        // Seen before the alarm's time (the op was much shorter than predicted): the observation.
        assert_eq!(solo_duration(start, ms(500), Some(ms(3060))), Duration::from_micros(500));
    }
}
