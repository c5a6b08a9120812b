//! AllReduces written with the device API, the kind of kernel inference stacks
//! write by hand; every rank's input lies in a symmetric window, and every rank sums in rank
//! order (the same bits on every rank):
//! - `kernels::one_shot_all_reduce` meets the LSA team at a barrier (every input is in place),
//!   sums four floats at a time with 16-byte loads from the peers' windows, writes its own
//!   output, and meets the team again before any rank may overwrite its input;
//! - `kernels::ll_all_reduce`, for small inputs, sends its input to every rank as LL lines
//!   (8 bytes and a flag in one 16-byte store) and sums the lines it receives: no barrier;
//! - `kernels::two_shot_all_reduce`, for larger inputs on 3 ranks or more, has each rank sum
//!   one slice of every rank's input and store the sums into every rank's output window;
//!   `kernels::two_shot_publish_all_reduce` stores each sum once, into its own output, and
//!   every rank then loads the other slices from their owners (as the library's two-shot).
//!
//! `--bench` runs each at the sizes where the library's own symmetric AllReduce runs the same
//! form (LL up to 64 KiB, loads above, two-shot loads from 3 ranks), beside it.

use crate::{check, RankData};
use nccl::{Comm, DevCommRequirements, DeviceBuffer, Module, Stream};
use std::error::Error;

/// Elements per rank: not a multiple of the grid's threads, nor of 4 (the loads form's tail)
/// or 2 (the LL form's half line).
pub const COUNT: usize = 10_007;

/// LL lines a rank sends each peer per CTA: 4 KiB of payload, as the library's symmetric LL
/// kernel.
const LL_SLOTS: u32 = 512;
/// CTAs of either form, at most (the library's symmetric kernels use up to 16).
const MAX_GRID: u32 = 16;
/// LL blocks the device communicator holds: the bench also tries the LL form on twice
/// [`ll_grid`]'s CTAs.
const LL_BLOCKS: u32 = 2 * MAX_GRID;
/// The input bytes of a CTA of the loads form (as the library's).
const LOADS_BYTES_PER_CTA: usize = 16 << 10;
/// Most CTAs the bench gives the loads forms' kernels (each CTA its own LSA barrier, of
/// `nccl_device::api::MAX_BARRIERS`).
const WIDE_GRID: u32 = 32;
/// The most bytes the LL form moves per rank.
const LL_MAX_BYTES: usize = (MAX_GRID * LL_SLOTS) as usize * 8;

/// The device communicator both forms can use: an LL block per CTA.
const REQUIREMENTS: DevCommRequirements = DevCommRequirements {
    ll_blocks: LL_BLOCKS,
    ll_slots: LL_SLOTS,
};

/// The CTAs the LL form takes for `bytes` per rank (every CTA's lines fit its slots).
fn ll_grid(bytes: usize) -> u32 {
    bytes
        .div_ceil(8 * LL_SLOTS as usize)
        .clamp(1, MAX_GRID as usize) as u32
}

/// The CTAs the loads form takes for `bytes` per rank.
fn loads_grid(bytes: usize) -> u32 {
    bytes
        .div_ceil(LOADS_BYTES_PER_CTA)
        .clamp(1, MAX_GRID as usize) as u32
}

/// Rank `r`'s input: small integers with random-looking placement, whose sums are exact in
/// f32 (so every rank's result can be checked bit for bit).
pub fn input(r: usize, count: usize) -> Vec<f32> {
    (0..count)
        .map(|i| ((r * 7 + i * 5 + (i >> 4)) % 13) as f32)
        .collect()
}

