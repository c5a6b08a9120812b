//! The kernel researcher's filter (`NCCL_RS_KERNELS` at build time): a call whose kernel the
//! build left out is refused with `ncclInvalidUsage` naming the kernel and the filter, before
//! it touches a buffer, and the communicator stays usable. Only a filtered build leaves a
//! kernel out: in a full build the check is skipped, and counted at the end of the run.

use crate::common::{self, skip, typed_op, ALL_OPS};
use nccl::{DataType, NcclResult};
use nccl_device::abi::Coll;
use nccl_device::kernel_set;

/// A (collective, type, reduction) whose kernel this build does not hold.
fn left_out() -> Option<(Coll, DataType, nccl::ReduceOp)> {
    Coll::ALL.into_iter().find_map(|coll| {
        DataType::ALL.into_iter().find_map(|dt| {
            ALL_OPS
                .into_iter()
                .find(|op| !kernel_set::built_coll(coll, dt, op.kind()))
                .map(|op| (coll, dt, typed_op(op, dt)))
        })
    })
}

#[test]
fn a_left_out_kernel_is_refused_naming_the_filter() {
    let Some((coll, dt, op)) = left_out() else {
        skip::record(
            "every kernel is built",
            "a left-out kernel's refusal (only a build with NCCL_RS_KERNELS leaves one out)",
        );
        return;
    };
    let filter = kernel_set::FILTER.expect("a kernel is left out only by a filter");
    let ranks = common::sim_ranks(2);
    let count = 64;
    for (c, s) in ranks.comms.iter().zip(&ranks.streams) {
        let n = c.count();
        let b = c.device().alloc(count * n * dt.size()).expect("alloc");
        // SAFETY: the call is refused before it reads or writes the buffer.
        let r = unsafe {
            match coll {
                Coll::AllReduce => c.all_reduce_raw(b.ptr(), b.ptr(), count, dt, op, *s),
                Coll::Broadcast => c.broadcast_raw(b.ptr(), b.ptr(), count, dt, 0, *s),
                Coll::Reduce => c.reduce_raw(b.ptr(), b.ptr(), count, dt, op, 0, *s),
                Coll::AllGather => c.all_gather_raw(b.ptr(), b.ptr(), count, dt, *s),
                Coll::ReduceScatter => c.reduce_scatter_raw(b.ptr(), b.ptr(), count, dt, op, *s),
            }
        };
        let e = r.expect_err("a call whose kernel was left out must be refused");
        assert_eq!(e.code, NcclResult::InvalidUsage, "{e}");
        assert!(
            e.message.contains("NCCL_RS_KERNELS") && e.message.contains(filter),
            "the error names the filter: {e}"
        );
        assert!(
            e.message.contains(&format!("nccl_{}", coll.symbol())),
            "the error names the kernel: {e}"
        );
    }
}
