//! Turns collective calls into kernel launches: checks the arguments, sizes the grid and the
//! chunks, and launches on the user's stream (at once, or when the thread's group ends).

pub mod group;

use crate::comm::Comm;
use crate::cuda::{DevPtr, StreamHandle};
use crate::error::{Error, Result};
use nccl_device::abi::CollArgs;
use nccl_device::ops::RedOpKind;
use nccl_device::types::DataType;

/// A reduction as the API takes it: NCCL's built-in ops, or PreMulSum with its scalar given as
/// the raw bits of one element of the collective's type (what `ncclRedOpCreatePreMulSum` makes).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReduceOp {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
    PreMulSum { scalar_bits: u64 },
}

impl ReduceOp {
    pub fn kind(self) -> RedOpKind {
        match self {
            ReduceOp::Sum => RedOpKind::Sum,
            ReduceOp::Prod => RedOpKind::Prod,
            ReduceOp::Max => RedOpKind::Max,
            ReduceOp::Min => RedOpKind::Min,
            ReduceOp::Avg => RedOpKind::Avg,
            ReduceOp::PreMulSum { .. } => RedOpKind::PreMulSum,
        }
    }

    /// From `ncclRedOp_t`'s built-in values (0..=4).
    pub fn from_raw(v: u32) -> Option<ReduceOp> {
        Some(match v {
            0 => ReduceOp::Sum,
            1 => ReduceOp::Prod,
            2 => ReduceOp::Max,
            3 => ReduceOp::Min,
            4 => ReduceOp::Avg,
            _ => return None,
        })
    }
}

/// Smallest per-channel share worth a channel of its own (bytes); smaller calls use fewer CTAs.
const MIN_CHANNEL_BYTES: usize = 64 * 1024;

/// How many channels a call of `bytes` uses on a communicator with `max` channels.
pub fn channels_for(bytes: usize, max: u32) -> u32 {
    (bytes / MIN_CHANNEL_BYTES).clamp(1, max.max(1) as usize) as u32
}

/// Checks one user buffer of `bytes` bytes for a call on `comm`.
fn check_buffer(comm: &Comm, what: &str, p: DevPtr, bytes: usize, dt: DataType) -> Result<()> {
    if p == 0 {
        return Err(Error::invalid_argument(format!("{what} is a null pointer")));
    }
    if !p.is_multiple_of(dt.size() as u64) {
        return Err(Error::invalid_argument(format!(
            "{what} {p:#x} is not aligned to its {}-byte elements ({})",
            dt.size(),
            dt.name()
        )));
    }
    match comm.device.pointer_device(p)? {
        Some(d) if d == comm.device.ordinal => Ok(()),
        Some(d) => Err(Error::invalid_argument(format!(
            "{what} {p:#x} is on device {d} but the communicator (rank {}) is on device {}",
            comm.rank, comm.device.ordinal
        ))),
        None => Err(Error::invalid_argument(format!(
            "{what} {p:#x} ({bytes} bytes) is not device memory"
        ))),
    }
}

/// `ncclAllReduce`.
pub fn all_reduce(
    comm: &Comm,
    send: DevPtr,
    recv: DevPtr,
    count: usize,
    dt: DataType,
    op: ReduceOp,
    stream: StreamHandle,
) -> Result<()> {
    all_reduce_checked(comm, send, recv, count, dt, op, stream).map_err(group::record_error)
}

fn all_reduce_checked(
    comm: &Comm,
    send: DevPtr,
    recv: DevPtr,
    count: usize,
    dt: DataType,
    op: ReduceOp,
    stream: StreamHandle,
) -> Result<()> {
    comm.check_usable()?;
    let bytes = count
        .checked_mul(dt.size())
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "count {count} of {} overflows the byte size",
                dt.name()
            ))
        })?;
    if count == 0 {
        return Ok(());
    }
    check_buffer(comm, "sendbuff", send, bytes, dt)?;
    check_buffer(comm, "recvbuff", recv, bytes, dt)?;
    let redop_arg = match op {
        ReduceOp::Avg => comm.nranks as u64,
        ReduceOp::PreMulSum { scalar_bits } => scalar_bits,
        _ => 0,
    };
    let shape = comm.shape;
    let args = CollArgs {
        comm: comm.dev_comm.ptr,
        sendbuff: send,
        recvbuff: recv,
        count: count as u64,
        redop_arg,
        chunk_elems: shape.slot_bytes / dt.size() as u32,
        _pad: 0,
    };
    let kernel = comm.kernel("all_reduce", dt, op.kind())?;
    let grid = channels_for(bytes, shape.nchannels);
    let (device, block) = (comm.device.clone(), shape.nthreads);
    group::ordered(Box::new(move || {
        device.launch(kernel, grid, block, stream, &args)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_calls_use_few_channels() {
        assert_eq!(channels_for(8, 16), 1);
        assert_eq!(channels_for(1 << 20, 32), 16);
        assert_eq!(channels_for(1 << 20, 4), 4);
        assert_eq!(channels_for(1 << 30, 16), 16);
        assert_eq!(channels_for(1 << 30, 0), 1);
        assert_eq!(ReduceOp::from_raw(4), Some(ReduceOp::Avg));
        assert_eq!(ReduceOp::from_raw(5), None);
    }
}
