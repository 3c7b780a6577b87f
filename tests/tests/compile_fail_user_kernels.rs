//! Compile-fail suite of the user-kernel API (`cuda_async::kernel`): the misuses its types must
//! refuse, each with its expected compiler error under `tests/ui/`, plus a positive control.
//!
//! Needs no GPU. Regenerate the `.stderr` files with
//! `TRYBUILD=overwrite cargo test -p cuda-async-tests --test compile_fail_user_kernels` and review
//! them: each must show the intended error (the missing `unsafe`, a double `&mut` borrow, a
//! missing `BufferMut` or `GraphNode` bound, a write through `&`), not an unrelated one.

#[test]
fn compile_fail_user_kernels() {
    let t = trybuild::TestCases::new();
    for case in [
        "user_kernel_requires_vouch",
        "kernel_op_requires_unsafe",
        "user_kernel_output_twice",
        "user_kernel_arc_output",
        "user_kernel_shared_output",
        "user_kernel_input_is_output",
        "kernel_op_write_through_input",
        "user_kernel_lazy_alloc_not_graph_node",
        "interop_into_owner_unsynced_requires_unsafe",
    ] {
        t.compile_fail(format!("ui/{case}.rs"));
    }
    t.pass("ui/pass_user_kernel_graph_node.rs");
}
