//! One buffer of every rank, addressed here: how a symmetric window and the symmetric scratch
//! reach every rank of the node (`window.rs`). A collective call: each rank exports its buffer
//! for ranks in other processes (an IPC handle, or for memory of CUDA's virtual memory API its
//! descriptor on offer, as registration does: `transport/regmap.rs`), the exports go round in
//! one allgather, each rank maps those of ranks in other processes (ranks of its own process
//! need nothing: their addresses are ours), and a second allgather tells whether every rank
//! mapped every other, so that all agree on the answer.

use super::Comm;
use crate::cuda::{DevPtr, IpcMapping, RegExport, VmmMapping};
use crate::error::{Error, Result};
use crate::transport::regmap;

/// Every rank's buffer as this rank addresses it, with what keeps those addresses valid.
pub(crate) struct Shared {
    /// Per rank, its buffer's address here.
    pub ptrs: Vec<DevPtr>,
    /// This rank's export, kept while peers may map it.
    _export: Option<RegExport>,
    /// Our mappings of the buffers of ranks in other processes, undone on drop.
    _maps: Vec<PeerMap>,
}

/// A mapping held for its drop (which undoes it).
enum PeerMap {
    Ipc { _m: IpcMapping },
    Vmm { _m: VmmMapping },
}

/// How a rank's buffer can be mapped elsewhere (the allgather's record).
const VIA_NONE: u8 = 0;
const VIA_IPC: u8 = 1;
const VIA_VMM: u8 = 2;
/// via, pad, buffer, allocation base, handle.
const RECORD_BYTES: usize = 8 + 8 + 8 + 64;

impl Comm {
    /// Whether this rank reaches `peer`'s memory by load and store: its own process (p2p), or
    /// another process of the node through p2p (CUDA IPC).
    pub(crate) fn reaches_memory_of(&self, peer: usize) -> bool {
        peer == self.rank || self.links.same_space(peer) || self.links.maps_our_buffers(peer)
    }

    /// Every rank's `bytes` at its `buff` (this rank's here), mapped on every rank; None, on
    /// every rank alike, where some rank could not map some other (said at INFO). Called by
    /// every rank at once; every rank must reach every other's memory
    /// ([`Comm::reaches_memory_of`]).
    pub(crate) fn share(&self, buff: DevPtr, bytes: usize) -> Result<Option<Shared>> {
        let others = (0..self.nranks).any(|p| self.links.maps_our_buffers(p));
        let vmm = crate::env::RS_VMM_IPC.int() != 0;
        let export = match others {
            true => export(&self.device, buff, bytes, vmm),
            false => None,
        };
        let record = encode(buff, export.as_ref());
        let records = self.bootstrap.allgather(&record)?;
        let mut ptrs = vec![0; self.nranks];
        let mut maps = Vec::new();
        let mut mapped_all = true;
        for (p, rec) in records.iter().enumerate() {
            let (via, theirs, base, handle) = decode(p, rec)?;
            if p == self.rank || self.links.same_space(p) {
                ptrs[p] = theirs;
                continue;
            }
            match self.map_peer(via, base, &handle) {
                Ok((m, at)) => {
                    ptrs[p] = at + (theirs - base);
                    maps.push(m);
                }
                Err(e) => {
                    log::info!(
                        "rank {}: cannot map rank {p}'s symmetric memory: {e}",
                        self.rank
                    );
                    mapped_all = false;
                }
            }
        }
        let oks = self.bootstrap.allgather(&[mapped_all as u8])?;
        if let Some(r) = oks.iter().position(|o| o.first() != Some(&1)) {
            log::info!(
                "rank {}: rank {r} could not map every rank's symmetric memory",
                self.rank
            );
            return Ok(None);
        }
        Ok(Some(Shared {
            ptrs,
            _export: export,
            _maps: maps,
        }))
    }

    /// Maps a peer process's allocation at `base` from its record: (the mapping, its address
    /// here).
    fn map_peer(&self, via: u8, base: DevPtr, handle: &[u8; 64]) -> Result<(PeerMap, DevPtr)> {
        match via {
            VIA_IPC => {
                let m = self.device.open_ipc(handle)?;
                let at = m.ptr;
                Ok((PeerMap::Ipc { _m: m }, at))
            }
            VIA_VMM => {
                let m = regmap::map_vmm(&self.device, handle)?;
                let at = m.ptr;
                Ok((PeerMap::Vmm { _m: m }, at))
            }
            _ => Err(Error::invalid_usage(format!(
                "its buffer at {base:#x} has neither an IPC handle nor an exported descriptor"
            ))),
        }
    }
}

/// This rank's buffer exported for other processes, where it can be: one allocation holding
/// all `bytes` (a VMM buffer spanning several allocations is not exported).
fn export(
    device: &crate::cuda::Device,
    buff: DevPtr,
    bytes: usize,
    vmm: bool,
) -> Option<RegExport> {
    match device.reg_export(buff, vmm) {
        Ok(RegExport::Vmm(x)) if x.base + (x.bytes as u64) < buff + bytes as u64 => None,
        Ok(x) => Some(x),
        Err(e) => {
            log::info!("symmetric memory at {buff:#x} cannot be mapped by other processes: {e}");
            None
        }
    }
}

fn encode(buff: DevPtr, export: Option<&RegExport>) -> Vec<u8> {
    let (via, base, handle) = match export {
        Some(RegExport::Ipc { base, handle }) => (VIA_IPC, *base, *handle),
        Some(RegExport::Vmm(x)) => match x.ticket() {
            Some(t) => (VIA_VMM, x.base, regmap::vmm_handle(&t, x.bytes)),
            None => (VIA_NONE, buff, [0; 64]),
        },
        None => (VIA_NONE, buff, [0; 64]),
    };
    let mut v = Vec::with_capacity(RECORD_BYTES);
    v.extend_from_slice(&[via, 0, 0, 0, 0, 0, 0, 0]);
    v.extend_from_slice(&buff.to_le_bytes());
    v.extend_from_slice(&base.to_le_bytes());
    v.extend_from_slice(&handle);
    v
}

/// A rank's record: (via, its buffer, its allocation's base, the handle).
fn decode(rank: usize, b: &[u8]) -> Result<(u8, DevPtr, DevPtr, [u8; 64])> {
    if b.len() != RECORD_BYTES {
        return Err(Error::remote(format!(
            "rank {rank} sent a symmetric-memory record of {} bytes, not {RECORD_BYTES}",
            b.len()
        )));
    }
    let word = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
    let mut handle = [0u8; 64];
    handle.copy_from_slice(&b[24..88]);
    let (buff, base) = (word(8), word(16));
    if buff < base {
        return Err(Error::remote(format!(
            "rank {rank} sent a buffer {buff:#x} below its allocation's base {base:#x}"
        )));
    }
    Ok((b[0], buff, base, handle))
}
