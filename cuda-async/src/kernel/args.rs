//! The sealed tuple traits of kernel arguments: input buffers, output buffers and scalars.
//!
//! Tuples of up to 8 buffer arguments (and up to 8 scalars) are supported; `()` means none.
//! Inputs are any [`IntoBufferOp`] (so `&buf`, `&mut buf`, an owned buffer, an `Arc`, or a lazy op
//! yielding one); outputs must yield a [`BufferMut`] (`&mut buf`, an owned buffer, or a lazy op
//! yielding one of these): an `Arc` or a `&` cannot be an output, and the same `&mut` cannot be
//! passed twice, so two outputs never alias and no input is written.

use crate::args::{BufferMut, BufferRef, IntoBufferOp};
use crate::combinators::{value, Value};
use crate::{DeviceOp, ExecutionContext, Op};
use cuda_core::memory::Access;
use cuda_core::{Allocation, DeviceBuffer, DeviceRepr, KernelArgs};
use std::ffi::c_void;
use std::sync::Arc;

mod sealed {
    pub trait Args<E> {}
    pub trait Bufs<E> {}
    pub trait Scalars {}
    pub trait Elems {}
}

/// A tuple of element types (`()`, `(f32,)`, `(f32, f64)`, ..): the buffers of one side of a
/// launch, as the launch sees them. Sealed.
pub trait Elems: sealed::Elems + 'static {
    /// The tuple of `&DeviceBuffer<_>` of these elements.
    type Refs<'a>;
    /// The tuple of `&mut DeviceBuffer<_>` of these elements.
    type Muts<'a>;
}
impl sealed::Elems for () {}
impl Elems for () {
    type Refs<'a> = ();
    type Muts<'a> = ();
}

/// One buffer of a launch, as the checks and the parameter list see it.
#[derive(Clone, Copy)]
pub(crate) struct BufParam<'a> {
    pub(crate) ptr: u64,
    pub(crate) len: usize,
    pub(crate) alloc: &'a Arc<Allocation>,
    pub(crate) access: Access,
}

/// One kernel parameter: a buffer (its device address is passed) or a scalar (passed by value).
pub(crate) enum Param<'a> {
    Buf(BufParam<'a>),
    Scalar(*mut c_void, std::marker::PhantomData<&'a ()>),
}

/// The kernel parameters of one launch, in the kernel's order: inputs, outputs, scalars.
#[derive(Default)]
#[doc(hidden)]
pub struct ParamList<'a> {
    pub(crate) params: Vec<Param<'a>>,
}

impl<'a> ParamList<'a> {
    fn push_buf<T: DeviceRepr>(&mut self, b: &'a DeviceBuffer<T>, access: Access) {
        self.params.push(Param::Buf(BufParam {
            ptr: b.device_ptr(),
            len: b.len(),
            alloc: b.allocation(),
            access,
        }));
    }

    /// The buffers, in order.
    pub(crate) fn buffers(&self) -> impl Iterator<Item = &BufParam<'a>> {
        self.params.iter().filter_map(|p| match p {
            Param::Buf(b) => Some(b),
            Param::Scalar(..) => None,
        })
    }

    /// `Ok` when every buffer lives on the device of `ctx`'s stream.
    pub(crate) fn check_devices(&self, op: &'static str, ctx: &ExecutionContext<'_>) -> crate::Result<()> {
        for b in self.buffers() {
            let dev = b.alloc.home_stream().device();
            if dev != ctx.device() {
                return Err(cuda_core::Error::DeviceMismatch {
                    during: op,
                    expected: ctx.device().ordinal(),
                    actual: dev.ordinal(),
                }
                .into());
            }
        }
        Ok(())
    }
}

