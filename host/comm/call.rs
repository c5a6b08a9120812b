//! One collective call as the API hands it to the communicator: what it asks for, and the
//! sizes its checks found; one send or receive as its group will launch it.

use super::graph_reg::GraphRegs;
use super::op::ReduceOp;
use super::order::StreamOrder;
use super::Comm;
use crate::cuda::{DevPtr, StreamHandle};
use crate::error::Result;
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
    /// The call's profiling, where a profiler plugin listens (`comm/profile.rs`), with the
    /// call's count and type (its `P2p` event reports them).
    pub(crate) profile: Option<(super::profile::Task, usize, DataType)>,
}

impl Comm {
    /// A checked send (`dir` Send) or receive of `bytes` at `buff` with `peer`, as its group
    /// will launch it: with the buffer's registration (zero-copy where NCCL_LOCAL_REGISTER
    /// allows) and, in a graph capture with a peer in another process, the graph
    /// registration's marks (`comm/graph_reg.rs`).
    pub(crate) fn p2p_op(
        &self,
        dir: Dir,
        buff: DevPtr,
        bytes: usize,
        peer: usize,
        stream: StreamHandle,
    ) -> Result<P2pOp> {
        let capturing = self.device.stream_capturing(stream)?;
        let mut graph_mark = None;
        if capturing && self.registered.graph_enabled() && self.links.maps_our_buffers(peer) {
            // A receive registers its buffer and tells the peer; a send waits for that at
            // launch.
            if dir == Dir::Recv {
                self.graph_register(stream, buff, bytes);
            }
            let seq = self.mark_captured_p2p(peer, dir == Dir::Recv);
            // A peer with graph registration off sends no marks: it is not waited for.
            if dir == Dir::Send && self.graph_marks_from(peer) {
                graph_mark = Some((self.graph_regs.clone(), seq));
            }
        }
        let registered = self.registered.p2p_zero_copy(buff, bytes, capturing);
        let offer_key = match registered && dir == Dir::Recv {
            true => self.links.offer_key(buff)?,
            false => 0,
        };
        Ok(P2pOp {
            links: self.links.clone(),
            order: self.order.clone(),
            nranks: self.nranks,
            peer,
            dir,
            buff,
            bytes,
            stream,
            abort_flag: self.kernel_abort_ptr(),
            kernel_flags: self.shape().kernel_flags,
            registered,
            offer_key,
            graph_mark,
            profile: None,
        })
    }
}
