//! [`Op`]: a reduction, with PreMulSum's scalar of the collective's element type.

use super::element::Element;
use crate::enqueue::ReduceOp;

/// How a reduction combines elements of type `T`.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub enum Op<T: Element> {
    /// Sum.
    Sum,
    /// Product.
    Prod,
    /// Maximum.
    Max,
    /// Minimum.
    Min,
    /// Average (the sum divided by the number of ranks).
    Avg,
    /// Each rank's input multiplied by the scalar, then summed (`ncclRedOpCreatePreMulSum`
    /// with a host scalar).
    PreMulSum(T),
}

impl<T: Element> Op<T> {
    /// The raw layer's reduction.
    pub fn to_raw(self) -> ReduceOp {
        match self {
            Op::Sum => ReduceOp::SUM,
            Op::Prod => ReduceOp::PROD,
            Op::Max => ReduceOp::MAX,
            Op::Min => ReduceOp::MIN,
            Op::Avg => ReduceOp::AVG,
            Op::PreMulSum(s) => ReduceOp::pre_mul_sum(s.scalar_bits()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_scalars_become_their_bits() {
        assert_eq!(Op::<f32>::Avg.to_raw(), ReduceOp::AVG);
        assert_eq!(
            Op::PreMulSum(0.5f64).to_raw(),
            ReduceOp::pre_mul_sum(0.5f64.to_bits())
        );
        assert_eq!(
            Op::PreMulSum(half::bf16::from_f32(1.0)).to_raw(),
            ReduceOp::pre_mul_sum(0x3f80)
        );
    }
}
