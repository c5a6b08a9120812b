//! Splitting a communicator (`ncclCommSplit`): four ranks, one thread each, split into the even
//! and the odd ranks; each half all-reduces on its own communicator. A split is collective over
//! the parent, so every rank calls it, each from its own thread.
//!
//! ```text
//! cargo run --example split [NRANKS]
//! ```

mod common;

use nccl::{Comm, DeviceBuffer, Op, Stream};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    common::choose_backend()?;
    let n = common::nranks_arg(4);
    let devices: Vec<i32> = (0..n)
        .map(|r| common::device_for(r).map(|d| d.ordinal))
        .collect::<nccl::Result<_>>()?;
    let comms = Comm::init_all(&devices)?;

    // Each communicator moves to a thread of its own (`Comm` is `Send`, not `Sync`).
    let results: Vec<nccl::Result<(usize, usize, Vec<u32>)>> = std::thread::scope(|s| {
        let threads: Vec<_> = comms
            .into_iter()
            .map(|parent| s.spawn(move || split_and_reduce(parent)))
            .collect();
        threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(nccl::Error::internal("a rank panicked")))
            })
            .collect()
    });

    for (rank, r) in results.into_iter().enumerate() {
        let (child_rank, child_size, sum) = r?;
        // The child's ranks are the parent's of one parity, in parent-rank order (the key).
        let peers: Vec<u32> = (0..n as u32).filter(|p| p % 2 == rank as u32 % 2).collect();
        if child_rank != rank / 2 || child_size != peers.len() {
            return Err(format!("rank {rank}: child rank {child_rank} of {child_size}").into());
        }
        if sum.iter().any(|&x| x != peers.iter().sum::<u32>()) {
            return Err(format!("rank {rank}: wrong sum in its half").into());
        }
    }
    println!("{n} ranks split into even and odd halves: each half's AllReduce correct");
    Ok(())
}

/// One rank: splits by parity (color), keeps the parent's order (key), and all-reduces its
/// rank number within its half.
fn split_and_reduce(parent: Comm) -> nccl::Result<(usize, usize, Vec<u32>)> {
    let rank = parent.rank();
    let child = parent
        .split((rank % 2) as i32, rank as i32, None)?
        .ok_or_else(|| nccl::Error::internal("every rank gave a color"))?;
    let device = child.device().clone();
    let stream = Stream::new(&device)?;
    let mut buf = DeviceBuffer::from_slice(&device, &[rank as u32; 256])?;
    child.all_reduce_in_place(&mut buf, Op::SUM, &stream)?;
    stream.synchronize()?;
    let out = (child.rank(), child.count(), buf.to_vec()?);
    // Finalize (collective) before destroy: a peer may still be completing the last
    // operation with this rank's memory until every rank has finalized.
    child.finalize()?;
    child.destroy()?;
    parent.finalize()?;
    parent.destroy()?;
    Ok(out)
}
