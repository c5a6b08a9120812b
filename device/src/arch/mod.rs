//! The hardware facade (rule 2 of docs/architecture.md): the only code that touches the machine. Kernels call
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

use crate::ops::RedOpKind;
use crate::types::DataType;

/// The reductions `multimem.ld_reduce` performs in the switch (PTX ISA 8.1, sm_90).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum McOp {
    Add,
    Min,
    Max,
}

/// The `multimem.ld_reduce` reduction that carries `op` on `dt`, or None where the ISA has none
/// (the host then runs ring or tree). From the PTX ISA's tables (multimem, PTX 8.1 on sm_90):
/// integers reduce as scalar `.u32`/`.s32`/`.u64`/`.s64` only, `.add` on `.u32`, `.s32`,
/// `.u64` (not `.s64`: a 64-bit two's-complement sum is the same bits, so int64 adds as
/// `.u64`), `.min`/`.max` on all four; floats `.add` on `.f16x2`, `.bf16x2`, `.f32`, `.f64`,
/// `.min`/`.max` on the half types only. No 8-bit integer and no fp8 form exists on sm_90
/// (fp8 needs PTX 8.6 on sm_100a). Sum, Avg and PreMulSum all add in the switch (Avg's and
/// PreMulSum's scaling happens when the data is copied in or out); Prod has no form.
pub const fn multimem_op(dt: DataType, op: RedOpKind) -> Option<McOp> {
    use DataType::*;
    let add = matches!(
        dt,
        Int32 | Uint32 | Int64 | Uint64 | Float16 | Bfloat16 | Float32 | Float64
    );
    let minmax = matches!(dt, Int32 | Uint32 | Int64 | Uint64 | Float16 | Bfloat16);
    match op {
        RedOpKind::Sum | RedOpKind::Avg | RedOpKind::PreMulSum if add => Some(McOp::Add),
        RedOpKind::Min if minmax => Some(McOp::Min),
        RedOpKind::Max if minmax => Some(McOp::Max),
        _ => None,
    }
}
