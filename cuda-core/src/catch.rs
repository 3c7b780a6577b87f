//! Running user code that may panic, on a thread that must survive it (the reaper, a graph's
//! host-node trampoline).

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Runs `f`; a panic ends `f`, never the caller. The panic's payload is dropped under a second
/// catch and forgotten if its own `Drop` panics too (`std::panic::panic_any` of a value whose
/// `Drop` panics): `let _ = catch_unwind(f)` drops that payload outside any catch, and its panic
/// would unwind past the caller: out of the reaper's loop (dropping the channel's receiver, so
/// every queued value before its work completed), or out of an `extern "C"` trampoline (an
/// abort).
pub(crate) fn catch_all(f: impl FnOnce()) {
    if let Err(payload) = catch_unwind(AssertUnwindSafe(f)) {
        if let Err(again) = catch_unwind(AssertUnwindSafe(move || drop(payload))) {
            std::mem::forget(again);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// A panic payload whose own `Drop` panics.
    struct Bomb;
    impl Drop for Bomb {
        fn drop(&mut self) {
            panic!("the payload's Drop panics too");
        }
    }

    #[test]
    fn a_payload_whose_drop_panics_does_not_unwind_past_the_caller() {
        let ran = Arc::new(AtomicBool::new(false));
        let r = ran.clone();
        let outer = catch_unwind(AssertUnwindSafe(move || {
            catch_all(move || {
                r.store(true, Ordering::SeqCst);
                std::panic::panic_any(Bomb);
            })
        }));
        assert!(ran.load(Ordering::SeqCst));
        assert!(outer.is_ok(), "catch_all unwound past its caller");
    }

    #[test]
    fn an_ordinary_panic_and_no_panic() {
        catch_all(|| panic!("plain"));
        let mut x = 0;
        catch_all(|| x = 1);
        assert_eq!(x, 1);
    }
}
