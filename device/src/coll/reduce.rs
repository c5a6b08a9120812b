//! Reduce. Ring: a chain that starts one hop after the root and ends at it; every rank adds its
//! input to what arrives and passes it on, the root stores the result.
//!
//! Between a root whose output is registered, out of place, and a registered last rank of the
//! chain, the last hop goes straight into the root's output (see [`ring`]); the hops before it
//! have no output to land in and take the FIFO.

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
        k.local_copy(input.add(k.start), output.add(k.start), k.end - k.start);
        return;
    }
    let op = k.op;
    let mut prims = k.prims();
    let chunk = k.max_chunk();
    // Registered buffers (see `Kernel::ring_direct`): only the chain's last connection, into
    // the root, takes the handshake (both of its ends know it from `d`). Out of place, the
    // last rank writes each piece's partial sum at its place in the root's output, and the
    // root adds its input to it there. Who writes where: the root's output[off..off + n] is
    // written by the last rank once (the piece at `off`), then read and overwritten with the
    // result by the root (each element read, then written, by one thread); nobody else
    // touches it, and the last rank writes nothing before the root's offer (after its launch,
    // so after every earlier use of its output in stream order). In place the write would
    // overwrite the root's input before it is added: such a root offers no room
    // ([`crate::abi::RING_PARTIALS`]) and the hop takes the FIFO.
    let bytes = k.args.count as usize * core::mem::size_of::<T>();
    let (sb, rb) = (k.args.sendbuff, k.args.recvbuff);
    let apart = sb + bytes as u64 <= rb || rb + bytes as u64 <= sb;
    let direct = k.ring_direct(&mut prims, bytes, d == 0, d == nranks - 1, d == 0 && apart);
    let mut direct_steps = 0;
    let mut off = k.start;
    while off < k.end {
        let n = core::cmp::min(chunk, k.end - off);
        let mine = input.add(off);
        let to = Dst::peer_or_fifo(direct.partial_at::<T>(off));
        match d {
            0 => {
                if direct.recv_partials {
                    direct_steps += 1;
                }
                let from = Src::landed_if(direct.recv_partials, output.add(off));
                prims.recv_reduce_copy(&op, mine, output.add(off), n, from)
            }
            1 => prims.send(&op, mine, n, to),
            _ => prims.recv_reduce_send(&op, mine, n, Src::Fifo, to),
        }
        off += n;
    }
    k.count_direct(direct_steps);
    prims.finish();
}
