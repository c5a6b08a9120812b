//! The deterministic mode's local fold ([`ALGO_FOLD`]): `nranks` blocks of `count` elements,
//! laid one after the other at `sendbuff` (block `q` holds rank `q`'s values), reduced in
//! block order into `recvbuff`. Each element is `post(((pre(x0) + pre(x1)) + pre(x2)) + …)`,
//! whatever the grid, the block size or where the call was cut: the bits depend only on the
//! inputs and the rank count.
//!
//! [`ALGO_FOLD`]: crate::abi::ALGO_FOLD

use crate::abi::{CollArgs, DevComm};
use crate::arch::{self, Pack16};
use crate::ops::{map1, map2, pack_elems, RedOp};
use crate::types::Elem;

/// Runs the fold as one CTA of the grid (a grid-stride loop over the elements).
///
/// # Safety
/// `args.sendbuff` holds `nranks × count` elements, `args.recvbuff` `count`, not overlapping.
pub unsafe fn run<T: Elem, O: RedOp<T>>(args: &CollArgs) {
    let nranks = (*(args.comm as *const DevComm)).nranks as usize;
    let op = O::new(super::scalar_bits::<T>(args));
    let (src, dst, count) = (
        args.sendbuff as *const T,
        args.recvbuff as *mut T,
        args.count as usize,
    );
    let threads = arch::block_dim() as usize * arch::grid_dim() as usize;
    let me = arch::block_idx() as usize * arch::block_dim() as usize + arch::thread_idx() as usize;
    // Packs where every block and the output are 16-byte aligned; elements one by one past
    // the last whole pack (and everywhere otherwise).
    let per = pack_elems::<T>();
    let aligned = (args.sendbuff | args.recvbuff).is_multiple_of(16)
        && (count * core::mem::size_of::<T>()).is_multiple_of(16);
    let packed = if aligned { count / per } else { 0 };
    let mut j = me;
    while j < packed {
        let at = |q: usize| arch::ld_pack((src.add(q * count) as *const Pack16).add(j));
        let mut v = pre_pack::<T, O>(&op, at(0));
        for q in 1..nranks {
            let x = pre_pack::<T, O>(&op, at(q));
            v = map2::<T>(v, x, |a, b| op.reduce(a, b));
        }
        if O::HAS_POST {
            v = map1::<T>(v, |a| op.post(a));
        }
        arch::st_pack((dst as *mut Pack16).add(j), v);
        j += threads;
    }
    let mut i = packed * per + me;
    while i < count {
        let mut v = op.pre(*src.add(i));
        for q in 1..nranks {
            v = op.reduce(v, op.pre(*src.add(q * count + i)));
        }
        *dst.add(i) = op.post(v);
        i += threads;
    }
}

/// `pre` on every element of a pack (nothing where the reduction has none).
#[cfg_attr(target_arch = "nvptx64", inline(always))]
fn pre_pack<T: Elem, O: RedOp<T>>(op: &O, x: Pack16) -> Pack16 {
    if O::HAS_PRE {
        map1::<T>(x, |a| op.pre(a))
    } else {
        x
    }
}
