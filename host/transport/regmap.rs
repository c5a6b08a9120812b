//! Registered buffers across processes of a node. When a rank registers a buffer
//! (`ncclCommRegister`), it sends every peer in another process of its node that it reaches
//! through p2p a record of the buffer: its range, the base of its allocation, and how to map
//! that allocation — an IPC handle for memory of `cuMemAlloc`; for memory of CUDA's virtual
//! memory API (`ncclMemAlloc`, `cuMemCreate` with a POSIX descriptor handle), which has no IPC
//! handle, a ticket for the allocation's exported descriptor (`cuda::fdpass`: the owner keeps
//! it on offer while the registration lives; the peer takes it over a Unix socket with
//! `SCM_RIGHTS`, else `pidfd_getfd`, imports it with `cuMemImportFromShareableHandle` and maps
//! it). Deregistering sends a withdrawal. A sender maps a peer's registered buffers as their
//! records arrive (drained before each launch, without waiting on the peer) and keeps them in a
//! table in device memory that the kernels read ([`RegTable`]), through which it translates the
//! addresses the peer offers for zero-copy (`prims::direct`). A record that has not arrived
//! yet, or a buffer that cannot be mapped (no IPC handle nor descriptor, a descriptor that
//! cannot be taken or imported, `NCCL_RS_VMM_IPC=0`), only means that the peer's offer is
//! declined and the message takes the FIFO. An offer names the allocation it lies in
//! (`abi::DIRECT_KEY`), and only an entry of that allocation translates it: a peer that freed a
//! registered buffer and registered another at the same address before its withdrawal reached
//! us is declined, not written through our mapping of the freed one.
//!
//! Graph registration adds marks: a rank capturing a CUDA graph sends its records for the
//! buffers the capture uses, then a mark counting its captured operations ([`Mark`]); a
//! sender about to capture an operation into such a buffer drains the peer's messages until
//! the matching mark is in (so the graph's replays find the records mapped), or a bounded wait
//! ends (its replays then take copies until a later launch drains the records).

use crate::bootstrap::Bootstrap;
use crate::cuda::fdpass::{self, Ticket, TICKET_BYTES};
use crate::cuda::{DevBuffer, DevPtr, Device, Fence, IpcMapping, VmmMapping};
use crate::error::{Error, Result};
use nccl_device::abi::{RegEntry, RegTable, REG_TABLE_ENTRIES};
use std::collections::HashMap;
use std::sync::Arc;

/// The bootstrap tag of registration records.
pub const TAG_REG: u32 = 0x7265_6701;

const ADD: u64 = 1;
const WITHDRAW: u64 = 2;
const ADD_VMM: u64 = 3;
const MARK: u64 = 4;
const RECORD_BYTES: usize = 6 * 8 + 64;

/// One registration as its owner describes it to a peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Record {
    /// The owner's registration handle.
    pub id: u64,
    /// The registered range, in the owner's address space.
    pub start: DevPtr,
    pub end: DevPtr,
    /// The base of the allocation holding it, and how to map that allocation.
    pub base: DevPtr,
    /// The owner's id of that allocation (`Device::allocation_id`; 0 where unknown): a freed
    /// allocation's base may come back as another's, which must get a mapping of its own.
    pub alloc: u64,
    pub via: Via,
    /// [`Via::Ipc`]: the allocation's IPC handle; [`Via::VmmFd`]: [`vmm_handle`]'s bytes.
    pub handle: [u8; 64],
}

/// How a peer maps the allocation of a [`Record`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Via {
    /// `cuIpcOpenMemHandle` on the handle.
    Ipc,
    /// The descriptor of a VMM allocation, taken and imported.
    VmmFd,
}

/// Which captured operations a mark counts. Ranks capture the same collectives in the same
/// order, and a pair's sends and receives match in order, so both ends count alike.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mark {
    /// Ring and tree collectives on Simple steps captured with graph registration: sent to
    /// every peer that maps our buffers.
    Coll = 0,
    /// Receives from the peer the mark goes to.
    Recv = 1,
}

/// A mark: `seq` operations of kind `mark` captured so far.
pub fn encode_mark(mark: Mark, seq: u64) -> Vec<u8> {
    let mut b = vec![0u8; RECORD_BYTES];
    b[..8].copy_from_slice(&MARK.to_le_bytes());
    b[8..16].copy_from_slice(&seq.to_le_bytes());
    b[16..24].copy_from_slice(&(mark as u64).to_le_bytes());
    b
}

