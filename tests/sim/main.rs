//! The CPU simulator suite: the real device kernels on host threads, one module per subject.
//! `cargo test --test sim all_reduce` runs the AllReduce tests, `cargo test --test sim ll::`
//! the LL protocol's, and so on (libtest filters by `module::test` name).
//!
//! Tests that need an environment of their own (a forced protocol, more simulated GPUs, ...)
//! run alone in a child process started with it (`common::procs::isolated`); nothing here
//! changes the environment of this process.

#[path = "../common/mod.rs"]
mod common;

mod all_reduce;
mod cleanup;
mod copy_engine;
mod deterministic;
mod device_api;
mod device_ll;
mod device_multimem;
mod flow_control;
mod gin;
mod graphs;
mod groups;
mod kernel_filter;
mod ll;
mod ll128;
mod memory;
mod multinode;
mod multinode_faults;
mod multinode_work;
mod net_plugin;
mod net_plugin_gdr;
mod nvls;
mod one_rank;
mod onesided;
mod p2p_large;
mod p2p_patterns;
mod pat;
mod profiler;
mod profiler_proxy;
mod publisher;
mod register;
mod register_coll;
mod register_coll_procs;
mod register_coll_reduce;
mod register_reuse;
mod register_vmm;
mod rings;
mod send_recv;
mod shared_gpu;
mod shm;
mod slices;
#[cfg(feature = "capi")]
mod suspend;
mod symmetric;
mod symmetric_multimem;
mod tree;
mod tuning;
mod window_groups;
