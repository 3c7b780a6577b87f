//! `shared`: run an op at most once and hand its output to many consumers.

use crate::{DeviceError, DeviceOp, ExecutionContext, Result};
use cuda_core::{Event, PooledEvent, Stream};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::ThreadId;

enum State<O: DeviceOp> {
    NotRun(O),
    /// A thread is executing the producer (it is registered as the owner in [`Waits`]).
    Running,
    Done {
        output: Arc<O::Output>,
        stream: Stream,
        event: Arc<PooledEvent>,
    },
    Failed(Arc<DeviceError>),
    Poisoned,
}

struct Inner<O: DeviceOp> {
    id: u64,
    state: Mutex<State<O>>,
    done: Condvar,
}

/// Who runs which shared producer, and which thread waits for which: the wait-for graph in which
/// a cycle would be a deadlock. Lock order: a shared op's `state`, then this.
#[derive(Default)]
struct Waits {
    owner: HashMap<u64, ThreadId>,
    waiting: HashMap<ThreadId, u64>,
}

fn waits() -> MutexGuard<'static, Waits> {
    static W: std::sync::OnceLock<Mutex<Waits>> = std::sync::OnceLock::new();
    W.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner())
}

/// A clone-able op that runs its inner op at most once, whichever clone is executed first, and
/// yields an `Arc` of the output to every clone. Built by [`crate::DeviceOpExt::shared`].
///
/// Guarantees:
/// - **At most once**, also when clones are executed from several threads at once: the first
///   execution runs the producer; the others wait for it (it only enqueues: no GPU work is waited
///   for) and then reuse the output.
/// - **No deadlock among shared ops.** A clone executed inside its own producer (directly, or
///   through other shared ops whose producers wait on each other across threads) would wait
///   forever; instead it fails with [`DeviceError::Lock`]. The check walks the wait-for graph of
///   shared producers. It sees only waits on shared ops: a producer that blocks the host on
///   something else (joins a thread, receives from a channel) which in turn executes a clone of
///   the same op waits forever, as with [`std::sync::OnceLock::get_or_init`].
/// - **Ordering:** a consumer on another stream than the producer's is ordered after the
///   producer's GPU work (an event recorded after it, waited on by the consumer's stream).
/// - If the producer fails, every consumer gets [`DeviceError::Shared`] with the error.
/// - A panic during the producer's execution leaves the op poisoned: consumers get an error.
///
/// ```no_run
/// # fn main() -> cuda_async::Result<()> {
/// use cuda_async::{memory, zip, DeviceOpExt};
/// let x = memory::from_host(vec![1.0f32; 4]).shared(); // uploaded at most once
/// let (a, b) = zip!(x.clone(), x).sync()?;
/// assert!(std::sync::Arc::ptr_eq(&a, &b));
/// # Ok(()) }
/// ```
pub struct Shared<O: DeviceOp>(Arc<Inner<O>>);

impl<O: DeviceOp> Clone for Shared<O> {
    fn clone(&self) -> Self {
        Shared(self.0.clone())
    }
}

impl<O: DeviceOp> Shared<O> {
    pub(crate) fn new(op: O) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        Shared(Arc::new(Inner {
            id: NEXT.fetch_add(1, Ordering::Relaxed),
            state: Mutex::new(State::NotRun(op)),
            done: Condvar::new(),
        }))
    }

    /// Whether the inner op has been executed (successfully or not) or is being executed.
    pub fn has_run(&self) -> bool {
        !matches!(*self.lock(), State::NotRun(_))
    }

    fn lock(&self) -> MutexGuard<'_, State<O>> {
        self.0.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Ends a producer's run: stores the outcome (poisoned if the producer unwound), forgets the owner
/// and wakes the waiters.
struct Finish<'a, O: DeviceOp> {
    inner: &'a Inner<O>,
    outcome: Option<State<O>>,
}

impl<O: DeviceOp> Drop for Finish<'_, O> {
    fn drop(&mut self) {
        let mut st = self.inner.state.lock().unwrap_or_else(|e| e.into_inner());
        *st = self.outcome.take().unwrap_or(State::Poisoned);
        waits().owner.remove(&self.inner.id);
        drop(st);
        self.inner.done.notify_all();
    }
}

impl<O> DeviceOp for Shared<O>
where
    O: DeviceOp,
    O::Output: Sync,
{
    type Output = Arc<O::Output>;

    fn execute(self, ctx: &ExecutionContext<'_>) -> Result<Arc<O::Output>> {
        let inner = &*self.0;
        let me = std::thread::current().id();
        let mut st = self.lock();
        loop {
            match std::mem::replace(&mut *st, State::Running) {
                State::NotRun(op) if ctx.stream().is_being_captured() => {
                    // Executed inside a capture, the op's work is only recorded (it runs when the
                    // graph is replayed, maybe never): its output must not be cached and handed to
                    // later users as if the work had run.
                    *st = State::NotRun(op);
                    return Err(cuda_core::Error::Capture(
                        "a shared op is first executed inside a stream capture (its work would only be recorded)",
                    )
                    .into());
                }
                State::NotRun(op) => {
                    waits().owner.insert(inner.id, me);
                    drop(st);
                    let mut finish = Finish { inner, outcome: None };
                    let produced = op.execute(ctx).and_then(|out| {
                        let event = Event::pooled(ctx.device())?;
                        event.record(ctx.stream())?;
                        Ok((out, event))
                    });
                    finish.outcome = Some(match produced {
                        Ok((out, event)) => State::Done {
                            output: Arc::new(out),
                            stream: ctx.stream().clone(),
                            event: Arc::new(event),
                        },
                        Err(e) => State::Failed(Arc::new(e)),
                    });
                    drop(finish);
                    st = self.lock();
                }
                State::Running => {
                    let mut w = waits();
                    let Some(&owner) = w.owner.get(&inner.id) else {
                        // The producer is finishing: its outcome is about to be stored.
                        drop(w);
                        st = inner.done.wait(st).unwrap_or_else(|e| e.into_inner());
                        continue;
                    };
                    // Walk the wait-for graph from the owner: reaching this thread is a deadlock.
                    let mut cur = owner;
                    loop {
                        if cur == me {
                            return Err(DeviceError::Lock(
                                "a shared op was executed inside its own producer (a wait cycle)",
                            ));
                        }
                        match w.waiting.get(&cur).and_then(|sid| w.owner.get(sid)) {
                            Some(&next) => cur = next,
                            None => break,
                        }
                    }
                    w.waiting.insert(me, inner.id);
                    drop(w);
                    st = inner.done.wait(st).unwrap_or_else(|e| e.into_inner());
                    waits().waiting.remove(&me);
                }
                other => {
                    *st = other;
                    break;
                }
            }
        }
        match &*st {
            State::Done { output, stream, event } => {
                if stream != ctx.stream() {
                    ctx.stream().wait_event(event)?;
                }
                Ok(output.clone())
            }
            State::Failed(e) => Err(DeviceError::Shared(e.clone())),
            State::Poisoned | State::NotRun(_) | State::Running => Err(DeviceError::Shared(Arc::new(
                DeviceError::Misuse("the shared op's producer panicked".into()),
            ))),
        }
    }
}
