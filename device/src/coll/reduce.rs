//! Reduce. Ring: a chain that starts one hop after the root and ends at it; every rank adds its
//! input to what arrives and passes it on, the root stores the result.

use super::Kernel;
use crate::ops::RedOp;
use crate::prims::copy::Move;
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
    let none = Move::<T>::none();
    let mut off = k.start;
    while off < k.end {
        let n = core::cmp::min(chunk, k.end - off);
        let mv = Move {
            input: input.add(off),
            ..none
        };
        match d {
            0 => prims.step(
                &op,
                true,
                false,
                Move {
                    output: output.add(off),
                    post: true,
                    ..mv
                },
                n,
            ),
            1 => prims.step(&op, false, true, mv, n),
            _ => prims.step(&op, true, true, mv, n),
        }
        off += n;
    }
    prims.finish();
}
