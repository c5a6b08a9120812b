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
        log::info!(
            "NVLS off: device {} has no multicast support",
            device.ordinal
        );
    }
    Ok(ok)
}

/// How rank 0 laid its multicast object out; every rank's kernels address the object by their
/// own layout, so every rank's must be rank 0's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct RootLayout {
    nchannels: usize,
    /// Bytes of one scratch half of a channel's region.
    half: usize,
    /// Bytes of the object.
    bytes: usize,
}

/// Rank 0's record: its multicast handle and its layout.
fn encode_root(handle: &[u8; 64], l: &RootLayout) -> Vec<u8> {
    let mut v = handle.to_vec();
    for w in [l.nchannels, l.half, l.bytes] {
        v.extend_from_slice(&(w as u64).to_le_bytes());
    }
    v
}

/// Rank 0's handle from its record, if its layout is `ours` (`ncclRemoteError` otherwise,
/// before anything is imported: a smaller object would be written past its end, another
/// layout would have the ranks' kernels meet at different offsets).
fn decode_root(b: &[u8], ours: &RootLayout) -> Result<[u8; 64]> {
    if b.len() != 64 + 3 * 8 {
        return Err(Error::remote(format!(
            "NVLS: rank 0 sent a malformed multicast record ({} bytes)",
            b.len()
        )));
    }
    let word = |i: usize| {
        let mut w = [0u8; 8];
        w.copy_from_slice(&b[64 + 8 * i..72 + 8 * i]);
        u64::from_le_bytes(w)
    };
    let theirs = [word(0), word(1), word(2)];
    let want = [ours.nchannels, ours.half, ours.bytes].map(|w| w as u64);
    if theirs != want {
        return Err(Error::remote(format!(
            "NVLS: rank 0's multicast object has {} channels, {}-byte halves and {} bytes; this \
             rank's layout is {} channels, {}-byte halves, {} bytes (nvlsCTAs or NCCL_NVLS_NCHANNELS, \
             and NCCL_NVLS_CHUNKSIZE must agree on every rank)",
            theirs[0], theirs[1], theirs[2], want[0], want[1], want[2]
        )));
    }
    let mut handle = [0u8; 64];
    handle.copy_from_slice(&b[..64]);
    Ok(handle)
}

/// Sets NVLS up where every rank may (None elsewhere), for `ctas` channels (the config's
/// nvlsCTAs, else NCCL_NVLS_NCHANNELS), up to `max_channels`. Every rank of the communicator
/// calls it at init.
pub(crate) fn setup(
    rank: usize,
    device: &Device,
    bootstrap: &Bootstrap,
    peers: &[PeerInfo],
    all_p2p: bool,
    (ctas, max_channels): (Option<u32>, usize),
) -> Result<Option<Nvls>> {
    let mine = may(rank, device, peers, all_p2p)?;
    let all = bootstrap.allgather(&[mine as u8])?;
    if !all.iter().all(|v| v.first() == Some(&1)) {
        return Ok(None);
    }
    let nranks = peers.len();
    let wanted = ctas.map_or(crate::env::NVLS_NCHANNELS.int(), i64::from);
    let nchannels = (wanted.max(1) as usize).min(max_channels.max(1));
    // Each half holds at least one 16-byte pack per rank.
    let half = (crate::env::NVLS_CHUNKSIZE.int().max(0) as usize)
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
    let layout = RootLayout {
        nchannels,
        half,
        bytes,
    };
    let mine = match rank {
        0 => encode_root(&handle, &layout),
        _ => Vec::new(),
    };
    let records = bootstrap.allgather(&mine)?;
    let root = decode_root(
        records.first().map(Vec::as_slice).unwrap_or_default(),
        &layout,
    )?;
    let mut mc = match mc.take() {
        Some(m) => m,
        None => device.multicast_import(&root, bytes)?,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::NcclResult;

    /// Rank 0's multicast record is taken only with this rank's layout: a smaller object, a
    /// huge one, another channel count or half size, or a malformed record is ncclRemoteError.
    #[test]
    fn rank_0s_multicast_layout_must_be_ours() {
        let ours = RootLayout {
            nchannels: 2,
            half: 4096,
            bytes: 2 << 20,
        };
        let handle = [7u8; 64];
        assert_eq!(
            decode_root(&encode_root(&handle, &ours), &ours).unwrap(),
            handle
        );
        for bad in [
            RootLayout {
                bytes: 1 << 20,
                ..ours
            },
            RootLayout {
                bytes: usize::MAX,
                ..ours
            },
            RootLayout {
                nchannels: 1,
                ..ours
            },
            RootLayout { half: 2048, ..ours },
        ] {
            let e = decode_root(&encode_root(&handle, &bad), &ours).expect_err("refused");
            assert_eq!(e.code, NcclResult::RemoteError, "{e}");
            assert!(e.message.contains("rank 0's multicast object"), "{e}");
        }
        for short in [&[][..], &handle[..], &encode_root(&handle, &ours)[..80]] {
            let e = decode_root(short, &ours).expect_err("malformed");
            assert_eq!(e.code, NcclResult::RemoteError, "{e}");
        }
    }
}
