//! The p2p transport: peers of this node reached through peer access (one process) or CUDA
//! IPC (across processes). On the rings every rank owns one device block holding, per channel,
//! its receive FIFO (NCCL_STEPS slots), its receive tail counter and its send head counter —
//! each counter in its own 128-byte line, and after all of those its LL FIFO (NCCL_STEPS slots
//! of `ll_slot_bytes`) and its LL128 FIFO (NCCL_STEPS slots of `ll128_slot_bytes`; steps and
//! counters shared with the Simple FIFO), published to every rank by one allgather. A sender
//! writes into its next's block (FIFO data and tail) and polls its own head; a receiver polls
//! its own tail and writes its prev's head. So every poll is local and every remote access is
//! a store. A link (send/recv, trees) has a block per (peer, direction) the same way round: the
//! receiving side's holds its tail lines and FIFOs, the sending side's its head lines, each
//! published to that peer alone.

use super::suspend::{any_other_process, OwnBlock, Suspendable};
use super::{Conn, Ctx, Dir, Made, Resources, Set, Setup, Transport, Want};
use crate::cuda::fdpass::{Ticket, TICKET_BYTES};
use crate::cuda::{DevPtr, Device};
use crate::error::{Error, Result};
use crate::graph::Transport as Kind;
use nccl_device::abi::{
    ConnRecv, ConnSend, CTRL_LINE, LL128_SLOT_BYTES, LL_SLOT_BYTES, NCCL_STEPS,
};
use std::sync::Arc;

/// Where things sit inside a rank's block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub nchannels: usize,
    pub slot_bytes: usize,
    /// Bytes of one LL FIFO slot (lines of 8 payload bytes and 8 flag bytes).
    pub ll_slot_bytes: usize,
    /// Bytes of one LL128 FIFO slot (128-byte lines of 120 payload bytes and a flag).
    pub ll128_slot_bytes: usize,
}

impl Layout {
    /// The layout with `nchannels` channels, Simple slots of `slot_bytes` and the device's LL
    /// slots.
    pub fn new(nchannels: usize, slot_bytes: usize) -> Layout {
        Layout {
            nchannels,
            slot_bytes,
            ll_slot_bytes: LL_SLOT_BYTES as usize,
            ll128_slot_bytes: LL128_SLOT_BYTES as usize,
        }
    }

    fn ctrl_bytes(&self) -> usize {
        self.nchannels * 2 * CTRL_LINE
    }
    pub fn recv_tail(&self, ch: usize) -> u64 {
        (ch * 2 * CTRL_LINE) as u64
    }
    pub fn send_head(&self, ch: usize) -> u64 {
        (ch * 2 * CTRL_LINE + CTRL_LINE) as u64
    }
    pub fn fifo(&self, ch: usize) -> u64 {
        (self.ctrl_bytes() + ch * NCCL_STEPS as usize * self.slot_bytes) as u64
    }
    fn simple_end(&self) -> usize {
        self.ctrl_bytes() + self.nchannels * NCCL_STEPS as usize * self.slot_bytes
    }
    pub fn ll_fifo(&self, ch: usize) -> u64 {
        (self.simple_end() + ch * NCCL_STEPS as usize * self.ll_slot_bytes) as u64
    }
    fn ll_end(&self) -> usize {
        self.simple_end() + self.nchannels * NCCL_STEPS as usize * self.ll_slot_bytes
    }
    pub fn ll128_fifo(&self, ch: usize) -> u64 {
        (self.ll_end() + ch * NCCL_STEPS as usize * self.ll128_slot_bytes) as u64
    }
    pub fn total(&self) -> usize {
        self.ll_end() + self.nchannels * NCCL_STEPS as usize * self.ll128_slot_bytes
    }

    /// Channel `ch`'s sending side: the receiver's FIFOs and tail in the block at `fifos`, our
    /// head in the block at `head` (p2p: the peer's block and ours; SHM: one segment).
    pub fn send(&self, fifos: DevPtr, head: DevPtr, ch: usize) -> ConnSend {
        ConnSend {
            fifo: fifos + self.fifo(ch),
            tail: fifos + self.recv_tail(ch),
            head: head + self.send_head(ch),
            ll_fifo: fifos + self.ll_fifo(ch),
            ll128_fifo: fifos + self.ll128_fifo(ch),
            ..ConnSend::default()
        }
    }

