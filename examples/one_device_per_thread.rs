//! One device per thread (NCCL's "Example 1" with threads for processes): the main thread makes
//! the unique id; each thread opens its own device, creates its rank's communicator and owns it
//! (a `Comm` is `Send`), all-reduces, and destroys it.
//!
//! ```text
//! cargo run --example one_device_per_thread [NRANKS]
//! ```

mod common;

use nccl::{Comm, DeviceBuffer, Op, Stream};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    common::choose_backend()?;
    let nranks = common::nranks_arg(4);
    let id = nccl::get_unique_id()?;

    let threads: Vec<_> = (0..nranks)
        .map(|rank| {
            std::thread::spawn(move || -> nccl::Result<Vec<i64>> {
                let device = common::device_for(rank)?;
                let comm = Comm::init_rank_on(device.clone(), nranks, &id, rank)?;
                let stream = Stream::new(&device)?;
                // In place: every rank's buffer ends up holding the element-wise maximum.
                let mine: Vec<i64> = (0..1000).map(|i| i * rank as i64).collect();
                let mut buf = DeviceBuffer::from_slice(&device, &mine)?;
                comm.all_reduce_in_place(&mut buf, Op::MAX, &stream)?;
                stream.synchronize()?;
                let out = buf.to_vec()?;
                comm.finalize()?;
                comm.destroy()?;
                Ok(out)
            })
        })
        .collect();

    let want: Vec<i64> = (0..1000).map(|i| i * (nranks as i64 - 1)).collect();
    for (rank, t) in threads.into_iter().enumerate() {
        let got = t.join().map_err(|_| format!("rank {rank} panicked"))??;
        if got != want {
            return Err(format!("rank {rank}: wrong AllReduce result").into());
        }
    }
    println!("{nranks} threads, one device each: AllReduce (max, in place) correct on every rank");
    Ok(())
}
