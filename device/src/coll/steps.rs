//! How many steps a CTA takes on each of its connections in one launch, from the launch's
//! arguments alone: the walks of the ring kernels of this module (`all_reduce::ring`,
//! `all_gather::ring`, `reduce_scatter::ring`, `broadcast::ring`, `reduce::ring`), of the tree
//! across nodes (`all_reduce::dbt`) and of PAT (`pat`), counting instead of moving. The host needs the counts before the kernel runs: the profiler's proxy
//! events name each connection's steps of a call ahead (NCCL's `ncclProxyOp::nsteps`).
//!
//! The unit is a Prims operation (one step of the launch's protocol; a Simple operation fills
//! `slice` FIFO slots, [`RingSteps::slots`]). Any change to those walks must change this
//! too: the simulator's tests compare both with the step counters the kernels leave.

use super::{align_up, div_ceil};
use crate::abi::{Coll, FLAG_RING_EXCHANGE, LL128_STEP_BYTES, LL_STEP_BYTES, PROTO_SIMPLE};
use crate::prims::slice_steps;

/// What a ring launch is, as one CTA of one rank sees it.
#[derive(Clone, Copy, Debug)]
pub struct RingLaunch {
    pub coll: Coll,
    /// `CollArgs::count`: elements (AllGather and ReduceScatter: per rank).
    pub count: usize,
    pub elem_bytes: usize,
    pub nranks: usize,
    pub cta: usize,
    pub grid: usize,
    /// The communicator's Simple slot (`DevComm::slot_bytes`).
    pub slot_bytes: usize,
    /// `CollArgs::chunk_elems`, `slice_steps`, `proto`, `flags`.
    pub chunk_elems: usize,
    pub slice_steps: u32,
    pub proto: u32,
    pub flags: u32,
    /// Broadcast and Reduce: how many hops downstream of the root this rank is on the CTA's
    /// ring (0: the root).
    pub root_distance: usize,
}

/// Prims operations on the CTA's send and receive connections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingSteps {
    pub send: u64,
    pub recv: u64,
}

impl RingSteps {
    /// FIFO slots one operation of `l` fills: `slice` for Simple, 1 for LL and LL128.
    pub fn slots(l: &RingLaunch) -> u64 {
        match l.proto {
            PROTO_SIMPLE => slice_steps(l.slice_steps) as u64,
            _ => 1,
        }
    }
}

/// The CTA's slice of the launch (`channel_range`).
fn range(l: &RingLaunch, pack: usize) -> (usize, usize) {
    let per = align_up(div_ceil(l.count, l.grid.max(1)), pack);
    let start = core::cmp::min(l.cta * per, l.count);
    (start, core::cmp::min(start + per, l.count))
}

/// Elements per step (`Kernel::max_chunk`).
fn max_chunk(l: &RingLaunch) -> usize {
    let bytes = match l.proto {
        PROTO_SIMPLE => l.slot_bytes * slice_steps(l.slice_steps) as usize,
        p if p == crate::abi::PROTO_LL => LL_STEP_BYTES as usize,
        _ => LL128_STEP_BYTES as usize,
    };
    core::cmp::min(l.chunk_elems, bytes / l.elem_bytes.max(1))
}

/// Pieces of `[start, end)` taken `chunk` at a time.
fn pieces(start: usize, end: usize, chunk: usize) -> u64 {
    match end > start {
        true => div_ceil(end - start, chunk.max(1)) as u64,
        false => 0,
    }
}

/// The operations one CTA of a ring launch takes on each connection (see the module's text).
/// A rank alone on its ring takes none.
pub fn ring_steps(l: &RingLaunch) -> RingSteps {
    let n = l.nranks;
    if n < 2 {
        return RingSteps::default();
    }
    let pack = 16 / l.elem_bytes.max(1);
    let (start, end) = range(l, pack.max(1));
    let chunk = max_chunk(l);
    let each = |ops: u64| RingSteps {
        send: ops,
        recv: ops,
    };
    match l.coll {
        Coll::AllReduce if n == 2 && l.flags & FLAG_RING_EXCHANGE != 0 => {
            each(pieces(start, end, chunk))
        }
        Coll::AllReduce => {
            // Pieces of up to n chunks (`piece_chunk`), 2 (n - 1) operations each way.
            let (mut off, mut count) = (start, 0u64);
            while off < end {
                let c = core::cmp::min(chunk, align_up(div_ceil(end - off, n), pack.max(1)));
                off += core::cmp::min(end - off, c * n);
                count += 1;
            }
            each(count * 2 * (n as u64 - 1))
        }
        Coll::AllGather | Coll::ReduceScatter => each(pieces(start, end, chunk) * (n as u64 - 1)),
        Coll::Broadcast => {
            // A chain from the root: it only sends, the last rank only receives.
            let p = pieces(start, end, chunk);
            let d = l.root_distance;
            RingSteps {
                send: if d < n - 1 { p } else { 0 },
                recv: if d > 0 { p } else { 0 },
            }
        }
        Coll::Reduce => {
            // A chain into the root from its successor (d = 1), which only sends; the root
            // (d = 0) only receives.
            let p = pieces(start, end, chunk);
            let d = l.root_distance;
            RingSteps {
                send: if d != 0 { p } else { 0 },
                recv: if d != 1 { p } else { 0 },
            }
        }
    }
}

