//! Point-to-point connections between any two ranks, made on first use. For each (peer,
//! direction) a rank keeps `nconns` connections, made by the pair's transport in a round of
//! connections (`transport::setup`: p2p blocks, SHM segments or network connections, each
//! transport's file says how). All publications of a group go out first, then all waits, so
//! two ranks connecting both ways at once never wait on each other. The links also carry what
//! zero-copy needs of peers: their registered buffers as we map them ([`regmap`]).

use super::net::NetPath;
use super::p2p::PeerAddr;
use super::regmap::{self, PeerRegs};
use super::{Conn, Ctx, Dir, Resources, Set, Want};
use crate::bootstrap::Bootstrap;
use crate::cuda::{DevBuffer, DevPtr, Device, Fence, RegExport, VmmExport};
use crate::error::{Error, Result};
use crate::graph::Transport;
use nccl_device::abi::{ConnRecv, ConnSend};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Connections whose sides every transport set up and published, the peers' still to be
/// taken ([`Links::finish`]).
pub struct Started {
    fresh: Vec<(usize, Dir)>,
    round: super::Started,
}

/// Most allocations of one registered buffer sent to peers ([`Links::export_registration`]).
pub const MAX_REG_PIECES: usize = 64;

/// The id on the wire of record `piece` of registration `id` (a registration sends one record
/// per allocation it spans).
fn piece_id(id: u64, piece: usize) -> u64 {
    id << 8 | piece as u64
}

pub struct Links {
    rank: usize,
    device: Device,
    bootstrap: Arc<Bootstrap>,
    peers: Vec<PeerAddr>,
    /// Connections per (peer, direction): how many CTAs one message uses.
    pub nconns: usize,
    pub slot_bytes: usize,
    /// Per connected (peer, direction), its `nconns` ConnSend or ConnRecv structures in device
    /// memory, which the kernels advance.
    sides: Mutex<HashMap<(usize, Dir), DevBuffer>>,
    /// The memory behind the connections (blocks, mappings, segments; a network connection's
    /// lives with the proxy).
    resources: Mutex<Resources>,
    /// How peers on other nodes are reached (None when every peer is on this node).
    net: Option<Arc<NetPath>>,
    /// Peer processes' registered buffers as we map them, by peer (see `regmap`).
    regs: Mutex<HashMap<usize, PeerRegs>>,
    /// Our registrations whose records went to the peers of [`Links::reg_peers`]: how many
    /// records (one per allocation the buffer spans), with the exports of a VMM buffer's
    /// allocations (their descriptors on offer) while they live.
    exported: Mutex<HashMap<u64, (u64, Vec<VmmExport>)>>,
    /// NCCL_RS_VMM_IPC: registered VMM buffers are exported to, and mapped from, peer
    /// processes by their descriptors.
    vmm_ipc: bool,
    /// A registration could not be exported (said once).
    unexported_said: AtomicBool,
    /// Some peer maps our registered buffers ([`Links::maps_our_buffers`]): fixed at
    /// construction, asked on every ring collective.
    any_reg_peer: bool,
    /// The network key of connection 0 (connection `c` is `key_base + c`): it picks the NIC
    /// (`key % ndevs`) and tags the handles ([`Links::keyed`]).
    key_base: u32,
    /// Connections inside the node also get an LL FIFO ([`Links::with_ll`]).
    ll: bool,
    /// Makes a fence behind the communicator's launched kernels: a peer's withdrawn buffer is
    /// unmapped once it has passed ([`Links::with_fences`]).
    fences: Option<Fences>,
    /// The communicator's suspendable connection memory, which our blocks join.
    suspendable: Arc<super::suspend::Suspendable>,
    /// The op queues of our network connections (`proxy/ops.rs`: the profiler's proxy
    /// events), by (peer, direction, connection); empty without a profiler plugin.
    op_queues: Mutex<HashMap<(usize, Dir, usize), Arc<crate::proxy::ops::OpQueue>>>,
}

