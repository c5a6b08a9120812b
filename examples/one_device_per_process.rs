//! One device per process (NCCL's "Example 2", MPI replaced by a launcher): this program starts
//! itself once per rank; the first copy makes the unique id and hands it to the others through
//! the environment, as an MPI program would broadcast it. Each rank opens its own device,
//! creates its communicator, and all-reduces a buffer.
//!
//! ```text
//! cargo run --example one_device_per_process [NRANKS]
//! ```

mod common;

use nccl::{Comm, DeviceBuffer, Op, Stream, UniqueId};
use std::process::Command;

const RANK: &str = "EXAMPLE_RANK";
const NRANKS: &str = "EXAMPLE_NRANKS";
const ID: &str = "EXAMPLE_UNIQUE_ID";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    match std::env::var(RANK) {
        Ok(rank) => {
            let nranks: usize = std::env::var(NRANKS)?.parse()?;
            let id = id_from_hex(&std::env::var(ID)?)?;
            rank_main(rank.parse()?, nranks, &id)
        }
        Err(_) => launch(common::nranks_arg(4)),
    }
}

/// Starts `nranks` copies of this program, one per rank, and waits for them.
fn launch(nranks: usize) -> Result<(), Box<dyn std::error::Error>> {
    // The id's root listens in this process, which stays until every rank is done.
    let id = nccl::get_unique_id()?;
    let hex: String = id.internal.iter().map(|b| format!("{b:02x}")).collect();
    let exe = std::env::current_exe()?;
    let children = (0..nranks)
        .map(|r| {
            Command::new(&exe)
                .env(RANK, r.to_string())
                .env(NRANKS, nranks.to_string())
                .env(ID, &hex)
                .spawn()
        })
        .collect::<std::io::Result<Vec<_>>>()?;
    let mut failed = 0;
    for mut c in children {
        if !c.wait()?.success() {
            failed += 1;
        }
    }
    if failed > 0 {
        return Err(format!("{failed} of {nranks} ranks failed").into());
    }
    println!("{nranks} processes, one device each: AllReduce correct on every rank");
    Ok(())
}

/// What each process runs.
fn rank_main(rank: usize, nranks: usize, id: &UniqueId) -> Result<(), Box<dyn std::error::Error>> {
    common::choose_backend()?;
    let device = common::device_for(rank)?;
    let comm = Comm::init_rank_on(device.clone(), nranks, id, rank)?;
    let stream = Stream::new(&device)?;

    let count = 32 * 1024;
    let send = DeviceBuffer::from_slice(&device, &vec![(rank + 1) as f32; count])?;
    let mut recv = DeviceBuffer::<f32>::zeroed(&device, count)?;
    comm.all_reduce(&send, &mut recv, Op::SUM, &stream)?;
    stream.synchronize()?;

    let want = (nranks * (nranks + 1) / 2) as f32;
    if recv.to_vec()?.iter().any(|&x| x != want) {
        return Err(format!("rank {rank}: AllReduce result is not {want}").into());
    }
    // Every rank finishes its operations before any destroys its communicator.
    comm.finalize()?;
    comm.destroy()?;
    Ok(())
}

fn id_from_hex(hex: &str) -> Result<UniqueId, Box<dyn std::error::Error>> {
    let mut id = UniqueId {
        internal: [0; std::mem::size_of::<UniqueId>()],
    };
    if hex.len() != 2 * id.internal.len() {
        return Err("the unique id has the wrong length".into());
    }
    for (i, b) in id.internal.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)?;
    }
    Ok(id)
}
