//! Put bandwidth and round trip between ranks 0 and 1 (`kernels::ping`), the numbers to set
//! beside the library's SendRecv (`nccl_bench -C sendrecv`): across nodes the puts go through
//! GIN, inside a node they are stores. Rank 0 prints one row per size.

use kernels::ping::{Ping, PING};
use nccl::{Comm, DeviceBuffer, Module, Op, Stream};
use std::error::Error;

/// The largest size: `GIN_BENCH_MAX_BYTES`, 256 MiB unless set.
fn max_bytes() -> usize {
    std::env::var("GIN_BENCH_MAX_BYTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256 << 20)
}

/// One rank of the benchmark (needs at least 2).
pub fn rank(comm: &Comm, module: &Module) -> Result<(), Box<dyn Error>> {
    if comm.count() < 2 {
        return Err("the put benchmark needs 2 ranks".into());
    }
    let (r, dev) = (comm.rank(), comm.device());
    let max = max_bytes().max(8);
    let mut win = DeviceBuffer::<u8>::zeroed(dev, max)?;
    let src = DeviceBuffer::<u8>::from_slice(dev, &vec![7u8; max])?;
    let mut barrier = DeviceBuffer::<f32>::zeroed(dev, 1)?;
    let window = comm.window(&mut win, true)?;
    let dc = comm.dev_comm(Default::default())?;
    let dw = comm.dev_window(&dc, window.handle())?;
    let stream = Stream::new(dev)?;
    if r == 0 {
        let how = if dc.get().gin != 0 {
            "GIN"
        } else {
            "stores (LSA)"
        };
        println!("puts from rank 0 to rank 1 through {how}");
        println!(
            "{:>12} {:>6} {:>12} {:>10}",
            "bytes", "puts", "us/launch", "GB/s"
        );
    }
    let (mut acks, mut data_total) = (0u64, 0u64);
    let mut bytes = 8;
    while bytes <= max {
        // 8 bytes: one put, a round trip. Larger: enough puts per launch to outweigh the ack.
        let puts = match bytes {
            8 => 1,
            _ => ((64 << 20) / bytes.max(8 << 20) + 3).clamp(1, 8) as u32,
        };
        let launches = if bytes <= 1 << 20 { 50 } else { 5 };
        let mut launch = || -> nccl::Result<()> {
            acks += 1;
            data_total += puts as u64;
            let args = Ping {
                comm: dc.get(),
                win: dw.get(),
                src: src.as_raw_ptr(),
                bytes: bytes as u64,
                puts,
                data_total,
                acks,
            };
            // SAFETY: every buffer outlives the kernel (drained before they go); both ranks
            // launch the same rounds.
            unsafe { module.launch(&PING, 1, 128, stream.handle(), args) }
        };
        launch()?; // warm-up
        stream.synchronize()?;
        comm.all_reduce_in_place(&mut barrier, Op::SUM, &stream)?;
        stream.synchronize()?;
        let t0 = std::time::Instant::now();
        for _ in 0..launches {
            launch()?;
        }
        stream.synchronize()?;
        let us = t0.elapsed().as_secs_f64() * 1e6 / launches as f64;
        if r == 0 {
            let gbs = (puts as usize * bytes) as f64 / us / 1e3;
            println!("{bytes:>12} {puts:>6} {us:>12.1} {gbs:>10.3}");
        }
        bytes *= 8;
    }
    drop((dw, dc));
    window.deregister()?;
    Ok(())
}