/// See [`Links::with_fences`].
pub(crate) type Fences = Arc<dyn Fn() -> Result<Option<Fence>> + Send + Sync>;

impl Links {
    pub(crate) fn new(
        rank: usize,
        device: Device,
        bootstrap: Arc<Bootstrap>,
        peers: Vec<PeerAddr>,
        nconns: usize,
        slot_bytes: usize,
        net: Option<Arc<NetPath>>,
    ) -> Links {
        let mut links = Links {
            suspendable: Arc::new(super::suspend::Suspendable::new()),
            op_queues: Mutex::new(HashMap::new()),
            rank,
            device,
            bootstrap,
            peers,
            nconns: nconns.max(1),
            slot_bytes,
            sides: Mutex::new(HashMap::new()),
            resources: Mutex::default(),
            regs: Mutex::new(HashMap::new()),
            exported: Mutex::new(Default::default()),
            vmm_ipc: crate::env::RS_VMM_IPC.int() != 0,
            unexported_said: AtomicBool::new(false),
            net,
            key_base: 0,
            ll: false,
            any_reg_peer: false,
            fences: None,
        };
        links.any_reg_peer = (0..links.peers.len()).any(|p| links.maps_our_buffers(p));
        links
    }

    /// Lists our suspendable blocks in `suspendable`, the communicator's (else in a set of
    /// their own, which no suspend reaches).
    pub(crate) fn with_suspendable(
        mut self,
        suspendable: Arc<super::suspend::Suspendable>,
    ) -> Links {
        self.suspendable = suspendable;
        self
    }

    /// Gives every connection made from here on inside the node an LL FIFO of its own
    /// (`NCCL_STEPS` slots of `LL_SLOT_BYTES`, zeroed), beside the Simple one: the tree's
    /// links, whose steps may be LL. (Network connections carry every protocol in one FIFO.)
    pub(crate) fn with_ll(mut self) -> Links {
        self.ll = true;
        self
    }

    /// Gives these links the communicator's fences (`StreamOrder::fence`). A peer's withdrawn
    /// registration stays mapped until a fence made after the withdrawal has passed, since a
    /// kernel launched before it may still write through the mapping; without fences, until
    /// the links go (after the communicator waited for its kernels).
    pub(crate) fn with_fences(mut self, fences: Fences) -> Links {
        self.fences = Some(fences);
        self
    }

    /// Numbers this set's network connections from `base`: sets of links made one per
    /// channel (the trees across nodes) then spread over the NICs as the channels do.
    pub(crate) fn keyed(mut self, base: u32) -> Links {
        self.key_base = base;
        self
    }

    /// The op queue of connection `c` for (`peer`, `dir`), where it has one (a network
    /// connection, a profiler plugin loaded).
    pub(crate) fn op_queue(
        &self,
        peer: usize,
        dir: Dir,
        c: usize,
    ) -> Option<Arc<crate::proxy::ops::OpQueue>> {
        self.op_queues.lock().ok()?.get(&(peer, dir, c)).cloned()
    }

    /// Every op queue of these links is lost (`OpQueue::lose`): some kernel took steps on
    /// them that nothing counted.
    pub(crate) fn lose_op_queues(&self) {
        if let Ok(qs) = self.op_queues.lock() {
            qs.values().for_each(|q| q.lose());
        }
    }

    /// Is `peer` on another node (its connections go through the network and the proxy)?
    pub(crate) fn remote(&self, peer: usize) -> bool {
        self.net.as_ref().is_some_and(|n| n.remote[peer])
    }

    /// Wakes the proxy thread before a launch that may use network connections.
    pub fn kick_proxy(&self) {
        if let Some(n) = &self.net {
            n.proxy.kick();
        }
    }

