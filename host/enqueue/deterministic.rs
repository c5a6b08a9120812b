//! Deterministic reductions (NCCL_RS_DETERMINISTIC; beyond NCCL): a floating-point AllReduce,
//! ReduceScatter or Reduce whose bits depend only on the inputs and the rank count. The order
//! of a ring's or a tree's additions depends on the algorithm, the channels and the node
//! layout; here every element is reduced by one rank, in rank order, from every rank's value:
//!
//! An AllReduce is one fused launch instead: the tree kernel on a chain in rank order (rank 0
//! a leaf, rank n − 1 the root: `comm/deterministic.rs`), which adds in that same order on
//! its way up and brings the result back down. ReduceScatter and Reduce go in three steps:
//!
//! 1. **exchange**: each rank sends block `q` of its input to rank `q` (sends and receives,
//!    the communicator's connections to every rank), which stages the blocks in rank order;
//! 2. **fold**: each rank reduces its staged blocks in rank order into its block of the output
//!    (`device/src/coll/fold.rs`);
//! 3. **gather** (AllReduce, Reduce): each rank sends its block to the ranks that need it.
//!
//! The network carries what a ring carries (each rank sends `(n-1)/n` of its input each way
//! for AllReduce). A call larger than the staging memory goes in pieces, each element's
//! order unchanged; the `count mod nranks` elements an AllReduce or Reduce has past its last
//! whole block are exchanged whole and folded by every rank that needs them.
//!
//! The whole call is one job of the communicator's order, so inside a group its three steps
//! stay together and in order.

use super::group;
use super::p2p;
use crate::comm::call::P2pOp;
use crate::comm::{CollCall, Comm};
use crate::cuda::DevPtr;
use crate::error::Result;
use crate::transport::Dir;
use nccl_device::abi::Coll;
use nccl_device::ops::RedOpKind;

/// Whether `call` takes the deterministic path on `comm`: the mode is on and the reduction's
/// result depends on the order of its operations (floating-point sums, products, averages
/// and premultiplied sums; integers and min/max come out the same in any order).
pub(crate) fn applies(comm: &Comm, call: &CollCall) -> bool {
    comm.deterministic_scratch().is_some()
        && matches!(
            call.coll,
            Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce
        )
        && call.dt.is_float()
        && !matches!(call.op.kind(), RedOpKind::Max | RedOpKind::Min)
}

/// One step of a call: sends and receives launched together, or a launch (a fold, or the
/// AllReduce's chain).
enum Step {
    Exchange(Vec<P2pOp>),
    Fold(crate::comm::LaunchPlan),
}

/// Queues `call` (checked, `applies`; one rank too, for a premultiplied sum) in the
/// communicator's order.
pub(crate) fn enqueue(comm: &Comm, call: &CollCall) -> Result<()> {
    let steps = steps(comm, call)?;
    let launcher = comm.launcher();
    let stream = call.stream;
    group::ordered(Box::new(move || {
        for step in steps {
            match step {
                Step::Exchange(ops) => p2p::flush(ops)?,
                Step::Fold(plan) => launcher.launch(&plan, stream)?,
            }
        }
        Ok(())
    }))
}

