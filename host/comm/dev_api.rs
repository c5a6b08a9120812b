//! The device API's host side (`nccl_device::api`): the [`DeviceComm`] a user's kernel takes
//! (its LSA team, the team's barrier areas, the abort flag) and the [`DeviceWindow`] of a
//! registered window (every LSA rank's part, as this GPU maps it).
//!
//! The LSA team is every rank where every rank maps every other's memory (one node, p2p: what
//! windows need to be mapped, `window.rs`); elsewhere it is the rank alone. Every rank decides
//! alike, from one allgather at [`Comm::dev_comm`]. Where the team is not every rank and the
//! network carries one-sided operations (a window was registered across nodes), kernels reach
//! the other ranks through GIN: a queue and its proxy thread (`gin.rs`).

use super::gin::GinProxy;
use super::onesided::Signals;
use super::share::Shared;
use super::window::WinHandle;
use super::Comm;
use crate::cuda::{DevBuffer, HostMem};
use crate::error::{Error, Result};
use nccl_device::api::{area_bytes, signals_offset, DevComm, Misuse, Window, FAULT_WORDS};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// A communicator as user kernels see it ([`Comm::dev_comm`]): its device structures live as
/// long as this value. Pass [`DeviceComm::get`] to kernels. Drop it before its communicator.
pub struct DeviceComm {
    /// First: its thread stops before the memory it reads goes.
    _gin: Option<Gin>,
    value: DevComm,
    /// This rank's barrier area, and the team's as mapped here.
    _barrier: DevBuffer,
    _peers: Option<Shared>,
    /// `[u64; lsa_size]` barrier bases, then `[u32; lsa_size]` communicator ranks.
    _tables: DevBuffer,
    /// Where a kernel that misused the device API says what it passed (host-mapped).
    fault: HostMem,
}

/// A device communicator's GIN: its proxy, and the network side it posts to.
struct Gin {
    proxy: Option<GinProxy>,
    signals: Arc<Signals>,
}

impl Drop for Gin {
    fn drop(&mut self) {
        drop(self.proxy.take());
        if let Some(remote) = self.signals.remote() {
            if let Err(e) = remote.set_gin_signals(None) {
                log::warn!("device communicator: {e}");
            }
        }
        self.signals.gin_active.store(false, Ordering::Release);
    }
}

impl DeviceComm {
    /// The value kernels take (`nccl_device::api::DevComm`).
    pub fn get(&self) -> DevComm {
        self.value
    }

    /// What a kernel using this device communicator did wrong, if one stopped on a GPU for
    /// passing an id, index or peer past what the communicator has (`nccl_device::api::Misuse`):
    /// the trap ends the context, whose streams then report only "an illegal instruction";
    /// this says which call and value. (On the simulator the stream's error says it.)
    pub fn fault(&self) -> Option<String> {
        let words: Vec<u64> = (0..FAULT_WORDS)
            .map(|w| self.fault.load_u64(8 * w).unwrap_or(0))
            .collect();
        let misuse = Misuse::from_code(words[0])?;
        let (what, limit_name) = misuse.what();
        Some(format!(
            "a kernel of rank {} stopped in CTA {}: {what}: {} (the device communicator's \
             {limit_name} is {})",
            self.value.rank, words[3], words[1], words[2]
        ))
    }
}

/// A registered window as user kernels see it ([`Comm::dev_window`]): valid while the window is
/// registered and this value lives.
pub struct DeviceWindow {
    value: Window,
    _bases: DevBuffer,
}

impl DeviceWindow {
    /// The value kernels take (`nccl_device::api::Window`).
    pub fn get(&self) -> Window {
        self.value
    }
}

/// What a device communicator provides beyond its barriers, signals and counters
/// (`ncclDevCommRequirements`); every rank asks the same.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DevCommRequirements {
    /// LL sessions (`nccl_device::api::LlA2a`): blocks (one per CTA index that uses them)...
    pub ll_blocks: u32,
    /// ...and the 8-byte lines a rank may send each peer per block and epoch.
    pub ll_slots: u32,
}

/// The most bytes of LL lines one rank's area may hold.
const MAX_LL_BYTES: u64 = 1 << 30;