/// One rank: each kernel over a poisoned (NaN) output, then the check.
pub fn rank(comm: &Comm, module: &Module) -> Result<(), Box<dyn Error>> {
    let (r, n) = (comm.rank(), comm.count());
    if n > kernels::MAX_TEAM as usize {
        return Err(format!("at most {} ranks", kernels::MAX_TEAM).into());
    }
    let want: Vec<f32> = (0..COUNT)
        .map(|i| (0..n).map(|q| input(q, COUNT)[i]).sum())
        .collect();
    let bytes = 4 * COUNT;
    for form in [
        (&kernels::ONE_SHOT_ALL_REDUCE, 4, REQUIREMENTS),
        (&kernels::LL_ALL_REDUCE, ll_grid(bytes), REQUIREMENTS),
    ] {
        let got = RankData::new(comm, &input(r, COUNT), &vec![f32::NAN; COUNT])?.run(
            module,
            form,
            |place| place,
        )?;
        check(r, &got, &want)?;
    }
    for kernel in [
        &kernels::TWO_SHOT_ALL_REDUCE,
        &kernels::TWO_SHOT_PUBLISH_ALL_REDUCE,
    ] {
        check(r, &two_shot(comm, module, kernel, &input(r, COUNT))?, &want)?;
    }
    Ok(())
}

/// A two-shot form (`kernel`) over `input`, into a NaN-poisoned output window: the output.
fn two_shot(
    comm: &Comm,
    module: &Module,
    kernel: &nccl_device::api::Kernel<kernels::TwoShot>,
    input: &[f32],
) -> Result<Vec<f32>, Box<dyn Error>> {
    let dev = comm.device();
    let mut inputs = DeviceBuffer::from_slice(dev, input)?;
    let mut outputs = DeviceBuffer::from_slice(dev, &vec![f32::NAN; input.len()])?;
    let w_in = comm.window(&mut inputs, true)?;
    let w_out = comm.window(&mut outputs, true)?;
    let dev_comm = comm.dev_comm(REQUIREMENTS)?;
    let (d_in, d_out) = (
        comm.dev_window(&dev_comm, w_in.handle())?,
        comm.dev_window(&dev_comm, w_out.handle())?,
    );
    let stream = Stream::new(dev)?;
    let args = kernels::TwoShot {
        comm: dev_comm.get(),
        input: d_in.get(),
        output: d_out.get(),
        count: input.len() as u64,
    };
    let grid = loads_grid(4 * input.len() / comm.count());
    // SAFETY: the windows and communicator outlive the kernel (the stream is drained below);
    // every rank launches the same grid.
    unsafe { module.launch(kernel, grid, 128, stream.handle(), args)? };
    stream.synchronize()?;
    let got = w_out.to_vec_after(&stream)?;
    drop((d_in, d_out, dev_comm));
    w_out.deregister()?;
    w_in.deregister()?;
    Ok(got)
}

