//! AllGather. Ring: each rank's block travels nranks-1 hops; every rank stores each block that
//! passes at its owner's place in the output. `count` is the per-rank element count.

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
    let none = Move::<T>::none();
    let mut off = k.start;
    while off < k.end {
        let n = core::cmp::min(chunk, k.end - off);
        let out = if core::ptr::eq(input, own) {
            core::ptr::null_mut()
        } else {
            own.add(off)
        };
        prims.step(
            &op,
            false,
            true,
            Move {
                input: input.add(off),
                output: out,
                ..none
            },
            n,
        );
        for j in 1..nranks {
            let from = k.rank_upstream(j);
            prims.step(
                &op,
                true,
                j < nranks - 1,
                Move {
                    output: output.add(from * count + off),
                    ..none
                },
                n,
            );
        }
        off += n;
    }
    prims.finish();
}
