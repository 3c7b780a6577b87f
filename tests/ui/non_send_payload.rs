// Ops must be Send (their futures move between executor threads): neither a non-Send value, nor a
// closure capturing one, nor a user op type holding one can become an op.

use cuda_async::{DeviceOp, DeviceOpExt, ExecutionContext};
use std::rc::Rc;

fn value_of_rc() {
    let _ = cuda_async::value(Rc::new(1u32)).sync();
}

fn map_capturing_rc() {
    let rc = Rc::new(2u32);
    let _ = cuda_async::value(1u32).map(move |v| v + *rc).sync();
}

struct RcOp(Rc<u32>);

impl DeviceOp for RcOp {
    type Output = u32;
    fn execute(self, _: &ExecutionContext<'_>) -> cuda_async::Result<u32> {
        Ok(*self.0)
    }
}

fn main() {
    value_of_rc();
    map_capturing_rc();
}
