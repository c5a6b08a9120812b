//! Connection memory a communicator can give back while it is idle and take again
//! (`ncclCommSuspend` / `ncclCommResume`, NCCL 2.29), at the same addresses: kernels, CUDA
//! graphs captured before and the connection structures keep the pointers they hold.
//!
//! The p2p transport's blocks of at least [`MIN_BYTES`] come from CUDA's virtual memory API
//! (the smaller ones, a few control lines, stay plain and are not worth a granule). Each rank's
//! [`Suspendable`] lists the blocks it owns ([`OwnBlock`]) and the blocks of ranks in other
//! processes it maps ([`PeerBlock`]; a peer of this process reaches ours at our own address,
//! so it lists nothing); each is listed while it lives. Suspending copies each owned block to
//! host memory and releases its physical memory, and unmaps every listed peer block, all
//! ranges staying reserved; resuming creates new memory at each owned block's address,
//! restores its bytes, exports it anew, and maps each peer block's new export where the old
//! one was. The communicator runs the exchange between ranks (`comm/suspend.rs`).
//!
//! Where CUDA's virtual memory API is missing, or its memory cannot be exported as a POSIX
//! descriptor (some containers), a block stays plain, as with `NCCL_CUMEM_ENABLE=0` (or
//! `NCCL_RS_VMM_IPC=0`, which leaves no way to hand VMM memory to another process): it is
//! not listed, and persists through a suspend.

use super::p2p::PeerAddr;
use crate::cuda::fdpass::{self, Ticket, TICKET_BYTES};
use crate::cuda::{DevBuffer, DevPtr, Device, VmmExport, VmmMapping};
use crate::error::{Error, Result};
use std::os::fd::AsFd;
use std::sync::{Arc, Mutex, MutexGuard};

/// Blocks smaller than this stay plain device memory (persistent).
pub const MIN_BYTES: usize = 1 << 20;

/// A block of ours in the virtual memory API, as listed.
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

/// A block of a rank in another process mapped here, as listed.
struct Mapped {
    owner: usize,
    /// The block's address in its owner's process: how its new export is found on resume.
    owner_ptr: DevPtr,
    ptr: DevPtr,
    bytes: usize,
}

/// Where a communicator's connection memory stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) enum Phase {
    #[default]
    Active,
    Suspended,
    /// A suspend or resume failed part-way on some rank: some memory may be unmapped, so
    /// the communicator is good only for destroy or abort.
    Broken,
}

#[derive(Default)]
struct State {
    owned: Vec<Owned>,
    mapped: Vec<Mapped>,
    phase: Phase,
}

/// One communicator rank's suspendable connection memory.
pub(crate) struct Suspendable {
    enabled: bool,
    state: Mutex<State>,
}

/// A connection block of ours: listed (where it is suspendable) while it lives.
pub(crate) struct OwnBlock {
    pub(crate) buf: DevBuffer,
    listed_in: Option<Arc<Suspendable>>,
}

impl OwnBlock {
    /// Whether it is suspendable (listed).
    pub(crate) fn is_listed(&self) -> bool {
        self.listed_in.is_some()
    }

    /// Its export where peer processes map it: (its ticket, the bytes a peer maps).
    pub(crate) fn ticket(&self) -> Option<(Ticket, usize)> {
        self.listed_in.as_ref()?.ticket(self.buf.ptr)
    }
}

impl Drop for OwnBlock {
    fn drop(&mut self) {
        if let Some(s) = &self.listed_in {
            // Its export goes with the entry (a retained handle, a descriptor on offer), before
            // the memory itself.
            s.lock().owned.retain(|o| o.ptr != self.buf.ptr);
        }
    }
}

/// A peer process's block mapped here, listed while it lives.
pub(crate) struct PeerBlock {
    pub(crate) mapping: VmmMapping,
    listed_in: Arc<Suspendable>,
}

impl Drop for PeerBlock {
    fn drop(&mut self) {
        let p = self.mapping.ptr;
        self.listed_in.lock().mapped.retain(|m| m.ptr != p);
    }
}

/// What a resumed block's owner tells its peers: (its address, its new export's ticket, the
/// bytes mapped).
pub(crate) type Reissue = (DevPtr, Ticket, usize);

