//! AllReduce. Ring: per channel slice, a reduce-scatter then an all-gather around the ring,
//! nranks-1 steps each; chunk numbers are ring positions, so chunk `r` is fully reduced at the
//! rank in ring position `r`.

use super::{align_up, div_ceil, Kernel};
use crate::ops::{pack_elems, RedOp};
use crate::prims::copy::Move;
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