/// One CTA's share of a launch whose steps fill one Simple slot each (the tree's and PAT's):
/// `count` elements of `elem_bytes` over `grid` CTAs; `chunk_elems` and `slot_bytes` are the
/// launch's `CollArgs::chunk_elems` and its connections' slot (the tree's `tree_slot_bytes`).
#[derive(Clone, Copy, Debug)]
pub struct SlotLaunch {
    pub coll: Coll,
    pub count: usize,
    pub elem_bytes: usize,
    pub cta: usize,
    pub grid: usize,
    pub chunk_elems: usize,
    pub slot_bytes: usize,
}

impl SlotLaunch {
    /// The same launch as the ring's walk takes it, for [`range`] and [`max_chunk`].
    fn as_ring(&self) -> RingLaunch {
        RingLaunch {
            coll: self.coll,
            count: self.count,
            elem_bytes: self.elem_bytes,
            nranks: 2,
            cta: self.cta,
            grid: self.grid,
            slot_bytes: self.slot_bytes,
            chunk_elems: self.chunk_elems,
            slice_steps: 1,
            proto: PROTO_SIMPLE,
            flags: 0,
            root_distance: 0,
        }
    }

    /// Elements per pack, and the CTA's slice.
    fn slice(&self) -> (usize, (usize, usize)) {
        let pack = (16 / self.elem_bytes.max(1)).max(1);
        (pack, range(&self.as_ring(), pack))
    }

    /// The steps one CTA of the tree AllReduce across nodes (`all_reduce::dbt`, every
    /// variant) takes on each connection it uses (to its parent, from and to each child): one
    /// per chunk, whichever protocol and whether or not the heads exchange.
    pub fn tree_steps(&self) -> u64 {
        let (pack, (start, end)) = self.slice();
        // `tree_chunk`: the host's chunk within a slot, in whole packs, at least one.
        let fits = core::cmp::min(self.chunk_elems, self.slot_bytes / self.elem_bytes.max(1));
        let chunk = core::cmp::max(pack, fits / pack * pack);
        pieces(start, end, chunk)
    }

    /// The steps one CTA of PAT (`coll::pat`) on `nranks` takes on each dimension's
    /// connections: per dimension `k` (ranks `2^k` apart), on its send and on its receive
    /// connection. A slice that fits one aggregated piece takes one step each way per
    /// dimension; a larger one a step per offset per piece. `scratch_bytes` is the CTA's
    /// `PatDev::scratch_bytes` (ReduceScatter's partial sums bound its pieces). Calls
    /// `each(k, send_steps, recv_steps)` for every dimension, in the order the kernel runs
    /// them.
    pub fn pat_steps(
        &self,
        nranks: usize,
        scratch_bytes: usize,
        mut each: impl FnMut(usize, u64, u64),
    ) {
        let n = nranks;
        if n < 2 {
            return;
        }
        let (pack, (start, end)) = self.slice();
        let mut chunk = max_chunk(&self.as_ring());
        let kept_slots = (n - 1) / 2;
        if self.coll == Coll::ReduceScatter && kept_slots > 0 {
            let room = scratch_bytes / self.elem_bytes.max(1) / kept_slots;
            chunk = core::cmp::min(chunk, room / pack * pack);
        }
        // `pat::aggregate_piece`.
        let piece = chunk / (n / 2) / pack * pack;
        let packed = start < end && end - start <= piece;
        let dims = crate::abi::pat_dims(n);
        // In the kernel's order: AllGather from the highest dimension down, ReduceScatter up.
        for i in 0..dims {
            let k = match self.coll {
                Coll::AllGather => dims - 1 - i,
                _ => i,
            };
            let d = 1usize << k;
            let steps = match packed {
                true => 1,
                // `pat::offsets`: the multiples of 2d below n - d.
                false => pieces(start, end, chunk) * ((n - d - 1) / (2 * d) + 1) as u64,
            };
            each(k, steps, steps);
        }
    }
}