impl Suspendable {
    pub(crate) fn new() -> Suspendable {
        Suspendable {
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
    pub(crate) fn bytes(&self) -> usize {
        self.lock().owned.iter().map(|o| o.bytes).sum()
    }

    pub(crate) fn phase(&self) -> Phase {
        self.lock().phase
    }

    /// Marks the memory as given up on (see [`Phase::Broken`]).
    pub(crate) fn break_down(&self) {
        self.lock().phase = Phase::Broken;
    }

    /// A zeroed block of `bytes` for connections; `exported`: a peer in another process will
    /// map it. Suspendable where enabled, large enough and exportable; plain otherwise.
    pub(crate) fn alloc(
        self: &Arc<Self>,
        device: &Device,
        bytes: usize,
        exported: bool,
    ) -> Result<OwnBlock> {
        let plain = |device: &Device| -> Result<OwnBlock> {
            Ok(OwnBlock {
                buf: device.alloc(bytes)?,
                listed_in: None,
            })
        };
        if !self.enabled || bytes < MIN_BYTES {
            return plain(device);
        }
        let made = device.alloc_vmm_unicast(bytes).and_then(|buf| {
            let export = match exported {
                true => Some(device.vmm_export_at(buf.ptr)?.ok_or_else(|| {
                    Error::internal(
                        "a connection block of the virtual memory API has no descriptor",
                    )
                })?),
                false => None,
            };
            Ok((buf, export))
        });
        let (buf, export) = match made {
            Ok(m) => m,
            Err(e) => {
                log::info!(
                    target: crate::debug::INIT,
                    "connection block of {bytes} bytes: plain memory, not suspendable (the \
                     virtual memory API: {e})"
                );
                return plain(device);
            }
        };
        self.lock().owned.push(Owned {
            ptr: buf.ptr,
            bytes,
            export,
            exported,
            backup: None,
        });
        Ok(OwnBlock {
            buf,
            listed_in: Some(self.clone()),
        })
    }

    /// The export of our block at `ptr` where it has one: (its ticket, the bytes a peer maps).
    fn ticket(&self, ptr: DevPtr) -> Option<(Ticket, usize)> {
        let st = self.lock();
        let e = st.owned.iter().find(|o| o.ptr == ptr)?.export.as_ref()?;
        Some((e.ticket()?, e.bytes))
    }

    /// Maps `owner`'s block (at `owner_ptr` there) from its export's `ticket`, `bytes` of it,
    /// and lists it while the mapping lives.
    pub(crate) fn map_peer(
        self: &Arc<Self>,
        device: &Device,
        owner: usize,
        owner_ptr: DevPtr,
        ticket: &Ticket,
        bytes: usize,
    ) -> Result<PeerBlock> {
        let fd = fdpass::take(ticket)?;
        let mapping = device.vmm_import(fd.as_fd(), bytes)?;
        self.lock().mapped.push(Mapped {
            owner,
            owner_ptr,
            ptr: mapping.ptr,
            bytes,
        });
        Ok(PeerBlock {
            mapping,
            listed_in: self.clone(),
        })
    }

    /// Gives back the memory: unmaps every peer block, then saves and releases each owned
    /// one. The communicator's work must have ended on every rank. A failure leaves the
    /// memory [`Phase::Broken`].
    pub(crate) fn suspend(&self, device: &Device) -> Result<()> {
        let mut st = self.lock();
        if st.phase != Phase::Active {
            return Err(Error::internal(format!("suspend from {:?}", st.phase)));
        }
        st.phase = Phase::Broken;
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
        st.phase = Phase::Suspended;
        Ok(())
    }

    /// Takes memory again for each owned block, restores its bytes and exports it anew: what
    /// the peers that map them need ([`Suspendable::remap_peers`]). A failure leaves the
    /// memory [`Phase::Broken`].
    pub(crate) fn restore_own(&self, device: &Device) -> Result<Vec<Reissue>> {
        let mut st = self.lock();
        if st.phase != Phase::Suspended {
            return Err(Error::internal(format!("resume from {:?}", st.phase)));
        }
        st.phase = Phase::Broken;
        let mut reissued = Vec::new();
        for o in st.owned.iter_mut() {
            let saved = o.backup.take().ok_or_else(|| {
                Error::internal("a suspended connection block without its saved bytes")
            })?;
            device.vmm_restore(o.ptr)?;
            device.copy_htod(o.ptr, &saved)?;
            if o.exported {
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
    /// what rank r reissued); then the memory is [`Phase::Active`] again.
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
        st.phase = Phase::Active;
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