/// The mark in `b`, if it is one (None: a record or withdrawal, for [`decode`]).
pub fn decode_mark(b: &[u8]) -> Result<Option<(Mark, u64)>> {
    let w = |i: usize| {
        let x = b.get(8 * i..8 * i + 8)?;
        Some(u64::from_le_bytes(x.try_into().unwrap_or_default()))
    };
    if b.len() != RECORD_BYTES || w(0) != Some(MARK) {
        return Ok(None);
    }
    match w(2) {
        Some(0) => Ok(Some((Mark::Coll, w(1).unwrap_or(0)))),
        Some(1) => Ok(Some((Mark::Recv, w(1).unwrap_or(0)))),
        k => Err(Error::remote(format!("registration mark of kind {k:?}"))),
    }
}

/// The handle of a [`Via::VmmFd`] record: the descriptor's ticket, then the size of the
/// mapping at the record's base (what the peer maps).
pub fn vmm_handle(ticket: &Ticket, bytes: usize) -> [u8; 64] {
    let mut h = [0u8; 64];
    h[..TICKET_BYTES].copy_from_slice(&ticket.encode());
    h[TICKET_BYTES..TICKET_BYTES + 8].copy_from_slice(&(bytes as u64).to_le_bytes());
    h
}

/// The ticket and mapping size in a [`Via::VmmFd`] record's handle.
pub fn parse_vmm_handle(h: &[u8; 64]) -> (Ticket, usize) {
    let mut t = [0u8; TICKET_BYTES];
    t.copy_from_slice(&h[..TICKET_BYTES]);
    let bytes = u64::from_le_bytes(
        h[TICKET_BYTES..TICKET_BYTES + 8]
            .try_into()
            .unwrap_or_default(),
    );
    (Ticket::decode(&t), bytes as usize)
}

/// A registration record (`Some`) or a withdrawal of registration `id`, as bytes.
pub fn encode(id: u64, add: Option<&Record>) -> Vec<u8> {
    let mut b = Vec::with_capacity(RECORD_BYTES);
    let r = add.copied().unwrap_or(Record {
        id,
        start: 0,
        end: 0,
        base: 0,
        alloc: 0,
        via: Via::Ipc,
        handle: [0; 64],
    });
    let kind = match add.map(|r| r.via) {
        None => WITHDRAW,
        Some(Via::Ipc) => ADD,
        Some(Via::VmmFd) => ADD_VMM,
    };
    for w in [kind, id, r.start, r.end, r.base, r.alloc] {
        b.extend_from_slice(&w.to_le_bytes());
    }
    b.extend_from_slice(&r.handle);
    b
}

/// The record in `b` (None: a withdrawal of the id returned).
pub fn decode(b: &[u8]) -> Result<(u64, Option<Record>)> {
    if b.len() != RECORD_BYTES {
        return Err(Error::remote(format!(
            "malformed registration record ({} bytes)",
            b.len()
        )));
    }
    let w = |i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().unwrap_or_default());
    let (kind, id) = (w(0), w(1));
    match kind {
        WITHDRAW => Ok((id, None)),
        ADD | ADD_VMM => {
            let (start, end, base, alloc) = (w(2), w(3), w(4), w(5));
            if start < base || end <= start {
                return Err(Error::remote(format!(
                    "registration record with range {start:#x}..{end:#x} in an allocation at {base:#x}"
                )));
            }
            let mut handle = [0u8; 64];
            handle.copy_from_slice(&b[48..]);
            let via = if kind == ADD { Via::Ipc } else { Via::VmmFd };
            if via == Via::VmmFd {
                let (_, bytes) = parse_vmm_handle(&handle);
                if base.checked_add(bytes as u64).is_none_or(|e| e < end) {
                    return Err(Error::remote(format!(
                        "registration record with range {start:#x}..{end:#x} past its VMM \
                         mapping of {bytes} bytes at {base:#x}"
                    )));
                }
            }
            Ok((
                id,
                Some(Record {
                    id,
                    start,
                    end,
                    base,
                    alloc,
                    via,
                    handle,
                }),
            ))
        }
        k => Err(Error::remote(format!("registration record of kind {k}"))),
    }
}

