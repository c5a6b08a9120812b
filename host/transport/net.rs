//! Making network connections between two ranks of a communicator: the receiving side listens
//! and sends its handle through the bootstrap, the sending side starts its connect to it, and
//! the proxy thread ends both handshakes ([`crate::proxy::establish`]). Each connection gets its
//! counters in pinned host memory mapped into the GPU, its FIFO there too or in GPU memory
//! where the network reads and writes it (GPU Direct RDMA, [`crate::net::gdr`]), the structure the
//! kernel advances, and a [`ProxyConn`] for the proxy thread.

use super::p2p::PeerAddr;
use super::{Conn, Ctx, Dir, Made, Set, Setup, Transport, Want};
use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};
use crate::graph::Transport as Kind;
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

/// Bootstrap tags of the ring's network handles: this base + the channel.
const TAG_NET_RING: u32 = 0x6e65_7200;
/// Bootstrap tags of send/recv network handles: this base + the connection's key.
const TAG_NET_LINK: u32 = 0x6e65_7300;

/// The net transport: the pairs the communicator agreed on NET (ranks on other nodes, and on
/// ours with p2p and SHM both off).
pub(crate) struct NetTransport;

/// What a round's network connections are for: the tags of their handles, whether the
/// connections to one peer may share a network comm, and how errors and log lines name them.
#[derive(Clone, Copy, Debug)]
struct Purpose {
    tag_base: u32,
    share: bool,
    /// The ring's (channel lines `Channel xx/0`, INIT), else links' (`Channel xx/1`, P2P).
    ring: bool,
}

impl Purpose {
    fn of(set: Set) -> Purpose {
        match set {
            Set::Ring { .. } => Purpose {
                tag_base: TAG_NET_RING,
                share: false,
                ring: true,
            },
            Set::Links { .. } => Purpose {
                tag_base: TAG_NET_LINK,
                share: true,
                ring: false,
            },
        }
    }

    fn what(&self) -> &'static str {
        match self.ring {
            true => "ring network connections",
            false => "send/recv network connections",
        }
    }
}

impl Transport for NetTransport {
    fn can_connect(&self, peer: &PeerAddr) -> bool {
        peer.transport == Kind::Net
    }

    fn setup(&self, cx: &Ctx, set: Set, wants: &[Want]) -> Result<Box<dyn Setup>> {
        if wants.is_empty() {
            return Ok(Box::new(NetSetup::default()));
        }
        let purpose = Purpose::of(set);
        let np = cx
            .net
            .ok_or_else(|| Error::internal("network connections without a network"))?;
        let slot_bytes = match set {
            Set::Ring { slot_bytes, .. } | Set::Links { slot_bytes, .. } => slot_bytes,
        };
        NetSetup::new(np, cx, wants, slot_bytes, purpose)
            .map(|s| Box::new(s) as Box<dyn Setup>)
            .map_err(|e| e.context(purpose.what()))
    }
}

/// A round's network connections, their receiving sides listening: the handles went out
/// through the bootstrap (receivers publish first, so no sender waits on a handle not yet
/// sent).
#[derive(Default)]
struct NetSetup {
    wants: Vec<Want>,
    /// Per want, the want whose network comm it uses ([`comm_owners`]).
    owners: Vec<usize>,
    /// Per want, the network device it uses.
    devs: Vec<usize>,
    /// Per want that owns its comm and receives, its listener.
    handshakes: Vec<Option<Handshake>>,
    slot_bytes: usize,
    purpose: Option<Purpose>,
}

impl NetSetup {
    /// Listens for every want (with `np`'s network, on the devices `np.nics` takes in turn by
    /// the wants' keys) that owns its comm and receives, and publishes its handle under
    /// `tag_base + key`. With `share`, the connections to one peer in one direction on one
    /// device share one network comm where the device groups receives ([`comm_owners`]); each
    /// tags its messages with its key.
    fn new(
        np: &NetPath,
        cx: &Ctx,
        wants: &[Want],
        slot_bytes: usize,
        purpose: Purpose,
    ) -> Result<NetSetup> {
        let net = &*np.net;
        if np.nics.is_empty() {
            return Err(Error::system(format!(
                "network '{}' has no devices",
                net.name()
            )));
        }
        let owners = comm_owners(net, wants, purpose.share);
        // A connection's device: the one its key picks among this GPU's NICs; a sharer's, its
        // owner's (the comm's).
        let devs: Vec<usize> = (0..wants.len())
            .map(|i| np.nics[wants[owners[i]].key as usize % np.nics.len()])
            .collect();
        let mut handshakes: Vec<Option<Handshake>> = Vec::with_capacity(wants.len());
        for (i, w) in wants.iter().enumerate() {
            handshakes.push(match (owners[i] == i, w.dir) {
                (true, Dir::Recv) => {
                    let (handle, l) = net.listen(devs[i])?;
                    let tag = purpose.tag_base.wrapping_add(w.key);
                    cx.bootstrap.send(w.peer, tag, &handle)?;
                    Some(Handshake::Listening(l))
                }
                _ => None,
            });
        }
        Ok(NetSetup {
            wants: wants.to_vec(),
            owners,
            devs,
            handshakes,
            slot_bytes,
            purpose: Some(purpose),
        })
    }
}

