//! The PTX entry points: one kernel per (element type, reduction), each a thin call into the
//! generic collective code, which picks the collective from its arguments.

use crate::abi::{CollArgs, P2pArgs};

macro_rules! coll_kernel {
    ($tn:ident, $t:ty, $on:ident, $op:ty) => {
        paste_kernel!(nccl_coll_, $tn, $on, $t, $op);
    };
}

macro_rules! paste_kernel {
    ($prefix:ident, $tn:ident, $on:ident, $t:ty, $op:ty) => {
        const _: () = {
            #[export_name = concat!(stringify!($prefix), stringify!($tn), "_", stringify!($on))]
            pub unsafe extern "ptx-kernel" fn kernel(args: CollArgs) {
                crate::coll::run::<$t, $op>(&args)
            }
        };
    };
}

crate::for_each_type_op!(coll_kernel);

/// Sends and receives of a group (one CTA per work item).
#[no_mangle]
pub unsafe extern "ptx-kernel" fn nccl_p2p(args: P2pArgs) {
    crate::coll::send_recv::launch(&args)
}
