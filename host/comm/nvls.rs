//! NVLS setup: one multicast object per communicator, its scratch bound on every rank's GPU,
//! and the channel regions the NVLS kernels use (`nccl_device::coll::nvls`).
//!
//! Set up only when NCCL_NVLS_ENABLE is exactly "1" on every rank, every rank's GPU reports
//! multicast support (asked only after the variable said 1), the communicator has more than
//! one rank, all on one node and on distinct GPUs (on the simulator: in one process), and every
//! pair connects through P2P. Every
//! rank says whether it may, and NVLS exists only where all may, so a rank with the variable
//! unset never creates, imports or binds a multicast object, and never lets the others wait.

use super::peer::PeerInfo;
use crate::bootstrap::Bootstrap;
use crate::cuda::{DevBuffer, Device, Multicast};
use crate::error::{Error, Result};
use nccl_device::abi::{NvlsChannel, NVLS_CTRL_BYTES};

/// A communicator's NVLS resources.
pub(crate) struct Nvls {
    /// `nchannels` NvlsChannel in device memory.
    pub chans: DevBuffer,
    pub nchannels: usize,
    /// Dropped after `chans`' users are gone (fields drop in order).
    _mc: Multicast,
}

impl std::fmt::Debug for Nvls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Nvls({} channels)", self.nchannels)
    }
}

/// Whether this rank may take part (see the module's comment); the device is asked about
/// multicast only once the variable said 1.
fn may(rank: usize, device: &Device, peers: &[PeerInfo], all_p2p: bool) -> Result<bool> {
    if !crate::cuda::multicast::allowed_by_env() || peers.len() < 2 || !all_p2p {
        return Ok(false);
    }
    let me = &peers[rank];
    let one_node = peers.iter().all(|p| p.host_hash == me.host_hash);
    let distinct = peers.iter().enumerate().all(|(i, p)| {
        peers[..i]
            .iter()
            .all(|q| q.bus_id != p.bus_id || q.sim != p.sim || q.device != p.device)
    });
    if !one_node || !distinct {
        log::info!("NVLS off: the ranks are not on distinct GPUs of one node");
        return Ok(false);
    }
    if device.is_sim() && peers.iter().any(|p| p.pid != me.pid) {
        log::info!("NVLS off: the simulator's multicast objects live in one process");
        return Ok(false);
    }
    let ok = device.multicast_supported()?;
    if !ok {
        log::info!("NVLS off: device {} has no multicast support", device.ordinal);
    }
    Ok(ok)
}

/// Sets NVLS up where every rank may (None elsewhere), for up to `max_channels` channels.
/// Every rank of the communicator calls it at init.
pub(crate) fn setup(
    rank: usize,
    device: &Device,
    bootstrap: &Bootstrap,
    peers: &[PeerInfo],
    all_p2p: bool,
    max_channels: usize,
) -> Result<Option<Nvls>> {
    let mine = may(rank, device, peers, all_p2p)?;
    let all = bootstrap.allgather(&[mine as u8])?;
    if !all.iter().all(|v| v.first() == Some(&1)) {
        return Ok(None);
    }
    let nranks = peers.len();
    let nchannels = (crate::env::int("NCCL_NVLS_NCHANNELS").max(1) as usize)
        .min(max_channels.max(1));
    // Each half holds at least one 16-byte pack per rank.
    let half = (crate::env::int("NCCL_NVLS_CHUNKSIZE").max(0) as usize)
        .max(16 * nranks)
        .next_multiple_of(16);
    let region = NVLS_CTRL_BYTES as usize + 2 * half;
    let gran = device.multicast_granularity(nranks, nchannels * region)?;
    let bytes = (nchannels * region).next_multiple_of(gran);
    // Rank 0 creates the object; the others import it from rank 0's handle.
    let (mut mc, handle) = match rank {
        0 => {
            let (mc, h) = device.multicast_create(nranks, bytes)?;
            (Some(mc), h)
        }
        _ => (None, [0u8; 64]),
    };
    let handles = bootstrap.allgather(&handle)?;
    let root: [u8; 64] = handles
        .first()
        .and_then(|h| h.as_slice().try_into().ok())
        .ok_or_else(|| Error::internal("NVLS: rank 0 sent no multicast handle"))?;
    let mut mc = match mc.take() {
        Some(m) => m,
        None => device.multicast_import(&root)?,
    };
    mc.add_device()?;
    // Every member is added before anyone binds.
    bootstrap.barrier()?;
    let (uc, mcp) = mc.bind_map(gran)?;
    let zeros = vec![0u8; NVLS_CTRL_BYTES as usize];
    let mut chans = Vec::with_capacity(nchannels);
    for c in 0..nchannels {
        let at = (c * region) as u64;
        device.copy_htod(uc + at, &zeros)?; // the barrier counter starts at 0
        chans.push(NvlsChannel {
            uc: uc + at,
            mc: mcp + at,
            half_bytes: half as u64,
            barriers: 0,
            pieces: 0,
        });
    }
    let buf = device.alloc(nchannels * std::mem::size_of::<NvlsChannel>())?;
    buf.write(0, super::as_bytes(&chans))?;
    // Every rank's counters are zero and its memory bound before any kernel runs.
    bootstrap.barrier()?;
    log::info!(
        "NVLS on: rank {rank}, {nchannels} channels, {} KiB scratch halves, {} KiB bound",
        half / 1024,
        bytes / 1024
    );
    Ok(Some(Nvls {
        chans: buf,
        nchannels,
        _mc: mc,
    }))
}
