//! ncclSend / ncclRecv. Calls are checked at once and gathered until the group ends (a lone
//! call is a group of one); then the connections they need are made and each communicator's
//! operations go out as a sequence of launches on one stream, a CTA per connection used, so
//! that sends and receives between the same ranks progress together.
//!
//! A launch holds at most [`MAX_P2P_ITEMS`] CTAs and uses each connection once, so a large
//! group takes several launches. They are cut the same way on every rank, so that each launch
//! can finish given only the peers' launches of the same place in the sequence: the k-th
//! operation on a (peer, direction) goes to round k, and within a round, a send to rank
//! `rank + d` and a receive from rank `rank - d` (mod nranks) go to chunk `d / width`, where
//! `width` distances fit one launch. Both ends of a message compute the same (round, chunk)
//! — the k-th send from A to B and the k-th receive at B from A both sit at distance
//! `B - A` — and every rank launches in (round, chunk) order; by induction over that order,
//! every launch's peers reach the launch that completes it.

use super::group;
use crate::comm::call::P2pOp;
use crate::comm::graph_reg;
use crate::comm::profile::{p2p_launch, p2p_name, Task};
use crate::cuda::{DevPtr, StreamHandle};
use crate::error::{Error, Result};
use crate::profiler::ProxyOpDescr;
use crate::proxy::timeline::{self, Mark};
use crate::transport::links::Links;
use crate::transport::regmap::Mark as RegMark;
use crate::transport::Dir;
use nccl_device::abi::{
    P2pArgs, P2pItem, P2pKind, DIRECT_DECLINE, DIRECT_OFF, MAX_P2P_ITEMS, NCCL_STEPS,
};
use std::collections::BTreeMap;
use std::sync::Arc;

/// `ncclSend` (`dir` Send) and `ncclRecv` (`dir` Recv): checks the call, then records it until
/// the group ends (or runs it now outside a group).
#[allow(clippy::too_many_arguments)]
pub fn submit(
    comm: &crate::comm::Comm,
    dir: Dir,
    buff: DevPtr,
    count: usize,
    dt: nccl_device::types::DataType,
    peer: usize,
    stream: StreamHandle,
) -> Result<()> {
    let what = if dir == Dir::Send {
        "ncclSend"
    } else {
        "ncclRecv"
    };
    let checked = || -> Result<P2pOp> {
        comm.enter_call(&what[4..])?;
        if !nccl_device::kernel_set::built(nccl_device::kernel_set::P2P_ENTRY) {
            return Err(super::left_out(nccl_device::kernel_set::P2P_ENTRY));
        }
        if peer >= comm.count() {
            return Err(Error::invalid_argument(format!(
                "peer {peer} is out of range (nranks {})",
                comm.count()
            )));
        }
        let bytes = count
            .checked_mul(dt.size())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "count {count} of {} overflows the byte size",
                    dt.name()
                ))
            })?;
        if bytes > 0 {
            let what = if dir == Dir::Send {
                "sendbuff"
            } else {
                "recvbuff"
            };
            super::check_buffer(comm, what, buff, bytes, dt)?;
        }
        let mut op = comm.p2p_op(dir, buff, bytes, peer, stream)?;
        let task = comm.profile_call(true, || comm.api_call(p2p_name(dir), count, dt, 0, stream));
        if let Some(t) = &task {
            t.queued();
        }
        op.profile = task.map(|t| (t, count, dt));
        Ok(op)
    };
    group::own_if_profiled(comm, || match checked() {
        Ok(op) => group::p2p(op),
        Err(e) => Err(group::record_error(e.context(what))),
    })
}

/// Least bytes a connection to a peer on another node carries of a message: every connection
/// used costs a network message and a proxy round per step, so an 8-byte send over 16 of them
/// took 205 µs on one H100 as 2 nodes (NCCL, with one channel per small message: 39 µs). The
/// socket network moves anything smaller than 64 KiB as one message anyway.
pub const NET_MIN_PART: usize = 64 << 10;

/// The byte range connection `c` of `n` carries of a `bytes`-long message: 16-byte aligned
/// pieces of at least `min` bytes, so the last ones may be empty.
pub fn part(bytes: usize, n: usize, c: usize, min: usize) -> (usize, usize) {
    let per = bytes.div_ceil(n).next_multiple_of(16).max(min);
    let s = (c * per).min(bytes);
    (s, (s + per).min(bytes) - s)
}

