//! The per-CTA copy ceilings of a plain copy kernel and of `cuMemcpyDtoDAsync`
//! (`src/copy_rate.rs`), the numbers the library's data movers are measured against.
//!
//! ```text
//! cargo run --release -p nccl-device-api-examples --example copy_rate -- 1
//! ```
fn main() -> Result<(), Box<dyn std::error::Error>> {
    nccl_device_api_examples::main_of("copy ceilings", nccl_device_api_examples::copy_rate::rank)
}
