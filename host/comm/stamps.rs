//! The kernel-stamps lab (`NCCL_RS_KERNEL_STAMPS=PREFIX`): every collective launch of a
//! communicator stamps its CTA 0's entry and exit in the GPU's nanosecond timer
//! ([`LabStamp`], written by the kernel into pinned host memory), and when the communicator
//! goes the stamps are written to `PREFIX.<pid>-<k>.<rank>` (`k`: the process's communicators
//! numbered in creation order, so a split's child does not overwrite its parent's file), one
//! line per launch:
//! `launch entry_ns exit_ns`. Beside `NCCL_RS_PROXY_TIMELINE` it tells a kernel's own time from
//! the gaps between kernels (`tools/proxy-timeline.py --kernels PREFIX`). Off by default: then
//! no memory is taken and no launch carries the flag. The ring keeps the last [`LAB_STAMPS`]
//! launches.

use crate::cuda::{DevPtr, Device, HostMem};
use crate::error::Result;
use nccl_device::abi::{LabStamp, LAB_STAMPS};
use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};

pub(crate) struct KernelStamps {
    mem: HostMem,
    path: String,
}

impl KernelStamps {
    /// The stamps' memory for rank `rank` on `device`, where the lab is on.
    pub(crate) fn from_env(device: &Device, rank: usize) -> Result<Option<KernelStamps>> {
        let Some(prefix) = crate::env::RS_KERNEL_STAMPS.raw().filter(|p| !p.is_empty()) else {
            return Ok(None);
        };
        let mem = device.alloc_host_mem(LAB_STAMPS as usize * std::mem::size_of::<LabStamp>())?;
        static COMMS: AtomicUsize = AtomicUsize::new(0);
        let k = COMMS.fetch_add(1, Ordering::Relaxed);
        let path = format!("{prefix}.{}-{k}.{rank}", std::process::id());
        Ok(Some(KernelStamps { mem, path }))
    }

    /// Where the kernels write ([`nccl_device::abi::DevComm::lab_stamps`]).
    pub(crate) fn device_ptr(&self) -> DevPtr {
        self.mem.ptr
    }

    /// The stamped launches, oldest first: (launch, entry, exit).
    fn read(&self) -> Vec<(u64, u64, u64)> {
        let size = std::mem::size_of::<LabStamp>();
        let mut rows: Vec<_> = (0..LAB_STAMPS as usize)
            .filter_map(|i| {
                let word = |k: usize| self.mem.load_u64(i * size + 8 * k);
                let index = word(0).filter(|&x| x != 0)?;
                Some((index - 1, word(1)?, word(2)?))
            })
            .collect();
        rows.sort_unstable();
        rows
    }
}

impl Drop for KernelStamps {
    /// The communicator's kernels are done by now (its drop waits for them first).
    fn drop(&mut self) {
        let rows = self.read();
        let written = crate::debug::open_private(&self.path, false).and_then(|f| {
            let mut w = std::io::BufWriter::new(f);
            for (n, entry, exit) in &rows {
                writeln!(w, "{n} {entry} {exit}")?;
            }
            w.flush()
        });
        if let Err(e) = written {
            log::warn!("NCCL_RS_KERNEL_STAMPS: writing {}: {e}", self.path);
        }
    }
}
