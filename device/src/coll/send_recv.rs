//! Point-to-point: each CTA runs one work item of a group — a send or a receive of a byte range
//! over one connection to one peer, step by step with the Simple protocol — or a copy for a send
//! to ourselves. Between registered buffers of peers that map each other, a message may skip
//! the FIFO (see [`crate::prims::Prims::direct_send`]).

use crate::abi::{ConnRecv, ConnSend, P2pArgs, P2pItem, P2pKind, DIRECT_OFF};
use crate::arch;
use crate::ops::Sum;
use crate::prims::copy::copy_local;
use crate::prims::{Dst, Offer, Prims, Src};

/// A launch: CTA `b` runs item `b`. Inlined into the kernel, so that nothing but the item is
/// read from `args` (see [`arch::p2p_param_item`]).
///
/// # Safety
/// As [`run`], for every item.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub unsafe fn launch(args: &P2pArgs) {
    let b = arch::block_idx() as usize;
    if b < args.nitems as usize {
        run(&arch::p2p_param_item(args, b), args.abort_flag, args.flags)
    }
}

/// This CTA's item of the launch.
///
/// # Safety
/// `it` was wired by the host; the peer runs the matching item with the same size. `flags` are
/// the launch's ([`P2pArgs::flags`]).
pub unsafe fn run(it: &P2pItem, abort_flag: u64, flags: u32) {
    let (tid, nthreads) = (arch::thread_idx() as usize, arch::block_dim() as usize);
    let bytes = it.bytes as usize;
    if it.kind == P2pKind::Copy as u32 {
        copy_local(
            it.src as *const u8,
            it.buff as *mut u8,
            bytes,
            tid,
            nthreads,
        );
        return;
    }
    let send = it.kind == P2pKind::Send as u32;
    let mut prims = if send {
        Prims::on(
            it.conn as *mut ConnSend,
            core::ptr::null_mut(),
            it.slot_bytes,
        )
    } else {
        Prims::on(
            core::ptr::null_mut(),
            it.conn as *mut ConnRecv,
            it.slot_bytes,
        )
    }
    .with_abort(abort_flag)
    .with_flags(flags)
    .with_inline_moves();
    if it.direct != DIRECT_OFF {
        let done = if send {
            prims.direct_send(it.direct, it.buff as *const u8, bytes)
        } else {
            prims.direct_recv(Offer {
                addr: it.direct,
                key: it.offer_key,
            })
        };
        if done {
            prims.finish();
            return;
        }
    }
    let chunk = it.slot_bytes as usize;
    if !send {
        // The steps this item reads (at least one): a proxy may group their receives.
        prims.promise_recv(bytes.div_ceil(chunk.max(1)).max(1) as u64);
    }
    let mut off = 0;
    // A zero-byte message still takes one step, so that both sides agree on the step count.
    loop {
        let n = core::cmp::min(chunk, bytes - off);
        if send {
            prims.send(&Sum, (it.buff as *const u8).add(off), n, Dst::Fifo);
        } else {
            prims.recv(&Sum, (it.buff as *mut u8).add(off), n, Src::Fifo);
        }
        off += n;
        if off >= bytes {
            break;
        }
    }
    prims.finish();
}