/// What one CTA group of a launch does, by index into the operations planned.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Work {
    /// A send or receive over the peer's connections (`nconns` CTAs).
    Conn(usize),
    /// A send to ourselves and the receive it matches, cut into `pieces` CTAs.
    Copy {
        send: usize,
        recv: usize,
        pieces: usize,
    },
}

/// Least bytes a CTA of a copy to ourselves moves: one CTA copies about 49 GB/s on an H200,
/// so a 1 GiB send to self on one took 22 ms against NCCL's 0.57, on 32 CTAs 0.85, on 64
/// 0.61 (results/h200-onerank-s12.txt, h200-self-copy-s12.txt, h200-self-copy-64-s12.txt);
/// with 256 KiB pieces, 256 KiB-2 MiB copies in graphs took 7.7 µs against NCCL's 5.5.
/// Pieces of this size keep a small copy on one CTA.
const SELF_COPY_PIECE: usize = 32 << 10;

/// CTAs a copy to ourselves of `bytes` takes in a launch with `room` work items left: at
/// least the `2 * nconns` distance 0 keeps (it uses no connection), more where the launch has
/// fewer peers than distances (a one-rank communicator's copy takes the whole launch).
fn self_copy_pieces(bytes: usize, room: usize) -> usize {
    bytes.div_ceil(SELF_COPY_PIECE).clamp(1, room.max(1))
}

/// Where a launch sits in the sequence every rank follows: (round, chunk).
pub type LaunchKey = (usize, usize);

/// Distances to peers one launch covers: a send and a receive of `nconns` CTAs each.
fn width(nconns: usize) -> Result<usize> {
    if nconns == 0 || 2 * nconns > MAX_P2P_ITEMS {
        return Err(Error::internal(format!(
            "{nconns} connections per peer do not fit a launch of {MAX_P2P_ITEMS} work items"
        )));
    }
    Ok(MAX_P2P_ITEMS / (2 * nconns))
}

/// Cuts one communicator's operations (peer, direction, bytes), in issue order, into
/// launches, in the order to launch them (see the module's documentation). Sends to ourselves
/// pair with receives from ourselves in order, and must match in number and size.
pub fn plan(
    rank: usize,
    nranks: usize,
    nconns: usize,
    ops: &[(usize, Dir, usize)],
) -> Result<Vec<(LaunchKey, Vec<Work>)>> {
    let width = width(nconns)?;
    let mut rounds: std::collections::HashMap<(usize, Dir), usize> = Default::default();
    let mut launches: BTreeMap<LaunchKey, Vec<Work>> = BTreeMap::new();
    let (mut self_sends, mut self_recvs) = (Vec::new(), Vec::new());
    for (i, &(peer, dir, _)) in ops.iter().enumerate() {
        if peer >= nranks {
            return Err(Error::internal(format!(
                "p2p peer {peer} of {nranks} ranks"
            )));
        }
        if peer == rank {
            match dir {
                Dir::Send => self_sends.push(i),
                Dir::Recv => self_recvs.push(i),
            }
            continue;
        }
        let k = rounds.entry((peer, dir)).or_insert(0);
        let d = match dir {
            Dir::Send => (peer + nranks - rank) % nranks,
            Dir::Recv => (rank + nranks - peer) % nranks,
        };
        launches
            .entry((*k, d / width))
            .or_default()
            .push(Work::Conn(i));
        *k += 1;
    }
    if self_sends.len() != self_recvs.len() {
        return Err(Error::invalid_usage(format!(
            "rank {rank}: {} sends to itself but {} receives from itself in one group",
            self_sends.len(),
            self_recvs.len()
        )));
    }
    for (k, (&s, &r)) in self_sends.iter().zip(&self_recvs).enumerate() {
        if ops[s].2 != ops[r].2 {
            return Err(Error::invalid_usage(format!(
                "send to self of {} bytes matched with a receive of {} bytes",
                ops[s].2, ops[r].2
            )));
        }
        // Distance 0: the first chunk of round k.
        let used = launches.get(&(k, 0)).map_or(0, |w| items(w, nconns));
        let pieces = self_copy_pieces(ops[s].2, MAX_P2P_ITEMS.saturating_sub(used));
        launches.entry((k, 0)).or_default().push(Work::Copy {
            send: s,
            recv: r,
            pieces,
        });
    }
    Ok(launches.into_iter().collect())
}

/// Work items (CTAs) a launch of `works` takes.
pub fn items(works: &[Work], nconns: usize) -> usize {
    works
        .iter()
        .map(|w| match w {
            Work::Conn(_) => nconns,
            Work::Copy { pieces, .. } => *pieces,
        })
        .sum()
}

