//! Connection memory a communicator can give back while it is idle and take again
//! (`ncclCommSuspend` / `ncclCommResume`, NCCL 2.29), at the same addresses: kernels, CUDA
//! graphs captured before and the connection structures keep the pointers they hold.
//!
//! The p2p transport's blocks of at least [`MIN_BYTES`] come from CUDA's virtual memory API
//! (the smaller ones, a few control lines, stay plain and are not worth a granule). Each rank's
//! [`Ledger`] lists the blocks it owns and the blocks of ranks in other processes it maps (a
//! peer of this process reaches ours at our own address, so it lists nothing). Suspending
//! copies each owned block to host memory and releases its physical memory, and unmaps every
//! listed peer block, all ranges staying reserved; resuming creates new memory at each owned
//! block's address, restores its bytes, exports it anew, and maps each peer block's new export
//! where the old one was. The communicator runs the exchange between ranks (`comm/suspend.rs`).
//!
//! `NCCL_CUMEM_ENABLE=0` (or `NCCL_RS_VMM_IPC=0`, which leaves no way to hand VMM memory to
//! another process) keeps every block plain: nothing can be suspended then.

use super::p2p::PeerAddr;
use crate::cuda::fdpass::{self, Ticket, TICKET_BYTES};
use crate::cuda::{DevBuffer, DevPtr, Device, VmmExport, VmmMapping};
use crate::error::{Error, Result};
use std::os::fd::AsFd;
use std::sync::{Mutex, MutexGuard};

/// Blocks smaller than this stay plain device memory (persistent).
pub const MIN_BYTES: usize = 1 << 20;

/// A block of ours in the virtual memory API.
struct Owned {
    ptr: DevPtr,
    /// What the connections use of it (the mapping may be larger).
    bytes: usize,
    /// Its descriptor on offer to peer processes (where one maps it); dropped while suspended.
    export: Option<VmmExport>,
    /// Whether a peer in another process maps it: it is exported again on resume.
    exported: bool,
    /// Its bytes while suspended.
    backup: Option<Vec<u8>>,
}

/// A block of a rank in another process, mapped here.
struct Mapped {
    owner: usize,
    /// The block's address in its owner's process: how its new export is found on resume.
    owner_ptr: DevPtr,
    ptr: DevPtr,
    bytes: usize,
}

#[derive(Default)]
struct State {
    owned: Vec<Owned>,
    mapped: Vec<Mapped>,
    suspended: bool,
}

/// One communicator rank's suspendable connection memory.
pub(crate) struct Ledger {
    enabled: bool,
    state: Mutex<State>,
}

/// What a resumed block's owner tells its peers: (its address, its new export's ticket, the
/// bytes mapped).
pub(crate) type Reissue = (DevPtr, Ticket, usize);

