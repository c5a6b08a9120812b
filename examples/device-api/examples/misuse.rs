//! A kernel that misuses the device API, and what its rank learns (`src/misuse.rs`). On a GPU
//! the trap ends the process's context: run it on its own.
//!
//! ```text
//! cargo run -p nccl-device-api-examples --example misuse -- [NRANKS] [--processes]
//! ```
fn main() -> Result<(), Box<dyn std::error::Error>> {
    nccl_device_api_examples::main_of(
        "device API misuse report",
        nccl_device_api_examples::misuse::rank,
    )
}
