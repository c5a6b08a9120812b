//! A mixture-of-experts dispatch and combine with device-API puts and signals
//! (`src/moe.rs`); across nodes with `--processes --nodes 2`.
//!
//! ```text
//! cargo run -p nccl-device-api-examples --example moe -- [NRANKS] [--processes [--nodes N]]
//! ```
fn main() -> Result<(), Box<dyn std::error::Error>> {
    nccl_device_api_examples::main_of(
        "device API MoE dispatch and combine",
        nccl_device_api_examples::moe::rank,
    )
}
