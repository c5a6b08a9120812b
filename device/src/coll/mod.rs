//! Collectives, one file each, generic over element type and reduction.

pub mod all_reduce;

/// Calls `$m!(type_name, RustType, op_name, OpType)` once per (element type, reduction) pair:
/// the matrix of kernels both the PTX entry points and the simulator's dispatch are made from.
#[macro_export]
macro_rules! for_each_type_op {
    ($m:ident) => {
        $crate::for_each_type_op!(@types $m,
            int8 i8, uint8 u8, int32 i32, uint32 u32, int64 i64, uint64 u64,
            half $crate::types::F16, float f32, double f64, bfloat16 $crate::types::Bf16,
            f8e4m3 $crate::types::F8E4M3, f8e5m2 $crate::types::F8E5M2);
    };
    (@types $m:ident, $($tn:ident $t:ty),*) => {
        $(
            $m!($tn, $t, sum, $crate::ops::Sum);
            $m!($tn, $t, prod, $crate::ops::Prod);
            $m!($tn, $t, max, $crate::ops::Max);
            $m!($tn, $t, min, $crate::ops::Min);
            $m!($tn, $t, avg, $crate::ops::Avg<$t>);
            $m!($tn, $t, premulsum, $crate::ops::PreMulSum<$t>);
        )*
    };
}

#[inline(always)]
pub(crate) const fn div_ceil(a: usize, b: usize) -> usize {
    a.div_ceil(b)
}

#[inline(always)]
pub(crate) const fn align_up(a: usize, b: usize) -> usize {
    a.div_ceil(b) * b
}
