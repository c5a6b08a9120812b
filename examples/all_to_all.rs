//! All-to-all with send and receive (NCCL's point-to-point example): every rank sends block `j`
//! of its buffer to rank `j` and receives rank `i`'s block into block `i`, as `ncclSend` /
//! `ncclRecv` pairs inside one group, which lets them all progress at once.
//!
//! ```text
//! cargo run --example all_to_all [NRANKS]
//! ```

mod common;

use nccl::{Comm, DeviceBuffer, Stream};

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

    // Element k of block j on rank r: 1000·r + 100·j + k.
    let block = 50;
    let value = |r: usize, j: usize, k: usize| (1000 * r + 100 * j + k) as i32;
    let sends = comms
        .iter()
        .map(|c| {
            let r = c.rank();
            let v: Vec<i32> = (0..n * block)
                .map(|i| value(r, i / block, i % block))
                .collect();
            DeviceBuffer::from_slice(c.device(), &v)
        })
        .collect::<nccl::Result<Vec<_>>>()?;
    let mut recvs = comms
        .iter()
        .map(|c| DeviceBuffer::<i32>::zeroed(c.device(), n * block))
        .collect::<nccl::Result<Vec<_>>>()?;

    // One group for every rank's sends and receives (this thread drives all the ranks).
    nccl::group(|g| {
        for (((comm, send), recv), stream) in comms.iter().zip(&sends).zip(&mut recvs).zip(&streams)
        {
            let blocks = send.chunks(block)?.zip(recv.chunks_mut(block)?);
            for (peer, (out, into)) in blocks.enumerate() {
                g.send(comm, out, peer, stream)?;
                g.recv(comm, into, peer, stream)?;
            }
        }
        Ok(())
    })?;

    for (r, (recv, stream)) in recvs.iter().zip(&streams).enumerate() {
        stream.synchronize()?;
        let got = recv.to_vec()?;
        let want: Vec<i32> = (0..n * block)
            .map(|i| value(i / block, r, i % block))
            .collect();
        if got != want {
            return Err(format!("rank {r}: wrong all-to-all result").into());
        }
    }
    println!("{n} ranks: all-to-all through send/recv correct on every rank");
    Ok(())
}
