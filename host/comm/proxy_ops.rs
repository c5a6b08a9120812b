//! The collectives' share of the profiler's proxy events (`proxy/ops.rs`): where a profiler
//! plugin is loaded, each ring or double-binary-tree launch appends to the op queue of every
//! network connection its CTAs use the steps it will take there (`nccl_device::coll::steps`),
//! so that the proxy thread can report them as `ProxyOp` and `ProxyStep` events under the
//! call's `Coll` event.

use super::pat::{Pat, PeerQueue};
use super::plan::LaunchPlan;
use super::Rings;
use crate::profiler::{CommProfiler, Event, ProxyOpDescr};
use crate::proxy::ops::{queue_of, OpQueue};
use crate::transport::Dir;
use crate::transport::{Conn, Made};
use nccl_device::abi::{pat_dims, Coll, ALGO_PAT, ALGO_RING, ALGO_TREE, PROTO_SIMPLE};
use nccl_device::coll::steps::{ring_steps, RingLaunch, RingSteps, SlotLaunch};
use std::sync::Arc;

/// One channel's network connections of the ring: (peer, queue) for its send and its receive.
#[derive(Default)]
struct Channel {
    send: Option<(usize, Arc<OpQueue>)>,
    recv: Option<(usize, Arc<OpQueue>)>,
    /// This rank's position on the channel's ring, and the ring (ranks in ring order).
    pos: usize,
    ring: Vec<usize>,
}

/// The network connections of the rings and of the double binary tree that have op queues,
/// per channel.
pub(crate) struct RingQueues {
    channels: Vec<Channel>,
    slot_bytes: usize,
    /// Per channel, the tree's: (peer, direction, queue).
    tree: Vec<Vec<(usize, Dir, Arc<OpQueue>)>>,
    /// PAT's: per CTA, per dimension, AllGather's and ReduceScatter's (send, receive); and
    /// each CTA's scratch bytes.
    pat: Vec<Vec<[[Option<PeerQueue>; 2]; 2]>>,
    pat_scratch: usize,
    nranks: usize,
}

/// What the launch's `Coll` event is, where the call is profiled: the plugin's context, the
/// activation mask at the call, and the event.
pub(crate) type Profiled = Option<(Arc<CommProfiler>, u64, Event)>;

/// Appends to `q` a launch of `descr.steps` FIFO steps in operations of `slots` slots (its
/// `ProxyOp` event hangs from `p`'s where the call is profiled); a launch `captured` into a
/// graph loses the queue instead.
fn put(q: &OpQueue, captured: bool, p: &Profiled, slots: u64, descr: ProxyOpDescr) {
    if captured {
        return q.lose();
    }
    let profiled = p
        .as_ref()
        .map(|(prof, mask, parent)| (prof.clone(), *mask, *parent, descr));
    q.append(descr.steps / slots.max(1), slots, profiled);
}

impl RingQueues {
    /// The queues of the ring connections `made` and of the tree's (None where none of them
    /// has one: no profiler plugin, or no network connection).
    pub(crate) fn of(
        made: &Made,
        rings: &Rings,
        dbt: Option<&super::tree::Dbt>,
        pat: Option<&Pat>,
        rank: usize,
        nchannels: usize,
        slot_bytes: usize,
    ) -> Option<Arc<RingQueues>> {
        let mut channels: Vec<Channel> = (0..nchannels)
            .map(|c| Channel {
                pos: rings.position(c, rank),
                ring: rings.ring(c).to_vec(),
                ..Channel::default()
            })
            .collect();
        let mut any = false;
        for (want, conn) in &made.conns {
            let Some(ch) = channels.get_mut(want.key as usize) else {
                continue;
            };
            let (tail, side) = match (want.dir, conn) {
                (Dir::Send, Conn::Send(s)) => (s.tail, &mut ch.send),
                (Dir::Recv, Conn::Recv(r)) => (r.tail, &mut ch.recv),
                _ => continue,
            };
            if let Some(q) = queue_of(tail) {
                *side = Some((want.peer, q));
                any = true;
            }
        }
        let tree: Vec<_> = match dbt {
            Some(d) => (0..d.ctas).map(|c| d.op_queues(c)).collect(),
            None => Vec::new(),
        };
        any |= tree.iter().any(|t| !t.is_empty());
        let nranks = rings.nranks();
        let pat_queues: Vec<Vec<_>> = match pat {
            Some(p) => (0..p.ctas)
                .map(|c| {
                    (0..pat_dims(nranks))
                        .map(|k| {
                            [Coll::AllGather, Coll::ReduceScatter].map(|x| p.op_queues(c, k, x))
                        })
                        .collect()
                })
                .collect(),
            None => Vec::new(),
        };
        any |= pat_queues
            .iter()
            .flatten()
            .flatten()
            .flatten()
            .any(Option::is_some);
        any.then(|| {
            Arc::new(RingQueues {
                channels,
                slot_bytes,
                tree,
                pat: pat_queues,
                pat_scratch: pat.map_or(0, |p| p.scratch_each),
                nranks,
            })
        })
    }

