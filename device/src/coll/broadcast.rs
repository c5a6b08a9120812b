//! Broadcast. Ring: a chain that starts at the root; each chunk is one step, received, stored
//! and forwarded by every rank but the last. Between ranks whose output buffers are registered,
//! each rank writes the chunks into its successor's output (no FIFO on either end).

use super::Kernel;
use crate::ops::RedOp;
use crate::prims::{Dst, Src};
use crate::types::Elem;

/// # Safety
/// See [`super::run`].
pub unsafe fn ring<T: Elem, O: RedOp<T>, const P: u32>(k: &mut Kernel<T, O, P>) {
    let (nranks, input, output) = (k.nranks, k.input, k.output);
    let d = k.distance_from(k.args.root as usize);
    if nranks == 1 {
        if !core::ptr::eq(input, output) {
            k.local_copy(input.add(k.start), output.add(k.start), k.end - k.start);
        }
        return;
    }
    let op = k.op;
    let mut prims = k.prims();
    let chunk = k.max_chunk();
    // Registered output buffers: each rank writes the chunks straight into its successor's
    // output, which passes them on from there (see `Kernel::ring_direct`). The chain's
    // connection from its last rank back to the root carries nothing and takes no handshake.
    let bytes = k.args.count as usize * core::mem::size_of::<T>();
    let direct = k.ring_direct(&mut prims, bytes, d != 0, d < nranks - 1, false);
    let dst = |s: usize| Dst::peer_or_fifo(direct.send_at::<T>(s));
    let mut direct_steps = 0;
    let mut off = k.start;
    while off < k.end {
        let n = core::cmp::min(chunk, k.end - off);
        if d == 0 {
            let out = if core::ptr::eq(input, output) {
                core::ptr::null_mut()
            } else {
                output.add(off)
            };
            prims.copy_send(&op, input.add(off), out, n, dst(off));
        } else {
            if direct.recv {
                direct_steps += 1;
            }
            // A direct receive finds the chunk in place: it is passed on from there.
            let src = Src::landed_if(direct.recv, output.add(off));
            if d < nranks - 1 {
                prims.recv_copy_send(&op, output.add(off), n, src, dst(off));
            } else {
                prims.recv(&op, output.add(off), n, src);
            }
        }
        off += n;
    }
    k.count_direct(direct_steps);
    prims.finish();
}
