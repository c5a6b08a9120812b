//! ReduceScatter. Ring: block b (of `count` elements, b = a rank) starts one hop after rank b,
//! collects every rank's part on its way and ends, complete, at rank b.

use super::Kernel;
use crate::ops::RedOp;
use crate::prims::copy::Move;
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
    let none = Move::<T>::none();
    let mut off = k.start;
    while off < k.end {
        let n = core::cmp::min(chunk, k.end - off);
        // The block we start is the one that ends one hop upstream of us.
        let first = k.rank_upstream(1);
        prims.step(
            &op,
            false,
            true,
            Move {
                input: input.add(first * count + off),
                ..none
            },
            n,
        );
        for j in 2..nranks {
            let b = k.rank_upstream(j);
            prims.step(
                &op,
                true,
                true,
                Move {
                    input: input.add(b * count + off),
                    ..none
                },
                n,
            );
        }
        let mv = Move {
            input: input.add(me * count + off),
            output: output.add(off),
            post: true,
            ..none
        };
        prims.step(&op, true, false, mv, n);
        off += n;
    }
    prims.finish();
}