/// Launches everything a group gathered: per communicator, the planned launches in order, on
/// the stream of its first operation; the group's other streams of that communicator join it
/// before and wait for it after.
pub fn flush(ops: Vec<P2pOp>) -> Result<()> {
    let mut batches: Vec<Vec<P2pOp>> = Vec::new();
    for op in ops {
        match batches
            .iter_mut()
            .find(|b| Arc::ptr_eq(&b[0].links, &op.links))
        {
            Some(b) => b.push(op),
            None => batches.push(vec![op]),
        }
    }
    // Publish every new connection of every communicator first, then wait for the peers.
    let mut started = Vec::new();
    for batch in &batches {
        let links = &batch[0].links;
        let needs: Vec<(usize, Dir)> = batch
            .iter()
            .filter(|o| o.peer != links.rank())
            .map(|o| (o.peer, o.dir))
            .collect();
        started.push(links.start(&needs)?);
    }
    for (batch, s) in batches.iter().zip(started) {
        batch[0].links.finish(s)?;
    }
    for batch in batches {
        launch_comm(&batch)?;
    }
    Ok(())
}

/// One communicator's share of a group (connections made).
fn launch_comm(batch: &[P2pOp]) -> Result<()> {
    let links = &batch[0].links;
    let nconns = links.nconns;
    let desc: Vec<(usize, Dir, usize)> = batch.iter().map(|o| (o.peer, o.dir, o.bytes)).collect();
    let plan = plan(links.rank(), batch[0].nranks, nconns, &desc)?;
    let mut all: Vec<P2pArgs> = Vec::with_capacity(plan.len());
    // The network connections' steps, for the profiler's proxy events: (message, connection,
    // queue, steps); empty without a plugin.
    let mut net_steps = Vec::new();
    for (_, works) in &plan {
        let mut args = P2pArgs {
            abort_flag: batch[0].abort_flag,
            flags: batch[0].kernel_flags,
            ..P2pArgs::default()
        };
        for w in works {
            match *w {
                Work::Conn(i) => {
                    let op = &batch[i];
                    // Both ends see the same bytes and the same kind of link, so they skip the
                    // same empty pieces.
                    let min = if links.remote(op.peer) {
                        NET_MIN_PART
                    } else {
                        0
                    };
                    if let Some((regs, seq)) = &op.graph_mark {
                        graph_reg::await_graph_mark(links, regs, op.peer, RegMark::Recv, *seq)?;
                    }
                    // Once per message: it brings the peer's registration table up to date.
                    let reach = links.direct_reach(op.peer)?;
                    for c in 0..nconns {
                        let (off, len) = part(op.bytes, nconns, c, min);
                        if len == 0 && op.bytes > 0 && min > 0 {
                            continue; // nothing for this connection: it stays idle
                        }
                        if let Some(q) = links.op_queue(op.peer, op.dir, c) {
                            // `send_recv::run`'s steps: a slot at a time, at least one.
                            let steps = len.div_ceil(links.slot_bytes.max(1)).max(1);
                            net_steps.push((i, c, q, steps as u64));
                        }
                        push(
                            &mut args,
                            P2pItem {
                                conn: links.conn(op.peer, op.dir, c)?,
                                buff: op.buff + off as u64,
                                src: 0,
                                bytes: len as u64,
                                kind: if op.dir == Dir::Send {
                                    P2pKind::Send as u32
                                } else {
                                    P2pKind::Recv as u32
                                },
                                slot_bytes: links.slot_bytes as u32,
                                direct: direct(links, reach, op, off, len),
                                offer_key: op.offer_key,
                            },
                        )?;
                    }
                }
                Work::Copy { send, recv, pieces } => {
                    let bytes = batch[send].bytes;
                    for c in 0..pieces {
                        let (off, len) = part(bytes, pieces, c, 0);
                        if len == 0 && c > 0 {
                            continue;
                        }
                        push(
                            &mut args,
                            P2pItem {
                                conn: 0,
                                buff: batch[recv].buff + off as u64,
                                src: batch[send].buff + off as u64,
                                bytes: len as u64,
                                kind: P2pKind::Copy as u32,
                                slot_bytes: 0,
                                direct: DIRECT_OFF,
                                offer_key: 0,
                            },
                        )?;
                    }
                }
            }
        }
        if args.nitems > 0 {
            all.push(args);
        }
    }
    if all.is_empty() {
        return Ok(());
    }
    let mut streams: Vec<StreamHandle> = Vec::new();
    for o in batch {
        if !streams.contains(&o.stream) {
            streams.push(o.stream);
        }
    }
    let (main, others) = (streams[0], &streams[1..]);
    let device = links.device();
    let k = device.kernel(nccl_device::kernel_set::P2P_ENTRY)?;
    let threads = crate::cuda::MAX_THREADS.min(links_threads(links));
    links.kick_proxy();
    timeline::mark(Mark::Launch, 0, 0);
    let launch = || {
        batch[0].order.launch_joined(main, others, || {
            all.iter()
                .try_for_each(|args| device.launch(k, args.nitems, threads, main, args))
        })
    };
    let (profiled, which): (Vec<_>, Vec<usize>) = batch
        .iter()
        .enumerate()
        .filter_map(|(i, o)| {
            let (t, count, dt) = o.profile.as_ref()?;
            Some(((t, p2p_launch(o, *count, *dt, nconns)), i))
        })
        .unzip();
    let r = match profiled.first() {
        None => launch(),
        Some((t, _)) => t.launch(main, launch),
    };
    if r.is_err() {
        // Some of its kernels may have been issued: these counters are unknown now.
        net_steps.iter().for_each(|(_, _, q, _)| q.lose());
    } else {
        let parents = Task::launched_p2p(&profiled);
        let captured = batch[0].order.captured();
        for (i, c, q, steps) in net_steps {
            if captured {
                q.lose();
                continue;
            }
            let op = &batch[i];
            let parent = which
                .iter()
                .position(|&w| w == i)
                .and_then(|k| parents[k].clone());
            let profiled = parent.map(|(prof, mask, e)| {
                let descr = ProxyOpDescr {
                    channel: c,
                    peer: op.peer,
                    steps,
                    chunk_bytes: links.slot_bytes,
                    send: op.dir == Dir::Send,
                };
                (prof, mask, e, descr)
            });
            q.append(steps, 1, profiled);
        }
    }
    timeline::mark(Mark::Launched, 0, 0);
    if batch[0].order.captured() {
        // A graph's replays will not wake the proxy: it keeps its naps short from now on.
        links.proxy_serves_replays();
    }
    r
}

