//! Making network connections between two ranks of a communicator: the receiving side listens
//! and sends its handle through the bootstrap, the sending side starts its connect to it, and
//! the proxy thread ends both handshakes ([`crate::proxy::establish`]). Each connection gets its
//! counters in pinned host memory mapped into the GPU, its FIFO there too or in GPU memory
//! where the network reads and writes it (GPU Direct RDMA, [`crate::net::gdr`]), the structure the
//! kernel advances, and a [`ProxyConn`] for the proxy thread.

use super::links::Dir;
use crate::bootstrap::Bootstrap;
use crate::cuda::Device;
use crate::error::{Error, Result};
use crate::net::gdr::Policy;
use crate::net::{Handle, Net, HANDLE_BYTES};
use crate::proxy::establish::{GoneCheck, Handshake, Pending, ShareSlot, Sharing};
use crate::proxy::{ConnLayout, ConnMem, FifoPlace, ProxyConn};
use nccl_device::abi::{
    ConnRecv, ConnSend, LL128_SLOT_BYTES, LL_SLOT_BYTES, STRIDE_LL_POLL, STRIDE_LL_SEND_POLL,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a communicator spanning several nodes needs to make network connections: which ranks
/// are on other nodes, the network, and its hold on the proxy thread.
pub(crate) struct NetPath {
    /// `remote[r]`: rank r is on another node.
    pub remote: Vec<bool>,
    pub net: Arc<dyn Net>,
    /// Where each network device's connections put their FIFOs (GPU Direct RDMA or not).
    pub gdr: Policy,
    /// The network devices its channels take in turn ([`crate::net::nics::channel_nics`]).
    pub nics: Vec<usize>,
    pub proxy: crate::proxy::ProxyGroup,
    pub timeout: Duration,
}

/// One connection wanted: with `peer`, in direction `dir`, known to both sides by `key` (the
/// channel of a ring, the index of a send/recv connection).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Want {
    pub peer: usize,
    pub dir: Dir,
    pub key: u32,
}

/// A connection made: what the kernel advances and what the proxy drives.
pub(crate) struct Made {
    pub want: Want,
    pub send: ConnSend,
    pub recv: ConnRecv,
    pub conn: ProxyConn,
    /// The network device it uses.
    pub dev: usize,
    /// Its FIFO is in GPU memory (GPU Direct RDMA).
    pub on_gpu: bool,
}

impl Made {
    /// How NCCL's INFO lines name the connection's path: `NET/<name>/<dev>`, with `/GDRDMA`
    /// where its FIFO is in GPU memory.
    pub(crate) fn via(&self, net: &str) -> String {
        format!(
            "NET/{net}/{}{}",
            self.dev,
            if self.on_gpu { "/GDRDMA" } else { "" }
        )
    }
}

/// The slot stride of a proxied connection: every protocol's slot fits, so that a receiving
/// proxy can post a step before it knows the protocol.
pub(crate) fn stride(slot_bytes: usize) -> usize {
    slot_bytes
        .max(LL_SLOT_BYTES as usize)
        .max(LL128_SLOT_BYTES as usize)
        .next_multiple_of(128)
}

/// For each want, the index of the want whose network comm it uses: its own, or with `share`
/// (send/recv links, NCCL_NET_SHARED_COMMS on) and a network that groups receives (maxRecvs
/// above 1, so it matches tags), the first want with the same peer, direction and class (its
/// key modulo the network's device count). Both ends decide alike from the same wants where
/// the network has as many devices on both nodes, whichever devices each end's GPU prefers
/// ([`crate::net::nics`]): a sharer uses its owner's comm, and with it its owner's device.
fn comm_owners(net: &dyn Net, wants: &[Want], share: bool) -> Vec<usize> {
    let ndevs = net.ndevs().max(1);
    let dev_of = |w: &Want| w.key as usize % ndevs;
    let mut owner: Vec<usize> = (0..wants.len()).collect();
    if !share || crate::env::NET_SHARED_COMMS.int() == 0 {
        return owner;
    }
    let mut first = std::collections::HashMap::new();
    for (i, w) in wants.iter().enumerate() {
        let dev = dev_of(w);
        if net.properties(dev).is_ok_and(|p| p.max_recvs > 1) {
            owner[i] = *first.entry((w.peer, w.dir, dev)).or_insert(i);
        }
    }
    owner
}

