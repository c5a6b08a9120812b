//! Transports: how the FIFOs of a connection are placed and reached. Inside a node: p2p (the
//! peer's memory through peer access in one process, CUDA IPC across processes), else shm
//! (host shared memory mapped into both GPUs); between nodes (or inside one with both off): net.
//!
//! Every transport has one shape, NCCL's `ncclTransport`: `Transport::can_connect` says
//! whether it carries a pair (as the communicator agreed), `Transport::setup` allocates our
//! sides of the connections it carries and publishes what each peer needs, and
//! `Setup::connect` completes them with the peers' records, yielding the kernel's
//! [`ConnSend`] / [`ConnRecv`] and the memory behind them. A round of connections (`setup`,
//! then `Started::connect`) runs every transport of `TRANSPORTS` on the wants it carries,
//! without knowing which made what: the rings at init, the send/recv and tree links on first
//! use ([`links`]). A new transport is a file implementing the trait and a line in
//! `TRANSPORTS`.

pub mod links;
pub(crate) mod net;
pub mod p2p;
pub mod regmap;
pub mod shm;
pub(crate) mod suspend;

use crate::bootstrap::Bootstrap;
use crate::cuda::Device;
use crate::error::{Error, Result};
use nccl_device::abi::{ConnRecv, ConnSend, LL_SLOT_BYTES, NCCL_STEPS};
use p2p::PeerAddr;
use std::any::Any;
use std::sync::Arc;

/// A connection's direction, seen from this rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Dir {
    Send,
    Recv,
}

/// One connection wanted: with `peer`, in direction `dir`, known to both sides by `key` (the
/// channel of a ring; for links, their base plus the connection's index).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct Want {
    pub peer: usize,
    pub dir: Dir,
    pub key: u32,
}

/// The kernel's structure of one connection made: the side `Want::dir` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Conn {
    Send(ConnSend),
    Recv(ConnRecv),
}

impl Conn {
    /// The structure as the device holds it (ConnSend and ConnRecv have one size).
    pub(crate) fn words(&self) -> [u64; 9] {
        match self {
            Conn::Send(s) => s.words(),
            Conn::Recv(r) => r.words(),
        }
    }
}

/// What a round connects, and so how each transport lays out its memory (both ends of a
/// connection lay it out alike from the same set).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Set {
    /// Every channel's ring neighbours (a want's key is its channel): `nchannels` channels,
    /// Simple slots of `slot_bytes`, and the LL and LL128 FIFOs.
    Ring { nchannels: usize, slot_bytes: usize },
    /// Send/recv or tree links: `nconns` connections per (peer, direction), keyed `key_base`
    /// up, Simple slots of `slot_bytes`, and with `ll` an LL FIFO each (network connections
    /// carry every protocol in one FIFO anyway).
    Links {
        nconns: usize,
        slot_bytes: usize,
        ll: bool,
        key_base: u32,
    },
}

/// Bytes of one link connection's Simple FIFO (`NCCL_STEPS` slots of `slot_bytes`) and of its
/// LL FIFO (`NCCL_STEPS` slots of `LL_SLOT_BYTES` with `ll`, else none).
pub(crate) fn link_fifo_bytes(slot_bytes: usize, ll: bool) -> (usize, usize) {
    let steps = NCCL_STEPS as usize;
    let ll_bytes = match ll {
        true => steps * LL_SLOT_BYTES as usize,
        false => 0,
    };
    (steps * slot_bytes, ll_bytes)
}

/// Where a round runs: this rank, its device and bootstrap, every rank's address (with the
/// transport agreed for the pair), and the network side across nodes.
pub(crate) struct Ctx<'a> {
    pub rank: usize,
    pub device: &'a Device,
    pub bootstrap: &'a Arc<Bootstrap>,
    pub peers: &'a [PeerAddr],
    pub net: Option<&'a net::NetPath>,
    /// This rank's suspendable connection memory.
    pub suspendable: &'a Arc<suspend::Suspendable>,
}

/// The memory behind connections (blocks, mappings, segments), whichever transports made it:
/// freed when this drops, so its holder decides when (a communicator leaves it to the last of
/// its members in this process, whose kernels may still reach it).
#[derive(Default)]
pub(crate) struct Resources(Vec<Box<dyn Any + Send + Sync>>);

impl Resources {
    /// Keeps `part` as long as these resources.
    pub(crate) fn hold(&mut self, part: impl Any + Send + Sync) {
        self.0.push(Box::new(part));
    }

    /// Keeps `other`'s parts too.
    pub(crate) fn take(&mut self, other: Resources) {
        self.0.extend(other.0);
    }
}

/// One transport (NCCL's `ncclTransport`). Implementations are stateless: a round's state is
/// its [`Setup`].
pub(crate) trait Transport: Sync {
    /// NCCL's `canConnect`: whether this transport carries the pair of this rank and `peer`,
    /// from the transport the communicator agreed for it ([`PeerAddr::transport`]). Exactly
    /// one transport carries each pair.
    fn can_connect(&self, peer: &PeerAddr) -> bool;