    /// Per channel, the send connection's step counter once the launches appended so far
    /// ran, as predicted (None where that connection has no queue).
    pub(crate) fn send_ends(&self) -> Vec<Option<u64>> {
        self.channels
            .iter()
            .map(|c| c.send.as_ref().and_then(|(_, q)| q.end()))
            .collect()
    }

    /// Appends ring or tree launch `plan` (elements of `elem_bytes`) to the queues of the
    /// connections its CTAs use; a launch captured into a graph loses them instead.
    pub(crate) fn append(&self, plan: &LaunchPlan, elem_bytes: usize, captured: bool, p: Profiled) {
        match plan.args.algo {
            ALGO_RING => self.append_ring(plan, elem_bytes, captured, p),
            ALGO_TREE if plan.args.tree != 0 => self.append_tree(plan, elem_bytes, captured, p),
            ALGO_PAT => self.append_pat(plan, elem_bytes, captured, p),
            // The tree on one node (a rank with network transport there: p2p and SHM off) runs
            // its way down on the rings' connections; its steps are not counted.
            ALGO_TREE => {
                for ch in self.channels.iter().take(plan.grid as usize) {
                    for (_, q) in ch.send.iter().chain(&ch.recv) {
                        q.lose();
                    }
                }
            }
            _ => {}
        }
    }

    /// PAT's launch: each dimension's connections, in the kernel's order of dimensions.
    fn append_pat(&self, plan: &LaunchPlan, elem_bytes: usize, captured: bool, p: Profiled) {
        let a = &plan.args;
        let Some(coll) = Coll::from_raw(a.coll) else {
            return;
        };
        let which = usize::from(coll != Coll::AllGather);
        for (cta, dims) in self.pat.iter().enumerate().take(plan.grid as usize) {
            let launch = SlotLaunch {
                coll,
                count: a.count as usize,
                elem_bytes,
                cta,
                grid: plan.grid as usize,
                chunk_elems: a.chunk_elems as usize,
                slot_bytes: self.slot_bytes,
            };
            let each = |k: usize, send: u64, recv: u64| {
                let Some(conns) = dims.get(k) else { return };
                for (i, steps) in [send, recv].into_iter().enumerate() {
                    let Some((peer, q)) = &conns[which][i] else {
                        continue;
                    };
                    let descr = ProxyOpDescr {
                        channel: cta,
                        peer: *peer,
                        steps,
                        chunk_bytes: self.slot_bytes,
                        send: i == 0,
                    };
                    put(q, captured, &p, 1, descr);
                }
            };
            launch.pat_steps(self.nranks, self.pat_scratch, each);
        }
    }

    /// The double binary tree's launch: every connection a CTA uses takes one step per chunk.
    fn append_tree(&self, plan: &LaunchPlan, elem_bytes: usize, captured: bool, p: Profiled) {
        let a = &plan.args;
        for (cta, conns) in self.tree.iter().enumerate().take(plan.grid as usize) {
            let steps = SlotLaunch {
                coll: Coll::AllReduce,
                count: a.count as usize,
                elem_bytes,
                cta,
                grid: plan.grid as usize,
                chunk_elems: a.chunk_elems as usize,
                slot_bytes: a.tree_slot_bytes as usize,
            }
            .tree_steps();
            for (peer, dir, q) in conns {
                let descr = ProxyOpDescr {
                    channel: cta,
                    peer: *peer,
                    steps,
                    chunk_bytes: a.tree_slot_bytes as usize,
                    send: *dir == Dir::Send,
                };
                put(q, captured, &p, 1, descr);
            }
        }
    }

    fn append_ring(&self, plan: &LaunchPlan, elem_bytes: usize, captured: bool, p: Profiled) {
        let a = &plan.args;
        let Some(coll) = Coll::from_raw(a.coll) else {
            return;
        };
        for (cta, ch) in self.channels.iter().enumerate().take(plan.grid as usize) {
            if ch.send.is_none() && ch.recv.is_none() {
                continue;
            }
            let n = ch.ring.len();
            let root_pos = ch
                .ring
                .iter()
                .position(|&r| r == a.root as usize)
                .unwrap_or(0);
            let launch = RingLaunch {
                coll,
                count: a.count as usize,
                elem_bytes,
                nranks: n,
                cta,
                grid: plan.grid as usize,
                slot_bytes: self.slot_bytes,
                chunk_elems: a.chunk_elems as usize,
                slice_steps: a.slice_steps,
                proto: a.proto,
                flags: a.flags,
                root_distance: (ch.pos + n - root_pos) % n,
            };
            let steps = ring_steps(&launch);
            let slots = RingSteps::slots(&launch);
            let chunk_bytes = match a.proto {
                PROTO_SIMPLE => self.slot_bytes,
                _ => a.chunk_elems as usize * elem_bytes,
            };
            for (side, ops, send) in [(&ch.send, steps.send, true), (&ch.recv, steps.recv, false)] {
                let Some((peer, q)) = side else { continue };
                let descr = ProxyOpDescr {
                    channel: cta,
                    peer: *peer,
                    steps: ops * slots,
                    chunk_bytes,
                    send,
                };
                put(q, captured, &p, slots, descr);
            }
        }
    }
}