    /// Channel `ch`'s receiving side: our FIFOs and tail in the block at `fifos`, the sender's
    /// head in the block at `head`.
    pub fn recv(&self, fifos: DevPtr, head: DevPtr, ch: usize) -> ConnRecv {
        ConnRecv {
            fifo: fifos + self.fifo(ch),
            tail: fifos + self.recv_tail(ch),
            head: head + self.send_head(ch),
            ll_fifo: fifos + self.ll_fifo(ch),
            ll128_fifo: fifos + self.ll128_fifo(ch),
            ..ConnRecv::default()
        }
    }
}

/// How a rank is reached: its device, whether it shares our process, and the transport the
/// communicator chose for the pair.
#[derive(Clone, Copy, Debug)]
pub struct PeerAddr {
    pub device: i32,
    pub same_process: bool,
    pub transport: crate::graph::Transport,
}

/// What one rank publishes about a block of its device memory: what the block is to peers of
/// other processes (one of the `REC_*` kinds, then an IPC handle or a descriptor's ticket), its
/// address (for peers of this process) and the bytes a VMM block maps.
const EXPORT_BYTES: usize = 1 + 64 + 8 + 8;
/// Plain memory: a CUDA IPC handle follows.
const REC_IPC: u8 = 0;
/// Memory of the virtual memory API, its descriptor on offer: the ticket follows.
const REC_VMM: u8 = 1;
/// Memory only peers of this process reach (a VMM block no other process maps).
const REC_LOCAL: u8 = 2;

/// A peer's block mapped into this process: held as long as the connections using it.
pub type PeerMapping = Box<dyn std::any::Any + Send + Sync>;

/// The record that lets a peer reach `own`.
pub(crate) fn export(device: &Device, own: &OwnBlock) -> Result<Vec<u8>> {
    let mut e = vec![0u8; EXPORT_BYTES];
    if let Some((ticket, bytes)) = own.ticket() {
        e[0] = REC_VMM;
        e[1..1 + TICKET_BYTES].copy_from_slice(&ticket.encode());
        e[73..81].copy_from_slice(&(bytes as u64).to_le_bytes());
    } else if own.is_listed() {
        e[0] = REC_LOCAL;
    } else {
        e[0] = REC_IPC;
        e[1..65].copy_from_slice(&device.ipc_handle(&own.buf)?);
    }
    e[65..73].copy_from_slice(&own.buf.ptr.to_le_bytes());
    Ok(e)
}

/// Makes rank `owner`'s exported block addressable from `device`: peer access in this
/// process; across processes an IPC mapping, or the block's descriptor mapped (and listed in
/// `suspendable`, to be remapped on resume). The block must hold the `needed` bytes our layout
/// addresses in it (the kernels address it from our layout, not from the record): a shorter one
/// is `ncclRemoteError` and nothing is kept mapped.
pub(crate) fn import(
    device: &Device,
    suspendable: &Arc<Suspendable>,
    owner: usize,
    peer: &PeerAddr,
    record: &[u8],
    needed: usize,
) -> Result<(DevPtr, Option<PeerMapping>)> {
    if record.len() != EXPORT_BYTES {
        return Err(Error::remote(format!(
            "malformed p2p connection record ({} bytes)",
            record.len()
        )));
    }
    let word = |at: usize| u64::from_le_bytes(record[at..at + 8].try_into().unwrap_or([0; 8]));
    let addr = word(65);
    if peer.same_process {
        let other = Device::open(peer.device)?;
        if other.ordinal != device.ordinal {
            if !device.can_access_peer(&other)? {
                return Err(Error::system(format!(
                    "GPU {} cannot access GPU {} (no peer-to-peer path): the pair should have taken SHM or the network",
                    device.ordinal, other.ordinal
                )));
            }
            device.enable_peer_access(&other)?;
        }
        // In this process the address must be device memory we know, holding the block.
        match device.pointer_extent(addr, needed)? {
            Some((_, held)) => check_block(addr, held, needed)?,
            None => {
                return Err(Error::remote(format!(
                    "p2p connection record names {addr:#x}, which is no device memory of this \
                     process"
                )))
            }
        }
        return Ok((addr, None));
    }
    let (ptr, mapping): (DevPtr, PeerMapping) = match record[0] {
        REC_IPC => {
            let mut handle = [0u8; 64];
            handle.copy_from_slice(&record[1..65]);
            let m = device.open_ipc(&handle)?;
            (m.ptr, Box::new(m))
        }
        REC_VMM => {
            let mut t = [0u8; TICKET_BYTES];
            t.copy_from_slice(&record[1..1 + TICKET_BYTES]);
            let bytes = word(73) as usize;
            check_block(addr, bytes, needed)?;
            let m = suspendable.map_peer(device, owner, addr, &Ticket::decode(&t), bytes)?;
            (m.mapping.ptr, Box::new(m))
        }
        k => {
            return Err(Error::remote(format!(
                "p2p connection record of kind {k}: rank {owner}'s block is not exported to \
                 other processes"
            )))
        }
    };
    // What the mapping holds; where the backend cannot tell, nothing is refused (as for
    // buffers of unknown extent). A refused mapping is closed as it drops.
    if let Some((_, held)) = device.pointer_extent(ptr, needed)? {
        check_block(ptr, held, needed)?;
    }
    Ok((ptr, Some(mapping)))
}

