//! AllReduce kernels of one's own, one-shot and two-shot (`src/all_reduce.rs` says how they work);
//! `--bench` times it beside the library's AllReduce on symmetric windows.
//!
//! ```text
//! cargo run -p nccl-device-api-examples --example all_reduce -- [NRANKS] [--processes] [--bench]
//! ```
use nccl_device_api_examples::{all_reduce, main_of};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    match std::env::args().any(|a| a == "--bench") {
        true => main_of("device API one-shot AllReduce (bench)", all_reduce::bench),
        false => main_of("device API one-shot AllReduce", all_reduce::rank),
    }
}
