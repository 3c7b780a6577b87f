//! Synchronisation primitives, swapped for [`loom`](https://docs.rs/loom)'s model-checked
//! versions when building the loom test (`RUSTFLAGS="--cfg loom"`).
//!
//! `loom` is only a *dev*-dependency, so it is visible only to test builds: the switch is
//! `cfg(all(loom, test))`. The non-test library build under `--cfg loom` (the one an integration
//! test links against) keeps the std types; `tests/loom_completion.rs` therefore compiles
//! `runtime/completion.rs` and this file into itself with `#[path]`, where `cfg(test)` holds.
//!
//! The std [`UnsafeCell`] is wrapped to offer loom's closure-based `with`/`with_mut` API, so that
//! the code using it is identical under both configurations.

#[cfg(all(loom, test))]
pub(crate) use loom::{cell::UnsafeCell, sync::atomic, sync::Arc};

#[cfg(not(all(loom, test)))]
pub(crate) use std::sync::{atomic, Arc};

/// `std::cell::UnsafeCell` with loom's access API (`with` / `with_mut` hand out raw pointers;
/// dereferencing them is the caller's `unsafe` responsibility, exactly as with `UnsafeCell::get`).
#[cfg(not(all(loom, test)))]
#[derive(Debug, Default)]
pub(crate) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(all(loom, test)))]
impl<T> UnsafeCell<T> {
    /// Wraps `value`.
    pub(crate) const fn new(value: T) -> Self {
        Self(std::cell::UnsafeCell::new(value))
    }

    /// Runs `f` with a shared raw pointer to the contents.
    #[inline]
    #[allow(dead_code)] // kept for API parity with `loom::cell::UnsafeCell`
    pub(crate) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Runs `f` with a mutable raw pointer to the contents.
    #[inline]
    pub(crate) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}
