//! Planning and launching one collective call: the tuner's choice made into the kernel's
//! arguments, its grid and block and the kernel itself, with the zero-copy handshakes and
//! graph registration the launch takes ([`LaunchPlan`]), and the [`Launcher`] that runs it in
//! the communicator's order, now or at the group's end. The communicator answers from its
//! own state; `enqueue` checks the call, asks for the plan, and queues the launch.

use super::call::{call_bytes, CollCall, Sizes};
use super::graph_reg::{self, GraphRegs};
use super::op::{ReduceOp, Scalar};
use super::order::StreamOrder;
use super::window::SymLaunch;
use super::{Comm, Shape};
use crate::cuda::{DevPtr, Device, Kernel, StreamHandle};
use crate::error::{Error, Result};
use crate::proxy::timeline::{self, Mark};
use crate::transport::links::Links;
use crate::transport::net::NetPath;
use crate::transport::regmap::Mark as RegMark;
use crate::tune::{Algo, Choice};
use nccl_device::abi::{
    Coll, CollArgs, ALGO_FOLD, ALGO_NVLS, ALGO_PAT, ALGO_RING, ALGO_SYMMETRIC, ALGO_TREE,
    FLAG_LAB_STAMPS, FLAG_RING_DIRECT, FLAG_RING_EXCHANGE, FLAG_RING_REGISTERED, FLAG_SYM_TWO_SHOT,
    FLAG_TREE_EXCHANGE, LL128_STEP_BYTES, LL_STEP_BYTES, PROTO_LL, PROTO_LL128, PROTO_SIMPLE,
    SYM_LL_CTA_BYTES, SYM_MAX_CTAS, SYM_SRC_STAGED,
};
use nccl_device::ops::RedOpKind;
use nccl_device::types::DataType;
use std::sync::Arc;

/// What one launch of a collective runs: the kernel, its arguments, grid and block, and in a
/// capture the peers whose graph-registration mark it waits for first, and the mark.
pub(crate) struct LaunchPlan {
    pub kernel: Kernel,
    pub args: CollArgs,
    pub grid: u32,
    pub block: u32,
    pub graph_wait: Option<(Vec<usize>, u64)>,
    /// Bytes of one element as the kernel moves them (1 for the copies).
    pub elem_bytes: usize,
}

/// The parts of a communicator a launch uses.
pub(crate) struct Launcher {
    device: Device,
    order: Arc<StreamOrder>,
    net: Option<Arc<NetPath>>,
    links: Arc<Links>,
    graph_regs: Arc<GraphRegs>,
    ring_ops: Option<Arc<super::proxy_ops::RingQueues>>,
}

impl Comm {
    /// What a launch on this communicator needs, to run now or at the group's end.
    pub(crate) fn launcher(&self) -> Launcher {
        Launcher {
            device: self.device.clone(),
            order: self.order.clone(),
            net: self.net.clone(),
            links: self.links.clone(),
            graph_regs: self.graph_regs.clone(),
            ring_ops: self.ring_ops.clone(),
        }
    }
}

impl Launcher {
    /// Launches `plan` on `stream`, in the communicator's order: first waits for the peers'
    /// graph-registration marks it names (at the group's end every mark of the group went out
    /// when its calls were made), and wakes the proxy where the kernel needs the network.
    pub(crate) fn launch(&self, plan: &LaunchPlan, stream: StreamHandle) -> Result<()> {
        if let Some((peers, seq)) = &plan.graph_wait {
            for &peer in peers {
                graph_reg::await_graph_mark(
                    &self.links,
                    &self.graph_regs,
                    peer,
                    RegMark::Coll,
                    *seq,
                )?;
            }
        }
        let (device, order) = (&self.device, &self.order);
        let (kernel, grid, block, args) = (plan.kernel, plan.grid, plan.block, &plan.args);
        let Some(n) = &self.net else {
            return order.launch(stream, || device.launch(kernel, grid, block, stream, args));
        };
        n.proxy.kick(); // the kernel will need the network: wake the proxy
        timeline::mark(Mark::Launch, 0, 0);
        let r = order.launch(stream, || device.launch(kernel, grid, block, stream, args));
        timeline::mark(Mark::Launched, 0, 0);
        if order.captured() {
            // A graph's replays will not wake the proxy: it keeps its naps short from now on.
            n.proxy.serve_replays();
        }
        r
    }