impl Setup for NetSetup {
    /// Takes each sending owner's handle and starts its connect; the handshakes end on the
    /// proxy thread ([`crate::proxy::establish`]), which fails a connection not up by the
    /// path's timeout from now or whose peer the bootstrap knows gone. Each connection's memory
    /// is made here, so its kernel structures are complete at once; the connections go to the
    /// proxy before this returns.
    fn connect(self: Box<Self>, cx: &Ctx) -> Result<Made> {
        let Some(purpose) = self.purpose else {
            return Ok(Made::default());
        };
        let np = cx
            .net
            .ok_or_else(|| Error::internal("network connections without a network"))?;
        self.finish(np, cx, purpose)
            .map_err(|e| e.context(purpose.what()))
    }
}

impl NetSetup {
    /// [`Setup::connect`] on `np`.
    fn finish(self, np: &NetPath, cx: &Ctx, purpose: Purpose) -> Result<Made> {
        let NetSetup {
            wants,
            owners,
            devs,
            mut handshakes,
            slot_bytes,
            ..
        } = self;
        let net = &*np.net;
        for (i, w) in wants.iter().enumerate() {
            if owners[i] == i && w.dir == Dir::Send {
                let tag = purpose.tag_base.wrapping_add(w.key);
                let handle = recv_handle(cx.bootstrap, w.peer, tag)?;
                handshakes[i] = Some(Handshake::Connecting(net.connect(devs[i], &handle)?));
            }
        }
        let sharers = |i: usize| owners.iter().filter(|&&o| o == i).count();
        let slots: Vec<Option<ShareSlot>> = (0..wants.len())
            .map(|i| (owners[i] == i && sharers(i) > 1).then(ShareSlot::default))
            .collect();
        let deadline = Instant::now() + np.timeout;
        let gone: GoneCheck = {
            let bs = Arc::downgrade(cx.bootstrap);
            Arc::new(move |peer| bs.upgrade().and_then(|b| b.gone(peer)))
        };
        let layout = ConnLayout {
            stride: stride(slot_bytes),
        };
        let mut made = Made::default();
        let mut proxied = Vec::with_capacity(wants.len());
        for (i, (w, handshake)) in wants.iter().zip(handshakes).enumerate() {
            let dev = devs[i];
            let g = np.gdr.dev(dev);
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
            let mem = ConnMem::new(cx.device, layout, place, w.dir == Dir::Send, &peer)?;
            let (send, recv) = conn_structs(&mem, layout);
            let on_gpu = mem.on_gpu();
            proxied.push(ProxyConn::pending(Pending {
                handshake,
                sharing,
                mem,
                peer_rank: w.peer,
                peer,
                deadline,
                gone: Some(gone.clone()),
            }));
            made.conns.push((
                *w,
                match w.dir {
                    Dir::Send => Conn::Send(send),
                    Dir::Recv => Conn::Recv(recv),
                },
            ));
            log_conn(cx, net.name(), purpose, w, dev, on_gpu);
        }
        np.proxy.add(proxied);
        Ok(made)
    }
}

/// Logs connection `w` as NCCL does: `Channel <key>/<0 ring, 1 links> : <from>[<dev>] ->
/// <to>[<dev>] [send|receive] via NET/<name>/<dev>`, with `/GDRDMA` where its FIFO is in GPU
/// memory.
fn log_conn(cx: &Ctx, net: &str, purpose: Purpose, w: &Want, dev: usize, on_gpu: bool) {
    let (from, to) = match w.dir {
        Dir::Send => (cx.rank, w.peer),
        Dir::Recv => (w.peer, cx.rank),
    };
    let (target, set) = match purpose.ring {
        true => (crate::debug::INIT, 0),
        false => (crate::debug::P2P, 1),
    };
    log::info!(
        target: target,
        "Channel {:02}/{set} : {from}[{}] -> {to}[{}] [{}] via NET/{net}/{dev}{}",
        w.key,
        cx.device.ordinal,
        cx.device.ordinal,
        dir_name(w.dir),
        if on_gpu { "/GDRDMA" } else { "" }
    );
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
