//! One collective call as the API hands it to the communicator: what it asks for, and the
//! sizes its checks found.

use super::graph_reg::GraphRegs;
use super::op::ReduceOp;
use super::order::StreamOrder;
use crate::cuda::{DevPtr, StreamHandle};
use crate::transport::links::Links;
use crate::transport::Dir;
use nccl_device::abi::Coll;
use nccl_device::types::DataType;
use std::sync::Arc;

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

/// One send or receive, checked, waiting for its group to end (or run at once outside one):
/// what its launch needs of the communicator.
pub struct P2pOp {
    pub links: Arc<Links>,
    pub order: Arc<StreamOrder>,
    pub nranks: usize,
    pub peer: usize,
    pub dir: Dir,
    pub buff: DevPtr,
    pub bytes: usize,
    pub stream: StreamHandle,
    /// The communicator's abort flag (device address), for the kernel's waits.
    pub abort_flag: DevPtr,
    /// The communicator's kernel flags ([`crate::comm::Shape::kernel_flags`]).
    pub kernel_flags: u32,
    /// The buffer is registered (and NCCL_LOCAL_REGISTER allows zero-copy).
    pub registered: bool,
    /// A registered receive's [`nccl_device::abi::P2pItem::offer_key`].
    pub offer_key: u64,
    /// A captured send to a peer in another process (graph registration): the peer's receive
    /// mark to wait for before the launch, and where the wait is configured.
    pub graph_mark: Option<(Arc<GraphRegs>, u64)>,
}
