//! CUDA-graph registration with peers in other processes (NCCL_GRAPH_REGISTER). A captured
//! operation's buffers count as registered at once for peers of this process (they address
//! them as they are). Peers in other processes need records to map them, and need them
//! before the graph's first replay, which runs without this library:
//! - a capture registers the allocation holding the buffer the peers write into (an output; a
//!   receive's buffer), as NCCL does, and exports its record, once per graph and allocation
//!   (only the peers learn of it: calls outside the graph do not count it as registered);
//!   the registration is tied to the graph (`Device::on_graph_release`) and withdrawn once
//!   the graph is destroyed, at the communicator's next call (CUDA's release runs on a thread
//!   of its own, which must not call CUDA or wait on sockets, so it only queues the buffer);
//! - every rank counts its captured operations and sends the count as a mark after its
//!   records (`regmap::Mark`); before launching a captured operation, a rank drains the
//!   records of each peer it writes into until that peer's mark has caught up, for at most
//!   NCCL_RS_GRAPH_REG_WAIT_MS. Marks of all the operations of a group go out when they are
//!   called, the waits come at the group's end, so ranks never wait on each other in a cycle.
//!   A wait that times out (a peer that captures later, or not at all) only means the
//!   replays take copies until a later launch drains the records. A peer whose process has
//!   graph registration off (its `PeerInfo::graph_register`, exchanged at init) sends no
//!   marks and is never waited for.