/// A peer's allocation as we map it: its base and the peer's id of it ([`Record::alloc`]).
type MapKey = (DevPtr, u64);

/// One peer process's registered buffers as we map them.
pub struct PeerRegs {
    /// The table kernels read, in device memory (a kernel looks an offer up in it at every
    /// direct step: from pinned host memory that took dependent reads over PCIe), written by
    /// synchronous copies.
    table: DevBuffer,
    /// Entries written (never reused: a kernel may be reading any of them).
    used: usize,
    /// Registration id → entry index.
    by_id: HashMap<u64, usize>,
    /// The peer's allocation base → our mapping of it, the bytes it holds and how many
    /// entries use it.
    mappings: HashMap<MapKey, Mapped>,
    /// Entry index → the peer's allocation base it maps.
    entry_base: HashMap<usize, MapKey>,
    /// The table filled up (said once).
    full_said: bool,
    /// A VMM buffer of the peer's could not be mapped (said once).
    vmm_said: bool,
    /// The peer's latest marks, by [`Mark`].
    marks: [u64; 2],
    /// Mappings no entry uses any more (their last one withdrawn): a kernel launched before
    /// the withdrawal may still be writing through them, so each is undone once a fence behind
    /// the kernels launched until then has passed ([`PeerRegs::settle`]), or with the table. A
    /// record with the same IPC handle of the same allocation before then takes its mapping
    /// back (the driver maps an IPC handle once).
    retired: Vec<Retired>,
}

/// Our mapping of a peer's allocation.
enum PeerMapping {
    Ipc(IpcMapping),
    Vmm(VmmMapping),
}

impl PeerMapping {
    fn ptr(&self) -> DevPtr {
        match self {
            PeerMapping::Ipc(m) => m.ptr,
            PeerMapping::Vmm(m) => m.ptr,
        }
    }
}

/// Takes the descriptor a [`Via::VmmFd`] handle names and maps the allocation behind it.
pub(crate) fn map_vmm(device: &Device, handle: &[u8; 64]) -> Result<VmmMapping> {
    let (ticket, bytes) = parse_vmm_handle(handle);
    let fd = fdpass::take(&ticket)?;
    use std::os::fd::AsFd;
    // The descriptor only carries the import: the mapping holds the memory from here on.
    device.vmm_import(fd.as_fd(), bytes)
}

/// A mapping no entry uses, until the kernels that could use it have finished.
struct Retired {
    key: MapKey,
    mapped: Mapped,
    /// Behind the kernels launched before it retired (None: not fenced yet).
    fence: Option<Arc<Fence>>,
}

/// Makes a fence behind every kernel the communicator launched so far (None: it launched
/// none); see [`crate::comm::order::StreamOrder::fence`].
pub type FenceProbe<'a> = &'a dyn Fn() -> Result<Option<Fence>>;

/// One of a peer's allocations as we map it.
struct Mapped {
    map: PeerMapping,
    /// Bytes mapped from `map.ptr` (`usize::MAX` where the backend cannot tell).
    bytes: usize,
    /// Entries using it.
    refs: usize,
    /// The handle of the record it was mapped from.
    handle: [u8; 64],
}

const ENTRIES_AT: usize = std::mem::offset_of!(RegTable, entries);

impl PeerRegs {
    pub fn new(device: &Device) -> Result<PeerRegs> {
        Ok(PeerRegs {
            table: {
                let t = device.alloc(std::mem::size_of::<RegTable>())?;
                t.write(0, &0u64.to_le_bytes())?; // no entries
                t
            },
            used: 0,
            by_id: HashMap::new(),
            mappings: HashMap::new(),
            entry_base: HashMap::new(),
            full_said: false,
            vmm_said: false,
            marks: [0; 2],
            retired: Vec::new(),
        })
    }

    /// Retires the mapping of `key` if no entry uses it.
    fn retire_unused(&mut self, key: MapKey) {
        if self.mappings.get(&key).is_some_and(|m| m.refs == 0) {
            if let Some(m) = self.mappings.remove(&key) {
                self.retired.push(Retired {
                    key,
                    mapped: m,
                    fence: None,
                });
            }
        }
    }

