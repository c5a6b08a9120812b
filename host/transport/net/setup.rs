//! Making network connections between two ranks of a communicator: the receiving side listens
//! and sends its handle through the bootstrap, the sending side connects to it, and both poll
//! until every connection of the batch is up. Each connection gets its counters in pinned host
//! memory mapped into the GPU, its FIFO there too or in GPU memory where the network reads and
//! writes it (GPU Direct RDMA, [`super::gdr`]), the structure the kernel advances, and a
//! [`NetConn`] for the proxy thread.

use super::gdr::Policy;
use super::{Connecting, Handle, Listener, Net, HANDLE_BYTES};
use crate::bootstrap::{AbortFlag, Bootstrap};
use crate::cuda::Device;
use crate::error::{Error, Result};
use crate::proxy::{ConnLayout, FifoPlace, NetConn, Side};
use crate::transport::links::Dir;
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
    pub conn: NetConn,
    /// The network device it uses.
    pub dev: usize,
}

impl Made {
    /// How NCCL's INFO lines name the connection's path: `NET/<name>/<dev>`, with `/GDRDMA`
    /// where its FIFO is in GPU memory.
    pub(crate) fn via(&self, net: &str) -> String {
        format!(
            "NET/{net}/{}{}",
            self.dev,
            if self.conn.on_gpu() { "/GDRDMA" } else { "" }
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

enum Half {
    Listening(Box<dyn Listener>),
    AwaitingHandle,
    Connecting(Box<dyn Connecting>),
    Up(Side),
    /// Shares the network comm of another want ([`comm_owners`]).
    Shares,
}

/// For each want, the index of the want whose network comm it uses: its own, or with `share`
/// (send/recv links, NCCL_NET_SHARED_COMMS on) and a device that groups receives (maxRecvs
/// above 1, so it matches tags), the first want with the same peer, direction and device. Both
/// ends decide alike from the same network and the same wants.
fn comm_owners(
    net: &dyn Net,
    wants: &[Want],
    dev_of: impl Fn(&Want) -> usize,
    share: bool,
) -> Vec<usize> {
    let mut owner: Vec<usize> = (0..wants.len()).collect();
    if !share || crate::env::int("NCCL_NET_SHARED_COMMS") == 0 {
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

/// Makes every connection in `wants` with network `net`, FIFOs placed as `gdr` says;
/// `tag_base + key` tags the handles on the bootstrap. With `share`, the connections to one
/// peer in one direction on one device share one network comm where the device groups
/// receives ([`comm_owners`]); each tags its messages with its key. Gives up at `timeout` or
/// when `abort` is raised.
#[allow(clippy::too_many_arguments)]
pub(crate) fn connect(
    net: &dyn Net,
    gdr: &Policy,
    device: &Device,
    bootstrap: &Bootstrap,
    wants: &[Want],
    slot_bytes: usize,
    tag_base: u32,
    timeout: Duration,
    abort: Option<&AbortFlag>,
    share: bool,
) -> Result<Vec<Made>> {
    let ndevs = net.ndevs();
    if ndevs == 0 {
        return Err(Error::system(format!(
            "network '{}' has no devices",
            net.name()
        )));
    }
    let dev_of = |w: &Want| w.key as usize % ndevs;
    let owners = comm_owners(net, wants, dev_of, share);
    // Receivers listen and publish first, so no sender waits on a handle not yet sent.
    let mut halves = Vec::with_capacity(wants.len());
    for (i, w) in wants.iter().enumerate() {
        if owners[i] != i {
            halves.push(Half::Shares);
            continue;
        }
        halves.push(match w.dir {
            Dir::Recv => {
                let (handle, l) = net.listen(dev_of(w))?;
                bootstrap.send(w.peer, tag_base.wrapping_add(w.key), &handle)?;
                Half::Listening(l)
            }
            Dir::Send => Half::AwaitingHandle,
        });
    }
    for (w, h) in wants.iter().zip(halves.iter_mut()) {
        if matches!(h, Half::AwaitingHandle) {
            let got = bootstrap
                .recv(w.peer, tag_base.wrapping_add(w.key))
                .map_err(|e| e.context(format!("network handle from rank {}", w.peer)))?;
            if got.len() != HANDLE_BYTES {
                return Err(Error::remote(format!(
                    "rank {} sent a {}-byte network handle (expected {HANDLE_BYTES})",
                    w.peer,
                    got.len()
                )));
            }
            let mut handle: Handle = [0; HANDLE_BYTES];
            handle.copy_from_slice(&got);
            *h = Half::Connecting(net.connect(dev_of(w), &handle)?);
        }
    }
    let deadline = Instant::now() + timeout;
    loop {
        let mut pending = 0;
        for h in halves.iter_mut() {
            let next = match h {
                Half::Listening(l) => l.accept()?.map(|c| Half::Up(Side::Recv(c))),
                Half::Connecting(c) => c.poll()?.map(|c| Half::Up(Side::Send(c))),
                _ => None,
            };
            match next {
                Some(up) => *h = up,
                None if !matches!(h, Half::Up(_) | Half::Shares) => pending += 1,
                None => {}
            }
        }
        if pending == 0 {
            break;
        }
        if let Some(a) = abort {
            a.check()?;
        }
        // A peer known gone (dead, aborted, reported hung) will never connect.
        for (w, _) in wants
            .iter()
            .zip(&halves)
            .filter(|(_, h)| matches!(h, Half::Listening(_) | Half::Connecting(_)))
        {
            if let Some(why) = bootstrap.gone(w.peer) {
                return Err(Error::remote(format!(
                    "network connection with rank {} ({:?}) not established: the peer is \
                     gone: {why}",
                    w.peer, w.dir
                )));
            }
        }
        if Instant::now() > deadline {
            let who: Vec<String> = wants
                .iter()
                .zip(&halves)
                .filter(|(_, h)| !matches!(h, Half::Up(_) | Half::Shares))
                .map(|(w, _)| format!("rank {} ({:?})", w.peer, w.dir))
                .collect();
            return Err(Error::system(format!(
                "network connections not established within {:.1} s: {}",
                timeout.as_secs_f64(),
                who.join(", ")
            )));
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    let layout = ConnLayout {
        stride: stride(slot_bytes),
    };
    let sides = share_sides(net, wants, &owners, halves, dev_of)?;
    let mut made = Vec::with_capacity(wants.len());
    for (w, (side, tag, shared)) in wants.iter().zip(sides) {
        let dev = dev_of(w);
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
        let peer = format!("rank {} ({} via {})", w.peer, dir_name(w.dir), net.name());
        let conn = NetConn::new(side, device, layout, place, w.peer, peer)?.with_tag(tag, shared);
        let (send, recv) = conn_structs(&conn, layout);
        made.push(Made {
            want: *w,
            send,
            recv,
            conn,
            dev,
        });
    }
    Ok(made)
}

/// Each want's endpoint, message tag and whether it shares its comm, once every comm is up:
/// its own comm with tag 0, or a handle on the comm it shares (every sharer, the owner too,
/// tags with its key).
fn share_sides(
    net: &dyn Net,
    wants: &[Want],
    owners: &[usize],
    halves: Vec<Half>,
    dev_of: impl Fn(&Want) -> usize,
) -> Result<Vec<(Side, u32, bool)>> {
    use crate::proxy::shared::{Grouper, SharedRecv, SharedSend};
    use std::sync::Mutex;
    enum Shared {
        Send(Arc<Mutex<Box<dyn super::SendComm>>>),
        Recv(Arc<Mutex<Grouper>>),
    }
    let sharers = |i: usize| owners.iter().filter(|&&o| o == i).count();
    let mut comms: std::collections::HashMap<usize, Shared> = Default::default();
    let mut out: Vec<Option<(Side, u32, bool)>> = Vec::with_capacity(wants.len());
    for (i, h) in halves.into_iter().enumerate() {
        match h {
            Half::Up(side) if sharers(i) > 1 => {
                let w = &wants[i];
                let max_recvs = net.properties(dev_of(w))?.max_recvs;
                log::info!(
                    "NET/{}: {} {} connections with rank {} share one comm (maxRecvs {max_recvs})",
                    net.name(),
                    sharers(i),
                    dir_name(w.dir),
                    w.peer
                );
                comms.insert(
                    i,
                    match side {
                        Side::Send(c) => Shared::Send(Arc::new(Mutex::new(c))),
                        Side::Recv(c) => Shared::Recv(Grouper::new(c, max_recvs)),
                    },
                );
                out.push(None);
            }
            Half::Up(side) => out.push(Some((side, 0, false))),
            Half::Shares => out.push(None),
            _ => return Err(Error::internal("network connection left pending")),
        }
    }
    out.into_iter()
        .enumerate()
        .map(|(i, s)| match s {
            Some(s) => Ok(s),
            None => {
                let side = match comms.get(&owners[i]) {
                    Some(Shared::Send(c)) => Side::Send(Box::new(SharedSend(c.clone()))),
                    Some(Shared::Recv(g)) => Side::Recv(Box::new(SharedRecv(g.clone()))),
                    None => return Err(Error::internal("a shared network comm went missing")),
                };
                Ok((side, wants[i].key, true))
            }
        })
        .collect()
}

fn dir_name(d: Dir) -> &'static str {
    match d {
        Dir::Send => "send",
        Dir::Recv => "receive",
    }
}

/// The kernel's view of a proxied connection: one FIFO for every protocol.
fn conn_structs(conn: &NetConn, l: ConnLayout) -> (ConnSend, ConnRecv) {
    let at = |o: usize| conn.ctrl_addr(o);
    let fifo = conn.fifo_addr();
    // 1: LL lines are read by their flags both ways; 2: by receivers only; 0: neither.
    let ll_poll = crate::env::int("NCCL_RS_NET_LL_POLL");
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
