#!/bin/sh
# Builds the workspace's API docs with working links between its crates, and fails on a broken
# intra-doc link.
#
# `cargo doc --workspace --no-deps` alone renders many cross-crate links as literal `[...]`: with
# `--no-deps` cargo runs rustdoc on the workspace crates concurrently, and rustdoc links to another
# crate only if that crate's doc folder exists when it starts (rust-lang/rust#106011,
# rust-lang/cargo#8487); which links break then depends on timing. Documenting the crates in
# dependency order avoids it; the last run adds the example and test crates.
# Extra arguments go to every `cargo doc` (e.g. `--open` is best left to the last one by hand).
set -eu
RUSTDOCFLAGS="${RUSTDOCFLAGS:-} -D rustdoc::broken_intra_doc_links -D rustdoc::private_intra_doc_links"
export RUSTDOCFLAGS
for p in cuda-core cuda-async kernels models; do
    cargo doc --no-deps -p "$p" "$@"
done
cargo doc --workspace --no-deps --exclude cuda-core --exclude cuda-async --exclude kernels --exclude models "$@"