    /// A launch that needs the proxy was captured into a CUDA graph (see
    /// [`crate::proxy::Proxy::serve_replays`]).
    pub fn proxy_serves_replays(&self) {
        if let Some(n) = &self.net {
            n.proxy.serve_replays();
        }
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The step counters of the connections for (`peer`, `dir`), None if not made yet.
    pub fn steps(&self, peer: usize, dir: Dir) -> Result<Option<Vec<u64>>> {
        let sides = self
            .sides
            .lock()
            .map_err(|_| Error::internal("p2p connection table poisoned"))?;
        let Some(conns) = sides.get(&(peer, dir)) else {
            return Ok(None);
        };
        let size = std::mem::size_of::<ConnSend>();
        let mut raw = vec![0u8; self.nconns * size];
        conns.read(0, &mut raw)?;
        // `step` is the fourth word of ConnSend and ConnRecv alike.
        Ok(Some(
            raw.chunks(size)
                .map(|c| u64::from_le_bytes(c[24..32].try_into().unwrap_or_default()))
                .collect(),
        ))
    }

    /// How a send to `peer` reaches a buffer the peer offers for zero-copy
    /// ([`nccl_device::abi::P2pItem::direct`]), or None where messages to and from it always
    /// take the FIFO (a peer reached through SHM or the network). Peers of this process share
    /// our address space; other processes' registered buffers are reached through the table
    /// of what they sent us (`regmap`), brought up to date here.
    pub fn direct_reach(&self, peer: usize) -> Result<Option<u64>> {
        let p = self
            .peers
            .get(peer)
            .ok_or_else(|| Error::internal(format!("zero-copy reach of rank {peer}")))?;
        if self.remote(peer) || p.transport != Transport::P2p {
            return Ok(None);
        }
        if p.same_process {
            return Ok(Some(nccl_device::abi::DIRECT_SAME_SPACE));
        }
        self.drained(peer, |r| Some(r.device_ptr()))
    }

    /// `peer`'s registration table with the messages it sent so far applied, for `f`.
    fn drained<T>(&self, peer: usize, f: impl FnOnce(&PeerRegs) -> T) -> Result<T> {
        let mut regs = self
            .regs
            .lock()
            .map_err(|_| Error::internal("registration table poisoned"))?;
        let r = match regs.entry(peer) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => v.insert(PeerRegs::new(&self.device)?),
        };
        let fence = self.fences.as_deref().map(|f| f as regmap::FenceProbe);
        // Drains run at launches, which may be captured: mapping, fencing, querying and
        // unmapping are calls a capture in CUDA's global mode forbids a thread's default mode.
        let _relaxed = self.device.relaxed_capture();
        regmap::drain(&self.bootstrap, &self.device, peer, r, self.vmm_ipc, fence)?;
        let out = f(r);
        // Other peers' withdrawn mappings go as their fences pass, drained or not.
        if let Some(fence) = fence {
            for (_, other) in regs
                .iter_mut()
                .filter(|(&p, r)| p != peer && r.has_retired())
            {
                other.settle(fence);
            }
        }
        Ok(out)
    }

    /// How many of `peer`'s registrations we map now (none drained here).
    pub fn mapped_from(&self, peer: usize) -> usize {
        self.regs
            .lock()
            .map_or(0, |r| r.get(&peer).map_or(0, PeerRegs::mapped))
    }

    /// Whether `peer` maps our registered buffers (see `reg_peers`).
    /// Whether `peer` shares this process's address space and our p2p connections reach it:
    /// its device memory is addressed here as it is.
    pub fn same_space(&self, peer: usize) -> bool {
        peer < self.peers.len()
            && !self.remote(peer)
            && self.peers[peer].same_process
            && self.peers[peer].transport == Transport::P2p
    }

    pub fn maps_our_buffers(&self, peer: usize) -> bool {
        peer != self.rank
            && peer < self.peers.len()
            && !self.remote(peer)
            && !self.peers[peer].same_process
            && self.peers[peer].transport == Transport::P2p
    }

    /// The key our offers of a registered buffer at `buff` carry (`abi::DIRECT_KEY`): our id of
    /// its allocation, as our records name it; 0 where the backend cannot tell, or when no peer
    /// in another process maps our buffers (peers of our process take offers as they are).
    pub fn offer_key(&self, buff: DevPtr) -> Result<u64> {
        match self.any_reg_peer {
            true => Ok(self.device.allocation_id(buff)?.unwrap_or(0)),
            false => Ok(0),
        }
    }