use super::register::RegHandle;
use super::Comm;
use crate::cuda::{DevPtr, StreamHandle};
use crate::error::{Error, Result};
use crate::transport::regmap::Mark;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A buffer as a capture registered it (its allocation's where known): start, bytes and the
/// allocation's id (a freed allocation's addresses may come back in another, whose peers
/// must not write through their mapping of the old one).
type Key = (DevPtr, usize, u64);

/// One graph-registered buffer: its registration and the captures (graphs) using it.
struct Live {
    handle: RegHandle,
    captures: HashSet<u64>,
}

/// Buffers whose graphs were destroyed, queued by CUDA's release for the next call.
#[derive(Default)]
struct Released {
    queue: Mutex<Vec<(u64, Key)>>,
    pending: AtomicBool,
}

#[derive(Default)]
struct Counts {
    /// Captured collectives that take marks.
    coll: u64,
    /// Per peer: captured sends to it, captured receives from it.
    p2p: HashMap<usize, [u64; 2]>,
}

/// A communicator's graph registrations and mark counts.
pub struct GraphRegs {
    live: Mutex<HashMap<Key, Live>>,
    released: Arc<Released>,
    counts: Mutex<Counts>,
    /// NCCL_RS_GRAPH_REG_WAIT_MS.
    wait: Duration,
    /// Peers whose mark did not come in time once (said once; later waits do not wait).
    late: Mutex<HashSet<usize>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl GraphRegs {
    pub fn new() -> GraphRegs {
        let ms = crate::env::RS_GRAPH_REG_WAIT_MS.int().max(0) as u64;
        GraphRegs {
            live: Mutex::default(),
            released: Arc::default(),
            counts: Mutex::default(),
            wait: Duration::from_millis(ms),
            late: Mutex::default(),
        }
    }
}

impl Default for GraphRegs {
    fn default() -> GraphRegs {
        GraphRegs::new()
    }
}

impl Comm {
    crate::internal! {
        /// Buffers registered for graphs that live (released ones count until the next call
        /// withdraws them).
        fn graph_registrations(&self) -> usize {
            lock(&self.graph_regs.live).len()
        }
    }

    crate::internal! {
        /// How many of `peer`'s registrations (its users' and its graphs') this rank maps now.
        fn mapped_registrations(&self, peer: usize) -> usize {
            self.links.mapped_from(peer)
        }
    }

    crate::internal! {
        /// Peers whose mark a captured launch waited for in vain (NCCL_RS_GRAPH_REG_WAIT_MS)
        /// and that have not caught up since.
        fn graph_late_peers(&self) -> usize {
            lock(&self.graph_regs.late).len()
        }
    }

    /// Whether captured operations of this communicator need records and marks: graph
    /// registration is on and some peer in another process maps our buffers.
    pub(crate) fn graph_marks_needed(&self) -> bool {
        self.registered.graph_enabled() && self.links.has_reg_peers()
    }

    /// Registers `bytes` at `buff` for the graph the capture open on `stream` builds and tells
    /// the peers that map our buffers, once per graph and buffer; released with the graph.
    /// Failures only cost copies (logged).
    pub(crate) fn graph_register(&self, stream: StreamHandle, buff: DevPtr, bytes: usize) {
        if let Err(e) = self.try_graph_register(stream, buff, bytes) {
            log::info!(
                "rank {}: registering captured buffer {buff:#x} ({bytes} bytes) for peers in \
                 other processes: {e}; their messages into it take copies",
                self.rank
            );
        }
    }

    fn try_graph_register(&self, stream: StreamHandle, buff: DevPtr, bytes: usize) -> Result<()> {
        if bytes == 0 {
            return Ok(());
        }
        let Some(capture) = self.device.capture_id(stream)? else {
            return Ok(());
        };
        // The whole allocation, as NCCL registers: the buffers of one allocation (PyTorch's
        // segments hold many) share one record in each peer's table.
        let (start, len) = self
            .device
            .allocation_range(buff, bytes)?
            .unwrap_or((buff, bytes));
        let key = (start, len, self.device.allocation_id(buff)?.unwrap_or(0));
        let g = &self.graph_regs;
        let mut live = lock(&g.live);
        if live
            .get(&key)
            .is_some_and(|l| l.captures.contains(&capture))
        {
            return Ok(());
        }
        let released = g.released.clone();
        let release = Box::new(move || {
            lock(&released.queue).push((capture, key));
            released.pending.store(true, Ordering::Release);
        });
        if self.device.on_graph_release(stream, release)?.is_err() {
            return Err(Error::internal("the stream stopped capturing"));
        }
        if let Some(l) = live.get_mut(&key) {
            l.captures.insert(capture);
            return Ok(());
        }
        // Only the peers learn of it: outside its graph the buffer is not registered (the
        // user may free the allocation and get its addresses back in another while the graph
        // lives, unreplayed).
        let handle = self.registered.fresh_handle();
        live.insert(
            key,
            Live {
                handle,
                captures: HashSet::from([capture]),
            },
        );
        drop(live);
        self.links.export_registration(handle, key.0, key.1)
    }

    /// Withdraws the registrations of destroyed graphs (queued by their release): at each
    /// call, cheap when nothing is queued.
    pub(crate) fn release_graph_regs(&self) {
        let g = &self.graph_regs;
        // A load first: the common case writes nothing.
        let pending = &g.released.pending;
        if !pending.load(Ordering::Relaxed) || !pending.swap(false, Ordering::Acquire) {
            return;
        }
        let gone = std::mem::take(&mut *lock(&g.released.queue));
        for (capture, key) in gone {
            let handle = {
                let mut live = lock(&g.live);
                let Some(l) = live.get_mut(&key) else {
                    continue;
                };
                if !l.captures.remove(&capture) || !l.captures.is_empty() {
                    continue;
                }
                let h = l.handle;
                live.remove(&key);
                h
            };
            if let Err(e) = self.links.withdraw_registration(handle) {
                log::warn!("releasing a destroyed graph's buffer {:#x}: {e}", key.0);
            }
        }
    }

    /// Counts one captured collective that takes marks and tells the peers: the count to
    /// wait for before launching it ([`await_graph_mark`]).
    pub(crate) fn mark_captured_coll(&self) -> u64 {
        let seq = {
            let mut c = lock(&self.graph_regs.counts);
            c.coll += 1;
            c.coll
        };
        if let Err(e) = self.links.send_mark(None, Mark::Coll, seq) {
            log::warn!("rank {}: graph registration mark: {e}", self.rank);
        }
        seq
    }

    /// Counts one captured send to (`recv` false) or receive from `peer`, a peer that maps
    /// our buffers; a receive tells the peer. Returns the count.
    pub(crate) fn mark_captured_p2p(&self, peer: usize, recv: bool) -> u64 {
        let seq = {
            let mut c = lock(&self.graph_regs.counts);
            let n = &mut c.p2p.entry(peer).or_default()[recv as usize];
            *n += 1;
            *n
        };
        if recv {
            if let Err(e) = self.links.send_mark(Some(peer), Mark::Recv, seq) {
                log::warn!(
                    "rank {}: graph registration mark to rank {peer}: {e}",
                    self.rank
                );
            }
        }
        seq
    }
}

/// Waits until `peer`'s mark of kind `mark` reaches `seq` (its records for the captured
/// operation are then mapped), for at most the communicator's wait; see the module's doc.
pub fn await_graph_mark(
    links: &crate::transport::links::Links,
    regs: &GraphRegs,
    peer: usize,
    mark: Mark,
    seq: u64,
) -> Result<()> {
    let late = lock(&regs.late).contains(&peer);
    let wait = if late { Duration::ZERO } else { regs.wait };
    let on_time = links.await_mark(peer, mark, seq, wait)?;
    if on_time && late {
        lock(&regs.late).remove(&peer);
    }
    if !on_time && !late {
        lock(&regs.late).insert(peer);
        log::warn!(
            "rank {}: rank {peer} did not tell its captured buffers within {} ms \
             (NCCL_RS_GRAPH_REG_WAIT_MS; it captures later, or not at all): \
             this graph's messages into them take copies until a later launch maps them",
            links.rank(),
            regs.wait.as_millis()
        );
    }
    Ok(())
}