/// The zero-copy handshake of one part (`len` bytes at `off`) of `op` ([`P2pItem::direct`]),
/// given `reach`, the peer's [`Links::direct_reach`] (looked up once per message).
/// Both ends decide alike whether it happens: the connection is a direct one (p2p, inside the
/// node) and the part fills the connection's FIFO at least once, so that a message the FIFO
/// could have taken whole before the receiver arrived never waits for it now. Each end then
/// puts in its own value: what it offers (receiver) or how it reaches an offer (sender).
fn direct(links: &Links, reach: Option<u64>, op: &P2pOp, off: usize, len: usize) -> u64 {
    let Some(reach) = reach else {
        return DIRECT_OFF;
    };
    if len < NCCL_STEPS as usize * links.slot_bytes {
        return DIRECT_OFF;
    }
    match op.dir {
        Dir::Recv if op.registered => op.buff + off as u64,
        Dir::Send if op.registered => reach,
        _ => DIRECT_DECLINE,
    }
}

fn push(args: &mut P2pArgs, it: P2pItem) -> Result<()> {
    let n = args.nitems as usize;
    if n == MAX_P2P_ITEMS {
        return Err(Error::internal(
            "a planned p2p launch overflowed its work items",
        ));
    }
    args.items[n] = it;
    args.nitems += 1;
    Ok(())
}

