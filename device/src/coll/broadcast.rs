//! Broadcast. Ring: a chain that starts at the root; each chunk is one step, received, stored
//! and forwarded by every rank but the last.

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
        if !core::ptr::eq(input, output) {
            k.local_copy(input.add(k.start), output.add(k.start), k.end - k.start);
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
        if d == 0 {
            let out = if core::ptr::eq(input, output) {
                core::ptr::null_mut()
            } else {
                output.add(off)
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
        } else {
            prims.step(
                &op,
                true,
                d < nranks - 1,
                Move {
                    output: output.add(off),
                    ..none
                },
                n,
            );
        }
        off += n;
    }
    prims.finish();
}
