//! The p2p transport. Every rank owns one device block holding, per channel, its receive FIFO
//! (NCCL_STEPS slots), its receive tail counter and its send head counter — each counter in its
//! own 128-byte line, and after all of those its LL FIFO (NCCL_STEPS slots of `ll_slot_bytes`)
//! and its LL128 FIFO (NCCL_STEPS slots of `ll128_slot_bytes`; steps and counters shared with
//! the Simple FIFO). A sender writes into its next's block (FIFO data and tail) and polls its
//! own head; a receiver polls its own tail and writes its prev's head. So every poll is local
//! and every remote access is a store.

use crate::bootstrap::Bootstrap;
use crate::cuda::{DevBuffer, DevPtr, Device, IpcMapping};
use crate::error::{Error, Result};
use nccl_device::abi::{
    ConnRecv, ConnSend, CTRL_LINE, LL128_SLOT_BYTES, LL_SLOT_BYTES, NCCL_STEPS,
};

/// Where things sit inside a rank's block.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Layout {
    pub nchannels: usize,
    pub slot_bytes: usize,
    /// Bytes of one LL FIFO slot (lines of 8 payload bytes and 8 flag bytes).
    pub ll_slot_bytes: usize,
    /// Bytes of one LL128 FIFO slot (128-byte lines of 120 payload bytes and a flag).
    pub ll128_slot_bytes: usize,
}

impl Layout {
    /// The layout with `nchannels` channels, Simple slots of `slot_bytes` and the device's LL
    /// slots.
    pub fn new(nchannels: usize, slot_bytes: usize) -> Layout {
        Layout {
            nchannels,
            slot_bytes,
            ll_slot_bytes: LL_SLOT_BYTES as usize,
            ll128_slot_bytes: LL128_SLOT_BYTES as usize,
        }
    }

    fn ctrl_bytes(&self) -> usize {
        self.nchannels * 2 * CTRL_LINE
    }
    pub fn recv_tail(&self, ch: usize) -> u64 {
        (ch * 2 * CTRL_LINE) as u64
    }
    pub fn send_head(&self, ch: usize) -> u64 {
        (ch * 2 * CTRL_LINE + CTRL_LINE) as u64
    }
    pub fn fifo(&self, ch: usize) -> u64 {
        (self.ctrl_bytes() + ch * NCCL_STEPS as usize * self.slot_bytes) as u64
    }
    fn simple_end(&self) -> usize {
        self.ctrl_bytes() + self.nchannels * NCCL_STEPS as usize * self.slot_bytes
    }
    pub fn ll_fifo(&self, ch: usize) -> u64 {
        (self.simple_end() + ch * NCCL_STEPS as usize * self.ll_slot_bytes) as u64
    }
    fn ll_end(&self) -> usize {
        self.simple_end() + self.nchannels * NCCL_STEPS as usize * self.ll_slot_bytes
    }
    pub fn ll128_fifo(&self, ch: usize) -> u64 {
        (self.ll_end() + ch * NCCL_STEPS as usize * self.ll128_slot_bytes) as u64
    }
    pub fn total(&self) -> usize {
        self.ll_end() + self.nchannels * NCCL_STEPS as usize * self.ll128_slot_bytes
    }
}

/// How a rank is reached: its device, whether it shares our process, and the transport the
/// communicator chose for the pair.
#[derive(Clone, Copy, Debug)]
pub struct PeerAddr {
    pub device: i32,
    pub same_process: bool,
    pub transport: crate::graph::Transport,
}

/// What one rank publishes about a block of its device memory.
const EXPORT_BYTES: usize = 64 + 8;

/// The record that lets a peer reach `buf`: an IPC handle (for other processes) and the address
/// (for peers in this process).
pub fn export(device: &Device, buf: &DevBuffer) -> Result<Vec<u8>> {
    let mut e = vec![0u8; EXPORT_BYTES];
    e[..64].copy_from_slice(&device.ipc_handle(buf)?);
    e[64..].copy_from_slice(&buf.ptr.to_le_bytes());
    Ok(e)
}