/// `--bench`: this kernel beside the library's own AllReduce on symmetric windows (the
/// symmetric kernels), 8 B to 256 KiB, on the same ranks and stream; rank 0 prints the
/// table. Each result is checked after its timing.
pub fn bench(comm: &Comm, module: &Module) -> Result<(), Box<dyn Error>> {
    use nccl::Op;
    let (r, n) = (comm.rank(), comm.count());
    let max = 256 * 1024 / 4;
    let dev = comm.device();
    let mut inputs = DeviceBuffer::from_slice(dev, &input(r, max))?;
    let mut sym_out = DeviceBuffer::<f32>::zeroed(dev, max)?;
    let mut out = DeviceBuffer::<f32>::zeroed(dev, max)?;
    let w_in = comm.window(&mut inputs, true)?;
    let mut w_out = comm.window(&mut sym_out, true)?;
    // The two-shot form's output: a window of its own (every rank stores into it).
    let mut w_user = comm.window(&mut out, true)?;
    let dev_comm = comm.dev_comm(REQUIREMENTS)?;
    let dev_win = comm.dev_window(&dev_comm, w_in.handle())?;
    let dev_user = comm.dev_window(&dev_comm, w_user.handle())?;
    let stream = Stream::new(dev)?;
    let want_all: Vec<f32> = (0..max)
        .map(|i| (0..n).map(|q| input(q, max)[i]).sum())
        .collect();
    if r == 0 {
        println!(
            "{:>9} {:>8} {:>5} {:>12} {:>12} {:>7}",
            "bytes", "form", "CTAs", "kernel us", "library us", "ratio"
        );
    }
    for bytes in [8usize, 64, 512, 4096, 32768, 65536, 262144] {
        let count = bytes / 4;
        let place = crate::Place {
            comm: dev_comm.get(),
            input: dev_win.get(),
            output: w_user.as_raw_ptr(),
            count: count as u64,
        };
        let two = kernels::TwoShot {
            comm: dev_comm.get(),
            input: dev_win.get(),
            output: dev_user.get(),
            count: count as u64,
        };
        // The forms the library's symmetric AllReduce takes at this size.
        let form = match (bytes <= LL_MAX_BYTES, n >= 3) {
            (true, _) => "LL",
            (false, false) => "loads",
            (false, true) => "two-shot",
        };
        let grid = match form {
            "LL" => ll_grid(bytes),
            "loads" => loads_grid(bytes),
            _ => loads_grid(bytes.div_ceil(n)),
        };
        // Also wider grids, the kernel's own choice: the loads forms on 4× and 8× the CTAs (at
        // most WIDE_GRID), the LL form on 2× (at most LL_BLOCKS, fewer lines per CTA); the
        // fastest of the counts (each rank times its own; rank 0 prints). Each timing's output
        // is checked, then poisoned.
        let wider = match form {
            "LL" => vec![(2 * grid).min(LL_BLOCKS)],
            _ => vec![(4 * grid).min(WIDE_GRID), (8 * grid).min(WIDE_GRID)],
        };
        let mut grids = vec![grid];
        for wide in wider {
            if !grids.contains(&wide) {
                grids.push(wide);
            }
        }
        // The two-shot also as the publishing form (each sum stored once, peers load it).
        let mut tries: Vec<(&str, u32)> = grids.iter().map(|&g| (form, g)).collect();
        if form == "two-shot" {
            tries.extend(grids.iter().map(|&g| ("publish", g)));
        }
        let mut user = f64::MAX;
        let (mut best, mut best_form) = (grid, form);
        for (kind, g) in tries {
            // SAFETY: the windows and outputs outlive the launches (the stream is drained
            // before they are dropped); every rank launches the same grids in the same order.
            let us = crate::time_calls(&stream, 50, 500, || unsafe {
                let h = stream.handle();
                match kind {
                    "LL" => module.launch(&kernels::LL_ALL_REDUCE, g, 512, h, place),
                    "loads" => module.launch(&kernels::ONE_SHOT_ALL_REDUCE, g, 512, h, place),
                    "publish" => {
                        module.launch(&kernels::TWO_SHOT_PUBLISH_ALL_REDUCE, g, 512, h, two)
                    }
                    _ => module.launch(&kernels::TWO_SHOT_ALL_REDUCE, g, 512, h, two),
                }
            })?;
            check(
                r,
                &w_user.to_vec_after(&stream)?[..count],
                &want_all[..count],
            )?;
            w_user.copy_from_host_after(&vec![f32::NAN; max], &stream)?;
            if r == 0 && (g != grid || kind != form) {
                println!("{bytes:>9} {kind:>8} {g:>5} {us:>12.2}   (another grid or form)");
            }
            if us < user {
                (user, best, best_form) = (us, g, kind);
            }
        }
        let (grid, form) = (best, best_form);
        let library = crate::time_calls(&stream, 50, 500, || {
            let (src, dst) = (w_in.slice(..count)?, w_out.slice_mut(..count)?);
            comm.all_reduce(src, dst, Op::SUM, &stream)
        })?;
        check(
            r,
            &w_out.to_vec_after(&stream)?[..count],
            &want_all[..count],
        )?;
        if r == 0 {
            println!(
                "{bytes:>9} {form:>8} {grid:>5} {user:>12.2} {library:>12.2} {:>7.2}",
                user / library
            );
        }
        // Poisoned for the next size: a result that is not written fails its check. A peer's
        // next two-shot stores into this rank's output only after this rank's kernel reached
        // the first barrier, which its stream launches after the poison.
        w_user.copy_from_host_after(&vec![f32::NAN; max], &stream)?;
        w_out.copy_from_host_after(&vec![f32::NAN; max], &stream)?;
    }
    drop((dev_win, dev_user, dev_comm));
    w_user.deregister()?;
    w_out.deregister()?;
    w_in.deregister()?;
    Ok(())
}