/// A peer's block at `p` holding `held` bytes, where our layout addresses `needed`.
fn check_block(p: DevPtr, held: usize, needed: usize) -> Result<()> {
    if held < needed {
        return Err(Error::remote(format!(
            "p2p connection record: the block at {p:#x} holds {held} bytes, its connections \
             need {needed}"
        )));
    }
    Ok(())
}

/// Bootstrap tag of a link's receive block (its tail lines and FIFOs), receiver to sender.
/// SHM links send their segment's record under it too (a pair has one transport).
pub(super) const TAG_RECV_BLOCK: u32 = 0x7032_7001;
/// Bootstrap tag of a link's send block (its head lines), sender to receiver.
const TAG_SEND_CTRL: u32 = 0x7032_7002;

/// The p2p transport: the pairs the communicator agreed on P2P (peers of this node that peer
/// access or CUDA IPC reach).
pub(crate) struct P2pTransport;

impl Transport for P2pTransport {
    fn can_connect(&self, peer: &PeerAddr) -> bool {
        peer.transport == Kind::P2p
    }

    fn setup(&self, cx: &Ctx, set: Set, wants: &[Want]) -> Result<Box<dyn Setup>> {
        Ok(match set {
            Set::Ring {
                nchannels,
                slot_bytes,
            } => Box::new(RingSetup::new(
                cx,
                Layout::new(nchannels, slot_bytes),
                wants,
            )?),
            Set::Links {
                nconns,
                slot_bytes,
                ll,
                key_base,
            } => {
                let (fifo_bytes, ll_bytes) = super::link_fifo_bytes(slot_bytes, ll);
                let block = LinkBlock {
                    nconns,
                    fifo_bytes,
                    ll_bytes,
                    key_base,
                };
                Box::new(LinkSetup::new(cx, block, wants)?)
            }
        })
    }
}

/// The rings' p2p side: our block (every channel's receive FIFOs and counters, in a
/// [`Layout`]), published to every rank by an allgather that every rank joins, whatever its
/// neighbours' transports.
struct RingSetup {
    layout: Layout,
    own: OwnBlock,
    /// Every rank's record of its block, by rank.
    all: Vec<Vec<u8>>,
    wants: Vec<Want>,
}

impl RingSetup {
    fn new(cx: &Ctx, layout: Layout, wants: &[Want]) -> Result<RingSetup> {
        if let Some(w) = wants.iter().find(|w| w.key as usize >= layout.nchannels) {
            return Err(Error::internal(format!(
                "p2p setup: a connection of channel {} for {} channels",
                w.key, layout.nchannels
            )));
        }
        let exported = any_other_process(wants.iter().filter_map(|w| cx.peers.get(w.peer)));
        let own = cx.suspendable.alloc(cx.device, layout.total(), exported)?;
        let all = cx.bootstrap.allgather(&export(cx.device, &own)?)?;
        Ok(RingSetup {
            layout,
            own,
            all,
            wants: wants.to_vec(),
        })
    }
}

impl Setup for RingSetup {
    /// Maps each neighbour's block once, however many channels reach it: a sender writes into
    /// its next's block and polls its own head; a receiver polls its own tail and writes its
    /// prev's head.
    fn connect(self: Box<Self>, cx: &Ctx) -> Result<Made> {
        let RingSetup {
            layout: l,
            own,
            all,
            wants,
        } = *self;
        let peers = cx.peers;
        let mut mappings = Vec::new();
        let mut mapped: Vec<Option<DevPtr>> = vec![None; peers.len()];
        let mut base_of = |r: usize| -> Result<DevPtr> {
            if let Some(Some(p)) = mapped.get(r) {
                return Ok(*p);
            }
            let e = all
                .get(r)
                .filter(|_| r < peers.len())
                .ok_or_else(|| Error::remote(format!("no p2p connection record from rank {r}")))?;
            let (p, m) = import(cx.device, cx.suspendable, r, &peers[r], e, l.total())
                .map_err(|err| err.context(format!("rank {r}'s buffers")))?;
            mappings.extend(m);
            mapped[r] = Some(p);
            Ok(p)
        };
        let mut conns = Vec::with_capacity(wants.len());
        for w in wants {
            let (ch, base) = (w.key as usize, base_of(w.peer)?);
            let conn = match w.dir {
                Dir::Send => Conn::Send(l.send(base, own.buf.ptr, ch)),
                Dir::Recv => Conn::Recv(l.recv(own.buf.ptr, base, ch)),
            };
            if w.dir == Dir::Send {
                log::info!(
                    target: crate::debug::INIT,
                    "Channel {ch:02}/0 : {}[{}] -> {}[{}] via P2P/{}",
                    cx.rank,
                    cx.device.ordinal,
                    w.peer,
                    peers[w.peer].device,
                    if peers[w.peer].same_process {
                        "direct pointer"
                    } else {
                        "IPC"
                    }
                );
            }
            conns.push((w, conn));
        }
        let mut resources = Resources::default();
        resources.hold(own);
        resources.hold(mappings);
        Ok(Made { conns, resources })
    }
}