impl Ledger {
    pub(crate) fn new() -> Ledger {
        Ledger {
            enabled: crate::env::CUMEM_ENABLE.int() != 0 && crate::env::RS_VMM_IPC.int() != 0,
            state: Mutex::new(State::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether this rank's blocks can be suspended at all (`NCCL_CUMEM_ENABLE`).
    pub(crate) fn enabled(&self) -> bool {
        self.enabled
    }

    /// Bytes of owned blocks a suspend releases (`ncclCommMemStats`' `ncclStatGpuMemSuspend`).
    pub(crate) fn suspendable_bytes(&self) -> usize {
        self.lock().owned.iter().map(|o| o.bytes).sum()
    }

    pub(crate) fn is_suspended(&self) -> bool {
        self.lock().suspended
    }

    /// A zeroed block of `bytes` for connections; `exported`: a peer in another process will
    /// map it. Suspendable where enabled and large enough.
    pub(crate) fn alloc(&self, device: &Device, bytes: usize, exported: bool) -> Result<DevBuffer> {
        if !self.enabled || bytes < MIN_BYTES {
            return device.alloc(bytes);
        }
        let buf = device.alloc_vmm(bytes)?;
        let export = if exported {
            Some(device.vmm_export_at(buf.ptr)?.ok_or_else(|| {
                Error::internal("a connection block of the virtual memory API has no descriptor")
            })?)
        } else {
            None
        };
        self.lock().owned.push(Owned {
            ptr: buf.ptr,
            bytes,
            export,
            exported,
            backup: None,
        });
        Ok(buf)
    }

    /// Whether the block at `ptr` is one of ours in the virtual memory API.
    pub(crate) fn owns(&self, ptr: DevPtr) -> bool {
        self.lock().owned.iter().any(|o| o.ptr == ptr)
    }

    /// The export of our block at `ptr` where it has one: (its ticket, the bytes a peer maps).
    pub(crate) fn ticket(&self, ptr: DevPtr) -> Option<(Ticket, usize)> {
        let st = self.lock();
        let e = st.owned.iter().find(|o| o.ptr == ptr)?.export.as_ref()?;
        Some((e.ticket()?, e.bytes))
    }

    /// Maps `owner`'s block (at `owner_ptr` there) from its export's `ticket`, `bytes` of it,
    /// and lists it.
    pub(crate) fn map_peer(
        &self,
        device: &Device,
        owner: usize,
        owner_ptr: DevPtr,
        ticket: &Ticket,
        bytes: usize,
    ) -> Result<VmmMapping> {
        let fd = fdpass::take(ticket)?;
        let m = device.vmm_import(fd.as_fd(), bytes)?;
        self.lock().mapped.push(Mapped {
            owner,
            owner_ptr,
            ptr: m.ptr,
            bytes,
        });
        Ok(m)
    }

    /// Gives back the memory: unmaps every peer block, then saves and releases each owned
    /// one. The communicator's work must have ended on every rank.
    pub(crate) fn suspend(&self, device: &Device) -> Result<()> {
        let mut st = self.lock();
        if st.suspended {
            return Err(Error::invalid_usage(
                "the communicator is suspended already",
            ));
        }
        for m in &st.mapped {
            device.vmm_detach(m.ptr, m.bytes)?;
        }
        for o in st.owned.iter_mut() {
            let mut saved = vec![0u8; o.bytes];
            device.copy_dtoh(&mut saved, o.ptr)?;
            o.backup = Some(saved);
            // The export holds the allocation (its retained handle, its descriptor).
            o.export = None;
            device.vmm_evict(o.ptr)?;
        }
        st.suspended = true;
        Ok(())
    }

    /// Takes memory again for each owned block, restores its bytes and exports it anew: what
    /// the peers that map them need ([`Ledger::remap_peers`]).
    pub(crate) fn restore_own(&self, device: &Device) -> Result<Vec<Reissue>> {
        let mut st = self.lock();
        if !st.suspended {
            return Err(Error::invalid_usage(
                "the communicator is not suspended (ncclCommSuspend first)",
            ));
        }
        let mut reissued = Vec::new();
        for o in st.owned.iter_mut() {
            if let Some(saved) = o.backup.as_ref() {
                device.vmm_restore(o.ptr)?;
                device.copy_htod(o.ptr, saved)?;
                o.backup = None;
            }
            if o.exported && o.export.is_none() {
                let e = device.vmm_export_at(o.ptr)?.ok_or_else(|| {
                    Error::internal("a resumed connection block has no descriptor")
                })?;
                let ticket = e.ticket().ok_or_else(|| {
                    Error::internal("a resumed connection block's descriptor is not on offer")
                })?;
                reissued.push((o.ptr, ticket, e.bytes));
                o.export = Some(e);
            }
        }
        Ok(reissued)
    }

    /// Maps each listed peer block where it was, from its owner's new export (`by_rank[r]`:
    /// what rank r reissued); then the communicator is whole again.
    pub(crate) fn remap_peers(&self, device: &Device, by_rank: &[Vec<Reissue>]) -> Result<()> {
        let mut st = self.lock();
        for m in &st.mapped {
            let (_, ticket, bytes) = by_rank
                .get(m.owner)
                .and_then(|v| v.iter().find(|(p, _, _)| *p == m.owner_ptr))
                .ok_or_else(|| {
                    Error::remote(format!(
                        "rank {} did not reissue its connection block at {:#x}",
                        m.owner, m.owner_ptr
                    ))
                })?;
            if *bytes < m.bytes {
                return Err(Error::remote(format!(
                    "rank {}'s resumed block holds {bytes} bytes, {} were mapped",
                    m.owner, m.bytes
                )));
            }
            let fd = fdpass::take(ticket)?;
            device.vmm_reattach(fd.as_fd(), m.ptr, m.bytes)?;
        }
        st.suspended = false;
        Ok(())
    }
}

/// A reissue list on the wire: per block its address, ticket and size.
pub(crate) fn encode(list: &[Reissue]) -> Vec<u8> {
    let mut out = Vec::with_capacity(list.len() * (16 + TICKET_BYTES));
    for (ptr, t, bytes) in list {
        out.extend_from_slice(&ptr.to_le_bytes());
        out.extend_from_slice(&t.encode());
        out.extend_from_slice(&(*bytes as u64).to_le_bytes());
    }
    out
}

/// The list [`encode`] wrote, or a remote error for bytes of another shape.
pub(crate) fn decode(b: &[u8]) -> Result<Vec<Reissue>> {
    let rec = 16 + TICKET_BYTES;
    if !b.len().is_multiple_of(rec) {
        return Err(Error::remote(format!(
            "a resume record of {} bytes (not a multiple of {rec})",
            b.len()
        )));
    }
    Ok(b.chunks(rec)
        .map(|c| {
            let word = |at: usize| u64::from_le_bytes(c[at..at + 8].try_into().unwrap_or([0; 8]));
            let mut t = [0u8; TICKET_BYTES];
            t.copy_from_slice(&c[8..8 + TICKET_BYTES]);
            (word(0), Ticket::decode(&t), word(8 + TICKET_BYTES) as usize)
        })
        .collect())
}

/// Whether a block published to `peers` is mapped by one in another process.
pub(crate) fn any_other_process<'a>(peers: impl IntoIterator<Item = &'a PeerAddr>) -> bool {
    peers.into_iter().any(|p| !p.same_process)
}