/// Threads per p2p CTA: the simulator's small CTAs, else a full one.
fn links_threads(links: &Links) -> u32 {
    if links.device().is_sim() {
        crate::env::RS_SIM_NTHREADS.int().clamp(1, 64) as u32
    } else {
        crate::env::NTHREADS
            .int()
            .clamp(32, crate::cuda::MAX_THREADS as i64) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_message_once() {
        for bytes in [0usize, 1, 15, 16, 17, 1000, 1 << 20] {
            for (n, min) in [(1usize, 0), (2, 0), (4, 0), (4, 4096), (16, NET_MIN_PART)] {
                let mut next = 0;
                for c in 0..n {
                    let (s, len) = part(bytes, n, c, min);
                    assert_eq!(s, next.min(bytes));
                    assert!(len == 0 || s % 16 == 0);
                    next = s + len;
                }
                assert_eq!(next, bytes, "bytes {bytes} n {n}");
            }
        }
    }

    /// Every rank's operations of an all-to-all with `m` messages per ordered pair (self
    /// included), issued in a rank-specific shuffled order.
    fn all_to_all(n: usize, m: usize, seed: u64) -> Vec<Vec<(usize, Dir, usize)>> {
        let mut x = seed | 1;
        let mut rnd = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        (0..n)
            .map(|r| {
                let mut ops = Vec::new();
                for p in 0..n {
                    for j in 0..m {
                        ops.push((p, Dir::Send, r * 1000 + p * 10 + j));
                        ops.push((p, Dir::Recv, p * 1000 + r * 10 + j));
                    }
                }
                // Shuffle, then restore the order of each (peer, direction)'s messages, which
                // the user's issue order fixes and the sizes above encode.
                for i in (1..ops.len()).rev() {
                    ops.swap(i, rnd() as usize % (i + 1));
                }
                let mut seen: std::collections::HashMap<(usize, Dir), usize> = Default::default();
                let mut fixed = ops.clone();
                for slot in fixed.iter_mut() {
                    let (p, d, _) = *slot;
                    let j = seen.entry((p, d)).or_insert(0);
                    let bytes = if d == Dir::Send {
                        r * 1000 + p * 10 + *j
                    } else {
                        p * 1000 + r * 10 + *j
                    };
                    *slot = (p, d, bytes);
                    *j += 1;
                }
                fixed
            })
            .collect()
    }

    #[test]
    fn plans_fit_launches_and_agree_across_ranks() {
        for (n, m, nconns) in [
            (2, 1, 1),
            (8, 3, 1),
            (16, 5, 1),
            (40, 2, 1),
            (9, 3, 4),
            (33, 2, 2),
        ] {
            let all = all_to_all(n, m, (n * 31 + m) as u64);
            // (rank, peer, dir, k) -> key
            let mut key_of: std::collections::HashMap<(usize, usize, Dir, usize), LaunchKey> =
                Default::default();
            for (r, ops) in all.iter().enumerate() {
                let plan = plan(r, n, nconns, ops).unwrap();
                let keys: Vec<LaunchKey> = plan.iter().map(|(k, _)| *k).collect();
                let mut sorted = keys.clone();
                sorted.sort();
                sorted.dedup();
                assert_eq!(keys, sorted, "launches in key order, once each");
                let mut placed = vec![0usize; ops.len()];
                let mut next_k: std::collections::HashMap<(usize, Dir), usize> = Default::default();
                for (key, works) in &plan {
                    assert!(
                        items(works, nconns) <= MAX_P2P_ITEMS,
                        "n {n} rank {r} {key:?}"
                    );
                    let mut used = Vec::new();
                    for w in works {
                        match *w {
                            Work::Conn(i) => {
                                let (p, d, _) = ops[i];
                                assert!(!used.contains(&(p, d)), "a connection used twice");
                                used.push((p, d));
                                placed[i] += 1;
                                // Each connection's messages go out in issue order.
                                let k = next_k.entry((p, d)).or_insert(0);
                                let nth = ops[..i].iter().filter(|o| (o.0, o.1) == (p, d)).count();
                                assert_eq!(nth, *k);
                                *k += 1;
                                key_of.insert((r, p, d, nth), *key);
                            }
                            Work::Copy { send, recv, pieces } => {
                                assert_eq!(ops[send].2, ops[recv].2);
                                let want = ops[send].2.div_ceil(SELF_COPY_PIECE).max(1);
                                assert!(
                                    pieces >= want.min(2 * nconns) && pieces <= want,
                                    "a copy of {} B in {pieces} pieces",
                                    ops[send].2
                                );
                                placed[send] += 1;
                                placed[recv] += 1;
                            }
                        }
                    }
                }
                assert!(
                    placed.iter().all(|&c| c == 1),
                    "every operation placed once"
                );
            }
            // Both ends of every message are in the launch of the same key.
            for (&(r, p, d, k), key) in &key_of {
                if d == Dir::Send {
                    assert_eq!(
                        key_of.get(&(p, r, Dir::Recv, k)),
                        Some(key),
                        "n {n}: send {r}->{p} #{k}"
                    );
                }
            }
            if n > width(nconns).unwrap() {
                assert!(key_of.values().any(|k| k.1 > 0), "several chunks per round");
            }
        }
    }

    #[test]
    fn unmatched_self_messages_are_refused() {
        let e = plan(0, 2, 1, &[(0, Dir::Send, 4)]).unwrap_err();
        assert_eq!(e.code, crate::NcclResult::InvalidUsage);
        let e = plan(0, 2, 1, &[(0, Dir::Send, 4), (0, Dir::Recv, 8)]).unwrap_err();
        assert_eq!(e.code, crate::NcclResult::InvalidUsage);
    }
}
