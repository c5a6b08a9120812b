//! One collective call as the API hands it to the communicator: what it asks for, and the
//! sizes its checks found.

use super::op::ReduceOp;
use crate::cuda::{DevPtr, StreamHandle};
use nccl_device::abi::Coll;
use nccl_device::types::DataType;

/// One collective call as the API received it.
#[derive(Clone, Copy, Debug)]
pub struct CollCall {
    /// Which collective.
    pub coll: Coll,
    /// The send buffer's device address.
    pub send: DevPtr,
    /// The receive buffer's device address.
    pub recv: DevPtr,
    /// Elements: of the whole buffer (AllReduce, Broadcast, Reduce), of each rank's block
    /// (AllGather's input, ReduceScatter's output).
    pub count: usize,
    /// The element type.
    pub dt: DataType,
    /// The reduction (AllReduce, Reduce, ReduceScatter).
    pub op: ReduceOp,
    /// Broadcast and Reduce only.
    pub root: usize,
    /// The stream it is ordered on.
    pub stream: StreamHandle,
}

/// NCCL's `nBytes` of a call: one rank's buffer of AllReduce, Broadcast and Reduce, the whole
/// output of AllGather and input of ReduceScatter. `None` when it overflows.
pub(crate) fn call_bytes(nranks: usize, c: &CollCall) -> Option<usize> {
    let block = c.count.checked_mul(c.dt.size())?;
    let whole = block
        .checked_mul(nranks)
        .filter(|&b| b <= isize::MAX as usize)?;
    Some(match c.coll {
        Coll::AllGather | Coll::ReduceScatter => whole,
        _ => block,
    })
}

/// A checked call's sizes: one rank's block, and the bytes of its send and receive buffers.
pub(crate) struct Sizes {
    /// One rank's block.
    pub bytes: usize,
    /// The send buffer's bytes.
    pub send_bytes: usize,
    /// The receive buffer's bytes.
    pub recv_bytes: usize,
}
