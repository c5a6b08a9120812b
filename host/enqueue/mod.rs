//! Turns collective calls into kernel launches: checks the arguments, sizes the grid and the
//! chunks, and launches on the user's stream (at once, or when the thread's group ends).

pub mod group;
mod op;
pub mod p2p;
mod patterns;

/// The communicator's launch order, which moved down to the communicator layer that owns it
/// (this path stays for code that named it here).
// For the tests, through the `internals` feature.
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use crate::comm::order;

use crate::comm::{graph_reg, Comm, Shape};
use crate::cuda::{DevPtr, StreamHandle};
use crate::error::{Error, Result};
use crate::proxy::timeline::{self, Mark};
use crate::transport::regmap::Mark as RegMark;
use crate::tune::{Algo, Choice};
use nccl_device::abi::{
    Coll, CollArgs, ALGO_NVLS, ALGO_RING, ALGO_TREE, FLAG_LAB_STAMPS, FLAG_RING_DIRECT,
    FLAG_RING_EXCHANGE, FLAG_RING_REGISTERED, FLAG_TREE_EXCHANGE, LL128_STEP_BYTES, LL_STEP_BYTES,
    PROTO_LL, PROTO_LL128, PROTO_SIMPLE,
};
use nccl_device::ops::RedOpKind;
use nccl_device::types::DataType;
pub use op::{ReduceOp, Scalar};

/// NCCL's `nBytes` of a call: one rank's buffer of AllReduce, Broadcast and Reduce, the whole
/// output of AllGather and input of ReduceScatter. `None` when it overflows.
fn call_bytes(nranks: usize, c: &CollCall) -> Option<usize> {
    let block = c.count.checked_mul(c.dt.size())?;
    let whole = block
        .checked_mul(nranks)
        .filter(|&b| b <= isize::MAX as usize)?;
    Some(match c.coll {
        Coll::AllGather | Coll::ReduceScatter => whole,
        _ => block,
    })
}

/// What the tuner runs for `call` on `comm`: algorithm, protocol, channels, estimated time.
pub fn choose(comm: &Comm, call: &CollCall) -> Result<Choice> {
    let bytes = call_bytes(comm.nranks, call).ok_or_else(|| {
        Error::invalid_argument(format!(
            "count {} of {} overflows the byte size",
            call.count,
            call.dt.name()
        ))
    })?;
    // The switch reduces only some (type, reduction) pairs; AllGather moves bytes.
    let nvls_ok = comm.nvls.is_some()
        && match call.coll {
            Coll::AllGather => true,
            _ => nccl_device::arch::multimem_op(call.dt, call.op.kind()).is_some(),
        };
    comm.tuner.choose_with(call.coll, bytes, nvls_ok)
}

/// The model's time for `call` in µs (0 for an empty call), for ncclGroupSimulateEnd.
pub fn estimate_us(comm: &Comm, call: &CollCall) -> f64 {
    if call.count == 0 {
        return 0.0;
    }
    choose(comm, call).map(|c| c.est_time_us).unwrap_or(0.0)
}

/// Checks one user buffer of `bytes` bytes for a call on `comm`: not null, aligned to its
/// elements, on the communicator's device, and all `bytes` inside its allocation.
pub(crate) fn check_buffer(
    comm: &Comm,
    what: &str,
    p: DevPtr,
    bytes: usize,
    dt: DataType,
) -> Result<()> {
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
    match comm.device.pointer_extent(p, bytes)? {
        Some((d, avail)) if d == comm.device.ordinal && avail >= bytes => Ok(()),
        Some((d, avail)) if d == comm.device.ordinal => Err(Error::invalid_argument(format!(
            "{what} {p:#x} is too short: the call needs {bytes} bytes, its allocation holds \
             {avail} from there"
        ))),
        Some((d, _)) => Err(Error::invalid_argument(format!(
            "{what} {p:#x} is on device {d} but the communicator (rank {}) is on device {}",
            comm.rank, comm.device.ordinal
        ))),
        None => Err(Error::invalid_argument(format!(
            "{what} {p:#x} ({bytes} bytes) is not device memory"
        ))),
    }
}

