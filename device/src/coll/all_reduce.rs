//! AllReduce. Ring: per channel slice, a reduce-scatter then an all-gather around the ring,
//! nranks-1 steps each; chunk numbers are ring positions, so chunk `r` is fully reduced at the
//! rank in ring position `r`. Tree: a chain in ring order; each chunk is reduced on its way to
//! ring position 0 and broadcast back down, the two directions pipelined. Across nodes the tree
//! is the double binary tree the host wired ([`dbt`]).

use super::{align_up, div_ceil, Kernel};
use crate::abi::{ConnRecv, ConnSend, TreeDev, TREE_MAX_CHILDREN};
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
pub unsafe fn ring<T: Elem, O: RedOp<T>, const P: u32>(k: &mut Kernel<T, O, P>) {
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

/// Named barriers of the tree's two thread groups.
const BAR_UP: u32 = 1;
const BAR_DOWN: u32 = 2;

/// The tree AllReduce on channel `c`'s ring as a chain rooted at its position 0: the sum
/// travels up to the root, which finishes each chunk and sends it back down.
///
/// The root does both in one step per chunk (receive from below, add its input, write its
/// output, send down). Every other rank splits its CTA in two groups that run apart, so the
/// way up and the way down stream at once, as in NCCL's split tree: the first half of the
/// threads sends the partial sums up, the second half stores and passes on what comes down.
/// A group waits only on its own direction, so neither can hold the other up. (One group
/// taking turns up and down tied each chunk's way down to a later chunk's way up.)
///
/// # Safety
/// See [`super::run`]; the host wired `tree_up_send`/`tree_up_recv` for every CTA and
/// launched an even number of threads (whole pairs of warps on GPUs).
pub unsafe fn tree<T: Elem, O: RedOp<T>, const P: u32>(k: &mut Kernel<T, O, P>) {
    let (nranks, input, output) = (k.nranks, k.input, k.output);
    if nranks == 1 {
        k.local_copy(input.add(k.start), output.add(k.start), k.end - k.start);
        return;
    }
    if k.args.tree != 0 {
        return dbt(k);
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
    let (up_slot, down_slot) = (a.tree_slot_bytes, k.slot_bytes);
    let slot = core::cmp::min(up_slot, down_slot) as usize / core::mem::size_of::<T>();
    let chunk = core::cmp::max(
        pack_elems::<T>(),
        core::cmp::min(a.chunk_elems as usize, slot) / pack_elems::<T>() * pack_elems::<T>(),
    );
    let (op, abort, flags) = (k.op, k.abort_flag, k.args.flags);
    let none = Move::<T>::none();
    let (start, end) = (k.start, k.end);
    let span = |c: usize| {
        let s = start + c * chunk;
        (s, core::cmp::min(chunk, end - s))
    };
    let nchunks = div_ceil(end - start, chunk);
    if root {
        let mut p = Simple::between(down_send, down_slot, up_recv, up_slot)
            .with_abort(abort)
            .with_flags(flags);
        for c in 0..nchunks {
            let (s, n) = span(c);
            let mv = Move {
                input: input.add(s),
                output: output.add(s),
                post: true,
                ..none
            };
            p.step(&op, true, true, mv, n);
        }
        p.finish();
        return;
    }
    let nthreads = crate::arch::block_dim() as usize;
    let half = nthreads / 2;
    if (crate::arch::thread_idx() as usize) < half {
        // Up: add our input to what the ranks below sent (the leaf sends its input alone).
        let mut up = Simple::on(up_send, up_recv, up_slot)
            .with_abort(abort)
            .with_flags(flags)
            .group(0, half, BAR_UP);
        for c in 0..nchunks {
            let (s, n) = span(c);
            let mv = Move {
                input: input.add(s),
                ..none
            };
            up.step(&op, !leaf, true, mv, n);
        }
        up.finish();
    } else {
        // Down: store the finished chunks and pass them on.
        let mut down = Simple::on(down_send, down_recv, down_slot)
            .with_abort(abort)
            .with_flags(flags)
            .group(half, nthreads - half, BAR_DOWN);
        for c in 0..nchunks {
            let (s, n) = span(c);
            let mv = Move {
                output: output.add(s),
                ..none
            };
            down.step(&op, true, !leaf, mv, n);
        }
        down.finish();
    }
}

/// The tree AllReduce across nodes: CTA `c` takes its place in the tree the host wired for it
/// ([`crate::abi::CollArgs::tree`]: one of the double binary tree's two, a chain inside each
/// node), with a parent (none at the root) and up to [`TREE_MAX_CHILDREN`] children. Up: add
/// every child's partial sum to our input and send the sum to the parent; down: store what
/// the parent sends and pass it to every child. As in [`tree`], the root does both in one
/// group and every other rank splits its CTA so that both directions stream at once.
///
/// Several children are composed from the one-peer Simple steps rather than a primitive over
/// several peers: the first child's partial sum is reduced with our input into our output
/// buffer, each further child's is added to that (`Move::pre_done`: the operator's `pre` was
/// applied once already), and the last of these steps sends the sum up. On the way down, the
/// step that stores the parent's result also sends it to the first child, and each further
/// child gets it read back from the output buffer. That costs a pass over the chunk in the
/// output buffer per further child; in exchange the data mover and Simple's step, which every
/// ring collective runs, stay exactly as they are. The output buffer is free to serve as
/// scratch: a chunk's result comes down only after this rank sent the chunk's partial sum up.
///
/// # Safety
/// See [`super::run`]; `args.tree` holds a [`TreeDev`] for every CTA whose connections have
/// FIFO slots of `args.tree_slot_bytes`, and the CTA has an even number of threads.
pub unsafe fn dbt<T: Elem, O: RedOp<T>, const P: u32>(k: &mut Kernel<T, O, P>) {
    let (input, output) = (k.input, k.output);
    let cta = crate::arch::block_idx() as usize;
    let t: TreeDev = *(k.args.tree as *const TreeDev).add(cta);
    let nc = core::cmp::min(t.nchildren as usize, TREE_MAX_CHILDREN);
    let root = t.up_send == 0;
    if root && nc == 0 {
        k.local_copy(input.add(k.start), output.add(k.start), k.end - k.start);
        return;
    }
    let a = &k.args;
    let slot = a.tree_slot_bytes;
    let pe = pack_elems::<T>();
    let chunk = core::cmp::max(
        pe,
        core::cmp::min(
            a.chunk_elems as usize,
            slot as usize / core::mem::size_of::<T>(),
        ) / pe
            * pe,
    );
    let (op, abort, flags) = (k.op, k.abort_flag, a.flags);
    let none = Move::<T>::none();
    let (start, end) = (k.start, k.end);
    let span = |c: usize| {
        let s = start + c * chunk;
        (s, core::cmp::min(chunk, end - s))
    };
    let nchunks = div_ceil(end - start, chunk);
    let send_to = |p: u64| p as *mut ConnSend;
    let recv_from = |p: u64| p as *mut ConnRecv;
    let prims = |send: *mut ConnSend, recv: *mut ConnRecv| {
        Simple::on(send, recv, slot)
            .with_abort(abort)
            .with_flags(flags)
    };
    let null_send = core::ptr::null_mut::<ConnSend>();
    let null_recv = core::ptr::null_mut::<ConnRecv>();
    // Child `i`'s connections (null past the last child).
    let child_recv = |i: usize| match i < nc {
        true => recv_from(t.up_recv[i]),
        false => null_recv,
    };
    let child_send = |i: usize| match i < nc {
        true => send_to(t.down_send[i]),
        false => null_send,
    };
    if root {
        // Gather step i takes child i's sum; the last one finishes the chunk and sends it to
        // the first child. Then the other children get it from the output.
        let mut gather: [Simple; TREE_MAX_CHILDREN] = core::array::from_fn(|i| {
            let send = if i + 1 == nc {
                child_send(0)
            } else {
                null_send
            };
            prims(send, child_recv(i))
        });
        let mut pass: [Simple; TREE_MAX_CHILDREN] = core::array::from_fn(|j| match j {
            0 => prims(null_send, null_recv),
            _ => prims(child_send(j), null_recv),
        });
        for c in 0..nchunks {
            let (s, n) = span(c);
            for (i, g) in gather.iter_mut().enumerate().take(nc) {
                let last = i + 1 == nc;
                let mv = Move {
                    input: if i == 0 { input.add(s) } else { output.add(s) },
                    pre_done: i > 0,
                    output: output.add(s),
                    post: last,
                    ..none
                };
                g.step(&op, true, last, mv, n);
            }
            for p in pass.iter_mut().take(nc).skip(1) {
                let mv = Move {
                    input: output.add(s),
                    pre_done: true,
                    ..none
                };
                p.step(&op, false, true, mv, n);
            }
        }
        for p in gather.into_iter().chain(pass) {
            p.finish();
        }
        return;
    }
    let nthreads = crate::arch::block_dim() as usize;
    let half = nthreads / 2;
    if (crate::arch::thread_idx() as usize) < half {
        // Up: step i adds child i's partial sum (into the output buffer while more follow);
        // the last sends the sum to the parent. A leaf sends its input alone.
        let nup = core::cmp::max(nc, 1);
        let mut up: [Simple; TREE_MAX_CHILDREN] = core::array::from_fn(|i| {
            let send = if i + 1 == nup {
                send_to(t.up_send)
            } else {
                null_send
            };
            prims(send, child_recv(i)).group(0, half, BAR_UP)
        });
        for c in 0..nchunks {
            let (s, n) = span(c);
            for (i, u) in up.iter_mut().enumerate().take(nup) {
                let last = i + 1 == nup;
                let mv = Move {
                    input: if i == 0 { input.add(s) } else { output.add(s) },
                    pre_done: i > 0,
                    output: if last {
                        core::ptr::null_mut()
                    } else {
                        output.add(s)
                    },
                    ..none
                };
                u.step(&op, i < nc, last, mv, n);
            }
        }
        for u in up {
            u.finish();
        }
    } else {
        // Down: store the parent's result while passing it to the first child, then read it
        // back for the others.
        let (first, count) = (half, nthreads - half);
        let mut down: [Simple; TREE_MAX_CHILDREN] = core::array::from_fn(|j| {
            match j {
                0 => prims(child_send(0), recv_from(t.down_recv)),
                _ => prims(child_send(j), null_recv),
            }
            .group(first, count, BAR_DOWN)
        });
        for c in 0..nchunks {
            let (s, n) = span(c);
            let mv = Move {
                output: output.add(s),
                ..none
            };
            down[0].step(&op, true, nc > 0, mv, n);
            for d in down.iter_mut().take(nc).skip(1) {
                let mv = Move {
                    input: output.add(s),
                    pre_done: true,
                    ..none
                };
                d.step(&op, false, true, mv, n);
            }
        }
        for d in down {
            d.finish();
        }
    }
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