/// Makes a peer's exported block addressable from `device`: peer access in this process, an
/// IPC mapping (returned, to be kept alive) across processes. The block must hold the `needed`
/// bytes our layout addresses in it (the kernels address it from our layout, not from the
/// record): a shorter one is `ncclRemoteError` and nothing is kept mapped.
pub fn import(
    device: &Device,
    peer: &PeerAddr,
    record: &[u8],
    needed: usize,
) -> Result<(DevPtr, Option<IpcMapping>)> {
    if record.len() != EXPORT_BYTES {
        return Err(Error::remote(format!(
            "malformed p2p connection record ({} bytes)",
            record.len()
        )));
    }
    if peer.same_process {
        let other = Device::open(peer.device)?;
        if other.ordinal != device.ordinal {
            if !device.can_access_peer(&other)? {
                return Err(Error::system(format!(
                    "GPU {} cannot access GPU {} (no peer-to-peer path): the pair should have taken SHM or the network",
                    device.ordinal, other.ordinal
                )));
            }
            device.enable_peer_access(&other)?;
        }
        let mut a = [0u8; 8];
        a.copy_from_slice(&record[64..72]);
        let p = u64::from_le_bytes(a);
        // In this process the address must be device memory we know, holding the block.
        match device.pointer_extent(p, needed)? {
            Some((_, held)) => check_block(p, held, needed)?,
            None => {
                return Err(Error::remote(format!(
                    "p2p connection record names {p:#x}, which is no device memory of this \
                     process"
                )))
            }
        }
        return Ok((p, None));
    }
    let mut handle = [0u8; 64];
    handle.copy_from_slice(&record[..64]);
    let m = device.open_ipc(&handle)?;
    // What the mapping holds; where the backend cannot tell, nothing is refused (as for
    // buffers of unknown extent). A refused mapping is closed as `m` drops.
    if let Some((_, held)) = device.pointer_extent(m.ptr, needed)? {
        check_block(m.ptr, held, needed)?;
    }
    Ok((m.ptr, Some(m)))
}

/// A peer's block at `p` holding `held` bytes, where our layout addresses `needed`.
fn check_block(p: DevPtr, held: usize, needed: usize) -> Result<()> {
    if held < needed {
        return Err(Error::remote(format!(
            "p2p connection record: the block at {p:#x} holds {held} bytes, its connections \
             need {needed}"
        )));
    }
    Ok(())
}

/// The memory of a communicator's p2p connections: our block and the peers' blocks mapped.
pub struct P2p {
    pub layout: Layout,
    pub own: DevBuffer,
    /// Mapped blocks of peers in other processes (kept alive; unmapped on drop).
    _mappings: Vec<IpcMapping>,
    /// Per channel, its ring neighbours' blocks as we address them: (prev, next); None for a
    /// neighbour on another node (the network carries that side).
    bases: Vec<(Option<DevPtr>, Option<DevPtr>)>,
}