/// A one-rank call that scales nothing: its result is its input (Avg divides by one), so
/// nothing runs in place and the copy engine moves it out of place, as NCCL does; no kernel, no
/// FIFO, no tuner (`bytes`: the rank's block, which is the whole buffer for one rank).
fn one_rank(comm: &Comm, c: &CollCall, bytes: usize) -> Result<()> {
    comm.tuner.leaves_some(c.coll)?;
    if c.send == c.recv {
        return Ok(()); // on one H200, ~1.0 µs of host time a call against the kernel's 5.5
    }
    // The copy shares nothing with the communicator's other work, so it takes no place in the
    // communicator's launch order: the user's stream orders it with the user's own work. That
    // order's event wait and record would cost a call about 1.5 µs of host time (two capture
    // checks and an event record, by results/h200-driver-call-costs.txt), and in a capture
    // three graph nodes instead of one (twice the replay time of NCCL's one memcpy node on an
    // H100).
    let (device, stream) = (comm.device.clone(), c.stream);
    let (dst, src) = (c.recv, c.send);
    group::ordered(move || device.copy_dtod_async(dst, src, bytes, stream))
}

/// The error of a call whose kernel `name` this build left out (`NCCL_RS_KERNELS` at build
/// time: the kernel researcher's filter).
pub(crate) fn left_out(name: &str) -> Error {
    Error::invalid_usage(format!(
        "kernel {name} is not in this build: it was built with NCCL_RS_KERNELS={:?}, which leaves \
         it out (add it to the list, or build without the variable)",
        nccl_device::kernel_set::FILTER.unwrap_or("")
    ))
}

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

/// Checks a call and launches it now, or when the calling thread's group ends.
pub fn collective(comm: &Comm, call: CollCall) -> Result<()> {
    comm.ras.health.issued(call.coll.name());
    launch_checked(comm, call)
        .map_err(|e| group::record_error(e.context(format!("nccl{}", call.coll.name()))))
}

fn launch_checked(comm: &Comm, c: CollCall) -> Result<()> {
    comm.check_usable()?;
    comm.release_graph_regs();
    let Some(sizes) = check_call(comm, &c)? else {
        return Ok(());
    };
    if comm.nranks == 1 && c.op.kind() != RedOpKind::PreMulSum {
        return one_rank(comm, &c, sizes.bytes);
    }
    let mut plan = collective_args(comm, &c, sizes.bytes)?;
    let graph_wait = direct_handshake(comm, &c, &sizes, &mut plan)?;
    let Planned {
        mut args,
        grid,
        dt,
        op,
        proto,
        ..
    } = plan;
    if comm.stamps.is_some() {
        args.flags |= FLAG_LAB_STAMPS;
    }
    let kernel = comm.kernel(c.coll, dt, op.kind())?;
    let block = block_size(comm, &args, proto);
    let (device, stream) = (comm.device.clone(), c.stream);
    let order = comm.order.clone();
    let net = comm.net.clone();
    let (links, graph_regs) = (comm.links.clone(), comm.graph_regs.clone());
    group::ordered(Box::new(move || {
        // At the group's end: every mark of the group went out when its calls were made.
        if let Some((peers, seq)) = &graph_wait {
            for &peer in peers {
                graph_reg::await_graph_mark(&links, &graph_regs, peer, RegMark::Coll, *seq)?;
            }
        }
        let Some(n) = &net else {
            return order.launch(stream, || device.launch(kernel, grid, block, stream, &args));
        };
        n.proxy.kick(); // the kernel will need the network: wake the proxy
        timeline::mark(Mark::Launch, 0, 0);
        let r = order.launch(stream, || device.launch(kernel, grid, block, stream, &args));
        timeline::mark(Mark::Launched, 0, 0);
        if order.captured() {
            // A graph's replays will not wake the proxy: it keeps its naps short from now on.
            n.proxy.serve_replays();
        }
        r
    }))
}

/// A checked call's sizes: one rank's block, and the bytes of its send and receive buffers.
struct Sizes {
    bytes: usize,
    send_bytes: usize,
    recv_bytes: usize,
}

