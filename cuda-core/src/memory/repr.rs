//! Element types that may live in device memory.

/// A plain-old-data type that can be copied to and from the device bit for bit.
///
/// # Safety
/// Implementors must be `Copy`, contain no pointers to host memory, have no padding bytes that
/// would be read, and every bit pattern of `size_of::<Self>()` bytes must be a valid value (device
/// memory written by a kernel is copied back into `Self` without any check).
pub unsafe trait DeviceRepr: Copy + Send + Sync + 'static {}

macro_rules! impl_repr {
    ($($t:ty),*) => {$(
        // SAFETY: primitive numeric type: no padding, no pointers, every bit pattern is valid.
        unsafe impl DeviceRepr for $t {}
    )*};
}
impl_repr!(u8, i8, u16, i16, u32, i32, u64, i64, u128, i128, usize, isize, f32, f64);

// SAFETY: 16-bit IEEE binary16 / bfloat16 (`half`): `#[repr(transparent)]` over `u16`, every bit
// pattern is a valid value (NaNs included).
unsafe impl DeviceRepr for half::f16 {}
// SAFETY: as above.
unsafe impl DeviceRepr for half::bf16 {}
