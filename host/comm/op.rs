//! [`ReduceOp`]: the raw layer's reduction, the kernels' [`RedOpKind`] with PreMulSum's scalar.

use crate::cuda::DevPtr;
use nccl_device::ops::RedOpKind;

/// A reduction as the API takes it: one of the kernels' [`RedOpKind`]s (NCCL's `ncclRedOp_t`
/// values), with the scalar when it is PreMulSum (what `ncclRedOpCreatePreMulSum` makes).
///
/// The built-ins are [`ReduceOp::SUM`], [`ReduceOp::PROD`], [`ReduceOp::MAX`],
/// [`ReduceOp::MIN`] and [`ReduceOp::AVG`] (or [`ReduceOp::builtin`] of a kind); PreMulSum
/// comes from [`ReduceOp::pre_mul_sum`] or [`ReduceOp::pre_mul_sum_device`]. The fields are
/// private so that PreMulSum always has its scalar and the others never do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReduceOp {
    pub(crate) kind: RedOpKind,
    pub(crate) scalar: Option<Scalar>,
}

/// Where PreMulSum's scalar (one element of the collective's type) is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Scalar {
    /// On the host, given with the call (`ncclScalarHostImmediate`): the element's bytes
    /// (little-endian, of the collective's element type).
    Host(u64),
    /// In device memory (`ncclScalarDevice`), read by the kernel when it runs.
    Device(DevPtr),
}

impl ReduceOp {
    /// Sum.
    pub const SUM: ReduceOp = ReduceOp::plain(RedOpKind::Sum);
    /// Product.
    pub const PROD: ReduceOp = ReduceOp::plain(RedOpKind::Prod);
    /// Maximum.
    pub const MAX: ReduceOp = ReduceOp::plain(RedOpKind::Max);
    /// Minimum.
    pub const MIN: ReduceOp = ReduceOp::plain(RedOpKind::Min);
    /// Average (the sum divided by the number of ranks).
    pub const AVG: ReduceOp = ReduceOp::plain(RedOpKind::Avg);

    const fn plain(kind: RedOpKind) -> ReduceOp {
        ReduceOp { kind, scalar: None }
    }

    /// The reduction of `kind` when it takes no scalar (every kind but PreMulSum).
    pub const fn builtin(kind: RedOpKind) -> Option<ReduceOp> {
        match kind {
            RedOpKind::PreMulSum => None,
            _ => Some(ReduceOp::plain(kind)),
        }
    }

    /// Each input times a host scalar, then summed; `bits` are the scalar's bytes
    /// (little-endian, of the collective's element type).
    pub const fn pre_mul_sum(bits: u64) -> ReduceOp {
        ReduceOp {
            kind: RedOpKind::PreMulSum,
            scalar: Some(Scalar::Host(bits)),
        }
    }

    /// PreMulSum whose scalar (one element of the collective's type) is in device memory at
    /// `scalar` and is read by the kernel when it runs.
    pub const fn pre_mul_sum_device(scalar: DevPtr) -> ReduceOp {
        ReduceOp {
            kind: RedOpKind::PreMulSum,
            scalar: Some(Scalar::Device(scalar)),
        }
    }

    /// The kernels' reduction for this op.
    pub const fn kind(self) -> RedOpKind {
        self.kind
    }

    /// PreMulSum's scalar (`None` for the others).
    pub const fn scalar(self) -> Option<Scalar> {
        self.scalar
    }

    /// From `ncclRedOp_t`'s built-in values (0..=4: [`RedOpKind`]'s values but PreMulSum's).
    pub fn from_raw(v: u32) -> Option<ReduceOp> {
        RedOpKind::ALL
            .into_iter()
            .find(|&k| k as u32 == v)
            .and_then(ReduceOp::builtin)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_ops_map_to_builtins() {
        assert_eq!(ReduceOp::from_raw(0), Some(ReduceOp::SUM));
        assert_eq!(ReduceOp::from_raw(4), Some(ReduceOp::AVG));
        assert_eq!(ReduceOp::from_raw(5), None);
        for k in RedOpKind::ALL {
            let op = ReduceOp::builtin(k);
            assert_eq!(
                op.map(ReduceOp::kind),
                (k != RedOpKind::PreMulSum).then_some(k)
            );
            assert_eq!(op.and_then(ReduceOp::scalar), None);
        }
        let p = ReduceOp::pre_mul_sum_device(0x1000);
        assert_eq!(p.kind(), RedOpKind::PreMulSum);
        assert_eq!(p.scalar(), Some(Scalar::Device(0x1000)));
    }
}
