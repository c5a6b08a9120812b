//! A network connection's memory ([`ConnMem`]), made before its endpoint is up.

use super::layout::{counter, ConnLayout};
use super::{FifoPlace, SIZE_EMPTY};
use crate::cuda::{DevBuffer, DevPtr, Device, HostMem};
use crate::error::Result;
use crate::proxy::ops::OpTrack;
use nccl_device::abi::NCCL_STEPS;
use std::os::fd::OwnedFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Host pages: a GPU FIFO is sized and aligned to them, as a dmabuf range must be.
const PAGE: usize = 4096;

/// A connection's memory, made before its network endpoint is up: counters and slot sizes in
/// pinned host memory mapped into the GPU, the FIFO there too or in GPU memory
/// ([`FifoPlace::Gpu`]). Its addresses go into the kernel's structures at once; the FIFO is
/// registered with the network once the endpoint exists ([`NetConn::attach`]).
pub(crate) struct ConnMem {
    /// Made with the memory, so that the host finds the queue as soon as the kernel's
    /// structure exists (dropped before the memory whose address names it).
    pub(super) track: Option<OpTrack>,
    pub(super) mem: Arc<HostMem>,
    /// The FIFO in GPU memory, whether its received steps are flushed, and its dmabuf (where
    /// the network registers through one), open until the registration.
    pub(super) gpu: Option<(DevBuffer, bool, Option<OwnedFd>)>,
    pub(super) layout: ConnLayout,
}

impl ConnMem {
    /// The memory of a connection moving data `sending` (or receiving), laid out as `layout`,
    /// its FIFO where `place` says (GPU memory falls back to host memory, with a warning, where
    /// it cannot be allocated).
    pub(crate) fn new(
        device: &Device,
        layout: ConnLayout,
        place: FifoPlace,
        sending: bool,
        peer: &str,
    ) -> Result<ConnMem> {
        let gpu = match place {
            FifoPlace::Host => None,
            FifoPlace::Gpu { dmabuf, flush } => {
                match Self::gpu_fifo(device, layout.fifo_bytes(), dmabuf) {
                    Ok((buf, fd)) => Some((buf, flush, fd)),
                    Err(e) => {
                        log::warn!(
                            "network connection with {peer}: GPU memory for its FIFO failed \
                             ({e}); using host memory"
                        );
                        None
                    }
                }
            }
        };
        let bytes = match gpu {
            Some(_) => ConnLayout::FIFO,
            None => layout.total(),
        };
        let mem = Arc::new(device.alloc_host_mem(bytes)?);
        if sending {
            for k in 0..NCCL_STEPS as usize {
                counter(&mem, ConnLayout::SIZES + 8 * k)?.store(SIZE_EMPTY, Ordering::Relaxed);
            }
        }
        let track = OpTrack::new(mem.ptr + ConnLayout::TAIL as u64, sending);
        Ok(ConnMem {
            mem,
            gpu,
            layout,
            track,
        })
    }

    /// A FIFO of `len` bytes in `device`'s memory, with its dmabuf where `dmabuf` and the
    /// device gives one.
    fn gpu_fifo(device: &Device, len: usize, dmabuf: bool) -> Result<(DevBuffer, Option<OwnedFd>)> {
        let buf = device.alloc(len.next_multiple_of(PAGE))?;
        let fd = if dmabuf && (buf.ptr() as usize).is_multiple_of(PAGE) {
            device.dmabuf_fd(buf.ptr(), buf.bytes())?
        } else {
            None
        };
        Ok((buf, fd))
    }

    /// The device address of the counter at `offset` ([`ConnLayout`]'s TAIL, HEAD, SIZES).
    pub(crate) fn ctrl_addr(&self, offset: usize) -> DevPtr {
        self.mem.ptr + offset as u64
    }

    /// The device address of the FIFO's first slot.
    pub(crate) fn fifo_addr(&self) -> DevPtr {
        match &self.gpu {
            Some((b, _, _)) => b.ptr(),
            None => self.mem.ptr + ConnLayout::FIFO as u64,
        }
    }

    /// Whether the FIFO is in GPU memory (GPU Direct RDMA).
    pub(crate) fn on_gpu(&self) -> bool {
        self.gpu.is_some()
    }

    /// Publishes step `step` of a send side as a Simple one of `bytes`, as its kernel would.
    #[cfg(test)]
    pub(crate) fn publish_simple(&self, step: u64, bytes: u64) {
        let size = ConnLayout::SIZES + 8 * (step % NCCL_STEPS as u64) as usize;
        counter(&self.mem, size)
            .unwrap()
            .store(bytes, Ordering::Release);
        counter(&self.mem, ConnLayout::TAIL)
            .unwrap()
            .store(step + 1, Ordering::Release);
    }
}
