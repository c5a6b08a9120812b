//! The device API's host side (`nccl_device::api`): the [`DeviceComm`] a user's kernel takes
//! (its LSA team, the team's barrier areas, the abort flag) and the [`DeviceWindow`] of a
//! registered window (every LSA rank's part, as this GPU maps it).
//!
//! The LSA team is every rank where every rank maps every other's memory (one node, p2p: what
//! windows need to be mapped, `window.rs`); elsewhere it is the rank alone. Every rank decides
//! alike, from one allgather at [`Comm::dev_comm`].

use super::share::Shared;
use super::window::WinHandle;
use super::Comm;
use crate::cuda::DevBuffer;
use crate::error::{Error, Result};
use nccl_device::api::{barrier_bytes, DevComm, Window};

/// A communicator as user kernels see it ([`Comm::dev_comm`]): its device structures live as
/// long as this value. Pass [`DeviceComm::get`] to kernels.
pub struct DeviceComm {
    value: DevComm,
    /// This rank's barrier area, and the team's as mapped here.
    _barrier: DevBuffer,
    _peers: Option<Shared>,
    /// `[u64; lsa_size]` barrier bases, then `[u32; lsa_size]` communicator ranks.
    _tables: DevBuffer,
}

impl DeviceComm {
    /// The value kernels take (`nccl_device::api::DevComm`).
    pub fn get(&self) -> DevComm {
        self.value
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

impl Comm {
    /// Makes this communicator's device communicator (`ncclDevCommCreate`): collective, every
    /// rank calls it at once. Its LSA team is every rank where every rank maps every other
    /// (ranks of one node through p2p), else this rank alone.
    pub fn dev_comm(&self) -> Result<DeviceComm> {
        self.check_usable()?;
        // User kernels wait at barriers that peers release (`Device::preload_kernels`).
        self.device.preload_kernels()?;
        let all = self.bootstrap.allgather(&[self.maps_every_rank() as u8])?;
        let team = all.iter().all(|v| v.first() == Some(&1)) && self.nranks > 1;
        let lsa_size = if team { self.nranks } else { 1 };
        let bytes = barrier_bytes(lsa_size as u32);
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
        // Every rank's barrier area is zeroed before any rank's kernel may arrive in it.
        self.bootstrap.barrier()?;
        let value = DevComm {
            rank: self.rank as u32,
            nranks: self.nranks as u32,
            lsa_rank: if team { self.rank as u32 } else { 0 },
            lsa_size: lsa_size as u32,
            lsa_ranks: tables.ptr + 8 * lsa_size as u64,
            barriers: tables.ptr,
            abort: self.kernel_abort_ptr(),
        };
        log::info!(
            "rank {}: device communicator, LSA team of {lsa_size}",
            self.rank
        );
        Ok(DeviceComm {
            value,
            _barrier: barrier,
            _peers: peers,
            _tables: tables,
        })
    }

    /// Window `win` as kernels using `dc` address it: every LSA rank's part. Not collective.
    pub fn dev_window(&self, dc: &DeviceComm, win: WinHandle) -> Result<DeviceWindow> {
        let (all, bytes) = self.window_bases(win)?;
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
            },
            _bases: buf,
        })
    }
}