    /// Whether any peer maps our registered buffers.
    pub fn has_reg_peers(&self) -> bool {
        self.any_reg_peer
    }

    /// Sends mark `seq` of kind `mark` (see [`regmap::Mark`]) to `peer`, or with None to every
    /// peer that maps our buffers, after the records sent before it.
    pub fn send_mark(&self, peer: Option<usize>, mark: regmap::Mark, seq: u64) -> Result<()> {
        let peers = match peer {
            Some(p) => vec![p],
            None => self.reg_peers(),
        };
        self.tell_peers(&peers, &regmap::encode_mark(mark, seq))
    }

    /// Drains `peer`'s registration messages until its mark of kind `mark` reaches `seq`
    /// (true), or `wait` has passed (false: that peer's marks are late or never come, and its
    /// offers that our table lacks are declined).
    pub fn await_mark(
        &self,
        peer: usize,
        mark: regmap::Mark,
        seq: u64,
        wait: std::time::Duration,
    ) -> Result<bool> {
        let start = std::time::Instant::now();
        let mut nap = std::time::Duration::from_micros(10);
        loop {
            if self.drained(peer, |r| r.mark(mark))? >= seq {
                return Ok(true);
            }
            if start.elapsed() >= wait {
                return Ok(false);
            }
            std::thread::sleep(nap);
            nap = (nap * 2).min(std::time::Duration::from_millis(1));
        }
    }

    /// Peers in other processes of this node reached through p2p: they map our registrations.
    fn reg_peers(&self) -> Vec<usize> {
        (0..self.peers.len())
            .filter(|&p| self.maps_our_buffers(p))
            .collect()
    }

