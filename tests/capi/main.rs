//! The library from outside: the C ABI (`capi` feature: C programs compiled against
//! include/nccl.h, and garbage handles), NCCL's logging, the examples, the benchmark's reading
//! of launchers' environments, and the CUDA backend without a GPU.

#[path = "../common/mod.rs"]
mod common;

mod bench_launch_env;
#[cfg(all(feature = "capi", feature = "internals"))]
mod collectives;
mod debug_log;
mod examples;
#[cfg(feature = "capi")]
mod handles;
mod no_gpu;
#[cfg(feature = "capi")]
mod programs;
