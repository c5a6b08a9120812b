//! Which kernels this build holds: every (collective, type, reduction) entry point, or those
//! `NCCL_RS_KERNELS` kept when the crate was built ([`filter`] has the grammar). The list is
//! written by the build script (`build.rs`), which both the PTX build and the simulator's build
//! run, so the two always hold the same kernels.

#[cfg(not(target_arch = "nvptx64"))]
pub mod filter;

#[cfg(not(target_arch = "nvptx64"))]
pub use filter::P2P_ENTRY;

#[cfg(not(target_arch = "nvptx64"))]
use crate::abi::Coll;
#[cfg(not(target_arch = "nvptx64"))]
use crate::ops::RedOpKind;
#[cfg(not(target_arch = "nvptx64"))]
use crate::types::DataType;

include!(concat!(env!("OUT_DIR"), "/kernel_set.rs"));

/// Whether this build holds the kernel entry point `name` (e.g. `nccl_all_reduce_float_sum`).
/// Host only, as [`built_coll`] (string comparisons would call `memcmp` in the PTX).
#[cfg(not(target_arch = "nvptx64"))]
pub fn built(name: &str) -> bool {
    BUILT.binary_search(&name).is_ok()
}

/// Whether this build holds the kernel of collective `coll` for `dt` and `op` (the copies have
/// one kernel whatever the type and reduction).
#[cfg(not(target_arch = "nvptx64"))]
pub fn built_coll(coll: Coll, dt: DataType, op: RedOpKind) -> bool {
    BUILT.iter().any(|name| {
        let Some(rest) = name
            .strip_prefix("nccl_")
            .and_then(|r| r.strip_prefix(coll.symbol()))
        else {
            return false;
        };
        if coll.copies() {
            return rest.is_empty();
        }
        rest.strip_prefix('_')
            .and_then(|r| r.strip_prefix(dt.name()))
            .and_then(|r| r.strip_prefix('_'))
            == Some(op.name())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_is_sorted_and_answers_by_collective() {
        assert!(BUILT.windows(2).all(|w| w[0] < w[1]));
        for name in BUILT {
            assert!(built(name));
        }
        assert!(!built("nccl_all_reduce_float_add"));
        if FILTER.is_none() {
            assert_eq!(BUILT.len(), 2 + 3 * 12 * 6 + 1);
            assert!(built_coll(
                Coll::ReduceScatter,
                DataType::Bfloat16,
                RedOpKind::Avg
            ));
            assert!(built_coll(
                Coll::Broadcast,
                DataType::Float64,
                RedOpKind::Max
            ));
            assert!(built(P2P_ENTRY));
        }
    }
}
