//! The argument checks the decoder launchers share ([`crate::llama`], [`crate::gemv`]): lengths,
//! overflow-free sizes, 32-bit kernel dimensions, and one device for every stream and buffer.

use cuda_core::{Device, Error, Result, Stream};

/// `Err(LengthMismatch)` unless `expected == actual`.
pub(crate) fn len_check(during: &'static str, expected: usize, actual: usize) -> Result<()> {
    if expected == actual {
        return Ok(());
    }
    Err(Error::LengthMismatch { during, expected, actual })
}

/// `a * b`, or an error if it overflows.
pub(crate) fn mul(a: usize, b: usize) -> Result<usize> {
    a.checked_mul(b).ok_or_else(|| Error::InvalidArgument(format!("{a} * {b} elements overflow")))
}

/// `v` as a kernel's `unsigned`, or an error naming `what`.
pub(crate) fn dim(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::InvalidArgument(format!("{what} = {v} exceeds u32::MAX")))
}

/// `Err(DeviceMismatch)` unless `stream` and every one of `devices` are `home`.
pub(crate) fn same_device(
    home: &Device,
    stream: &Stream,
    during: &'static str,
    devices: &[&Device],
) -> Result<()> {
    for d in std::iter::once(stream.device()).chain(devices.iter().copied()) {
        if d != home {
            return Err(Error::DeviceMismatch { during, expected: home.ordinal(), actual: d.ordinal() });
        }
    }
    Ok(())
}
