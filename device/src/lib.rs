//! nccl-device: everything that runs on the GPU, written once and compiled two ways:
//! to PTX by rustc's `nvptx64-nvidia-cuda` target (the kernels the driver loads), and for the
//! host, where `arch::sim` runs the same code on threads (the CPU simulator).
#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(stdarch_nvptx, asm_experimental_arch))]
#![cfg_attr(all(target_arch = "nvptx64", feature = "kernels"), feature(abi_ptx))]
#![allow(clippy::missing_safety_doc)]

#[cfg(not(target_arch = "nvptx64"))]
extern crate std;

pub mod abi;
pub mod api;
pub mod arch;
// First: its `for_each_kernel!` (the kernels this build holds) is for the modules below.
#[macro_use]
#[cfg_attr(
    all(target_arch = "nvptx64", not(feature = "kernels")),
    allow(unused_macros, dead_code)
)]
pub mod kernel_set;

pub mod coll;
pub mod ops;
pub mod prims;
pub mod types;

#[cfg(all(target_arch = "nvptx64", feature = "kernels"))]
mod kernels;
#[cfg(not(target_arch = "nvptx64"))]
pub mod sim_kernels;

#[cfg(target_arch = "nvptx64")]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    arch::trap()
}
