//! The per-CTA copy ceilings (`kernels::copy`): bytes a CTA of 512 threads copies per µs
//! with a plain 16-byte copy kernel (1, 4 or 8 packs in flight per thread) on 1 to 32 CTAs,
//! and what `cuMemcpyDtoDAsync` moves, on the same device and buffers. The library's data
//! movers (`nccl_bench` with `NCCL_MIN_CTAS` = `NCCL_MAX_CTAS`) are set against these.
//!
//! `COPY_RATE_BYTES` sets the size: 256 MiB on a GPU unless set; the simulator copies
//! 64 KiB and 48 bytes on 1 and 3 CTAs.
//! Every copy is checked after its timing: random words in, a poisoned destination.

use kernels::copy::{CopyArgs, COPY_X1, COPY_X4, COPY_X8};
use nccl::{Backend, Comm, DeviceBuffer, Module, Stream};
use std::error::Error;

/// Threads per CTA, as the library's collectives launch.
const THREADS: u32 = 512;
/// The CTA counts measured.
const GRIDS: [u32; 6] = [1, 2, 4, 8, 16, 32];
/// A word no input holds (the inputs are odd).
const POISON: u32 = 0xdead_0000;

/// Rank 0 measures and prints the table; other ranks have nothing to do.
pub fn rank(comm: &Comm, module: &Module) -> Result<(), Box<dyn Error>> {
    if comm.rank() != 0 {
        return Ok(());
    }
    let on_sim = nccl::cuda::backend() == Backend::Sim;
    // On the simulator: a pack count no CTA's turn divides, and two grids.
    let default = if on_sim { (64 << 10) + 48 } else { 256 << 20 };
    let grids: &[u32] = if on_sim { &[1, 3] } else { &GRIDS };
    let bytes: usize = match std::env::var("COPY_RATE_BYTES") {
        Ok(v) => v
            .parse()
            .map_err(|_| format!("COPY_RATE_BYTES={v}: not a size"))?,
        Err(_) => default,
    };
    let words = (bytes / 16).max(1) * 4;
    let bytes = words * 4;
    let dev = comm.device();
    let data: Vec<u32> = (0..words as u32).map(odd_word).collect();
    let src = DeviceBuffer::from_slice(dev, &data)?;
    let mut dst = DeviceBuffer::<u32>::zeroed(dev, words)?;
    let poison = vec![POISON; words];
    let stream = Stream::new(dev)?;
    let iters = match (on_sim, bytes >= 64 << 20) {
        (true, _) => 1,
        (false, true) => 5,
        (false, false) => 20,
    };
    println!("copy ceilings, {bytes} bytes, {THREADS} threads per CTA, {iters} copies timed");
    println!(
        "{:>5} {:>12} {:>12} {:>12}   (bytes per CTA per us; total GB/s in brackets)",
        "CTAs", "1 in flight", "4 in flight", "8 in flight"
    );
    let args = CopyArgs {
        src: src.as_raw_ptr(),
        dst: dst.as_raw_ptr(),
        packs: (words / 4) as u64,
    };
    for &grid in grids {
        let mut row = format!("{grid:>5}");
        for kernel in [&COPY_X1, &COPY_X4, &COPY_X8] {
            dst.copy_from_host_after(&poison, &stream)?;
            // SAFETY: `src` and `dst` hold `packs` packs each and outlive the launches (the
            // stream is drained by the check before they are dropped).
            let us = crate::time_calls(&stream, 1, iters, || unsafe {
                module.launch(kernel, grid, THREADS, stream.handle(), args)
            })?;
            check(&dst.to_vec_after(&stream)?, &data)?;
            let rate = bytes as f64 / us;
            row += &format!(" {:>5.0} ({:>4.0})", rate / grid as f64, rate / 1e3);
        }
        println!("{row}");
    }
    dst.copy_from_host_after(&poison, &stream)?;
    let us = crate::time_calls(&stream, 1, iters, || dst.copy_from_device(&src, &stream))?;
    check(&dst.to_vec_after(&stream)?, &data)?;
    println!("cuMemcpyDtoDAsync: {:.0} GB/s", bytes as f64 / us / 1e3);
    Ok(())
}

/// A reproducible odd word for position `i` (never [`POISON`], which is even).
fn odd_word(i: u32) -> u32 {
    i.wrapping_mul(0x9e37_79b9).rotate_left(13) | 1
}

/// The first word that differs, as an error.
fn check(got: &[u32], want: &[u32]) -> Result<(), Box<dyn Error>> {
    match got.iter().zip(want).position(|(g, w)| g != w) {
        None => Ok(()),
        Some(i) => Err(format!("copy: word {i} is {:#x}, expected {:#x}", got[i], want[i]).into()),
    }
}
