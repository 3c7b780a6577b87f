//! `shared`: run an op at most once and hand its output to many consumers.

use crate::{DeviceError, DeviceOp, ExecutionContext, Op, Result};
use cuda_core::{Event, PooledEvent, Stream};
use std::sync::{Arc, Mutex};

enum State<O: DeviceOp> {
    NotRun(O),
    Done { output: Arc<O::Output>, stream: Stream, event: Arc<PooledEvent> },
    Failed(Arc<DeviceError>),
    Poisoned,
}

/// A clone-able op that runs its inner op at most once, whichever clone is executed first, and
/// yields an `Arc` of the output to every clone. Built by [`crate::DeviceOpExt::shared`].
///
/// Guarantees:
/// - **At most once**, also when clones are executed from several threads at once: the first
///   execution holds a mutex while it enqueues the inner op; the others wait for it and then reuse
///   the output. (Enqueueing is fast; no GPU work is waited for under the mutex.)
/// - **Ordering:** a consumer on another stream than the producer's is ordered after the
///   producer's GPU work (an event recorded after it, waited on by the consumer's stream).
/// - If the producer fails, every consumer gets [`DeviceError::Shared`] with the error.
/// - A panic during the producer's execution leaves the op poisoned: consumers get an error.
pub struct Shared<O: DeviceOp>(Arc<Mutex<State<O>>>);

impl<O: DeviceOp> Clone for Shared<O> {
    fn clone(&self) -> Self {
        Shared(self.0.clone())
    }
}

impl<O: DeviceOp> Shared<O> {
    pub(crate) fn new(op: O) -> Self {
        Shared(Arc::new(Mutex::new(State::NotRun(op))))
    }

    /// Whether the inner op has been executed (successfully or not).
    pub fn has_run(&self) -> bool {
        !matches!(*self.0.lock().unwrap_or_else(|e| e.into_inner()), State::NotRun(_))
    }
}

impl<O> DeviceOp for Shared<O>
where
    O: DeviceOp,
    O::Output: Sync,
{
    type Output = Arc<O::Output>;

    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<Arc<O::Output>> {
        let mut st = self.0.lock().unwrap_or_else(|e| e.into_inner());
        // Poisoned stays behind if the producer panics while we run it.
        *st = match std::mem::replace(&mut *st, State::Poisoned) {
            State::NotRun(op) => match op.execute(ctx).and_then(|out| {
                let event = Event::pooled(ctx.device())?;
                event.record(ctx.stream())?;
                Ok((out, event))
            }) {
                Ok((out, event)) => State::Done {
                    output: Arc::new(out),
                    stream: ctx.stream().clone(),
                    event: Arc::new(event),
                },
                Err(e) => State::Failed(Arc::new(e)),
            },
            other => other,
        };
        match &*st {
            State::Done { output, stream, event } => {
                if stream != ctx.stream() {
                    ctx.stream().wait_event(event)?;
                }
                Ok(output.clone())
            }
            State::Failed(e) => Err(DeviceError::Shared(e.clone())),
            State::Poisoned | State::NotRun(_) => Err(DeviceError::Shared(Arc::new(
                DeviceError::Scheduling("the shared op's producer panicked".into()),
            ))),
        }
    }
}

/// The left half of [`crate::DeviceOpExt::unzip`].
pub struct UnzipLeft<O: DeviceOp>(Shared<O>);
/// The right half of [`crate::DeviceOpExt::unzip`].
pub struct UnzipRight<O: DeviceOp>(Shared<O>);

pub(crate) fn unzip<O, A, B>(op: O) -> (Op<UnzipLeft<O>>, Op<UnzipRight<O>>)
where
    O: DeviceOp<Output = (A, B)>,
    A: Send + Sync + Clone,
    B: Send + Sync + Clone,
{
    let s = Shared::new(op);
    (Op(UnzipLeft(s.clone())), Op(UnzipRight(s)))
}

impl<O, A, B> DeviceOp for UnzipLeft<O>
where
    O: DeviceOp<Output = (A, B)>,
    A: Send + Sync + Clone,
    B: Send + Sync + Clone,
{
    type Output = A;
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<A> {
        Ok(self.0.execute(ctx)?.0.clone())
    }
}

impl<O, A, B> DeviceOp for UnzipRight<O>
where
    O: DeviceOp<Output = (A, B)>,
    A: Send + Sync + Clone,
    B: Send + Sync + Clone,
{
    type Output = B;
    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<B> {
        Ok(self.0.execute(ctx)?.1.clone())
    }
}