impl Comm {
    /// Makes this communicator's device communicator (`ncclDevCommCreate`): collective, every
    /// rank calls it at once, with the same `req`. Its LSA team is every rank where every rank
    /// maps every other (ranks of one node through p2p), else this rank alone; kernels reach
    /// ranks outside it through GIN where a window was registered before (the network's side
    /// of one-sided operations then exists). One device communicator with GIN at a time.
    pub fn dev_comm(&self, req: DevCommRequirements) -> Result<DeviceComm> {
        self.check_usable()?;
        // User kernels wait at barriers that peers release (`Device::preload_kernels`).
        self.device.preload_kernels()?;
        let mut mine = vec![self.maps_every_rank() as u8];
        mine.extend(req.ll_blocks.to_le_bytes());
        mine.extend(req.ll_slots.to_le_bytes());
        let all = self.bootstrap.allgather(&mine)?;
        if all.iter().any(|v| v.get(1..) != mine.get(1..)) {
            return Err(Error::invalid_usage(
                "ncclDevCommCreate: the ranks asked for different requirements (every rank must \
                 pass the same)",
            ));
        }
        // Every rank asked the same, so every rank fails here alike.
        let ll_bytes = [
            req.ll_blocks as u64,
            req.ll_slots as u64,
            self.nranks as u64,
        ]
        .into_iter()
        .try_fold(32u64, |b, x| b.checked_mul(x));
        if ll_bytes.is_none_or(|b| b > MAX_LL_BYTES) {
            return Err(Error::invalid_argument(format!(
                "ncclDevCommCreate: LL sessions of {} blocks x {} slots on {} ranks need more \
                 than {MAX_LL_BYTES} bytes per rank",
                req.ll_blocks, req.ll_slots, self.nranks
            )));
        }
        let team = all.iter().all(|v| v.first() == Some(&1)) && self.nranks > 1;
        let lsa_size = if team { self.nranks } else { 1 };
        let sizes = DevComm {
            nranks: self.nranks as u32,
            lsa_size: lsa_size as u32,
            ll_blocks: req.ll_blocks,
            ll_slots: req.ll_slots,
            ..DevComm::default()
        };
        let bytes = area_bytes(&sizes);
        let barrier = self.device.alloc(bytes)?;
        barrier.write(0, &vec![0u8; bytes])?;
        let (bases, peers) = match team {
            true => {
                let shared = self.share(barrier.ptr, bytes)?.ok_or_else(|| {
                    Error::invalid_usage(
                        "ncclDevCommCreate: some rank could not map every other rank's barrier \
                         memory (see the INFO lines)",
                    )
                })?;
                (shared.ptrs.clone(), Some(shared))
            }
            false => (vec![barrier.ptr], None),
        };
        let ranks: Vec<u32> = match team {
            true => (0..self.nranks as u32).collect(),
            false => vec![self.rank as u32],
        };
        let mut table: Vec<u8> = bases.iter().flat_map(|b| b.to_le_bytes()).collect();
        table.extend(ranks.iter().flat_map(|r| r.to_le_bytes()));
        let tables = self.device.alloc(table.len())?;
        tables.write(0, &table)?;
        let fault = self.device.alloc_host_mem(8 * FAULT_WORDS)?;
        let gin = match team {
            false => self.start_gin(barrier.ptr + signals_offset(1) as u64)?,
            true => None,
        };
        // Every rank's area is zeroed (and its GIN ready) before any rank's kernel may use it.
        self.bootstrap.barrier()?;
        let value = DevComm {
            rank: self.rank as u32,
            lsa_rank: if team { self.rank as u32 } else { 0 },
            lsa_ranks: tables.ptr + 8 * lsa_size as u64,
            barriers: tables.ptr,
            abort: self.kernel_abort_ptr(),
            gin: gin
                .as_ref()
                .and_then(|g| g.proxy.as_ref())
                .map_or(0, |p| p.queue_ptr()),
            fault: fault.ptr,
            ..sizes
        };
        log::info!(
            "rank {}: device communicator, LSA team of {lsa_size}, {}",
            self.rank,
            match (&gin, team) {
                (Some(_), _) => "GIN to the other ranks",
                (None, true) => "no rank outside it",
                (None, false) => "no GIN (register a window across nodes first)",
            }
        );
        Ok(DeviceComm {
            _gin: gin,
            value,
            _barrier: barrier,
            _peers: peers,
            _tables: tables,
            fault,
        })
    }

    /// GIN for a device communicator whose signal words are at `signal_words`, where the
    /// network's side of one-sided operations exists (else None).
    fn start_gin(&self, signal_words: u64) -> Result<Option<Gin>> {
        let (Some(signals), Some(net)) = (self.windows.signals(), self.net.as_ref()) else {
            return Ok(None);
        };
        let Some(remote) = signals.remote().filter(|_| self.nranks > 1) else {
            return Ok(None);
        };
        if signals.gin_active.swap(true, Ordering::AcqRel) {
            return Err(Error::invalid_usage(
                "ncclDevCommCreate: this communicator already has a device communicator with \
                 GIN; drop it first",
            ));
        }
        // From here on, dropping `gin` undoes what was done.
        let mut gin = Gin {
            proxy: None,
            signals: signals.clone(),
        };
        // Refused from here on, host puts must also be done: their staging and GIN's would
        // interleave.
        if !remote.idle() {
            return Err(Error::invalid_usage(
                "ncclDevCommCreate: one-sided operations across nodes are still in flight \
                 (ncclPutSignal, copy-engine collectives): synchronize their streams first",
            ));
        }
        remote.set_gin_signals(Some(signal_words))?;
        gin.proxy = Some(GinProxy::start(
            &self.device,
            (self.rank, self.nranks),
            signals.clone(),
            self.kernel_abort.clone(),
            net.proxy.on_error(),
        )?);
        Ok(Some(gin))
    }

    /// Window `win` as kernels using `dc` address it: every LSA rank's part. Not collective.
    pub fn dev_window(&self, dc: &DeviceComm, win: WinHandle) -> Result<DeviceWindow> {
        let (all, bytes, multimem) = self.window_bases(win)?;
        let bases = match (dc.value.lsa_size, all.len()) {
            (1, _) => vec![all[if all.len() == 1 { 0 } else { self.rank }]],
            (n, m) if n as usize == m => all,
            (n, _) => {
                return Err(Error::invalid_usage(format!(
                    "window {win:#x} is not mapped by every rank of the LSA team ({n} ranks)"
                )))
            }
        };
        let table: Vec<u8> = bases.iter().flat_map(|b| b.to_le_bytes()).collect();
        let buf = self.device.alloc(table.len())?;
        buf.write(0, &table)?;
        Ok(DeviceWindow {
            value: Window {
                bases: buf.ptr,
                bytes,
                handle: win,
                // The multicast object spans the team, which is every rank where it exists.
                multimem: if dc.value.lsa_size as usize == self.nranks {
                    multimem
                } else {
                    0
                },
            },
            _bases: buf,
        })
    }
}
