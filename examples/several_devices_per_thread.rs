//! Several devices per thread (NCCL's "Example 3", in one process): one thread creates every
//! rank's communicator with `Comm::init_all` and drives all of them. Their calls go in one
//! `nccl::group`, so that they are launched together; the group borrows the buffers until it
//! ends, so none can be dropped or reused while it still holds them.
//!
//! ```text
//! cargo run --example several_devices_per_thread [NDEVICES]
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
    let streams = comms
        .iter()
        .map(|c| Stream::new(c.device()))
        .collect::<nccl::Result<Vec<_>>>()?;

    let count = 4096;
    let sends = comms
        .iter()
        .map(|c| DeviceBuffer::from_slice(c.device(), &vec![c.rank() as f64; count]))
        .collect::<nccl::Result<Vec<_>>>()?;
    let mut recvs = comms
        .iter()
        .map(|c| DeviceBuffer::<f64>::zeroed(c.device(), count))
        .collect::<nccl::Result<Vec<_>>>()?;

    // One thread, several ranks: their AllReduces must be issued together, in a group.
    nccl::group(|g| {
        for (((comm, send), recv), stream) in comms.iter().zip(&sends).zip(&mut recvs).zip(&streams)
        {
            g.all_reduce(comm, send, recv, Op::AVG, stream)?;
        }
        Ok(())
    })?;

    let want = (n - 1) as f64 / 2.0;
    for (stream, recv) in streams.iter().zip(&recvs) {
        stream.synchronize()?;
        if recv.to_vec()?.iter().any(|&x| (x - want).abs() > 1e-12) {
            return Err(format!("AllReduce (avg) is not {want}").into());
        }
    }
    println!("1 thread, {n} devices: AllReduce (avg) correct on every rank");
    Ok(())
}
