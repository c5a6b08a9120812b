//! A fused "AllReduce + scale + residual add" written with the device API
//! (`kernels::all_reduce_scale_add`), as inference stacks hand-write after attention:
//! `out = residual + scale * sum over ranks of x`, in one kernel and one pass over the data,
//! where a library call would take an AllReduce and then a second kernel. Each rank's `x` lies
//! in a symmetric window; its output buffer holds the residual when the kernel starts and the
//! result when it ends.

use crate::{check, RankData};
use kernels::ScaleAdd;
use nccl::{Comm, Module};
use std::error::Error;

const COUNT: usize = 4099;
/// A power of two: every result is exact in f32.
const SCALE: f32 = 0.5;

fn x(r: usize) -> Vec<f32> {
    (0..COUNT).map(|i| ((r + 3 * i) % 11) as f32).collect()
}

fn residual(r: usize) -> Vec<f32> {
    (0..COUNT).map(|i| (r * 100 + i % 7) as f32).collect()
}

/// One rank: the kernel over the residual, then the check.
pub fn rank(comm: &Comm, module: &Module) -> Result<(), Box<dyn Error>> {
    let (r, n) = (comm.rank(), comm.count());
    let got = RankData::new(comm, &x(r), &residual(r))?.run(
        module,
        (&kernels::ALL_REDUCE_SCALE_ADD, 4, Default::default()),
        |place| ScaleAdd {
            place,
            scale: SCALE,
        },
    )?;
    let want: Vec<f32> = (0..COUNT)
        .map(|i| residual(r)[i] + SCALE * (0..n).map(|q| x(q)[i]).sum::<f32>())
        .collect();
    check(r, &got, &want)
}