/// Starts every connection in `wants` with network `net`, on the devices `nics` takes in turn
/// by the wants' keys, FIFOs placed as `gdr` says;
/// `tag_base + key` tags the handles on the bootstrap. Only the handles are traded here
/// (receivers listen and publish first, so no sender waits on a handle not yet sent; senders
/// start their connect): the handshakes end on the proxy thread ([`crate::proxy::establish`]),
/// which fails a connection not up by `timeout` from now or whose peer the bootstrap knows gone.
/// Each connection's memory is made here, so its kernel structures are complete at once. With
/// `share`, the connections to one peer in one direction on one device share one network comm
/// where the device groups receives ([`comm_owners`]); each tags its messages with its key.
#[allow(clippy::too_many_arguments)]
pub(crate) fn connect(
    net: &dyn Net,
    gdr: &Policy,
    nics: &[usize],
    device: &Device,
    bootstrap: &Arc<Bootstrap>,
    wants: &[Want],
    slot_bytes: usize,
    tag_base: u32,
    timeout: Duration,
    share: bool,
) -> Result<Vec<Made>> {
    if nics.is_empty() {
        return Err(Error::system(format!(
            "network '{}' has no devices",
            net.name()
        )));
    }
    let owners = comm_owners(net, wants, share);
    // A connection's device: the one its key picks among this GPU's NICs; a sharer's, its
    // owner's (the comm's).
    let dev_at = |i: usize| nics[wants[owners[i]].key as usize % nics.len()];
    let sharers = |i: usize| owners.iter().filter(|&&o| o == i).count();
    let slots: Vec<Option<ShareSlot>> = (0..wants.len())
        .map(|i| (owners[i] == i && sharers(i) > 1).then(ShareSlot::default))
        .collect();
    let mut handshakes: Vec<Option<Handshake>> = Vec::with_capacity(wants.len());
    for (i, w) in wants.iter().enumerate() {
        handshakes.push(match (owners[i] == i, w.dir) {
            (false, _) => None,
            (true, Dir::Recv) => {
                let (handle, l) = net.listen(dev_at(i))?;
                bootstrap.send(w.peer, tag_base.wrapping_add(w.key), &handle)?;
                Some(Handshake::Listening(l))
            }
            (true, Dir::Send) => None,
        });
    }
    for (i, w) in wants.iter().enumerate() {
        if owners[i] == i && w.dir == Dir::Send {
            let handle = recv_handle(bootstrap, w.peer, tag_base.wrapping_add(w.key))?;
            handshakes[i] = Some(Handshake::Connecting(net.connect(dev_at(i), &handle)?));
        }
    }
    let deadline = Instant::now() + timeout;
    let gone: GoneCheck = {
        let bs = Arc::downgrade(bootstrap);
        Arc::new(move |peer| bs.upgrade().and_then(|b| b.gone(peer)))
    };
    let layout = ConnLayout {
        stride: stride(slot_bytes),
    };
    let mut made = Vec::with_capacity(wants.len());
    for (i, (w, handshake)) in wants.iter().zip(handshakes).enumerate() {
        let dev = dev_at(i);
        let g = gdr.dev(dev);
        let place = match w.dir {
            Dir::Send if g.send => FifoPlace::Gpu {
                dmabuf: g.dmabuf,
                flush: false,
            },
            Dir::Recv if g.recv => FifoPlace::Gpu {
                dmabuf: g.dmabuf,
                flush: g.flush,
            },
            _ => FifoPlace::Host,
        };
        let (handshake, sharing) = match (&slots[i], handshake) {
            (Some(slot), Some(h)) => (
                h,
                Sharing::Owner {
                    slot: slot.clone(),
                    max_recvs: net.properties(dev)?.max_recvs,
                    tag: w.key,
                },
            ),
            (None, Some(h)) => (h, Sharing::Alone),
            (_, None) => match &slots[owners[i]] {
                Some(slot) => (
                    Handshake::Sharing(slot.clone()),
                    Sharing::User { tag: w.key },
                ),
                None => return Err(Error::internal("a shared network comm has no owner")),
            },
        };
        if let Sharing::Owner { max_recvs, .. } = &sharing {
            log::info!(
                "NET/{}: {} {} connections with rank {} share one comm (maxRecvs {max_recvs})",
                net.name(),
                sharers(i),
                dir_name(w.dir),
                w.peer
            );
        }
        let peer = format!("rank {} ({} via {})", w.peer, dir_name(w.dir), net.name());
        let mem = ConnMem::new(device, layout, place, w.dir == Dir::Send, &peer)?;
        let (send, recv) = conn_structs(&mem, layout);
        let on_gpu = mem.on_gpu();
        made.push(Made {
            want: *w,
            send,
            recv,
            conn: ProxyConn::pending(Pending {
                handshake,
                sharing,
                mem,
                peer_rank: w.peer,
                peer,
                deadline,
                gone: Some(gone.clone()),
            }),
            dev,
            on_gpu,
        });
    }
    Ok(made)
}