// SAFETY: one pointer per parameter: a scalar's points to the value borrowed for 'a (alive during
// the call); a buffer's points to its device address, copied into `addrs`, which lives across `f`
// and is not moved while the pointers exist. Every buffer's allocation is handed over with its
// access (reads for inputs, writes for outputs).
unsafe impl KernelArgs for ParamList<'_> {
    fn with_params<R>(
        &self,
        f: impl FnOnce(&mut [*mut c_void], &[Option<(&Arc<Allocation>, Access)>]) -> R,
    ) -> R {
        let mut addrs: Vec<u64> = self
            .params
            .iter()
            .map(|p| match p {
                Param::Buf(b) => b.ptr,
                Param::Scalar(..) => 0,
            })
            .collect();
        let base = addrs.as_mut_ptr();
        let mut ptrs: Vec<*mut c_void> = self
            .params
            .iter()
            .enumerate()
            .map(|(i, p)| match p {
                // `i < addrs.len()`: `addrs` has one entry per parameter.
                Param::Buf(_) => base.wrapping_add(i).cast::<c_void>(),
                Param::Scalar(ptr, _) => *ptr,
            })
            .collect();
        let homes: Vec<_> = self.buffers().map(|b| Some((b.alloc, b.access))).collect();
        f(&mut ptrs, &homes)
    }
}

/// Converts a tuple of buffer arguments into the tuple op that executes them in order.
/// `E` is the tuple of their element types. Sealed: implemented for tuples of up to 8.
pub trait IntoInputs<E: Elems>: sealed::Args<E> {
    /// The handles the op yields.
    type Handles: InputBufs<E>;
    /// The op executing every argument op in order.
    type Op: DeviceOp<Output = Self::Handles>;
    /// Converts.
    fn into_inputs(self) -> Self::Op;
}

/// Converts a tuple of writable buffer arguments into the tuple op that executes them in order.
/// Sealed: implemented for tuples of up to 8 whose handles are [`BufferMut`].
pub trait IntoOutputs<E: Elems>: sealed::Args<E> {
    /// The handles the op yields (and the kernel op yields back).
    type Handles: OutputBufs<E>;
    /// The op executing every argument op in order.
    type Op: DeviceOp<Output = Self::Handles>;
    /// Converts.
    fn into_outputs(self) -> Self::Op;
}

/// Executed input handles: read access to every buffer. Sealed.
pub trait InputBufs<E: Elems>: Send + sealed::Bufs<E> {
    /// The buffers.
    fn refs(&self) -> E::Refs<'_>;
    #[doc(hidden)]
    fn push_params<'a>(&'a self, list: &mut ParamList<'a>);
}

/// Executed output handles: write access to every buffer. Sealed.
pub trait OutputBufs<E: Elems>: Send + sealed::Bufs<E> {
    /// The buffers, mutably.
    fn muts(&mut self) -> E::Muts<'_>;
    /// Pushes the buffers as [`BufferMut::buffer_mut`] gives them — the exclusive borrows, never
    /// [`BufferRef::buffer`]: a handle type of the user's may return another (shared) buffer from
    /// `buffer`, and writing through that would alias an input or a `&`/`Arc` buffer.
    #[doc(hidden)]
    fn push_params<'a>(&'a mut self, list: &mut ParamList<'a>);
}

/// A tuple of scalar kernel parameters (each a [`DeviceRepr`], passed by value), `()` for none.
/// Sealed: implemented for tuples of up to 8.
pub trait Scalars: Send + sealed::Scalars {
    #[doc(hidden)]
    fn push_params<'a>(&'a self, list: &mut ParamList<'a>);
}

// `()`: no buffers.
impl sealed::Args<()> for () {}
impl sealed::Bufs<()> for () {}
impl sealed::Scalars for () {}
impl IntoInputs<()> for () {
    type Handles = ();
    type Op = Op<Value<()>>;
    fn into_inputs(self) -> Self::Op {
        value(())
    }
}
impl IntoOutputs<()> for () {
    type Handles = ();
    type Op = Op<Value<()>>;
    fn into_outputs(self) -> Self::Op {
        value(())
    }
}
impl InputBufs<()> for () {
    fn refs(&self) {}
    fn push_params<'a>(&'a self, _: &mut ParamList<'a>) {}
}
impl OutputBufs<()> for () {
    fn muts(&mut self) {}
    fn push_params<'a>(&'a mut self, _: &mut ParamList<'a>) {}
}
impl Scalars for () {
    fn push_params<'a>(&'a self, _: &mut ParamList<'a>) {}
}

