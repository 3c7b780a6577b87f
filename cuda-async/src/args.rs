//! Buffer arguments of ops: borrowed, owned, shared, or produced by a lazy op.
//!
//! Launchers and memory ops take any [`IntoBufferOp`]: `&DeviceBuffer<T>` (input), `&mut
//! DeviceBuffer<T>` (output), an owned `DeviceBuffer<T>`, an `Arc<DeviceBuffer<T>>`, or an
//! [`Op`] whose output is one of these (executed first, on the same stream). Inputs need
//! [`BufferRef`], outputs [`BufferMut`] (`&mut` or owned: never an `Arc` or `&`, so no two
//! writers and no reader during a write). An op taking arguments is a [`crate::GraphNode`] only if
//! every argument's op is one, so a lazily allocated argument cannot slip into a graph.

use crate::combinators::{value, Value};
use crate::{DeviceOp, Op};
use cuda_core::{DeviceBuffer, DeviceRepr};
use std::sync::Arc;

/// Read access to a device buffer held in some form.
pub trait BufferRef<T: DeviceRepr>: Send {
    /// The buffer.
    fn buffer(&self) -> &DeviceBuffer<T>;
}

/// Write access to a device buffer held in some form.
pub trait BufferMut<T: DeviceRepr>: BufferRef<T> {
    /// The buffer, mutably.
    fn buffer_mut(&mut self) -> &mut DeviceBuffer<T>;
}

impl<T: DeviceRepr> BufferRef<T> for &DeviceBuffer<T> {
    fn buffer(&self) -> &DeviceBuffer<T> {
        self
    }
}
impl<T: DeviceRepr> BufferRef<T> for &mut DeviceBuffer<T> {
    fn buffer(&self) -> &DeviceBuffer<T> {
        self
    }
}
impl<T: DeviceRepr> BufferMut<T> for &mut DeviceBuffer<T> {
    fn buffer_mut(&mut self) -> &mut DeviceBuffer<T> {
        self
    }
}
impl<T: DeviceRepr> BufferRef<T> for DeviceBuffer<T> {
    fn buffer(&self) -> &DeviceBuffer<T> {
        self
    }
}
impl<T: DeviceRepr> BufferMut<T> for DeviceBuffer<T> {
    fn buffer_mut(&mut self) -> &mut DeviceBuffer<T> {
        self
    }
}
impl<T: DeviceRepr> BufferRef<T> for Arc<DeviceBuffer<T>> {
    fn buffer(&self) -> &DeviceBuffer<T> {
        self
    }
}

/// Anything that can be turned into an op producing a buffer handle.
pub trait IntoBufferOp<T: DeviceRepr> {
    /// The handle the op produces.
    type Out: BufferRef<T>;
    /// The op.
    type Op: DeviceOp<Output = Self::Out>;
    /// Converts.
    fn into_buffer_op(self) -> Self::Op;
}

macro_rules! direct_arg {
    ($($t:ty),*) => {$(
        impl<'a, T: DeviceRepr> IntoBufferOp<T> for $t {
            type Out = $t;
            type Op = Op<Value<$t>>;
            #[inline]
            fn into_buffer_op(self) -> Self::Op {
                value(self)
            }
        }
    )*};
}
direct_arg!(&'a DeviceBuffer<T>, &'a mut DeviceBuffer<T>, DeviceBuffer<T>, Arc<DeviceBuffer<T>>);

impl<T: DeviceRepr, X> IntoBufferOp<T> for Op<X>
where
    X: DeviceOp,
    X::Output: BufferRef<T>,
{
    type Out = X::Output;
    type Op = Op<X>;
    #[inline]
    fn into_buffer_op(self) -> Self::Op {
        self
    }
}
