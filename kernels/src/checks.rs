//! The argument checks the launchers share ([`crate::Kernels`], [`crate::llama`], [`crate::gemv`]):
//! lengths, overflow-free sizes, 32-bit kernel dimensions, launch-grid limits, and one device for
//! every stream and buffer.

use cuda_core::{Device, Error, LaunchConfig, Result, Stream};

/// The largest `gridDim.x` of a launch (`2^31 - 1`).
pub(crate) const MAX_GRID_X: usize = i32::MAX as usize;
/// The largest `gridDim.y` (and `gridDim.z`) of a launch.
pub(crate) const MAX_GRID_Y: usize = 65_535;

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

/// `Err(InvalidArgument)` naming `what`, its value and the limit unless `v <= max`.
pub(crate) fn at_most(during: &str, what: &str, v: usize, max: usize) -> Result<()> {
    if v <= max {
        return Ok(());
    }
    Err(Error::InvalidArgument(format!("{during}: {what} = {v} exceeds the limit of {max}")))
}

/// The launch configuration of a 1-D grid-stride kernel over `n` elements: blocks of `block`
/// threads, `ceil(n / block)` of them but at least 1 and at most `max_blocks` (itself at least 1
/// and at most [`MAX_GRID_X`]); the kernel's 64-bit loop covers the rest.
pub(crate) fn grid_stride(n: usize, block: u32, max_blocks: u32) -> LaunchConfig {
    let block = block.max(1);
    let cap = (max_blocks as usize).clamp(1, MAX_GRID_X);
    let blocks = n.div_ceil(block as usize).clamp(1, cap) as u32; // <= cap <= i32::MAX
    LaunchConfig { grid: (blocks, 1, 1), block: (block, 1, 1), shared_mem_bytes: 0 }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_stride_caps_the_grid_beyond_u32_elements() {
        // 2^40 elements: ceil(n / 256) = 2^32 blocks would not even fit a u32; capped instead.
        let cfg = grid_stride(1 << 40, 256, 4224);
        assert_eq!(cfg.grid, (4224, 1, 1));
        assert_eq!(cfg.block, (256, 1, 1));
        // Just over 2^32 elements, as the GPU boundary test uses.
        assert_eq!(grid_stride((1 << 32) + 5, 256, 4224).grid.0, 4224);
        // A cap above the hardware limit is clamped to it; a zero cap or zero elements give 1.
        assert_eq!(grid_stride(usize::MAX, 256, u32::MAX).grid.0 as usize, MAX_GRID_X);
        assert_eq!(grid_stride(1 << 20, 256, 0).grid.0, 1);
        assert_eq!(grid_stride(0, 256, 4224).grid.0, 1);
        // Below the cap: exactly ceil(n / block).
        assert_eq!(grid_stride(5 * 256 + 1, 256, 4224).grid.0, 6);
    }

    #[test]
    fn at_most_names_the_value_and_the_limit() {
        assert!(at_most("k", "rows", 65_535, MAX_GRID_Y).is_ok());
        let e = at_most("k", "rows", 65_536, MAX_GRID_Y).unwrap_err().to_string();
        assert!(e.contains("rows = 65536") && e.contains("65535"), "{e}");
    }

    #[test]
    fn dim_refuses_what_does_not_fit_u32() {
        assert_eq!(dim(u32::MAX as usize, "n").ok(), Some(u32::MAX));
        assert!(dim(u32::MAX as usize + 1, "n").is_err());
    }
}