macro_rules! tuples {
    ($(($T:ident, $A:ident, $H:ident, $i:tt)),+) => {
        impl<$($T: DeviceRepr, $A: IntoBufferOp<$T>),+> sealed::Args<($($T,)+)> for ($($A,)+) {}
        impl<$($T: DeviceRepr, $H: BufferRef<$T>),+> sealed::Bufs<($($T,)+)> for ($($H,)+) {}
        impl<$($T: DeviceRepr, $A: IntoBufferOp<$T>),+> IntoInputs<($($T,)+)> for ($($A,)+) {
            type Handles = ($($A::Out,)+);
            type Op = ($($A::Op,)+);
            fn into_inputs(self) -> Self::Op {
                ($(self.$i.into_buffer_op(),)+)
            }
        }
        impl<$($T: DeviceRepr, $A: IntoBufferOp<$T>),+> IntoOutputs<($($T,)+)> for ($($A,)+)
        where
            $($A::Out: BufferMut<$T>,)+
        {
            type Handles = ($($A::Out,)+);
            type Op = ($($A::Op,)+);
            fn into_outputs(self) -> Self::Op {
                ($(self.$i.into_buffer_op(),)+)
            }
        }
        impl<$($T: DeviceRepr, $H: BufferRef<$T>),+> InputBufs<($($T,)+)> for ($($H,)+) {
            fn refs(&self) -> ($(&DeviceBuffer<$T>,)+) {
                ($(self.$i.buffer(),)+)
            }
            fn push_params<'a>(&'a self, list: &mut ParamList<'a>) {
                $(list.push_buf(self.$i.buffer(), Access::Read);)+
            }
        }
        impl<$($T: DeviceRepr, $H: BufferMut<$T>),+> OutputBufs<($($T,)+)> for ($($H,)+) {
            fn muts(&mut self) -> ($(&mut DeviceBuffer<$T>,)+) {
                ($(self.$i.buffer_mut(),)+)
            }
            fn push_params<'a>(&'a mut self, list: &mut ParamList<'a>) {
                $(list.push_buf(&*self.$i.buffer_mut(), Access::Write);)+
            }
        }
        impl<$($T: DeviceRepr),+> sealed::Scalars for ($($T,)+) {}
        impl<$($T: DeviceRepr),+> sealed::Elems for ($($T,)+) {}
        impl<$($T: DeviceRepr),+> Elems for ($($T,)+) {
            type Refs<'a> = ($(&'a DeviceBuffer<$T>,)+);
            type Muts<'a> = ($(&'a mut DeviceBuffer<$T>,)+);
        }
        impl<$($T: DeviceRepr),+> Scalars for ($($T,)+) {
            fn push_params<'a>(&'a self, list: &mut ParamList<'a>) {
                $(list.params.push(Param::Scalar(
                    (&self.$i as *const $T).cast_mut().cast::<c_void>(),
                    std::marker::PhantomData,
                ));)+
            }
        }
    };
}
tuples!((T0, A0, H0, 0));
tuples!((T0, A0, H0, 0), (T1, A1, H1, 1));
tuples!((T0, A0, H0, 0), (T1, A1, H1, 1), (T2, A2, H2, 2));
tuples!((T0, A0, H0, 0), (T1, A1, H1, 1), (T2, A2, H2, 2), (T3, A3, H3, 3));
tuples!((T0, A0, H0, 0), (T1, A1, H1, 1), (T2, A2, H2, 2), (T3, A3, H3, 3), (T4, A4, H4, 4));
tuples!((T0, A0, H0, 0), (T1, A1, H1, 1), (T2, A2, H2, 2), (T3, A3, H3, 3), (T4, A4, H4, 4), (T5, A5, H5, 5));
tuples!(
    (T0, A0, H0, 0),
    (T1, A1, H1, 1),
    (T2, A2, H2, 2),
    (T3, A3, H3, 3),
    (T4, A4, H4, 4),
    (T5, A5, H5, 5),
    (T6, A6, H6, 6)
);
tuples!(
    (T0, A0, H0, 0),
    (T1, A1, H1, 1),
    (T2, A2, H2, 2),
    (T3, A3, H3, 3),
    (T4, A4, H4, 4),
    (T5, A5, H5, 5),
    (T6, A6, H6, 6),
    (T7, A7, H7, 7)
);