/// Checks a collective's arguments and buffers; None when it moves nothing (count 0).
fn check_call(comm: &Comm, c: &CollCall) -> Result<Option<Sizes>> {
    let n = comm.nranks;
    if call_bytes(n, c).is_none() {
        return Err(Error::invalid_argument(format!(
            "count {} of {} overflows the byte size",
            c.count,
            c.dt.name()
        )));
    }
    let bytes = c.count * c.dt.size(); // one rank's block
    let rooted = matches!(c.coll, Coll::Broadcast | Coll::Reduce);
    if rooted && c.root >= n {
        return Err(Error::invalid_argument(format!(
            "root {} is out of range (nranks {n})",
            c.root
        )));
    }
    if !nccl_device::kernel_set::built_coll(c.coll, c.dt, c.op.kind()) {
        return Err(left_out(&crate::comm::kernel_name(
            c.coll,
            c.dt,
            c.op.kind(),
        )));
    }
    if c.count == 0 {
        return Ok(None);
    }
    let me_root = c.root == comm.rank;
    let (send_bytes, recv_bytes) = match c.coll {
        Coll::AllGather => (bytes, bytes * n),
        Coll::ReduceScatter => (bytes * n, bytes),
        _ => (bytes, bytes),
    };
    let send_checked = c.coll != Coll::Broadcast || me_root;
    if send_checked {
        check_buffer(comm, "sendbuff", c.send, send_bytes, c.dt)?;
    }
    // In place with equal extents a second check would repeat the first (where it ran: a
    // Broadcast's non-root ranks check only their receive buffer).
    let checked_as_send = send_checked && c.recv == c.send && recv_bytes == send_bytes;
    if (c.coll != Coll::Reduce || me_root) && !checked_as_send {
        check_buffer(comm, "recvbuff", c.recv, recv_bytes, c.dt)?;
    }
    Ok(Some(Sizes {
        bytes,
        send_bytes,
        recv_bytes,
    }))
}

/// What one launch runs: its arguments, its grid, the element type and reduction of its kernel
/// (copies move bytes: one kernel serves every type) and the protocol the tuner chose (NVLS
/// runs it as Simple in `args`).
struct Planned {
    args: CollArgs,
    grid: u32,
    dt: DataType,
    op: ReduceOp,
    count: usize,
    proto: u32,
}

/// The launch's arguments and grid for the tuner's choice: the algorithm's connections and
/// slots, the reduction's scalar, the exchanges this launch may take.
fn collective_args(comm: &Comm, c: &CollCall, bytes: usize) -> Result<Planned> {
    let n = comm.nranks;
    let (dt, op, count) = if c.coll.copies() {
        (DataType::Uint8, ReduceOp::SUM, bytes)
    } else {
        (c.dt, c.op, c.count)
    };
    let (redop_arg, redop_arg_ptr) = match (op.kind(), op.scalar()) {
        (RedOpKind::Avg, _) => (n as u64, 0),
        (_, Some(Scalar::Host(bits))) => (bits, 0),
        (_, Some(Scalar::Device(scalar))) => {
            check_buffer(comm, "the premulsum scalar", scalar, dt.size(), dt)?;
            (0, scalar)
        }
        _ => (0, 0),
    };
    let shape = comm.shape;
    let choice = choose(comm, c)?;
    let proto = choice.proto as u32;
    // FIFO slots one Simple ring step fills (the other protocols fill one of their own).
    let slices = match proto {
        PROTO_SIMPLE => shape.slice_steps_for(c.coll),
        _ => 1,
    };
    let mut args = CollArgs {
        comm: comm.dev_comm.ptr,
        sendbuff: c.send,
        recvbuff: c.recv,
        count: count as u64,
        redop_arg,
        redop_arg_ptr,
        // One step's payload fits one FIFO slot of the protocol (a slice of Simple slots).
        chunk_elems: match proto {
            PROTO_LL => shape.slot_bytes.min(LL_STEP_BYTES),
            PROTO_LL128 => shape.slot_bytes.min(LL128_STEP_BYTES),
            _ => shape.slot_bytes * slices,
        } / dt.size() as u32,
        slice_steps: slices,
        // The exchanges are this launch's to choose (below).
        flags: shape.kernel_flags & !(FLAG_RING_EXCHANGE | FLAG_TREE_EXCHANGE),
        coll: c.coll as u32,
        root: c.root as u32,
        proto,
        algo: ALGO_RING,
        ..CollArgs::default()
    };
    let mut grid = (choice.nchannels as u32).clamp(1, shape.nchannels.max(1));
    // One rank: the ring kernel's local copy serves any algorithm.
    if choice.algo == Algo::Tree && comm.nranks > 1 {
        // Across nodes the double binary tree (CTA c on channel c's tree), else the chain.
        let (slot, ctas) = match &comm.dbt {
            Some(d) => {
                args.tree = d.array.ptr;
                if d.exchanges(&shape) {
                    args.flags |= FLAG_TREE_EXCHANGE;
                }
                (d.slot_bytes as u32, d.ctas)
            }
            None if proto == PROTO_LL => {
                return Err(Error::internal(
                    "the tuner chose an LL tree inside one node, whose links have no LL FIFOs",
                ));
            }
            None => {
                let tree = comm.tree_up.as_ref().ok_or_else(|| {
                    Error::internal("the tuner chose the tree, whose connections were not made")
                })?;
                (args.tree_up_send, args.tree_up_recv) = tree.arrays;
                (tree.slot_bytes as u32, tree.ctas)
            }
        };
        args.algo = ALGO_TREE;
        args.tree_slot_bytes = slot;
        // An LL step's lines (twice its payload) fill at most a slot.
        args.chunk_elems = match proto {
            PROTO_LL => (slot / 2).min(LL_STEP_BYTES),
            _ => slot.min(shape.slot_bytes),
        } / dt.size() as u32;
        args.slice_steps = 1;
        // One CTA per tree connection.
        grid = grid.min(ctas as u32);
    }
    if choice.algo == Algo::Nvls {
        let nvls = comm.nvls.as_ref().ok_or_else(|| {
            Error::internal("the tuner chose NVLS, which this communicator did not set up")
        })?;
        args.algo = ALGO_NVLS;
        args.proto = PROTO_SIMPLE;
        // One CTA per NVLS channel region.
        grid = grid.min(nvls.nchannels as u32).max(1);
    }
    if args.algo == ALGO_RING
        && proto == PROTO_LL
        && n == 2
        && c.coll == Coll::AllReduce
        && shape.kernel_flags & FLAG_RING_EXCHANGE != 0
    {
        args.flags |= FLAG_RING_EXCHANGE;
    }
    Ok(Planned {
        args,
        grid,
        dt,
        op,
        count,
        proto,
    })
}

