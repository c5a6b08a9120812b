//! A fused AllReduce + scale + residual add kernel of one's own (`src/fused.rs`).
//!
//! ```text
//! cargo run -p nccl-device-api-examples --example fused -- [NRANKS] [--processes]
//! ```
fn main() -> Result<(), Box<dyn std::error::Error>> {
    nccl_device_api_examples::main_of(
        "device API fused AllReduce + scale + residual",
        nccl_device_api_examples::fused::rank,
    )
}
