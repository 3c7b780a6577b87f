//! Loom model-checking of `cuda_async`'s completion core (`src/runtime/completion.rs`).
//!
//! Run with:
//!
//! ```text
//! RUSTFLAGS="--cfg loom" cargo test -p cuda-async --release --test loom_completion
//! ```
//!
//! The models are small enough to be checked exhaustively (no preemption bound) in a few
//! seconds. If they grow, bound the search with `LOOM_MAX_PREEMPTIONS=3` in the environment.
//!
//! `loom` is a dev-dependency, so the library itself (built without `cfg(test)` for integration
//! tests) cannot use it. This test therefore compiles the module sources into itself, where
//! `crate::sync_shim` resolves to the `#[path]` module below and `cfg(all(loom, test))` selects the
//! loom primitives.
#![cfg(loom)]

#[path = "../src/sync_shim.rs"]
mod sync_shim;

#[path = "../src/runtime/completion.rs"]
mod completion;

use completion::Completion;
use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use loom::sync::Arc;
use loom::thread;
use std::task::{Context, Poll, Wake, Waker};

/// A waker counting its wake-ups in a loom atomic (held in a std `Arc`, as `Wake` requires).
struct CountingWaker(AtomicUsize);

impl Wake for CountingWaker {
    fn wake(self: std::sync::Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &std::sync::Arc<Self>) {
        self.0.fetch_add(1, SeqCst);
    }
}

fn counting_waker() -> (std::sync::Arc<CountingWaker>, Waker) {
    let counter = std::sync::Arc::new(CountingWaker(AtomicUsize::new(0)));
    let waker = Waker::from(counter.clone());
    (counter, waker)
}

fn wakes(c: &CountingWaker) -> usize {
    c.0.load(SeqCst)
}

/// Spawns a completer that writes `42` into non-atomic data, then completes.
fn spawn_completer(c: &Arc<Completion>) -> (Arc<UnsafeCell<u32>>, thread::JoinHandle<()>) {
    let data = Arc::new(UnsafeCell::new(0u32));
    let (c2, d2) = (c.clone(), data.clone());
    let handle = thread::spawn(move || {
        // SAFETY: the only other access is a read after completion was observed, which
        // `complete`'s Release / the poll's Acquire order after this write (loom checks it).
        d2.with_mut(|p| unsafe { *p = 42 });
        c2.complete();
    });
    (data, handle)
}

/// Reads the completer's data; loom reports a data race if completion did not order it.
fn assert_data_visible(data: &UnsafeCell<u32>) {
    // SAFETY: see `spawn_completer`.
    data.with(|p| assert_eq!(unsafe { *p }, 42));
}