    /// Tells the proxy what ring or tree launch `plan`, just launched, moves on the network (its
    /// profiler events; nothing without a plugin): `profiled` is the call's `Coll` event.
    pub(crate) fn proxy_ops(&self, plan: &LaunchPlan, profiled: super::proxy_ops::Profiled) {
        self.append_ops(plan, self.order.captured(), profiled);
    }

    /// A launch of `plan` failed, perhaps after its kernel was issued: the counters of the
    /// connections it uses can no longer be predicted.
    pub(crate) fn proxy_ops_lost(&self, plan: &LaunchPlan) {
        self.append_ops(plan, true, None);
    }

    fn append_ops(&self, plan: &LaunchPlan, lost: bool, profiled: super::proxy_ops::Profiled) {
        // Without queues on the rings' connections there are none on the node's links.
        let Some(q) = &self.ring_ops else { return };
        q.append(plan, plan.elem_bytes, lost, profiled);
        if plan.args.algo == ALGO_TREE && plan.args.tree == 0 {
            // The one-node tree's way up may run on the send/recv links' connections.
            self.links.lose_op_queues();
        }
    }
}

impl Comm {
    /// The launch of checked call `c` (`sizes`: what the checks found).
    pub(crate) fn plan(&self, c: &CollCall, sizes: &Sizes) -> Result<LaunchPlan> {
        if self.nranks > 1 {
            if let Some(sym) = self.symmetric_launch(c, sizes)? {
                return self.symmetric_plan(c, sizes.bytes, sym);
            }
        }
        let mut planned = collective_args(self, c, sizes.bytes)?;
        let graph_wait = direct_handshake(self, c, sizes, &mut planned)?;
        let Planned {
            mut args,
            grid,
            dt,
            op,
            proto,
            ..
        } = planned;
        if self.stamps.is_some() {
            args.flags |= FLAG_LAB_STAMPS;
        }
        Ok(LaunchPlan {
            kernel: self.kernel(c.coll, dt, op.kind())?,
            block: block_size(self, &args, proto),
            args,
            grid,
            graph_wait,
            elem_bytes: dt.size(),
        })
    }

    /// The kernel of `coll` for this type and op (the copies have one kernel, as uint8),
    /// loaded once per communicator. Each kernel is a module of its own: a first call
    /// JIT-compiles only what it runs.
    pub(crate) fn kernel(&self, coll: Coll, dt: DataType, op: RedOpKind) -> Result<Kernel> {
        let key = (coll, dt, op);
        if let Some(k) = self
            .kernels
            .lock()
            .map_err(|_| Error::internal("kernel cache poisoned"))?
            .get(&key)
        {
            return Ok(*k);
        }
        let k = self.device.kernel(&kernel_name(coll, dt, op))?;
        self.kernels
            .lock()
            .map_err(|_| Error::internal("kernel cache poisoned"))?
            .insert(key, k);
        Ok(k)
    }