impl P2p {
    /// Allocates our block, exchanges blocks with every rank and maps each channel's ring
    /// neighbours' (`ring_peers[c]` = (prev, next) of channel `c`; every peer is mapped once,
    /// however many channels reach it). Neighbours for which `remote` is true are not mapped.
    pub fn setup(
        device: &Device,
        bootstrap: &Bootstrap,
        peers: &[PeerAddr],
        ring_peers: &[(usize, usize)],
        remote: &dyn Fn(usize) -> bool,
        layout: Layout,
    ) -> Result<P2p> {
        if ring_peers.len() != layout.nchannels {
            return Err(Error::internal(format!(
                "p2p setup: {} ring neighbour pairs for {} channels",
                ring_peers.len(),
                layout.nchannels
            )));
        }
        let own = device.alloc(layout.total())?;
        let all = bootstrap.allgather(&export(device, &own)?)?;
        let mut mappings = Vec::new();
        let mut mapped: Vec<Option<DevPtr>> = vec![None; peers.len()];
        let mut base_of = |r: usize| -> Result<DevPtr> {
            if r == bootstrap.rank() {
                return Ok(own.ptr);
            }
            if let Some(Some(p)) = mapped.get(r) {
                return Ok(*p);
            }
            let e = all
                .get(r)
                .filter(|_| r < peers.len())
                .ok_or_else(|| Error::remote(format!("no p2p connection record from rank {r}")))?;
            let (p, m) = import(device, &peers[r], e, layout.total())
                .map_err(|err| err.context(format!("rank {r}'s buffers")))?;
            mappings.extend(m);
            mapped[r] = Some(p);
            Ok(p)
        };
        let mut local_base = |r: usize| -> Result<Option<DevPtr>> {
            if remote(r) {
                Ok(None)
            } else {
                base_of(r).map(Some)
            }
        };
        let bases = ring_peers
            .iter()
            .map(|&(prev, next)| Ok((local_base(prev)?, local_base(next)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(P2p {
            layout,
            own,
            _mappings: mappings,
            bases,
        })
    }

    /// Channel `ch`'s connections: send to next, receive from prev (steps start at 0); None
    /// for a side whose neighbour is on another node.
    pub fn conns(&self, ch: usize) -> (Option<ConnSend>, Option<ConnRecv>) {
        let l = &self.layout;
        let (prev_base, next_base) = self.bases[ch];
        let send = next_base.map(|next_base| ConnSend {
            fifo: next_base + l.fifo(ch),
            tail: next_base + l.recv_tail(ch),
            head: self.own.ptr + l.send_head(ch),
            step: 0,
            head_seen: 0,
            ll_fifo: next_base + l.ll_fifo(ch),
            ll128_fifo: next_base + l.ll128_fifo(ch),
            proxy_sizes: 0,
            proxy_stride: 0,
        });
        let recv = prev_base.map(|prev_base| ConnRecv {
            fifo: self.own.ptr + l.fifo(ch),
            tail: self.own.ptr + l.recv_tail(ch),
            head: prev_base + l.send_head(ch),
            step: 0,
            tail_seen: 0,
            ll_fifo: self.own.ptr + l.ll_fifo(ch),
            ll128_fifo: self.own.ptr + l.ll128_fifo(ch),
            proxy_stride: 0,
            proxy_proto: 0,
        });
        (send, recv)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A peer's record whose block is smaller than the connections our layout puts in it is
    /// refused, across processes (an IPC handle) and in this process (an address); so is an
    /// address that is no device memory.
    #[test]
    fn a_block_smaller_than_its_connections_is_refused() {
        let _ = crate::cuda::set_backend(crate::cuda::Backend::Sim);
        let dev = Device::open(0).expect("device 0");
        let block = dev.alloc(4096).expect("alloc");
        let record = export(&dev, &block).expect("export");
        for same_process in [false, true] {
            let peer = PeerAddr {
                device: 0,
                same_process,
                transport: crate::graph::Transport::P2p,
            };
            for needed in [4097, 1 << 30] {
                let e = match import(&dev, &peer, &record, needed) {
                    Err(e) => e,
                    Ok(_) => panic!("a 4096-byte block imported for {needed} bytes"),
                };
                assert_eq!(e.code, crate::error::NcclResult::RemoteError, "{e}");
                assert!(
                    e.message
                        .contains(&format!("holds 4096 bytes, its connections need {needed}")),
                    "{e}"
                );
            }
            let (p, m) = import(&dev, &peer, &record, 4096).expect("what it holds");
            assert_eq!(p == block.ptr, same_process);
            drop(m);
        }
        let mut forged = record.clone();
        forged[64..].copy_from_slice(&0x10u64.to_le_bytes());
        let peer = PeerAddr {
            device: 0,
            same_process: true,
            transport: crate::graph::Transport::P2p,
        };
        let e = match import(&dev, &peer, &forged, 8) {
            Err(e) => e,
            Ok(_) => panic!("an address that is no device memory was taken"),
        };
        assert_eq!(e.code, crate::error::NcclResult::RemoteError, "{e}");
    }

    #[test]
    fn layout_keeps_counters_in_their_own_lines() {
        let l = Layout::new(3, 1 << 19);
        let mut offs: Vec<u64> = (0..3)
            .flat_map(|c| [l.recv_tail(c), l.send_head(c)])
            .collect();
        offs.sort();
        assert!(offs.windows(2).all(|w| w[1] - w[0] >= CTRL_LINE as u64));
        assert_eq!(l.fifo(0) as usize, 3 * 2 * CTRL_LINE);
        assert_eq!(l.fifo(2) - l.fifo(1), 8 << 19);
        assert_eq!(l.ll_fifo(0) as usize, l.fifo(2) as usize + (8 << 19));
        assert_eq!(l.ll_fifo(2) - l.ll_fifo(1), 8 * LL_SLOT_BYTES as u64);
        assert_eq!(l.ll128_fifo(0), l.ll_fifo(2) + 8 * LL_SLOT_BYTES as u64);
        assert_eq!(
            l.ll128_fifo(2) - l.ll128_fifo(1),
            8 * LL128_SLOT_BYTES as u64
        );
        assert_eq!(
            l.total(),
            l.ll128_fifo(2) as usize + 8 * LL128_SLOT_BYTES as usize
        );
        assert_eq!(l.ll128_fifo(0) % 128, 0);
        assert_eq!(l.ll_fifo(0) % 128, 0);
        assert_eq!(l.fifo(0) % 128, 0);
    }
}
