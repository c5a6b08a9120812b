//! AllReduce. Ring: per channel slice, a reduce-scatter then an all-gather around the ring,
//! nranks-1 steps each; chunk numbers are ring positions, so chunk `r` is fully reduced at the
//! rank in ring position `r`. Tree: a chain in ring order; each chunk is reduced on its way to
//! ring position 0 and broadcast back down, the two directions pipelined.

use super::{align_up, div_ceil, Kernel};
use crate::abi::{ConnRecv, ConnSend, NCCL_STEPS};
use crate::ops::{pack_elems, RedOp};
use crate::prims::copy::Move;
use crate::prims::Simple;
use crate::types::Elem;

/// The chunk (elements per ring step) for a piece of `remaining` elements.
#[inline(always)]
pub fn piece_chunk<T>(remaining: usize, nranks: usize, max_chunk: usize) -> usize {
    core::cmp::min(
        max_chunk,
        align_up(div_ceil(remaining, nranks), pack_elems::<T>()),
    )
}

/// # Safety
/// See [`super::run`].
pub unsafe fn ring<T: Elem, O: RedOp<T>>(k: &mut Kernel<T, O>) {
    let (nranks, input, output) = (k.nranks, k.input, k.output);
    if nranks == 1 {
        k.local_copy(input.add(k.start), output.add(k.start), k.end - k.start);
        return;
    }
    let ring_ix = k.ring_ix();
    let op = k.op;
    let mut prims = k.prims();
    let max_chunk = k.max_chunk();
    let none = Move::<T>::none();
    let (mut off, end) = (k.start, k.end);
    while off < end {
        let chunk = piece_chunk::<T>(end - off, nranks, max_chunk);
        let piece = core::cmp::min(end - off, chunk * nranks);
        // Chunk c of this piece: its first element and length (the last ones may be short or empty).
        let span = |c: usize| {
            let s = core::cmp::min(off + c * chunk, off + piece);
            (s, core::cmp::min(chunk, off + piece - s))
        };
        let at = |j: usize| (ring_ix + nranks - j) % nranks;

        // Reduce-scatter: send our part of chunk ring_ix-1, then add ours to what arrives.
        let (s, n) = span(at(1));
        prims.step(
            &op,
            false,
            true,
            Move {
                input: input.add(s),
                ..none
            },
            n,
        );
        for j in 2..nranks {
            let (s, n) = span(at(j));
            prims.step(
                &op,
                true,
                true,
                Move {
                    input: input.add(s),
                    ..none
                },
                n,
            );
        }
        // Our chunk is now complete: store it and start it around the ring.
        let (s, n) = span(ring_ix);
        prims.step(
            &op,
            true,
            true,
            Move {
                input: input.add(s),
                output: output.add(s),
                post: true,
                ..none
            },
            n,
        );
        // All-gather: forward each finished chunk.
        for j in 1..nranks - 1 {
            let (s, n) = span(at(j));
            prims.step(
                &op,
                true,
                true,
                Move {
                    output: output.add(s),
                    ..none
                },
                n,
            );
        }
        let (s, n) = span((ring_ix + 1) % nranks);
        prims.step(
            &op,
            true,
            false,
            Move {
                output: output.add(s),
                ..none
            },
            n,
        );
        off += piece;
    }
    prims.finish();
}

/// Chunks each link of the chain adds to how far the broadcast down trails the reduction up:
/// a rank at depth d handles chunk j down TREE_LAG*(d+1) iterations after chunk j up, so what
/// it waits for from its parent was sent TREE_LAG iterations before and never hangs on its
/// own current chunk's trip to the root and back. With one lag for every depth, each
/// iteration waited for that whole round trip (4xH200: 0.05 of NCCL's tree at 256 MiB). The
/// FIFOs take it: a parent runs at most TREE_LAG chunks ahead down, a child TREE_LAG ahead up.
const TREE_LAG: usize = NCCL_STEPS as usize / 2;

/// # Safety
/// See [`super::run`]; the host wired `tree_up_send`/`tree_up_recv` for every CTA.
pub unsafe fn tree<T: Elem, O: RedOp<T>>(k: &mut Kernel<T, O>) {
    let (nranks, input, output) = (k.nranks, k.input, k.output);
    if nranks == 1 {
        k.local_copy(input.add(k.start), output.add(k.start), k.end - k.start);
        return;
    }
    let pos = k.ring_ix();
    let (root, leaf) = (pos == 0, pos == nranks - 1);
    let cta = crate::arch::block_idx() as usize;
    let a = &k.args;
    let up_send = if root {
        core::ptr::null_mut()
    } else {
        (a.tree_up_send as *mut ConnSend).add(cta)
    };
    let up_recv = if leaf {
        core::ptr::null_mut()
    } else {
        (a.tree_up_recv as *mut ConnRecv).add(cta)
    };
    let ch = &mut *k.ch;
    let down_send: *mut ConnSend = if leaf {
        core::ptr::null_mut()
    } else {
        &mut ch.send
    };
    let down_recv: *mut ConnRecv = if root {
        core::ptr::null_mut()
    } else {
        &mut ch.recv
    };
    let mut up = Simple::on(up_send, up_recv, a.tree_slot_bytes).with_abort(k.abort_flag);
    let mut down = Simple::on(down_send, down_recv, k.slot_bytes).with_abort(k.abort_flag);
    let slot = core::cmp::min(a.tree_slot_bytes, k.slot_bytes) as usize / core::mem::size_of::<T>();
    let chunk = core::cmp::max(
        pack_elems::<T>(),
        core::cmp::min(a.chunk_elems as usize, slot) / pack_elems::<T>() * pack_elems::<T>(),
    );
    let op = k.op;
    let none = Move::<T>::none();
    let (start, end) = (k.start, k.end);
    let nchunks = div_ceil(end - start, chunk);
    let span = |c: usize| {
        let s = start + c * chunk;
        (s, core::cmp::min(chunk, end - s))
    };
    let lag = TREE_LAG * (pos + 1);
    for i in 0..nchunks + lag {
        if i < nchunks {
            // Up: add our input to what the ranks below sent; the root finishes the value.
            let (s, n) = span(i);
            let mv = Move {
                input: input.add(s),
                output: if root { output.add(s) } else { none.output },
                post: root,
                ..none
            };
            up.step(&op, !leaf, !root, mv, n);
        }
        if i >= lag {
            // Down: the root sends finished chunks, the others store and pass them on.
            let (s, n) = span(i - lag);
            let mv = if root {
                Move {
                    recv: output.add(s),
                    ..none
                }
            } else {
                Move {
                    output: output.add(s),
                    ..none
                }
            };
            down.step(&op, !root, !leaf, mv, n);
        }
    }
    up.finish();
    down.finish();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_split_into_nranks_chunks() {
        assert_eq!(piece_chunk::<f32>(10, 4, 1 << 20), 4);
        assert_eq!(piece_chunk::<f32>(1 << 20, 4, 1024), 1024);
        assert_eq!(piece_chunk::<u8>(1, 8, 1 << 20), 16);
    }
}