    /// A one-shot AllReduce, AllGather or ReduceScatter on the symmetric path
    /// (`comm/window.rs`): a CTA per half LL slot or [`SYM_BYTES_PER_CTA`] of the rank's block,
    /// at least a thread per rank in each.
    fn symmetric_plan(&self, c: &CollCall, bytes: usize, sym: SymLaunch) -> Result<LaunchPlan> {
        let (redop_arg, redop_arg_ptr) = redop_args(self.nranks, c.op);
        let args = CollArgs {
            comm: self.dev_comm.ptr,
            sendbuff: c.send,
            recvbuff: c.recv,
            // The copies' kernel moves bytes.
            count: if c.coll.copies() { bytes } else { c.count } as u64,
            redop_arg,
            redop_arg_ptr,
            coll: c.coll as u32,
            proto: sym.proto,
            algo: ALGO_SYMMETRIC,
            flags: (self.shape.kernel_flags & !(FLAG_RING_EXCHANGE | FLAG_TREE_EXCHANGE))
                | if sym.two_shot { FLAG_SYM_TWO_SHOT } else { 0 },
            sym: sym.dev,
            sym_src: sym.src,
            mc_src: sym.mc.map_or(0, |m| m.0),
            mc_dst: sym.mc.map_or(0, |m| m.1),
            sym_dst: sym.mc.map_or(0, |m| m.2),
            ..CollArgs::default()
        };
        // Small calls as LL lines pushed to every rank (no barrier), larger ones read from
        // the peers between two barriers (`device/src/coll/symmetric.rs`).
        let per_cta = match sym.proto {
            PROTO_LL => SYM_LL_CTA_BYTES / 2,
            _ => SYM_BYTES_PER_CTA,
        };
        // Two-shot: each CTA takes a slice of every rank's block.
        let span = if sym.two_shot {
            bytes.div_ceil(self.nranks)
        } else {
            bytes
        };
        let grid = span.div_ceil(per_cta).clamp(1, SYM_MAX_CTAS) as u32;
        log::info!(
            target: crate::debug::TUNING,
            "{}: {bytes} bytes per rank -> symmetric {}, {grid} CTAs, input {}",
            c.coll.name(),
            match (sym.proto, sym.two_shot) {
                (PROTO_LL, _) => "one-shot LL",
                _ if sym.mc.is_some() => "multimem (where every rank's buffers lie alike)",
                (_, true) => "two-shot loads",
                _ => "one-shot loads",
            },
            match sym.src {
                SYM_SRC_STAGED => "staged",
                _ => "in a window",
            }
        );
        Ok(LaunchPlan {
            kernel: self.kernel(c.coll, c.dt, c.op.kind())?,
            block: self.shape.nthreads.max(self.nranks as u32),
            args,
            grid,
            graph_wait: None,
            elem_bytes: c.dt.size(),
        })
    }

    /// A local fold of the deterministic mode (`enqueue/deterministic.rs`): `nranks` blocks
    /// of `count` elements at `blocks`, reduced in block order with `op` into `out`
    /// ([`ALGO_FOLD`], through the ReduceScatter kernel of the type and reduction). A CTA per
    /// 64 KiB of the output, at most the communicator's channels.
    pub(crate) fn fold_plan(
        &self,
        dt: DataType,
        op: ReduceOp,
        blocks: DevPtr,
        out: DevPtr,
        count: usize,
    ) -> Result<LaunchPlan> {
        let (redop_arg, redop_arg_ptr) = redop_args(self.nranks, op);
        let args = CollArgs {
            comm: self.dev_comm.ptr,
            sendbuff: blocks,
            recvbuff: out,
            count: count as u64,
            redop_arg,
            redop_arg_ptr,
            coll: Coll::ReduceScatter as u32,
            algo: ALGO_FOLD,
            ..CollArgs::default()
        };
        let grid = (count * dt.size())
            .div_ceil(64 << 10)
            .clamp(1, self.shape.nchannels.max(1) as usize) as u32;
        Ok(LaunchPlan {
            kernel: self.kernel(Coll::ReduceScatter, dt, op.kind())?,
            block: self.shape.nthreads,
            args,
            grid,
            graph_wait: None,
            elem_bytes: dt.size(),
        })
    }