    /// NCCL's `setup`: allocates our side of each of `wants` (all carried by this
    /// transport; maybe none) and publishes what its peer needs, waiting on no peer. Called for
    /// every round on every rank, so a transport whose publication is collective joins it
    /// even with nothing to connect.
    fn setup(&self, cx: &Ctx, set: Set, wants: &[Want]) -> Result<Box<dyn Setup>>;
}

/// A transport's sides of a round, set up and published.
pub(crate) trait Setup {
    /// NCCL's `connect`: takes each peer's record and completes the connections, logging them
    /// as NCCL does.
    fn connect(self: Box<Self>, cx: &Ctx) -> Result<Made>;
}

/// What a transport (or a round) connected: each want's kernel structure, and the memory
/// behind them.
#[derive(Default)]
pub(crate) struct Made {
    pub conns: Vec<(Want, Conn)>,
    pub resources: Resources,
}

/// Every transport, in the order a round sets them up and connects them.
pub(crate) static TRANSPORTS: [&dyn Transport; 3] =
    [&p2p::P2pTransport, &shm::ShmTransport, &net::NetTransport];

/// A round whose sides every transport set up: [`Started::connect`] completes it.
pub(crate) struct Started {
    setups: Vec<Box<dyn Setup>>,
}

/// Starts a round of `set`: each transport of [`TRANSPORTS`], in order, sets up the wants it
/// carries. No peer is waited on, so several rounds (several communicators driven by one
/// thread) can all be started before any is connected.
pub(crate) fn setup(cx: &Ctx, set: Set, wants: &[Want]) -> Result<Started> {
    let carrier = |w: &Want| -> Result<usize> {
        let peer = cx
            .peers
            .get(w.peer)
            .filter(|_| w.peer != cx.rank)
            .ok_or_else(|| Error::internal(format!("a connection to rank {}", w.peer)))?;
        TRANSPORTS
            .iter()
            .position(|t| t.can_connect(peer))
            .ok_or_else(|| Error::internal(format!("no transport reaches rank {}", w.peer)))
    };
    let carriers = wants.iter().map(carrier).collect::<Result<Vec<_>>>()?;
    let mut setups = Vec::with_capacity(TRANSPORTS.len());
    for (i, t) in TRANSPORTS.iter().enumerate() {
        let mine: Vec<Want> = (wants.iter().zip(&carriers))
            .filter(|(_, &c)| c == i)
            .map(|(w, _)| *w)
            .collect();
        setups.push(t.setup(cx, set, &mine)?);
    }
    Ok(Started { setups })
}

impl Started {
    /// Connects what every transport set up, in the order of [`TRANSPORTS`].
    pub(crate) fn connect(self, cx: &Ctx) -> Result<Made> {
        let mut all = Made::default();
        for s in self.setups {
            let made = s.connect(cx)?;
            all.conns.extend(made.conns);
            all.resources.take(made.resources);
        }
        Ok(all)
    }
}

/// `wants` grouped by (peer, direction): groups in the order of their first want, each with its
/// wants in order. Both ends of a connection see the same groups from their own wants.
pub(crate) fn sides(wants: &[Want]) -> Vec<(usize, Dir, Vec<Want>)> {
    let mut out: Vec<(usize, Dir, Vec<Want>)> = Vec::new();
    for w in wants {
        match out.iter_mut().find(|(p, d, _)| *p == w.peer && *d == w.dir) {
            Some((_, _, ws)) => ws.push(*w),
            None => out.push((w.peer, w.dir, vec![*w])),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::Transport as Kind;

    #[test]
    fn exactly_one_transport_carries_each_pair() {
        for kind in [Kind::P2p, Kind::Shm, Kind::Net] {
            for same_process in [false, true] {
                let peer = PeerAddr {
                    device: 0,
                    same_process,
                    transport: kind,
                };
                let n = TRANSPORTS.iter().filter(|t| t.can_connect(&peer)).count();
                assert_eq!(n, 1, "{kind:?}");
            }
        }
    }

    #[test]
    fn wants_group_by_side() {
        let w = |peer, dir, key| Want { peer, dir, key };
        let wants = [
            w(2, Dir::Send, 0),
            w(1, Dir::Recv, 0),
            w(2, Dir::Send, 1),
            w(3, Dir::Recv, 1),
            w(1, Dir::Recv, 2),
            w(1, Dir::Send, 3),
        ];
        let got: Vec<(usize, Dir, Vec<u32>)> = sides(&wants)
            .into_iter()
            .map(|(p, d, ws)| (p, d, ws.iter().map(|w| w.key).collect()))
            .collect();
        assert_eq!(
            got,
            vec![
                (2, Dir::Send, vec![0, 1]),
                (1, Dir::Recv, vec![0, 2]),
                (3, Dir::Recv, vec![1]),
                (1, Dir::Send, vec![3]),
            ]
        );
    }
}