    /// Sends registration `id` (`bytes` at `buff`) to the peers that may map it: with the IPC
    /// handle of its allocation, or for an allocation of CUDA's virtual memory API a ticket for
    /// its exported descriptor, kept on offer until the registration is withdrawn (or these
    /// links drop). A VMM buffer spanning several allocations side by side (a range mapped
    /// from several physical allocations, as PyTorch's expandable segments are) goes as one
    /// record per allocation, each its part of the buffer with its own descriptor: the peer
    /// maps each allocation apart, and a message that lies inside one of them goes direct,
    /// one that straddles two takes the FIFO (no peer mapping covers it). At most
    /// [`MAX_REG_PIECES`] allocations: the rest of a longer buffer is not sent (copies). A
    /// buffer that can be neither (or a VMM one with NCCL_RS_VMM_IPC=0) is not sent:
    /// messages into it from other processes take copies.
    pub fn export_registration(&self, id: u64, buff: DevPtr, bytes: usize) -> Result<()> {
        let peers = self.reg_peers();
        if peers.is_empty() {
            return Ok(());
        }
        let end = buff + bytes as u64;
        let (records, keep) = match self.device.reg_export(buff, self.vmm_ipc) {
            Ok(RegExport::Ipc { base, handle }) => {
                let rec = regmap::Record {
                    id: piece_id(id, 0),
                    start: buff,
                    end,
                    base,
                    alloc: self.device.allocation_id(base)?.unwrap_or(0),
                    via: regmap::Via::Ipc,
                    handle,
                };
                (vec![rec], Vec::new())
            }
            Ok(RegExport::Vmm(x)) => {
                let mut pieces = vec![x];
                while pieces.len() < MAX_REG_PIECES {
                    let next = pieces
                        .last()
                        .map_or(end, |x| x.base.saturating_add(x.bytes as u64));
                    if next >= end {
                        break;
                    }
                    match self.device.vmm_export_at(next) {
                        Ok(Some(y)) if y.base == next && y.bytes > 0 => pieces.push(y),
                        _ => break,
                    }
                }
                let mut records = Vec::new();
                for (i, x) in pieces.iter().enumerate() {
                    let Some(ticket) = x.ticket() else {
                        break;
                    };
                    let x_end = x.base + x.bytes as u64;
                    records.push(regmap::Record {
                        id: piece_id(id, i),
                        start: buff.max(x.base),
                        end: end.min(x_end),
                        base: x.base,
                        alloc: self.device.allocation_id(x.base)?.unwrap_or(0),
                        via: regmap::Via::VmmFd,
                        handle: regmap::vmm_handle(&ticket, x.bytes),
                    });
                }
                if records.is_empty() {
                    return Ok(());
                }
                pieces.truncate(records.len());
                (records, pieces)
            }
            Err(e) => {
                // Said once: every registration of the kind would repeat it.
                if !self.unexported_said.swap(true, Ordering::Relaxed) {
                    log::info!(
                        "registered buffer {buff:#x} cannot be mapped by other processes ({e}): \
                         peers there send into it through the FIFO (said once)"
                    );
                }
                return Ok(());
            }
        };
        // On offer before any peer can ask.
        self.exported
            .lock()
            .map_err(|_| Error::internal("registration table poisoned"))?
            .insert(id, (records.len() as u64, keep));
        let mut first = None;
        for rec in &records {
            let msg = regmap::encode(rec.id, Some(rec));
            if let Err(e) = self.tell_peers(&peers, &msg) {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Withdraws registration `id` (each of its records) from the peers it was sent to.
    pub fn withdraw_registration(&self, id: u64) -> Result<()> {
        let sent = self
            .exported
            .lock()
            .map_err(|_| Error::internal("registration table poisoned"))?
            .remove(&id);
        // VMM exports (if any) stay on offer until the withdrawals are out.
        if let Some((records, _exports)) = sent {
            let peers = self.reg_peers();
            let mut first = None;
            for i in 0..records as usize {
                let msg = regmap::encode(piece_id(id, i), None);
                if let Err(e) = self.tell_peers(&peers, &msg) {
                    first.get_or_insert(e);
                }
            }
            return first.map_or(Ok(()), Err);
        }
        Ok(())
    }

    /// Sends a registration record or withdrawal to each of `peers` that is still there: a
    /// peer gone (its process exited) is skipped at once, without the bootstrap's connect
    /// retries, and one failure does not keep the others from hearing. The first failure is
    /// returned after every peer was tried.
    fn tell_peers(&self, peers: &[usize], msg: &[u8]) -> Result<()> {
        let mut first = None;
        for &p in peers {
            match self.bootstrap.send_unless_gone(p, regmap::TAG_REG, msg) {
                Ok(true) => {}
                Ok(false) => log::debug!("registration record for rank {p}: rank {p} is gone"),
                Err(e) => {
                    first.get_or_insert(e);
                }
            }
        }
        first.map_or(Ok(()), Err)
    }

    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The device address of connection `c` to/from `peer` (connected before).
    pub fn conn(&self, peer: usize, dir: Dir, c: usize) -> Result<DevPtr> {
        let sides = self
            .sides
            .lock()
            .map_err(|_| Error::internal("p2p connection table poisoned"))?;
        let conns = sides
            .get(&(peer, dir))
            .ok_or_else(|| Error::internal(format!("no {dir:?} connection with rank {peer}")))?;
        Ok(conns.ptr + (c * std::mem::size_of::<ConnSend>()) as u64)
    }

    /// A new device array whose entry `c` is a copy of connection `c` of `picks[c]` (connected
    /// before; zeros where `picks[c]` is `None`): CTA `c` of a launch then reaches its own peer.
    /// The copies carry the connections' step counters from here on, so the picked
    /// connections must serve nothing else.
    pub fn gather(&self, picks: &[Option<(usize, Dir)>]) -> Result<DevBuffer> {
        let size = std::mem::size_of::<ConnSend>();
        debug_assert_eq!(size, std::mem::size_of::<ConnRecv>());
        let mut raw = vec![0u8; picks.len().max(1) * size];
        for (c, pick) in picks.iter().enumerate() {
            if let Some((peer, dir)) = *pick {
                if c >= self.nconns {
                    return Err(Error::internal(format!(
                        "connection {c} of {} per peer",
                        self.nconns
                    )));
                }
                let at = self.conn(peer, dir, c)?;
                self.device
                    .copy_dtoh(&mut raw[c * size..(c + 1) * size], at)?;
            }
        }
        let conns = self.device.alloc(raw.len())?;
        conns.write(0, &raw)?;
        Ok(conns)
    }

    /// Where these links' rounds run.
    fn cx(&self) -> Ctx<'_> {
        Ctx {
            rank: self.rank,
            device: &self.device,
            bootstrap: &self.bootstrap,
            peers: &self.peers,
            net: self.net.as_deref(),
            suspendable: &self.suspendable,
        }
    }

    /// What these links' rounds connect: `nconns` connections per (peer, direction), keyed
    /// from [`Links::keyed`]'s base.
    fn set(&self) -> Set {
        Set::Links {
            nconns: self.nconns,
            slot_bytes: self.slot_bytes,
            ll: self.ll,
            key_base: self.key_base,
        }
    }

    /// Starts connecting every (peer, direction) in `needs` that is not connected yet: the
    /// transport of each pair sets up our side and publishes it ([`super::setup`]).
    /// [`Links::finish`] completes them. Several communicators driven by one thread start
    /// first and finish after, so none waits on a peer that has not published yet.
    pub fn start(&self, needs: &[(usize, Dir)]) -> Result<Started> {
        let sides = self
            .sides
            .lock()
            .map_err(|_| Error::internal("p2p connection table poisoned"))?;
        let mut fresh: Vec<(usize, Dir)> = Vec::new();
        for &(peer, dir) in needs {
            if peer >= self.peers.len() || peer == self.rank {
                return Err(Error::internal(format!("p2p connection to rank {peer}")));
            }
            if !sides.contains_key(&(peer, dir)) && !fresh.contains(&(peer, dir)) {
                fresh.push((peer, dir));
            }
        }
        drop(sides);
        let wants: Vec<Want> = fresh
            .iter()
            .flat_map(|&(peer, dir)| {
                (0..self.nconns).map(move |c| Want {
                    peer,
                    dir,
                    key: self.key_base + c as u32,
                })
            })
            .collect();
        let round = super::setup(&self.cx(), self.set(), &wants)?;
        Ok(Started { fresh, round })
    }

    /// Completes what [`Links::start`] began with the peers' records ([`super::Started`]) and
    /// writes each (peer, direction)'s `nconns` connections where the kernels find them.
    pub fn finish(&self, started: Started) -> Result<()> {
        let Started { fresh, round } = started;
        let mut sides = self
            .sides
            .lock()
            .map_err(|_| Error::internal("p2p connection table poisoned"))?;
        let made = round.connect(&self.cx())?;
        let by_want: HashMap<Want, Conn> = made.conns.into_iter().collect();
        for (peer, dir) in fresh {
            let mut raw = Vec::with_capacity(self.nconns * std::mem::size_of::<ConnSend>());
            for c in 0..self.nconns {
                let want = Want {
                    peer,
                    dir,
                    key: self.key_base + c as u32,
                };
                let conn = by_want.get(&want).ok_or_else(|| {
                    Error::internal(format!("connection {c} of {dir:?} rank {peer} not made"))
                })?;
                let tail = match conn {
                    Conn::Send(s) => s.tail,
                    Conn::Recv(r) => r.tail,
                };
                if let Some(q) = crate::proxy::ops::queue_of(tail) {
                    if let Ok(mut qs) = self.op_queues.lock() {
                        qs.insert((peer, dir, c), q);
                    }
                }
                conn.words()
                    .iter()
                    .for_each(|w| raw.extend_from_slice(&w.to_le_bytes()));
            }
            let conns = self.device.alloc(raw.len())?;
            conns.write(0, &raw)?;
            sides.insert((peer, dir), conns);
        }
        self.resources
            .lock()
            .map_err(|_| Error::internal("p2p connection table poisoned"))?
            .take(made.resources);
        Ok(())
    }
}