/// Where the parts of a link's blocks lie. The receiving side's block: `nconns` tail lines,
/// `nconns` Simple FIFOs of `fifo_bytes`, then `nconns` LL FIFOs of `ll_bytes` (none when 0);
/// the sending side's: `nconns` head lines. Connection `c` is the one keyed `key_base + c`.
#[derive(Clone, Copy, Debug)]
struct LinkBlock {
    nconns: usize,
    fifo_bytes: usize,
    ll_bytes: usize,
    key_base: u32,
}

impl LinkBlock {
    /// Bytes of our block for direction `dir`.
    fn bytes(&self, dir: Dir) -> usize {
        match dir {
            Dir::Recv => self.nconns * (CTRL_LINE + self.fifo_bytes + self.ll_bytes),
            Dir::Send => self.nconns * CTRL_LINE,
        }
    }

    /// Bytes of the peer's block our connections in direction `dir` address: tail lines and
    /// Simple FIFOs (its receive block, for our send), or head lines (for our receive).
    fn needed(&self, dir: Dir) -> usize {
        match dir {
            Dir::Send => self.nconns * (CTRL_LINE + self.fifo_bytes),
            Dir::Recv => self.nconns * CTRL_LINE,
        }
    }

    fn ctrl(&self, base: DevPtr, c: usize) -> DevPtr {
        base + (c * CTRL_LINE) as u64
    }

    fn fifo(&self, base: DevPtr, c: usize) -> DevPtr {
        base + (self.nconns * CTRL_LINE + c * self.fifo_bytes) as u64
    }

    /// After the Simple FIFOs (none without LL FIFOs: 0 tells the kernels so).
    fn ll_fifo(&self, base: DevPtr, c: usize) -> DevPtr {
        match self.ll_bytes {
            0 => 0,
            ll => base + (self.nconns * (CTRL_LINE + self.fifo_bytes) + c * ll) as u64,
        }
    }

    /// Connection `w`'s kernel structure, with our block at `own` and the peer's at `theirs`.
    fn conn(&self, w: &Want, own: DevPtr, theirs: DevPtr) -> Result<Conn> {
        let c = w.key.wrapping_sub(self.key_base) as usize;
        if c >= self.nconns {
            return Err(Error::internal(format!(
                "link connection key {} outside {}..+{}",
                w.key, self.key_base, self.nconns
            )));
        }
        Ok(match w.dir {
            Dir::Send => Conn::Send(ConnSend {
                fifo: self.fifo(theirs, c),
                tail: self.ctrl(theirs, c),
                head: self.ctrl(own, c),
                ll_fifo: self.ll_fifo(theirs, c),
                ..ConnSend::default()
            }),
            Dir::Recv => Conn::Recv(ConnRecv {
                fifo: self.fifo(own, c),
                tail: self.ctrl(own, c),
                head: self.ctrl(theirs, c),
                ll_fifo: self.ll_fifo(own, c),
                ..ConnRecv::default()
            }),
        })
    }
}

/// The links' p2p sides: per (peer, direction), our block, published to that peer.
struct LinkSetup {
    block: LinkBlock,
    sides: Vec<(usize, Dir, Vec<Want>, OwnBlock)>,
}

impl LinkSetup {
    fn new(cx: &Ctx, block: LinkBlock, wants: &[Want]) -> Result<LinkSetup> {
        let mut sides = Vec::new();
        for (peer, dir, ws) in super::sides(wants) {
            let tag = match dir {
                Dir::Recv => TAG_RECV_BLOCK,
                Dir::Send => TAG_SEND_CTRL,
            };
            let exported = any_other_process([&cx.peers[peer]]);
            let own = cx
                .suspendable
                .alloc(cx.device, block.bytes(dir), exported)?;
            cx.bootstrap.send(peer, tag, &export(cx.device, &own)?)?;
            sides.push((peer, dir, ws, own));
        }
        Ok(LinkSetup { block, sides })
    }
}

