//! The hardware facade (DESIGN rule 2): the only code that touches the machine. Kernels call
//! these functions and nothing else of the hardware, so the same kernels run on the GPU
//! (`nvptx`) and on host threads (`sim`).

#[cfg(target_arch = "nvptx64")]
mod nvptx;
#[cfg(target_arch = "nvptx64")]
pub use nvptx::*;

#[cfg(not(target_arch = "nvptx64"))]
pub mod sim;
#[cfg(not(target_arch = "nvptx64"))]
pub use sim::*;

/// A 16-byte unit of data, the widest single memory access the kernels make.
#[repr(C, align(16))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Pack16(pub [u32; 4]);
