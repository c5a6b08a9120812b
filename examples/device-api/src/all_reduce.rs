//! A one-shot AllReduce written with the device API (`kernels::one_shot_all_reduce`), the
//! kind of kernel inference stacks write by hand: every rank's input lies in a symmetric
//! window; the kernel meets the LSA team at a barrier (every input is in place), sums element
//! `i` over every rank with loads from the peers' windows (in rank order: the same bits on
//! every rank), writes the sum to its own output, and meets the team again before any rank may
//! overwrite its input.

use crate::{check, RankData};
use nccl::{Comm, Module};
use std::error::Error;

/// Elements per rank: not a multiple of the grid's threads.
pub const COUNT: usize = 10_007;

/// Rank `r`'s input: small integers with random-looking placement, whose sums are exact in
/// f32 (so every rank's result can be checked bit for bit).
pub fn input(r: usize, count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| ((r * 7 + i * 5 + (i >> 4)) % 13) as f32)
        .collect()
}

/// One rank: the kernel over a poisoned (NaN) output, then the check.
pub fn rank(comm: &Comm, module: &Module) -> Result<(), Box<dyn Error>> {
    let (r, n) = (comm.rank(), comm.count());
    let got = RankData::new(comm, &input(r, COUNT), &vec![f32::NAN; COUNT])?.run(
        module,
        &kernels::ONE_SHOT_ALL_REDUCE,
        4,
        |place| place,
    )?;
    let want: Vec<f32> = (0..COUNT)
        .map(|i| (0..n).map(|q| input(q, COUNT)[i]).sum())
        .collect();
    check(r, &got, &want)
}

/// `--bench`: this kernel beside the library's own AllReduce on symmetric windows (the
/// symmetric kernels), 8 B to 256 KiB, on the same ranks and stream; rank 0 prints the
/// table. Each result is checked after its timing.
pub fn bench(comm: &Comm, module: &Module) -> Result<(), Box<dyn Error>> {
    use nccl::{DeviceBuffer, Op, Stream};
    let (r, n) = (comm.rank(), comm.count());
    let max = 256 * 1024 / 4;
    let dev = comm.device();
    let mut inputs = DeviceBuffer::from_slice(dev, &input(r, max))?;
    let mut sym_out = DeviceBuffer::<f32>::zeroed(dev, max)?;
    let mut out = DeviceBuffer::<f32>::zeroed(dev, max)?;
    let w_in = comm.window(&mut inputs, true)?;
    let mut w_out = comm.window(&mut sym_out, true)?;
    let dev_comm = comm.dev_comm()?;
    let dev_win = comm.dev_window(&dev_comm, w_in.handle())?;
    let stream = Stream::new(dev)?;
    let want_all: Vec<f32> = (0..max)
        .map(|i| (0..n).map(|q| input(q, max)[i]).sum())
        .collect();
    if r == 0 {
        println!(
            "{:>9} {:>8} {:>12} {:>12} {:>7}",
            "bytes", "CTAs", "kernel us", "library us", "ratio"
        );
    }
    for bytes in [8usize, 64, 512, 4096, 32768, 262144] {
        let count = bytes / 4;
        let grid = (count / 4096).clamp(1, 16) as u32;
        let place = crate::Place {
            comm: dev_comm.get(),
            input: dev_win.get(),
            output: out.as_raw_ptr(),
            count: count as u64,
        };
        // SAFETY: the window and output outlive the launches (the stream is drained before
        // they are dropped); every rank launches the same grids in the same order.
        let user = time(&stream, || unsafe {
            module.launch(
                &kernels::ONE_SHOT_ALL_REDUCE,
                grid,
                128,
                stream.handle(),
                place,
            )
        })?;
        let library = time(&stream, || {
            let (src, dst) = (w_in.slice(..count)?, w_out.slice_mut(..count)?);
            comm.all_reduce(src, dst, Op::SUM, &stream)
        })?;
        check(r, &out.to_vec()?[..count], &want_all[..count])?;
        check(r, &w_out.to_vec()?[..count], &want_all[..count])?;
        if r == 0 {
            println!(
                "{bytes:>9} {grid:>8} {user:>12.2} {library:>12.2} {:>7.2}",
                user / library
            );
        }
        // Poisoned for the next size: a result that is not written fails its check.
        out.copy_from_host(&vec![f32::NAN; max])?;
        w_out.copy_from_host(&vec![f32::NAN; max])?;
    }
    drop((dev_win, dev_comm));
    w_out.deregister()?;
    w_in.deregister()?;
    Ok(())
}

/// Microseconds per call of `launch`: 50 calls to warm up, then 500 in a row on `stream`.
fn time(stream: &nccl::Stream, mut launch: impl FnMut() -> nccl::Result<()>) -> nccl::Result<f64> {
    for _ in 0..50 {
        launch()?;
    }
    stream.synchronize()?;
    let iters = 500;
    let t0 = std::time::Instant::now();
    for _ in 0..iters {
        launch()?;
    }
    stream.synchronize()?;
    Ok(t0.elapsed().as_secs_f64() * 1e6 / iters as f64)
}
