//! User buffer registration (`ncclCommRegister`): each rank registers the buffers it will use
//! with its communicator, runs collectives on them, and deregisters them by dropping the
//! registration guards (which borrow the communicator, so it outlives them).
//!
//! ```text
//! cargo run --example user_buffer_registration [NRANKS]
//! ```

mod common;

use nccl::{Comm, DeviceBuffer, Op, Stream};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    common::choose_backend()?;
    let n = common::nranks_arg(2);
    let devices: Vec<i32> = (0..n)
        .map(|r| common::device_for(r).map(|d| d.ordinal))
        .collect::<nccl::Result<_>>()?;
    let comms = Comm::init_all(&devices)?;
    let streams = comms
        .iter()
        .map(|c| Stream::new(c.device()))
        .collect::<nccl::Result<Vec<_>>>()?;

    let count = 1 << 16;
    let sends = comms
        .iter()
        .map(|c| DeviceBuffer::from_slice(c.device(), &vec![half::bf16::from_f32(1.0); count]))
        .collect::<nccl::Result<Vec<_>>>()?;
    let mut recvs = comms
        .iter()
        .map(|c| DeviceBuffer::<half::bf16>::zeroed(c.device(), count * n))
        .collect::<nccl::Result<Vec<_>>>()?;

    // Register both buffers of every rank; the guards deregister when dropped.
    let mut registrations = Vec::new();
    for ((comm, send), recv) in comms.iter().zip(&sends).zip(&recvs) {
        registrations.push(comm.register(send)?);
        registrations.push(comm.register(recv)?);
    }

    for _ in 0..3 {
        nccl::group(|g| {
            for (((comm, send), recv), stream) in
                comms.iter().zip(&sends).zip(&mut recvs).zip(&streams)
            {
                g.all_gather(comm, send, recv, stream)?;
            }
            Ok(())
        })?;
        nccl::group(|g| {
            for ((comm, recv), stream) in comms.iter().zip(&mut recvs).zip(&streams) {
                g.all_reduce_in_place(comm, recv, Op::SUM, stream)?;
            }
            Ok(())
        })?;
    }
    for (recv, stream) in recvs.iter().zip(&streams) {
        stream.synchronize()?;
        let want = half::bf16::from_f32(n as f32);
        if recv.to_vec()?.iter().any(|&x| x != want) {
            return Err(format!("the result is not {want}").into());
        }
    }
    drop(registrations); // ncclCommDeregister, before the communicators go
    println!("{n} ranks: AllGather and AllReduce on registered bf16 buffers correct");
    Ok(())
}
