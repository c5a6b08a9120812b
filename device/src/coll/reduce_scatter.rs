//! ReduceScatter. Ring: block b (of `count` elements, b = a rank) starts one hop after rank b,
//! collects every rank's part on its way and ends, complete, at rank b.
//!
//! Between ranks whose outputs are registered, out of place, the last hop of each block goes
//! straight into its owner's output (see [`ring`]); the hops before it have no place to land
//! (an output holds one block) and take the FIFO.

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
    if nranks == 1 {
        k.local_copy(input.add(k.start), output.add(k.start), k.end - k.start);
        return;
    }
    let op = k.op;
    let mut prims = k.prims();
    let chunk = k.max_chunk();
    // Registered outputs, out of place (see `Kernel::ring_direct`): the partial sum of our
    // successor's block, which we send last in each piece, lands at its place in the
    // successor's output, and the successor adds its input to it there. Who writes where:
    // our output[off..off + n] is written by the predecessor only in its last send of the
    // piece at `off` (each piece its own place), then read and overwritten with the final
    // value by us in our last step of that piece (each element read, then written, by one
    // thread); nobody else touches it, and the predecessor writes nothing before our offer
    // (after our launch, so after every earlier use of our output in stream order). In place
    // our output is our input's block, which that write would overwrite before we added it:
    // such a rank offers no room ([`crate::abi::RING_PARTIALS`]) and every hop takes the FIFO.
    let out_bytes = count * core::mem::size_of::<T>();
    let (sb, rb) = (k.args.sendbuff, k.args.recvbuff);
    let apart = sb + (nranks * out_bytes) as u64 <= rb || rb + out_bytes as u64 <= sb;
    let direct = k.ring_direct(&mut prims, out_bytes, true, true, apart);
    // The last hop of a piece: into the successor's output, or its FIFO.
    let last = |j: usize, off: usize| {
        if j == nranks - 1 {
            Dst::peer_or_fifo(direct.partial_at::<T>(off))
        } else {
            Dst::Fifo
        }
    };
    let mut direct_steps = 0;
    let mut off = k.start;
    while off < k.end {
        let n = core::cmp::min(chunk, k.end - off);
        // The block we start is the one that ends one hop upstream of us.
        let first = k.rank_upstream(1);
        prims.send(&op, input.add(first * count + off), n, last(1, off));
        for j in 2..nranks {
            let b = k.rank_upstream(j);
            let src = input.add(b * count + off);
            prims.recv_reduce_send(&op, src, n, Src::Fifo, last(j, off));
        }
        let from = Src::landed_if(direct.recv_partials, output.add(off));
        prims.recv_reduce_copy(&op, input.add(me * count + off), output.add(off), n, from);
        if direct.recv_partials {
            direct_steps += 1;
        }
        off += n;
    }
    k.count_direct(direct_steps);
    prims.finish();
}
