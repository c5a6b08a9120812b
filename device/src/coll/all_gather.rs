//! AllGather. Ring: each rank's block travels nranks-1 hops; every rank stores each block that
//! passes at its owner's place in the output. `count` is the per-rank element count. Between
//! ranks whose output buffers are registered, a rank writes each block it passes on straight
//! into its successor's output, which passes it on from there (no FIFO on either end).

use super::Kernel;
use crate::ops::RedOp;
use crate::prims::{Dst, Src};
use crate::types::Elem;

/// # Safety
/// See [`super::run`].
pub unsafe fn ring<T: Elem, O: RedOp<T>, const P: u32>(k: &mut Kernel<T, O, P>) {
    let (nranks, input, output) = (k.nranks, k.input, k.output);
    let count = k.args.count as usize;
    let me = k.rank_upstream(0);
    let own = output.add(me * count);
    if nranks == 1 {
        if !core::ptr::eq(input, own) {
            k.local_copy(input.add(k.start), own.add(k.start), k.end - k.start);
        }
        return;
    }
    let op = k.op;
    let mut prims = k.prims();
    let chunk = k.max_chunk();
    // Registered output buffers: the predecessor may write our blocks in place, and we may
    // write into the successor's (see `Kernel::ring_direct`).
    let bytes = nranks * count * core::mem::size_of::<T>();
    let direct = k.ring_direct(&mut prims, bytes, true, true, false);
    let at = |block: usize, off: usize| Dst::peer_or_fifo(direct.send_at::<T>(block * count + off));
    let mut direct_steps = 0;
    let mut off = k.start;
    while off < k.end {
        let n = core::cmp::min(chunk, k.end - off);
        let out = if core::ptr::eq(input, own) {
            core::ptr::null_mut()
        } else {
            own.add(off)
        };
        prims.copy_send(&op, input.add(off), out, n, at(me, off));
        for j in 1..nranks {
            let from = k.rank_upstream(j);
            let place = output.add(from * count + off);
            // A direct receive finds the block in place: it is passed on from there.
            let src = Src::landed_if(direct.recv, place);
            if j < nranks - 1 {
                prims.recv_copy_send(&op, place, n, src, at(from, off));
            } else {
                prims.recv(&op, place, n, src);
            }
        }
        if direct.recv {
            direct_steps += nranks as u64 - 1;
        }
        off += n;
    }
    k.count_direct(direct_steps);
    prims.finish();
}