    /// Puts the mappings retired since the last call behind a fence on the kernels launched
    /// so far (undone at once where nothing was launched), and undoes those whose fence has
    /// passed. A fence that cannot be made is tried again next time.
    pub fn settle(&mut self, fence: FenceProbe) {
        if self.retired.iter().any(|r| r.fence.is_none()) {
            match fence() {
                Ok(None) => self.retired.retain(|r| r.fence.is_some()),
                Ok(Some(f)) => {
                    let f = Arc::new(f);
                    for r in self.retired.iter_mut().filter(|r| r.fence.is_none()) {
                        r.fence = Some(f.clone());
                    }
                }
                Err(e) => log::debug!("withdrawn peer mappings wait for a fence: {e}"),
            }
        }
        self.retired
            .retain(|r| !r.fence.as_ref().is_some_and(|f| f.passed()));
    }

    /// Whether mappings wait to be undone.
    pub fn has_retired(&self) -> bool {
        !self.retired.is_empty()
    }

    /// The peer's registrations mapped now.
    pub fn mapped(&self) -> usize {
        self.by_id.len()
    }

    /// The peer's latest mark of kind `mark` (0: none yet).
    pub fn mark(&self, mark: Mark) -> u64 {
        self.marks[mark as usize]
    }

    /// The table's device address (a [`nccl_device::abi::P2pItem::direct`] of a send).
    pub fn device_ptr(&self) -> DevPtr {
        self.table.ptr
    }

    fn write_entry(&self, i: usize, e: RegEntry) -> Result<()> {
        let at = ENTRIES_AT + i * std::mem::size_of::<RegEntry>();
        let mut b = [0u8; std::mem::size_of::<RegEntry>()];
        for (k, w) in [e.peer_start, e.peer_end, e.local, e.alloc]
            .into_iter()
            .enumerate()
        {
            b[8 * k..8 * k + 8].copy_from_slice(&w.to_le_bytes());
        }
        self.table.write(at, &b)
    }

    /// Publishes `n` entries: the copies are synchronous, so the entries are in before it.
    fn write_count(&self, n: usize) -> Result<()> {
        self.table.write(0, &(n as u64).to_le_bytes())
    }

