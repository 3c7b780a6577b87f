//! `PerDevice<T>`: a lazily built value per device, kept for the life of the process.

use crate::device::Device;
use crate::error::{Error, Result};
use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Mutex;

thread_local! {
    /// The caches (by address) whose `init` this thread is running, holding their lock: a use of
    /// the same cache from inside its `init` would lock it again (found by review: a deadlock, or
    /// a panic of the standard mutex).
    static BUILDING: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// Takes `cache` off the thread's building list when the build ends (also by unwinding).
struct Building(usize);

impl Drop for Building {
    fn drop(&mut self) {
        let _ = BUILDING.try_with(|b| b.borrow_mut().retain(|&c| c != self.0));
    }
}

/// One value per device, built on first use by the caller's closure and kept for the rest of the
/// process (loaded kernels, per-device streams, handles of other libraries). The values are leaked
/// on purpose: modules must outlive every graph and launch that uses them, which process lifetime
/// guarantees. A failed build is not cached: the next call tries again.
///
/// ```no_run
/// use cuda_core::{Device, Function, PerDevice};
/// static KERNELS: PerDevice<Function> = PerDevice::new();
/// fn my_kernel(d: &Device) -> cuda_core::Result<&'static Function> {
///     KERNELS.get_or_try_init(d, || {
///         d.compile_module("k.cu", r#"extern "C" __global__ void k() {}"#, &[])?.function("k")
///     })
/// }
/// ```
pub struct PerDevice<T: 'static> {
    slots: Mutex<Option<HashMap<usize, &'static T>>>,
}

impl<T: Send + Sync + 'static> Default for PerDevice<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Send + Sync + 'static> PerDevice<T> {
    /// An empty cache (usable in a `static`).
    pub const fn new() -> Self {
        PerDevice { slots: Mutex::new(None) }
    }

    /// The value for `device`, built by `init` if there is none yet. `init` runs with the cache
    /// locked, so it runs at most once per device at a time; a use of this same cache from inside
    /// `init` is an error (`get` answers `None` there), not a deadlock.
    ///
    /// ```no_run
    /// # fn main() -> cuda_core::Result<()> {
    /// use cuda_core::{Device, PerDevice, Stream};
    /// static STREAMS: PerDevice<Stream> = PerDevice::new();
    /// let dev = Device::new(0)?;
    /// assert!(STREAMS.get(&dev).is_none());
    /// let s = STREAMS.get_or_try_init(&dev, || dev.new_stream())?;
    /// let again = STREAMS.get_or_try_init(&dev, || unreachable!("built once"))?;
    /// assert_eq!(s, again);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The error of `init`; [`Error::InvalidArgument`] when called from inside this cache's own
    /// `init`.
    pub fn get_or_try_init(&self, device: &Device, init: impl FnOnce() -> Result<T>) -> Result<&'static T> {
        if self.building_here() {
            return Err(Error::InvalidArgument(
                "PerDevice::get_or_try_init called from inside the same cache's init".into(),
            ));
        }
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        let map = slots.get_or_insert_with(HashMap::new);
        if let Some(v) = map.get(&device.ordinal()) {
            return Ok(v);
        }
        let me = self as *const Self as usize;
        let _ = BUILDING.try_with(|b| b.borrow_mut().push(me));
        let building = Building(me);
        let built = init();
        drop(building);
        let v: &'static T = Box::leak(Box::new(built?));
        map.insert(device.ordinal(), v);
        Ok(v)
    }

    /// The value for `device`, if it has been built (`None` from inside this cache's `init`).
    pub fn get(&self, device: &Device) -> Option<&'static T> {
        if self.building_here() {
            return None;
        }
        self.slots.lock().unwrap_or_else(|e| e.into_inner()).as_ref()?.get(&device.ordinal()).copied()
    }

    /// Whether this thread is running this cache's `init` (holding its lock).
    fn building_here(&self) -> bool {
        let me = self as *const Self as usize;
        // `try_with`: during the thread's teardown (a thread-local's destructor loading kernels)
        // the list is gone, and no build of this thread can be running then.
        BUILDING.try_with(|b| b.borrow().contains(&me)).unwrap_or(false)
    }
}