impl Setup for LinkSetup {
    /// Maps each peer's block (its receive block for our send, its send block for our
    /// receive).
    fn connect(self: Box<Self>, cx: &Ctx) -> Result<Made> {
        let mut made = Made::default();
        for (peer, dir, ws, own) in self.sides {
            let tag = match dir {
                Dir::Recv => TAG_SEND_CTRL,
                Dir::Send => TAG_RECV_BLOCK,
            };
            let record = cx
                .bootstrap
                .recv(peer, tag)
                .map_err(|e| e.context(format!("connecting to rank {peer}")))?;
            let needed = self.block.needed(dir);
            let (theirs, mapping) = import(
                cx.device,
                cx.suspendable,
                peer,
                &cx.peers[peer],
                &record,
                needed,
            )
            .map_err(|e| e.context(format!("rank {peer}'s connection")))?;
            for w in ws {
                made.conns
                    .push((w, self.block.conn(&w, own.buf.ptr, theirs)?));
            }
            made.resources.hold((own, mapping));
        }
        Ok(made)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer's record whose block is smaller than the connections our layout puts in it is
    /// refused, across processes (an IPC handle) and in this process (an address); so is an
    /// address that is no device memory.
    #[test]
    fn a_block_smaller_than_its_connections_is_refused() {
        let _ = crate::cuda::set_backend(crate::cuda::Backend::Sim);
        let dev = Device::open(0).expect("device 0");
        let suspendable = Arc::new(Suspendable::new());
        let block = suspendable.alloc(&dev, 4096, true).expect("alloc");
        let record = export(&dev, &block).expect("export");
        for same_process in [false, true] {
            let peer = PeerAddr {
                device: 0,
                same_process,
                transport: crate::graph::Transport::P2p,
            };
            for needed in [4097, 1 << 30] {
                let e = match import(&dev, &suspendable, 1, &peer, &record, needed) {
                    Err(e) => e,
                    Ok(_) => panic!("a 4096-byte block imported for {needed} bytes"),
                };
                assert_eq!(e.code, crate::error::NcclResult::RemoteError, "{e}");
                assert!(
                    e.message
                        .contains(&format!("holds 4096 bytes, its connections need {needed}")),
                    "{e}"
                );
            }
            let (p, m) =
                import(&dev, &suspendable, 1, &peer, &record, 4096).expect("what it holds");
            assert_eq!(p == block.buf.ptr, same_process);
            drop(m);
        }
        let mut forged = record.clone();
        forged[65..73].copy_from_slice(&0x10u64.to_le_bytes());
        let peer = PeerAddr {
            device: 0,
            same_process: true,
            transport: crate::graph::Transport::P2p,
        };
        let e = match import(&dev, &suspendable, 1, &peer, &forged, 8) {
            Err(e) => e,
            Ok(_) => panic!("an address that is no device memory was taken"),
        };
        assert_eq!(e.code, crate::error::NcclResult::RemoteError, "{e}");
    }

    #[test]
    fn layout_keeps_counters_in_their_own_lines() {
        let l = Layout::new(3, 1 << 19);
        let mut offs: Vec<u64> = (0..3)
            .flat_map(|c| [l.recv_tail(c), l.send_head(c)])
            .collect();
        offs.sort();
        assert!(offs.windows(2).all(|w| w[1] - w[0] >= CTRL_LINE as u64));
        assert_eq!(l.fifo(0) as usize, 3 * 2 * CTRL_LINE);
        assert_eq!(l.fifo(2) - l.fifo(1), 8 << 19);
        assert_eq!(l.ll_fifo(0) as usize, l.fifo(2) as usize + (8 << 19));
        assert_eq!(l.ll_fifo(2) - l.ll_fifo(1), 8 * LL_SLOT_BYTES as u64);
        assert_eq!(l.ll128_fifo(0), l.ll_fifo(2) + 8 * LL_SLOT_BYTES as u64);
        assert_eq!(
            l.ll128_fifo(2) - l.ll128_fifo(1),
            8 * LL128_SLOT_BYTES as u64
        );
        assert_eq!(
            l.total(),
            l.ll128_fifo(2) as usize + 8 * LL128_SLOT_BYTES as usize
        );
        assert_eq!(l.ll128_fifo(0) % 128, 0);
        assert_eq!(l.ll_fifo(0) % 128, 0);
        assert_eq!(l.fifo(0) % 128, 0);
    }
}