/// (1a) Completer vs a poller that registers a waker once: the poller either sees `Ready` (and
/// the completer's data) or is woken exactly once.
#[test]
fn completer_vs_registering_poller() {
    loom::model(|| {
        let c = Completion::new();
        let (data, completer) = spawn_completer(&c);

        let (counter, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        let ready = c.poll_complete(&mut cx).is_ready();
        if ready {
            assert_data_visible(&data);
        }
        completer.join().unwrap();

        assert_eq!(wakes(&counter), usize::from(!ready));
        assert!(c.is_complete());
        assert!(c.poll_complete(&mut cx).is_ready());
        assert_data_visible(&data);
    });
}

/// Wakes by unparking a loom thread.
struct Unparker(thread::Thread);

impl Wake for Unparker {
    fn wake(self: std::sync::Arc<Self>) {
        self.0.unpark();
    }
}

/// A minimal `block_on`: poll, park until woken, repeat. If a wake-up were lost, the thread
/// would stay parked forever and loom would report a deadlock.
fn block_on_completion<E>(c: &Completion<E>) {
    let waker = Waker::from(std::sync::Arc::new(Unparker(thread::current())));
    let mut cx = Context::from_waker(&waker);
    while c.poll_complete(&mut cx).is_pending() {
        thread::park();
    }
}

/// (1b) The same race with a poller that parks until woken (an executor in miniature): a lost
/// wake-up shows up as a loom deadlock. The data read is ordered only by the completion protocol.
#[test]
fn completer_vs_parking_poller() {
    loom::model(|| {
        let c = Completion::new();
        let (data, completer) = spawn_completer(&c);
        block_on_completion(&c);
        assert_data_visible(&data);
        completer.join().unwrap();
    });
}

/// (2) Completer vs a poller that registers a waker and then replaces it twice. Only the waker
/// of the last `Pending` poll may be relied on; at most one wake happens in total; and if the last
/// poll returned `Pending`, exactly its waker is woken.
#[test]
fn completer_vs_poller_replacing_waker_twice() {
    loom::model(|| {
        let c = Completion::new();
        let (data, completer) = spawn_completer(&c);

        let wakers = [counting_waker(), counting_waker(), counting_waker()];
        let mut results = Vec::new();
        for (_, waker) in &wakers {
            let r = c.poll_complete(&mut Context::from_waker(waker));
            results.push(r);
            if r.is_ready() {
                assert_data_visible(&data);
                break;
            }
        }
        completer.join().unwrap();

        let counts: Vec<usize> = wakers.iter().map(|(c, _)| wakes(c)).collect();
        assert!(counts.iter().sum::<usize>() <= 1, "woken twice: {counts:?}");
        let last = results.len() - 1;
        if results[last].is_pending() {
            // All three polls were pending: only the final waker is woken.
            assert_eq!(counts, [0, 0, 1]);
        } else {
            // Only a waker that was replaced *before* the Ready poll may have been woken.
            assert!(counts[last..].iter().all(|&n| n == 0), "{counts:?}");
        }
        assert!(c.is_complete());
    });
}

/// (3) Two completers vs a registering poller: exactly one wake-up or `Ready`, never two.
#[test]
fn double_complete() {
    loom::model(|| {
        let c = Completion::<()>::new();
        let c1 = c.clone();
        let c2 = c.clone();
        let t1 = thread::spawn(move || c1.complete());
        let t2 = thread::spawn(move || c2.complete());

        let (counter, waker) = counting_waker();
        let mut cx = Context::from_waker(&waker);
        let ready = c.poll_complete(&mut cx).is_ready();
        t1.join().unwrap();
        t2.join().unwrap();

        assert_eq!(wakes(&counter), usize::from(!ready));
        assert!(c.poll_complete(&mut cx) == Poll::Ready(()));
        assert_eq!(Arc::strong_count(&c), 1);
    });
}

/// (3b) Two failing completers vs a parking poller: the poller that observed completion sees
/// one of the two failures (the boxed value is published by the completion), which stays the same
/// after both completers returned; the other is dropped.
#[test]
fn failing_completers_vs_poller() {
    loom::model(|| {
        let c = Completion::<u32>::new();
        let c1 = c.clone();
        let c2 = c.clone();
        let t1 = thread::spawn(move || c1.fail(1));
        let t2 = thread::spawn(move || c2.fail(2));

        block_on_completion(&c);
        let failure = c.failure().copied();
        assert!(matches!(failure, Some(1) | Some(2)), "{failure:?}");
        t1.join().unwrap();
        t2.join().unwrap();
        // The first failure stored is kept: a later completer's is dropped.
        assert_eq!(c.failure().copied(), failure);
    });
}

/// (4) Two pollers (two tasks sharing one `Completion`, outside the intended single-waiter use)
/// vs the completer: loom checks that the waker slot is never accessed concurrently and nothing
/// panics. Only one waker is stored, so a waker replaced by the other task's poll is
/// legitimately never woken; but if *both* polls returned `Pending`, the last registered waker
/// (or the immediate self-wake of a poll that found the slot busy) must fire.
#[test]
fn two_pollers_vs_completer() {
    loom::model(|| {
        let c = Completion::<()>::new();
        let c1 = c.clone();
        let completer = thread::spawn(move || c1.complete());
        let c2 = c.clone();
        let other = thread::spawn(move || {
            let (counter, waker) = counting_waker();
            let pending = c2.poll_complete(&mut Context::from_waker(&waker)).is_pending();
            (pending, counter)
        });

        let (counter, waker) = counting_waker();
        let pending = c.poll_complete(&mut Context::from_waker(&waker)).is_pending();
        let (other_pending, other_counter) = other.join().unwrap();
        completer.join().unwrap();

        let woken = wakes(&counter) + wakes(&other_counter);
        if pending && other_pending {
            assert!(woken >= 1);
        }
        assert!(woken <= 2);
        assert!(c.poll_complete(&mut Context::from_waker(&waker)).is_ready());
    });
}
