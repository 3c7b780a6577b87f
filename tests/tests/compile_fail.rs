//! Compile-fail suite: misuses of the op API that the type system must refuse, each with its
//! expected compiler error under `tests/ui/`, plus a positive control that must compile.
//!
//! Needs no GPU (nothing is launched). Regenerate the `.stderr` files with
//! `TRYBUILD=overwrite cargo test -p cuda-async-tests --test compile_fail` and review them: each
//! must show the intended error (a missing `GraphNode`, `Send` or `BufferMut` bound, a use
//! after move, a borrow held by a graph or its replay, a mistyped parameter, a
//! module that is not `Replicable`), not an unrelated one.

#[test]
fn compile_fail() {
    let t = trybuild::TestCases::new();
    for case in [
        "alloc_op_not_graph_node",
        "launcher_lazy_alloc_arg_not_graph_node",
        "non_send_payload",
        "arc_as_output",
        "shared_borrow_as_output",
        "use_after_move_into_op",
        "graph_launch_outlives_graph",
        "graph_record_alloc",
        "graph_record_lazy_alloc_arg",
        "graph_capture_non_graph_node",
        "graph_launch_not_graph_node",
        "graph_scope_not_send",
        "graph_output_borrow",
        "graph_set_param_wrong_type",
        "graph_add_host_requires_unsafe",
        "launch_overlapped_requires_unsafe",
        "rope_attention_requires_unsafe",
        "gemv_output_aliases_input",
        "replicas_llama_model",
    ] {
        t.compile_fail(format!("ui/{case}.rs"));
    }
    t.pass("ui/pass_graph_node_ok.rs");
    t.pass("ui/pass_replicas_mlp.rs");
}
