//! CUDA graph capture: each rank captures an in-place AllReduce into a graph once and launches
//! the graph several times. The captured graph borrows the buffer it uses for as long as it
//! lives, so the buffer cannot be read, dropped or reused while the graph may still run.
//!
//! ```text
//! cargo run --example graph_capture [NRANKS]
//! ```

mod common;

use nccl::{Comm, DeviceBuffer, Op, Stream};

const LAUNCHES: u32 = 4;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    common::choose_backend()?;
    let n = common::nranks_arg(2);
    let devices: Vec<i32> = (0..n)
        .map(|r| common::device_for(r).map(|d| d.ordinal))
        .collect::<nccl::Result<_>>()?;
    let comms = Comm::init_all(&devices)?;

    // One thread per rank (each owns its communicator): each captures and launches its graph.
    let results: Vec<nccl::Result<Vec<f64>>> = std::thread::scope(|s| {
        let threads: Vec<_> = comms
            .into_iter()
            .map(|comm| s.spawn(move || rank(comm)))
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(nccl::Error::internal("a rank panicked")))
            })
            .collect()
    });

    // Rank r starts with r + 1; the first launch leaves the sum S everywhere, and each later
    // launch multiplies it by n: S·n^(launches − 1).
    let want = (n * (n + 1) / 2) as f64 * (n as f64).powi(LAUNCHES as i32 - 1);
    for (r, res) in results.into_iter().enumerate() {
        if res?.iter().any(|&x| x != want) {
            return Err(format!("rank {r}: wrong result after {LAUNCHES} launches").into());
        }
    }
    println!("{n} ranks: an AllReduce captured once and launched {LAUNCHES} times, correct");
    Ok(())
}

/// One rank: captures the AllReduce, launches it, and returns the buffer once the graph is gone.
fn rank(comm: Comm) -> nccl::Result<Vec<f64>> {
    let device = comm.device().clone();
    let stream = Stream::new(&device)?;
    let mut buf = DeviceBuffer::from_slice(&device, &[(comm.rank() + 1) as f64; 1024])?;
    {
        let graph = nccl::capture(&stream, |c| {
            c.all_reduce_in_place(&comm, &mut buf, Op::SUM, &stream)
        })?;
        for _ in 0..LAUNCHES {
            graph.launch()?;
        }
        stream.synchronize()?;
    } // the graph is dropped: `buf` is free to be read again
    let out = buf.to_vec()?;
    drop(buf);
    // Finalize (collective) before destroy: peers may still use this rank's memory until all
    // of them are done.
    comm.finalize()?;
    comm.destroy()?;
    Ok(out)
}
