//! Put bandwidth and round trip between two ranks (`src/ping.rs`); across two nodes through
//! GIN with `2 --processes --nodes 2`. `GIN_BENCH_MAX_BYTES` caps the sizes (256 MiB).
//!
//! ```text
//! cargo run --release -p nccl-device-api-examples --example put_bench -- 2 --processes --nodes 2
//! ```
fn main() -> Result<(), Box<dyn std::error::Error>> {
    nccl_device_api_examples::main_of(
        "device API put benchmark",
        nccl_device_api_examples::ping::rank,
    )
}
