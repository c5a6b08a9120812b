//! The kernels as the CPU simulator calls them, by PTX entry-point name (the same list as
//! `kernels.rs`, `for_each_kernel!` ([`crate::kernel_set`]), which holds what `NCCL_RS_KERNELS` kept). They are instantiated here, in this crate's own
//! build for the host: a crate that only names them through these functions does not compile
//! every kernel again (the host crate's build, and its test build, each did).

use crate::abi::{CollArgs, P2pArgs, WaitArgs};

/// One CTA's share of a collective kernel's launch.
pub type CollKernel = unsafe fn(&CollArgs);

/// One CTA's share of a send/receive launch.
pub type P2pKernel = unsafe fn(&P2pArgs);

/// The signal waits' kernel.
pub type WaitKernel = unsafe fn(&WaitArgs);

/// The signal waits' entry point and body (always built).
pub const WAIT_KERNEL: (&str, WaitKernel) =
    (crate::abi::WAIT_SIGNALS_ENTRY, crate::coll::wait_signals);

/// Calls `add(entry point, kernel)` for every collective kernel.
pub fn each_coll_kernel(add: &mut dyn FnMut(&'static str, CollKernel)) {
    macro_rules! one {
        ($name:expr, $t:ty, $op:ty, $coll:expr) => {
            add($name, crate::coll::run::<$t, $op, { $coll as u32 }>);
        };
    }
    for_each_kernel!(one);
}

/// The send/receive kernel's entry point and body, unless `NCCL_RS_KERNELS` left it out.
#[cfg(nccl_rs_p2p_kernel)]
pub const P2P_KERNEL: Option<(&str, P2pKernel)> =
    Some((crate::kernel_set::P2P_ENTRY, crate::coll::send_recv::launch));
#[cfg(not(nccl_rs_p2p_kernel))]
pub const P2P_KERNEL: Option<(&str, P2pKernel)> = None;