/// The network handle `peer` published under `tag`.
fn recv_handle(bootstrap: &Bootstrap, peer: usize, tag: u32) -> Result<Handle> {
    let got = bootstrap
        .recv(peer, tag)
        .map_err(|e| e.context(format!("network handle from rank {peer}")))?;
    if got.len() != HANDLE_BYTES {
        return Err(Error::remote(format!(
            "rank {peer} sent a {}-byte network handle (expected {HANDLE_BYTES})",
            got.len()
        )));
    }
    let mut handle: Handle = [0; HANDLE_BYTES];
    handle.copy_from_slice(&got);
    Ok(handle)
}

fn dir_name(d: Dir) -> &'static str {
    match d {
        Dir::Send => "send",
        Dir::Recv => "receive",
    }
}

/// The kernel's view of a proxied connection: one FIFO for every protocol.
fn conn_structs(conn: &ConnMem, l: ConnLayout) -> (ConnSend, ConnRecv) {
    let at = |o: usize| conn.ctrl_addr(o);
    let fifo = conn.fifo_addr();
    // 1: LL lines are read by their flags both ways; 2: by receivers only; 0: neither.
    let ll_poll = crate::env::RS_NET_LL_POLL.int();
    let send = ConnSend {
        fifo,
        tail: at(ConnLayout::TAIL),
        head: at(ConnLayout::HEAD),
        step: 0,
        head_seen: 0,
        ll_fifo: fifo,
        ll128_fifo: fifo,
        proxy_sizes: at(ConnLayout::SIZES),
        // A FIFO in host memory lets the proxy check an LL step's lines itself
        // ([`STRIDE_LL_SEND_POLL`]); one in GPU memory it does not read.
        proxy_stride: l.stride as u64
            | match !conn.on_gpu() && ll_poll == 1 {
                true => STRIDE_LL_SEND_POLL,
                false => 0,
            },
    };
    let recv = ConnRecv {
        fifo,
        tail: at(ConnLayout::TAIL),
        head: at(ConnLayout::HEAD),
        step: 0,
        tail_seen: 0,
        ll_fifo: fifo,
        ll128_fifo: fifo,
        // A FIFO in host memory receives LL lines in order ([`STRIDE_LL_POLL`]); one in GPU
        // memory (GPU Direct RDMA) has no such promise, and its steps may need a flush.
        proxy_stride: l.stride as u64
            | match !conn.on_gpu() && ll_poll != 0 {
                true => STRIDE_LL_POLL,
                false => 0,
            },
        proxy_proto: at(ConnLayout::PROTO),
    };
    (send, recv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stride_fits_every_protocol() {
        assert_eq!(stride(8192), LL128_SLOT_BYTES as usize);
        assert_eq!(stride(1 << 19), 1 << 19);
        assert!(stride(100_000) >= 100_000 && stride(100_000).is_multiple_of(128));
    }
}
