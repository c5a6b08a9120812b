//! The PTX entry points: one kernel per (collective, element type, reduction), each a thin call
//! into the generic collective code (see `for_each_kernel!` ([`crate::kernel_set`])).

use crate::abi::CollArgs;
#[cfg(nccl_rs_p2p_kernel)]
use crate::abi::P2pArgs;

macro_rules! coll_kernel {
    ($name:expr, $t:ty, $op:ty, $coll:expr) => {
        const _: () = {
            #[export_name = $name]
            pub unsafe extern "ptx-kernel" fn kernel(args: CollArgs) {
                crate::coll::run::<$t, $op, { $coll as u32 }>(&args)
            }
        };
    };
}

for_each_kernel!(coll_kernel);

/// Sends and receives of a group (one CTA per work item), unless `NCCL_RS_KERNELS` left it out.
#[cfg(nccl_rs_p2p_kernel)]
#[no_mangle]
pub unsafe extern "ptx-kernel" fn nccl_p2p(args: P2pArgs) {
    crate::coll::send_recv::launch(&args)
}