    /// The deterministic AllReduce of `count` elements from `send` to `recv`: the tree kernel
    /// on the chain in rank order (`comm/deterministic.rs`), Simple steps, a CTA per 64 KiB
    /// up to the chain's connections.
    pub(crate) fn chain_plan(
        &self,
        dt: DataType,
        op: ReduceOp,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
    ) -> Result<LaunchPlan> {
        let (tree, ctas, slot) = self
            .deterministic_chain()
            .ok_or_else(|| Error::internal("a deterministic AllReduce without its chain"))?;
        let (redop_arg, redop_arg_ptr) = redop_args(self.nranks, op);
        let args = CollArgs {
            comm: self.dev_comm.ptr,
            sendbuff: send,
            recvbuff: recv,
            count: count as u64,
            redop_arg,
            redop_arg_ptr,
            chunk_elems: (slot / dt.size()) as u32,
            coll: Coll::AllReduce as u32,
            proto: PROTO_SIMPLE,
            algo: ALGO_TREE,
            tree,
            tree_slot_bytes: slot as u32,
            slice_steps: 1,
            flags: self.shape.kernel_flags & FLAG_LAB_STAMPS,
            ..CollArgs::default()
        };
        let grid = (count * dt.size()).div_ceil(64 << 10).clamp(1, ctas) as u32;
        Ok(LaunchPlan {
            kernel: self.kernel(Coll::AllReduce, dt, op.kind())?,
            block: block_size(self, &args, PROTO_SIMPLE),
            args,
            grid,
            graph_wait: None,
            elem_bytes: dt.size(),
        })
    }

    /// What the tuner runs for `call` on `comm`: algorithm, protocol, channels, estimated time.
    pub(crate) fn choose(&self, call: &CollCall) -> Result<Choice> {
        let bytes = call_bytes(self.nranks, call).ok_or_else(|| {
            Error::invalid_argument(format!(
                "count {} of {} overflows the byte size",
                call.count,
                call.dt.name()
            ))
        })?;
        // The switch reduces only some (type, reduction) pairs; AllGather moves bytes.
        let nvls_ok = self.nvls.is_some()
            && match call.coll {
                Coll::AllGather => true,
                _ => nccl_device::arch::multimem_op(call.dt, call.op.kind()).is_some(),
            };
        self.tuner.choose_with(call.coll, bytes, nvls_ok)
    }
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

/// The symmetric path's CTAs above LL sizes: one per this many bytes of the rank's block, at
/// most [`SYM_MAX_CTAS`].
const SYM_BYTES_PER_CTA: usize = 16 << 10;

/// [`CollArgs::redop_arg`] and [`CollArgs::redop_arg_ptr`] of `op` on `n` ranks.
fn redop_args(n: usize, op: ReduceOp) -> (u64, u64) {
    match (op.kind(), op.scalar()) {
        (RedOpKind::Avg, _) => (n as u64, 0),
        (_, Some(Scalar::Host(bits))) => (bits, 0),
        // Checked with the call's other buffers (`enqueue::check_call`).
        (_, Some(Scalar::Device(scalar))) => (0, scalar),
        _ => (0, 0),
    }
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
    let (redop_arg, redop_arg_ptr) = redop_args(n, op);
    let shape = comm.shape;
    let choice = comm.choose(c)?;
    log::info!(
        target: crate::debug::TUNING,
        "{}: {bytes} bytes per rank -> algo {} proto {} channels {} est {:.1} us",
        c.coll.name(),
        choice.algo,
        choice.proto,
        choice.nchannels,
        choice.est_time_us
    );
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
    if choice.algo == Algo::Pat {
        let pat = comm.pat.as_ref().ok_or_else(|| {
            Error::internal("the tuner chose PAT, whose connections were not made")
        })?;
        args.algo = ALGO_PAT;
        args.pat = pat.array.ptr;
        // One FIFO slot per step, on every dimension's connections.
        args.slice_steps = 1;
        args.chunk_elems = shape.slot_bytes / dt.size() as u32;
        grid = grid.min(pat.ctas as u32);
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

/// The entry point of `coll`'s kernel for `dt` and `op` (the copies have one kernel, as
/// uint8): `nccl_<symbol>`, or `nccl_<symbol>_<type>_<reduction>`.
pub(crate) fn kernel_name(coll: Coll, dt: DataType, op: RedOpKind) -> String {
    match coll.copies() {
        true => format!("nccl_{}", coll.symbol()),
        false => format!("nccl_{}_{}_{}", coll.symbol(), dt.name(), op.name()),
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