/// The zero-copy handshake of a ring or tree launch on Simple steps (registered buffers, the
/// agreement on fewer CTAs), and in a capture the graph registration with peers in other
/// processes: the peers whose mark the launch waits for, and the mark.
fn direct_handshake(
    comm: &Comm,
    c: &CollCall,
    sizes: &Sizes,
    plan: &mut Planned,
) -> Result<Option<(Vec<usize>, u64)>> {
    let (send_bytes, recv_bytes) = (sizes.send_bytes, sizes.recv_bytes);
    let me_root = c.root == comm.rank;
    let shape = comm.shape;
    let (proto, grid, dt, count) = (plan.proto, plan.grid, plan.dt, plan.count);
    let args = &mut plan.args;
    // The trees take the handshakes too: the one-node tree (a chain in ring order), and across
    // nodes the links of the double binary tree inside each node (its chains).
    let tree = args.algo == ALGO_TREE;
    // Peers whose graph-registration mark a captured launch waits for, and the mark.
    let mut graph_wait: Option<(Vec<usize>, u64)> = None;
    if (args.algo == ALGO_RING || tree) && proto == PROTO_SIMPLE {
        // Every rank sets the handshake alike (collective, algorithm, protocol); only this
        // rank's registration of its output decides whether it offers and takes offers (a
        // Reduce's other ranks have no output: their input's).
        args.flags |= FLAG_RING_DIRECT;
        // Asked once where captures take marks (peers in other processes), else only when
        // the registration does not decide alone.
        let known = match comm.graph_marks_needed() {
            true => Some(comm.device.stream_capturing(c.stream)?),
            false => None,
        };
        let captured = || known.map_or_else(|| comm.device.stream_capturing(c.stream), Ok);
        let (buff, len) = match c.coll {
            Coll::Reduce if !me_root => (c.send, send_bytes),
            _ => (c.recv, recv_bytes),
        };
        if known == Some(true) {
            // Graph registration with peers in other processes (comm/graph_reg.rs): the
            // buffer the predecessors write into, then the mark the successors wait for.
            comm.graph_register(c.stream, buff, len);
            let seq = comm.mark_captured_coll();
            // Peers with graph registration off send no marks: they would only be waited for.
            let preds: &[usize] = if tree { &comm.tree_tables } else { &[] };
            let peers: Vec<usize> = comm
                .ring_tables
                .iter()
                .chain(preds)
                .copied()
                .filter(|&p| comm.graph_markers[p])
                .collect();
            graph_wait = Some((peers, seq));
        }
        let chunk_bytes = args.chunk_elems as usize * dt.size();
        if !tree {
            args.reg_ctas = fewer_ctas(&shape, c.coll, count * dt.size(), grid, chunk_bytes);
        }
        if comm.registered.coll_zero_copy(buff, len, captured)? {
            args.flags |= FLAG_RING_REGISTERED;
            args.offer_key = comm.links.offer_key(args.recvbuff)?;
            // The successors' registration tables (a tree's neighbours' too), up to date
            // (their records drained).
            let preds: &[usize] = if tree { &comm.tree_tables } else { &[] };
            for &peer in comm.ring_tables.iter().chain(preds) {
                comm.links.direct_reach(peer)?;
            }
        }
    }
    Ok(graph_wait)
}