    /// Applies one record from `peer`: maps and enters a registration, or withdraws one. A
    /// registration whose range leaves the allocation its handle maps, or that reuses a live
    /// id, is `ncclRemoteError` and enters nothing (the kernels would write where the range
    /// says). A withdrawal of an id not in the table is nothing: its registration may have been
    /// declined (table full, no mapping). `vmm` false (NCCL_RS_VMM_IPC=0): records of VMM
    /// buffers are not mapped.
    pub fn apply(
        &mut self,
        device: &Device,
        peer: usize,
        id: u64,
        rec: Option<Record>,
        vmm: bool,
    ) -> Result<()> {
        match rec {
            None => {
                let Some(i) = self.by_id.remove(&id) else {
                    return Ok(());
                };
                // An empty range: no offer matches it again.
                self.write_entry(i, RegEntry::default())?;
                if let Some(key) = self.entry_base.remove(&i) {
                    if let Some(m) = self.mappings.get_mut(&key) {
                        m.refs -= 1;
                    }
                    self.retire_unused(key);
                }
                Ok(())
            }
            Some(r) => {
                if self.by_id.contains_key(&id) {
                    return Err(Error::remote(format!(
                        "rank {peer} registered buffer id {id} again ({:#x}..{:#x}) without \
                         withdrawing it",
                        r.start, r.end
                    )));
                }
                if self.used == REG_TABLE_ENTRIES {
                    if !self.full_said {
                        log::warn!(
                            "rank {peer} registered more than {REG_TABLE_ENTRIES} buffers with \
                             this communicator: later ones take copies"
                        );
                        self.full_said = true;
                    }
                    return Ok(());
                }
                // `decode` made sure that base <= start < end.
                let need = r.end - r.base;
                let key = (r.base, r.alloc);
                // Only an allocation known by its id, through the very handle it was mapped
                // with: a key of id 0 may name a new allocation at a freed one's base.
                let again = |x: &Retired| {
                    x.key == key && r.alloc != 0 && r.via == Via::Ipc && x.mapped.handle == r.handle
                };
                if !self.mappings.contains_key(&key) {
                    if let Some(i) = self.retired.iter().position(again) {
                        let x = self.retired.swap_remove(i);
                        self.mappings.insert(key, x.mapped);
                    }
                }
                let fresh = if self.mappings.contains_key(&key) {
                    None
                } else {
                    let mapped = match r.via {
                        Via::Ipc => device.open_ipc(&r.handle).map(PeerMapping::Ipc),
                        Via::VmmFd if !vmm => Err(Error::invalid_usage(
                            "NCCL_RS_VMM_IPC=0 keeps peers' VMM buffers unmapped",
                        )),
                        Via::VmmFd => map_vmm(device, &r.handle).map(PeerMapping::Vmm),
                    };
                    match mapped {
                        Ok(map) => {
                            // What the driver (or the simulator) says the mapping holds;
                            // unknown: not refused, as buffers of unknown extent are not.
                            let bytes = match device.pointer_extent(map.ptr(), need as usize)? {
                                Some((_, b)) => b,
                                None => usize::MAX,
                            };
                            Some(Mapped {
                                map,
                                bytes,
                                refs: 0,
                                handle: r.handle,
                            })
                        }
                        Err(e) => {
                            // A VMM failure repeats for every buffer: said once per peer.
                            if r.via == Via::Ipc || !self.vmm_said {
                                self.vmm_said |= r.via == Via::VmmFd;
                                log::info!(
                                    "cannot map rank {peer}'s registered buffer {:#x} ({e}): \
                                     messages into it take copies",
                                    r.start
                                );
                            }
                            return Ok(());
                        }
                    }
                };
                let held = match (&fresh, self.mappings.get(&key)) {
                    (Some(m), _) | (None, Some(m)) => m.bytes,
                    (None, None) => return Err(Error::internal("registration mapping lost")),
                };
                if need > held as u64 {
                    // A fresh mapping drops here, unused; a taken-back one is retired again.
                    self.retire_unused(key);
                    return Err(Error::remote(format!(
                        "rank {peer} registered {:#x}..{:#x} in an allocation at {:#x}: {need} \
                         bytes from its base, but the allocation its handle maps holds {held}",
                        r.start, r.end, r.base
                    )));
                }
                let m = match fresh {
                    Some(m) => self.mappings.entry(key).or_insert(m),
                    None => self
                        .mappings
                        .get_mut(&key)
                        .ok_or_else(|| Error::internal("registration mapping lost"))?,
                };
                let local = m.map.ptr();
                let i = self.used;
                let entry = RegEntry {
                    peer_start: r.start,
                    peer_end: r.end,
                    local: local + (r.start - r.base),
                    alloc: r.alloc,
                };
                if let Err(e) = self.write_entry(i, entry) {
                    self.retire_unused(key);
                    return Err(e);
                }
                if let Some(m) = self.mappings.get_mut(&key) {
                    m.refs += 1;
                }
                self.used += 1;
                self.by_id.insert(id, i);
                self.entry_base.insert(i, key);
                self.write_count(self.used)
            }
        }
    }
}

/// Drains the records `peer` has sent so far into `regs` (`vmm`: see [`PeerRegs::apply`]). A
/// registration withdrawn in the same batch is not mapped at all: its descriptor may already
/// be gone. `fence` (None: keep withdrawn mappings until the table goes) fences the mappings
/// the batch retired ([`PeerRegs::settle`]); after the batch, as a kernel that starts later
/// reads the table with their entries cleared.
pub fn drain(
    bootstrap: &Bootstrap,
    device: &Device,
    peer: usize,
    regs: &mut PeerRegs,
    vmm: bool,
    fence: Option<FenceProbe>,
) -> Result<()> {
    let mut batch = Vec::new();
    while let Some(m) = bootstrap.try_recv(peer, TAG_REG)? {
        let in_rank = |e: Error| e.context(format!("rank {peer}"));
        if let Some((mark, seq)) = decode_mark(&m).map_err(in_rank)? {
            // Marks follow the records they cover: those are in `batch`, applied below.
            let m = &mut regs.marks[mark as usize];
            *m = (*m).max(seq);
            continue;
        }
        batch.push(decode(&m).map_err(in_rank)?);
    }
    for (i, (id, rec)) in batch.iter().enumerate() {
        let withdrawn = || batch[i + 1..].iter().any(|(w, r)| w == id && r.is_none());
        if rec.is_some() && withdrawn() {
            continue;
        }
        regs.apply(device, peer, *id, *rec, vmm)?;
    }
    if let Some(fence) = fence {
        regs.settle(fence);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
