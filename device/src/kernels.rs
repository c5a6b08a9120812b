//! The PTX entry points: one kernel per (collective, element type, reduction), each a thin call
//! into the generic collective code (see `for_each_kernel!` ([`crate::kernel_set`])).

#[cfg(nccl_rs_p2p_kernel)]
use crate::abi::P2pArgs;
use crate::abi::{CollArgs, WaitArgs};

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

/// Holds its stream until signals arrived (one-sided waits, copy-engine collectives' hand-overs).
#[no_mangle]
pub unsafe extern "ptx-kernel" fn nccl_wait_signals(args: WaitArgs) {
    crate::coll::wait_signals(&args)
}
