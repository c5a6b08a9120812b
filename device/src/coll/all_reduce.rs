//! AllReduce. Ring: per channel slice, a reduce-scatter then an all-gather around the ring,
//! nranks-1 steps each; chunk numbers are ring positions, so chunk `r` is fully reduced at the
//! rank in ring position `r`.

use super::{align_up, div_ceil};
use crate::abi::{ChannelDev, CollArgs, DevComm};
use crate::arch;
use crate::ops::{pack_elems, RedOp};
use crate::prims::copy::Move;
use crate::prims::Simple;
use crate::types::Elem;

/// The range of elements channel `ch` of `nch` owns.
#[inline(always)]
pub fn channel_range<T>(count: usize, ch: usize, nch: usize) -> (usize, usize) {
    let per = align_up(div_ceil(count, nch), pack_elems::<T>());
    let start = core::cmp::min(ch * per, count);
    (start, core::cmp::min(start + per, count))
}

/// The chunk (elements per ring step) for a piece of `remaining` elements.
#[inline(always)]
pub fn piece_chunk<T>(remaining: usize, nranks: usize, max_chunk: usize) -> usize {
    core::cmp::min(
        max_chunk,
        align_up(div_ceil(remaining, nranks), pack_elems::<T>()),
    )
}

/// Ring AllReduce with the Simple protocol; the CTA is channel `block_idx`.
///
/// # Safety
/// `args` describes buffers and a communicator wired by the host; every rank of the
/// communicator launches the same collective with the same count and grid.
pub unsafe fn run<T: Elem, O: RedOp<T>>(args: &CollArgs) {
    let comm = &*(args.comm as *const DevComm);
    let nranks = comm.nranks as usize;
    let ch_id = arch::block_idx() as usize;
    let nch = arch::grid_dim() as usize;
    let op = O::new(args.redop_arg);
    let input = args.sendbuff as *const T;
    let output = args.recvbuff as *mut T;
    let (start, end) = channel_range::<T>(args.count as usize, ch_id, nch);
    let tid = arch::thread_idx() as usize;
    let nthreads = arch::block_dim() as usize;
    let none = Move::<T> {
        recv: core::ptr::null(),
        input: core::ptr::null(),
        output: core::ptr::null_mut(),
        send: core::ptr::null_mut(),
        post: false,
    };

    if nranks == 1 {
        let mv = Move {
            input: input.add(start),
            output: output.add(start),
            post: true,
            ..none
        };
        mv.run(&op, end - start, tid, nthreads);
        return;
    }

    let ch = (comm.channels as *mut ChannelDev).add(ch_id);
    let ring_ix = (*ch).ring_index as usize;
    let mut prims = Simple::new(ch, comm.slot_bytes);
    let max_chunk = core::cmp::min(args.chunk_elems as usize, prims.step_elems::<T>());
    let mut off = start;
    while off < end {
        let chunk = piece_chunk::<T>(end - off, nranks, max_chunk);
        let piece = core::cmp::min(end - off, chunk * nranks);
        // Chunk c of this piece: its first element and length (the last ones may be short or empty).
        let span = |c: usize| {
            let s = core::cmp::min(off + c * chunk, off + piece);
            (s, core::cmp::min(chunk, off + piece - s))
        };
        let at = |k: usize| (ring_ix + nranks - k) % nranks;

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn channels_cover_the_buffer_once() {
        for count in [0usize, 1, 3, 17, 1000, 4099] {
            for nch in [1usize, 2, 3, 16] {
                let mut next = 0;
                for c in 0..nch {
                    let (s, e) = channel_range::<f32>(count, c, nch);
                    assert!(
                        s <= e && s == next.min(count),
                        "count {count} nch {nch} ch {c}"
                    );
                    if e > s {
                        assert_eq!(s % 4, 0, "channel slices start on a pack");
                    }
                    next = next.max(e);
                }
                assert_eq!(next, count);
            }
        }
    }

    #[test]
    fn pieces_split_into_nranks_chunks() {
        assert_eq!(piece_chunk::<f32>(10, 4, 1 << 20), 4);
        assert_eq!(piece_chunk::<f32>(1 << 20, 4, 1024), 1024);
        assert_eq!(piece_chunk::<u8>(1, 8, 1 << 20), 16);
    }
}