/// The steps of `call`, piece by piece (an AllReduce: one launch on the chain in rank order).
fn steps(comm: &Comm, c: &CollCall) -> Result<Vec<Step>> {
    let (n, size) = (comm.count(), c.dt.size());
    if c.coll == Coll::AllReduce {
        let plan = comm.chain_plan(c.dt, c.op, c.send, c.recv, c.count)?;
        comm.log_deterministic(c.coll, c.count * size, 1);
        return Ok(vec![Step::Fold(plan)]);
    }
    let (scratch, bytes) = comm
        .deterministic_scratch()
        .ok_or_else(|| crate::error::Error::internal("deterministic mode without its scratch"))?;
    // Elements per rank and piece: n staged blocks and a folded one, each 16-byte aligned
    // (the staging holds at least n + 1 packs: `comm/deterministic.rs`).
    let piece = (((bytes / (n + 1)) & !15) / size).max(1);
    // Rank q owns elements q * block .. (q + 1) * block (a ReduceScatter's blocks are its
    // per-rank count) and, of an AllReduce's or Reduce's `count mod n` last ones, the q-th.
    let (block, tail) = match c.coll {
        Coll::ReduceScatter => (c.count, 0),
        _ => (c.count / n, c.count % n),
    };
    let mut steps = Vec::new();
    let mut first = 0;
    while first < block {
        let len = piece.min(block - first);
        let out = (c.coll == Coll::ReduceScatter).then_some(first);
        round(
            comm,
            c,
            scratch,
            n,
            |q| q * block + first,
            len,
            out,
            &mut steps,
        )?;
        first += len;
    }
    if tail > 0 {
        round(
            comm,
            c,
            scratch,
            tail,
            |q| n * block + q,
            1,
            None,
            &mut steps,
        )?;
    }
    comm.log_deterministic(c.coll, c.count * size, steps.len());
    Ok(steps)
}

/// One round: ranks `0..owners` each fold `len` elements, rank `q` those at `offset(q)` of
/// the input (and of an AllReduce's or Reduce's output; a ReduceScatter's at `out_at`),
/// staged at `scratch`.
#[allow(clippy::too_many_arguments)]
fn round(
    comm: &Comm,
    c: &CollCall,
    scratch: DevPtr,
    owners: usize,
    offset: impl Fn(usize) -> usize,
    len: usize,
    out_at: Option<usize>,
    steps: &mut Vec<Step>,
) -> Result<()> {
    let (n, r, size) = (comm.count(), comm.rank(), c.dt.size());
    let at = |base: DevPtr, elems: usize| base + (elems * size) as u64;
    // A send is willing to write straight into the peer's buffer (zero-copy) whatever its
    // own buffer is: no peer reads it, and the receive decides (it offers its staging, which
    // is registered, or a registered output, or declines).
    let op = |dir, buff, elems: usize, peer| -> Result<P2pOp> {
        let mut op = comm.p2p_op(dir, buff, elems * size, peer, c.stream)?;
        op.registered |= dir == Dir::Send;
        Ok(op)
    };
    let staged = |q: usize| at(scratch, q * len);
    let root = (c.coll == Coll::Reduce).then_some(c.root);
    // Who needs an owner's result: every rank (AllReduce), the root (Reduce), nobody else
    // (ReduceScatter: its owner).
    let needs = |q: usize| c.coll == Coll::AllReduce || root == Some(q);
    let owner = r < owners;
    let mut exchange = Vec::with_capacity(2 * n);
    for q in 0..n {
        if q < owners {
            exchange.push(op(Dir::Send, at(c.send, offset(q)), len, q)?);
        }
        if owner {
            exchange.push(op(Dir::Recv, staged(q), len, q)?);
        }
    }
    steps.push(Step::Exchange(exchange));
    // Where this rank's folded block goes: its place in the output, or (a Reduce's other
    // ranks) the staging memory's last block, from where it goes to the root.
    let mine = match out_at {
        Some(first) => at(c.recv, first),
        None if needs(r) => at(c.recv, offset(r)),
        None => staged(n),
    };
    if owner {
        steps.push(Step::Fold(comm.fold_plan(c.dt, c.op, scratch, mine, len)?));
    }
    let mut gather = Vec::new();
    for q in (0..n).filter(|&q| q != r && c.coll != Coll::ReduceScatter) {
        if owner && needs(q) {
            gather.push(op(Dir::Send, mine, len, q)?);
        }
        if q < owners && needs(r) {
            gather.push(op(Dir::Recv, at(c.recv, offset(q)), len, q)?);
        }
    }
    if !gather.is_empty() {
        steps.push(Step::Exchange(gather));
    }
    Ok(())
}