/// Threads per CTA for the launch: the tree's halves and LL128's lines take whole groups.
fn block_size(comm: &Comm, args: &CollArgs, proto: u32) -> u32 {
    let shape = comm.shape;
    let mut block = shape.nthreads;
    if args.algo == ALGO_TREE {
        // The tree splits its CTAs in two halves that meet at named barriers: whole warps on
        // GPUs (NCCL_NTHREADS=32 would leave 16-thread halves), any halves on the simulator.
        block = match comm.device.is_sim() {
            true => block.next_multiple_of(2),
            false => block.next_multiple_of(64),
        };
    }
    if proto == PROTO_LL128 {
        // LL128 runs in whole warps of 8-lane lines; the simulator's CTAs may be smaller (there,
        // under 32 threads, a multiple of 8 is one narrow warp).
        block = match block {
            0..32 => block.next_multiple_of(8),
            _ => block.next_multiple_of(32),
        };
    }
    block
}

/// [`CollArgs::reg_ctas`] for a ring collective on Simple steps: the shape's registered CTAs
/// where fewer than the `grid` and where every hop of `coll` can go direct (AllReduce,
/// AllGather, Broadcast: ReduceScatter and Reduce copy all but their last hop through the
/// FIFOs, which fewer CTAs would slow down), and only when each of the grid's channels gets a
/// step's `chunk_bytes` of the `block_bytes` (else no channel takes the zero-copy handshake).
/// From facts every rank shares, so every rank asks alike; whether it happens the kernels
/// agree (every rank registered).
fn fewer_ctas(shape: &Shape, coll: Coll, block_bytes: usize, grid: u32, chunk_bytes: usize) -> u32 {
    let direct_all_the_way = matches!(coll, Coll::AllReduce | Coll::AllGather | Coll::Broadcast);
    let fewer = shape.reg_ctas;
    if !direct_all_the_way || fewer == 0 || fewer >= grid {
        return 0;
    }
    match block_bytes / grid as usize >= chunk_bytes.max(1) {
        true => fewer,
        false => 0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fewer_ctas_only_for_large_direct_collectives() {
        let mut shape = Shape {
            nchannels: 32,
            nthreads: 512,
            slot_bytes: 1 << 19,
            algo_mask: 0,
            proto_mask: 0,
            p2p_conns: 0,
            p2p_slot_bytes: 1 << 19,
            slice_steps: 0,
            kernel_flags: 0,
            net_nchannels: 8,
            reg_ctas: 8,
        };
        let mib = 1 << 20;
        assert_eq!(fewer_ctas(&shape, Coll::AllReduce, 64 * mib, 32, mib), 8);
        assert_eq!(fewer_ctas(&shape, Coll::AllGather, 64 * mib, 32, mib), 8);
        assert_eq!(fewer_ctas(&shape, Coll::Broadcast, 64 * mib, 32, mib), 8);
        // Hops through the FIFOs, a grid no larger, slices under a step, or switched off.
        assert_eq!(
            fewer_ctas(&shape, Coll::ReduceScatter, 64 * mib, 32, mib),
            0
        );
        assert_eq!(fewer_ctas(&shape, Coll::Reduce, 64 * mib, 32, mib), 0);
        assert_eq!(fewer_ctas(&shape, Coll::AllReduce, 64 * mib, 8, mib), 0);
        assert_eq!(fewer_ctas(&shape, Coll::AllReduce, 16 * mib, 32, mib), 0);
        shape.reg_ctas = 0;
        assert_eq!(fewer_ctas(&shape, Coll::AllReduce, 64 * mib, 32, mib), 0);
    }
}
