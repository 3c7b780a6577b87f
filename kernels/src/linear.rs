//! The fully connected layer ([`Kernels::linear`], lazy form [`crate::ops::linear`]), checked
//! against a [`LinearShape`].

use crate::{checks, Element, Kernels, BLOCK};
use cuda_core::{DeviceBuffer, Error, LaunchConfig, Result, Stream};

/// CUDA C source of the fully connected layer kernel ([`Kernels::linear`]).
pub const LINEAR_SRC: &str = include_str!("../cuda/linear.cu");

impl Kernels {
    /// A fully connected layer: `y[r, o] = act(b[o] + sum_i x[r, i] * w[o, i])` for every row
    /// `r < shape.batch` and output feature `o < shape.out_dim`, with `act` = ReLU (`max(0, .)`)
    /// when `shape.relu`, else the identity. Row-major `x[batch][in_dim]`, `w[out_dim][in_dim]`
    /// (PyTorch's `nn.Linear` layout), `b[out_dim]`, `y[batch][out_dim]`. Accumulates in `T`
    /// (`f32` for `f32`).
    ///
    /// Checks, before launching anything: the stream and the four buffers are on these kernels'
    /// device ([`Error::DeviceMismatch`]); every dimension is at most `i32::MAX` and the element counts do
    /// not overflow ([`Error::InvalidArgument`]); `x.len() == batch * in_dim`,
    /// `w.len() == out_dim * in_dim`, `b.len() == out_dim` and `y.len() == batch * out_dim`
    /// ([`Error::LengthMismatch`]). With `batch == 0` or `out_dim == 0` nothing is launched; with
    /// `in_dim == 0`, `y` gets the (activated) bias.
    ///
    /// One warp computes one output feature for a tile of up to four rows (see
    /// `cuda/linear.cu`); every element of `y` is written exactly once, nothing else is.
    pub fn linear<T: Element>(
        &self,
        stream: &Stream,
        x: &DeviceBuffer<T>,
        w: &DeviceBuffer<T>,
        b: &DeviceBuffer<T>,
        y: &mut DeviceBuffer<T>,
        shape: LinearShape,
    ) -> Result<()> {
        const DURING: &str = "linear kernel";
        let lens = shape.lens()?;
        self.check(stream, DURING, &[lens.y])?; // the stream's device (one length: always agrees)
        for buf_device in [x.device(), w.device(), b.device(), y.device()] {
            if buf_device != stream.device() {
                return Err(Error::DeviceMismatch {
                    during: DURING,
                    expected: stream.device().ordinal(),
                    actual: buf_device.ordinal(),
                });
            }
        }
        for (during, expected, actual) in [
            ("linear kernel: x must hold batch * in_dim elements", lens.x, x.len()),
            ("linear kernel: w must hold out_dim * in_dim elements", lens.w, w.len()),
            ("linear kernel: b must hold out_dim elements", lens.b, b.len()),
            ("linear kernel: y must hold batch * out_dim elements", lens.y, y.len()),
        ] {
            if expected != actual {
                return Err(Error::LengthMismatch { during, expected, actual });
            }
        }
        if shape.batch == 0 || shape.out_dim == 0 {
            return Ok(());
        }
        let warps = BLOCK / 32;
        // Dimensions are <= i32::MAX (checked by `lens`), so these fit in u32 (checked anyway).
        let blocks_x = checks::dim(shape.out_dim.div_ceil(warps as usize), "linear kernel blocks")?;
        let tiles = shape.batch.div_ceil(LINEAR_ROWS);
        let cfg = LaunchConfig {
            grid: (blocks_x, checks::dim(tiles.min(checks::MAX_GRID_Y), "linear kernel tiles")?, 1),
            block: (BLOCK, 1, 1),
            shared_mem_bytes: 0,
        };
        let (batch, in_dim, out_dim) = (
            checks::dim(shape.batch, "linear kernel batch")?,
            checks::dim(shape.in_dim, "linear kernel in_dim")?,
            checks::dim(shape.out_dim, "linear kernel out_dim")?,
        );
        // SAFETY: matches `linear_<T>(const T* x, const T* w, const T* b, T* y, unsigned batch,
        // unsigned in_dim, unsigned out_dim, int relu)`. The lengths of all four buffers were
        // checked against the dimensions above, and the kernel reads x[0..batch*in_dim],
        // w[0..out_dim*in_dim], b[0..out_dim] and writes only y[0..batch*out_dim] (rows tiled by
        // LINEAR_ROWS, the same constant as the kernel's; any grid is correct); `y` is borrowed
        // mutably, so it aliases none of the inputs. BLOCK is a multiple of 32, as the kernel needs.
        unsafe {
            T::kernels(self).linear.launch(
                stream,
                cfg,
                (x, w, b, y, batch, in_dim, out_dim, i32::from(shape.relu)),
            )
        }
    }
}

/// Batch rows per warp tile of the linear kernel (`LINEAR_ROWS` in `cuda/linear.cu`).
const LINEAR_ROWS: usize = 4;

/// The dimensions of a fully connected layer ([`Kernels::linear`], [`crate::ops::linear`]): `batch` rows
/// of `in_dim` inputs mapped to `out_dim` outputs, with ReLU applied to the outputs when `relu`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LinearShape {
    /// Rows of `x` and `y`.
    pub batch: usize,
    /// Features per input row (columns of `x` and of `w`).
    pub in_dim: usize,
    /// Features per output row (rows of `w`, elements of `b`, columns of `y`).
    pub out_dim: usize,
    /// Whether ReLU is applied to the outputs.
    pub relu: bool,
}

/// The element counts a [`LinearShape`] requires of its four buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinearLens {
    /// `batch * in_dim`.
    pub x: usize,
    /// `out_dim * in_dim`.
    pub w: usize,
    /// `out_dim`.
    pub b: usize,
    /// `batch * out_dim`.
    pub y: usize,
}

impl LinearShape {
    /// The element counts of `x`, `w`, `b` and `y`, or [`Error::InvalidArgument`] when a
    /// dimension exceeds `i32::MAX` (the kernel's index arithmetic) or a count overflows `usize`.
    pub fn lens(&self) -> Result<LinearLens> {
        let limit = i32::MAX as usize;
        if self.batch > limit || self.in_dim > limit || self.out_dim > limit {
            return Err(Error::InvalidArgument(format!(
                "linear layer {self:?}: every dimension must be at most {limit}"
            )));
        }
        let mul = |a: usize, b: usize| {
            a.checked_mul(b).ok_or_else(|| {
                Error::InvalidArgument(format!("linear layer {self:?}: {a} * {b} elements overflow"))
            })
        };
        Ok(LinearLens {
            x: mul(self.batch, self.in_dim)?,
            w: mul(self.out_dim, self.in_dim)?,
            b: self.out_dim,
            y: mul(self.batch, self.out_dim)?,
        })
    }
}
