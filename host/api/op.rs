//! [`Op`]: a reduction, with PreMulSum's scalar of the collective's element type.

use super::element::Element;
use crate::comm::{ReduceOp, Scalar};
use nccl_device::ops::RedOpKind;

/// How a reduction combines elements of type `T`: one of the kernels' [`RedOpKind`]s, with
/// the scalar when it is PreMulSum.
///
/// The built-ins are [`Op::SUM`], [`Op::PROD`], [`Op::MAX`], [`Op::MIN`] and [`Op::AVG`] (or
/// [`Op::builtin`] of a kind); [`Op::pre_mul_sum`] makes PreMulSum. The fields are private so
/// that PreMulSum always has its scalar and the others never do.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Op<T: Element> {
    kind: RedOpKind,
    scalar: Option<T>,
}

impl<T: Element> Op<T> {
    /// Sum.
    pub const SUM: Op<T> = Op::plain(RedOpKind::Sum);
    /// Product.
    pub const PROD: Op<T> = Op::plain(RedOpKind::Prod);
    /// Maximum.
    pub const MAX: Op<T> = Op::plain(RedOpKind::Max);
    /// Minimum.
    pub const MIN: Op<T> = Op::plain(RedOpKind::Min);
    /// Average (the sum divided by the number of ranks).
    pub const AVG: Op<T> = Op::plain(RedOpKind::Avg);

    const fn plain(kind: RedOpKind) -> Op<T> {
        Op { kind, scalar: None }
    }

    /// The reduction of `kind` when it takes no scalar (every kind but PreMulSum).
    pub const fn builtin(kind: RedOpKind) -> Option<Op<T>> {
        match kind {
            RedOpKind::PreMulSum => None,
            _ => Some(Op::plain(kind)),
        }
    }

    /// Each rank's input multiplied by `scalar`, then summed (`ncclRedOpCreatePreMulSum` with
    /// a host scalar).
    pub const fn pre_mul_sum(scalar: T) -> Op<T> {
        Op {
            kind: RedOpKind::PreMulSum,
            scalar: Some(scalar),
        }
    }

    /// The kernels' reduction for this op.
    pub const fn kind(self) -> RedOpKind {
        self.kind
    }

    /// PreMulSum's scalar (`None` for the others).
    pub const fn scalar(self) -> Option<T> {
        self.scalar
    }

    /// The raw layer's reduction.
    pub fn to_raw(self) -> ReduceOp {
        ReduceOp {
            kind: self.kind,
            scalar: self.scalar.map(|s| Scalar::Host(s.scalar_bits())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typed_scalars_become_their_bits() {
        assert_eq!(Op::<f32>::AVG.to_raw(), ReduceOp::AVG);
        assert_eq!(
            Op::pre_mul_sum(0.5f64).to_raw(),
            ReduceOp::pre_mul_sum(0.5f64.to_bits())
        );
        assert_eq!(
            Op::pre_mul_sum(half::bf16::from_f32(1.0)).to_raw(),
            ReduceOp::pre_mul_sum(0x3f80)
        );
    }

    #[test]
    fn builtins_keep_their_kind() {
        for k in RedOpKind::ALL {
            let typed = Op::<i32>::builtin(k);
            assert_eq!(typed.map(Op::to_raw), ReduceOp::builtin(k));
            assert_eq!(
                typed.map(Op::kind),
                (k != RedOpKind::PreMulSum).then_some(k)
            );
        }
    }
}
