//! Compiles the kernel crate (`kernels/`) to PTX for the GPUs this build is for:
//! `$OUT_DIR/kernels_ptx.rs`, which `src/lib.rs` includes.
fn main() {
    nccl_kernel_build::build_kernels("kernels");
}
