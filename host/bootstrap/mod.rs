//! The out-of-band TCP network among the ranks of a communicator.
//!
//! `get_unique_id` starts a root thread listening on this host and returns the id that leads to
//! it, with a secret that never goes on the wire and keys everything below (`keys.rs`). Every
//! rank opens a listener of its own, then answers the root's challenge with a hello (nonce,
//! rank, nranks, how long it will wait, its listen address, its own challenge, a MAC). When all
//! ranks arrived the root answers each with the address of its parent in a binary gather tree
//! (MACed over the rank's challenge) and exits; the ranks gather the address table up that tree
//! and spread it down. If one rank's timeout expires first, the root tells every rank that
//! arrived how many did, and exits.
//!
//! After that, ranks talk directly: `send` opens a connection to the peer on first use and
//! keeps it; `allgather` is a ring (n−1 steps to the next rank) and `barrier` a dissemination
//! barrier (log2 n rounds), both on the same connections with channels of their own. Every wait
//! is bounded: by the init timeout during `init`, by the operation timeout afterwards
//! (`NCCL_RS_BOOTSTRAP_OP_TIMEOUT_MS`, `set_op_timeout`), and a peer that closes its
//! connection is noticed at once.
//!
//! Several roots (`ncclCommInitRankScalable`): ranks split into one contiguous block per unique
//! id (`init::RootPlan`); each block bootstraps with its own root as above, except that the root of
//! the first id also takes the first rank of every other block as an extra member. Each first
//! rank gathers its block's addresses, sends them up root 0's tree, and spreads the whole table
//! down its block. No root handles more than its block (plus one rank per other block).
//!
//! Peers that go: a rank dropping its bootstrap (`ncclCommDestroy`) first says goodbye on each
//! of its connections. A connection that ends without one means the peer died or aborted; once
//! a communicator watches (`Bootstrap::watch`), the rank that sees it reports it to the communicator
//! (its async error, the kernels' abort flag) and tells every other rank, so ranks that never
//! talked to the dead one learn of it too; waits on a dead rank and every allgather and
//! barrier then fail at once.
//!
//! Every wait can be cut short by an [`AbortFlag`] (`init_with`, `init_scalable`): setting it
//! shuts down the sockets the rank is blocked on.
//!
//! Environment read here (through `crate::env`): `NCCL_COMM_ID` (`get_unique_id`),
//! `NCCL_SOCKET_IFNAME` and `NCCL_SOCKET_FAMILY` (which interface and address family the root
//! listens on), `NCCL_SOCKET_RETRY_CNT` and `NCCL_SOCKET_RETRY_SLEEP_MSEC` (connect retries),
//! `NCCL_UID_STAGGER_THRESHOLD` and `NCCL_UID_STAGGER_RATE` (hello pacing).

mod abort;
mod doorway;
mod faults;
mod id;
mod init;
mod keys;
mod p2p;
mod ras;
mod root;
pub(crate) mod socket;
mod wire;

#[cfg(test)]
mod tests;
#[cfg(test)]
use init::RootPlan;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub use abort::AbortFlag;
#[cfg(feature = "internals")]
pub use id::new_local_root_id;
#[cfg(not(feature = "internals"))]
pub(crate) use id::new_local_root_id;
pub use id::{get_unique_id, new_root_id, UniqueId, UNIQUE_ID_BYTES};

use crate::error::{Error, Result};
use crate::sockets;
pub(crate) use p2p::Fault;
use p2p::{lock, Outgoing, Shared};
pub(crate) use ras::RasReply;
use wire::Channel;

/// Default bound of every wait after `init` (and never less than the init timeout), unless
/// `NCCL_RS_BOOTSTRAP_OP_TIMEOUT_MS` says otherwise.
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(300);

/// The bound of every wait after `init`: `NCCL_RS_BOOTSTRAP_OP_TIMEOUT_MS` when set (NCCL has
/// no such variable: its bootstrap waits without a deadline), else the larger of
/// [`DEFAULT_OP_TIMEOUT`] and the init timeout.
pub fn op_timeout_from_env(init_timeout: Duration) -> Duration {
    match crate::env::RS_BOOTSTRAP_OP_TIMEOUT_MS.raw() {
        Some(_) => {
            Duration::from_millis(crate::env::RS_BOOTSTRAP_OP_TIMEOUT_MS.int().max(1) as u64)
        }
        None => init_timeout.max(DEFAULT_OP_TIMEOUT),
    }
}
/// The longest [`Bootstrap::send_unless_gone`] waits for a new connection to open.
pub const NOTICE_CONNECT: Duration = Duration::from_secs(5);

/// Extra time a rank gives the root to deliver its verdict after the rank's own timeout (the
/// root counts from the hello's arrival, slightly later than the rank started counting).
const ROOT_GRACE: Duration = Duration::from_secs(1);
/// How long an abort after a fault waits for its notices of that fault to reach the others.
const NOTICE_GRACE: Duration = Duration::from_secs(1);

/// One rank's end of the bootstrap network. Send + Sync: any thread may call any method.
pub struct Bootstrap {
    shared: Arc<Shared>,
    /// Every rank's listen address, by rank.
    peers: Vec<SocketAddr>,
    /// One lazily opened connection per peer; the lock keeps frames to one peer in order.
    out: Vec<Mutex<Option<Outgoing>>>,
    /// Serialises allgather and barrier: their frames carry no sequence number, so two of them
    /// running at once on one rank would take each other's messages.
    collective: Mutex<()>,
    op_timeout_ms: AtomicU64,
    /// Fault notices still being sent to the other ranks: abort lets them finish (briefly)
    /// before it closes the sockets, so the news of the dead rank gets out.
    notices: (Mutex<usize>, Condvar),
    /// Closes this bootstrap when the init's abort flag is set.
    _abort_hook: abort::HookGuard,
}

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Bootstrap>();
};

impl Bootstrap {
    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    pub fn nranks(&self) -> usize {
        self.shared.nranks
    }

    /// The listen address of every rank, by rank.
    pub fn peer_addresses(&self) -> Vec<SocketAddr> {
        self.peers.clone()
    }

    /// Bound of every wait from now on (default: [`op_timeout_from_env`]).
    pub fn set_op_timeout(&self, timeout: Duration) {
        self.op_timeout_ms
            .store(socket::millis(timeout).max(1), Ordering::Relaxed);
    }

    /// Most bytes one peer may have waiting unread here (default: `NCCL_RS_BOOTSTRAP_QUEUE_BYTES`).
    #[cfg(test)]
    pub(crate) fn set_queue_budget(&self, bytes: usize) {
        self.shared.set_queue_budget(bytes);
    }

    fn op_timeout(&self) -> Duration {
        Duration::from_millis(self.op_timeout_ms.load(Ordering::Relaxed).max(1))
    }

    fn check_peer(&self, peer: usize) -> Result<()> {
        if peer < self.nranks() {
            Ok(())
        } else {
            Err(Error::invalid_argument(format!(
                "bootstrap: peer {peer} is out of range for {} ranks",
                self.nranks()
            )))
        }
    }

    fn send_on(&self, peer: usize, channel: Channel, tag: u32, data: &[u8]) -> Result<()> {
        self.send_inner(peer, channel, tag, data, false).map(|_| ())
    }

    /// Sends one frame; `notice`: a message a gone peer no longer needs, not sent (false) to a
    /// peer that said goodbye or is known gone, whose listener refuses a connection, or whose
    /// connection is found closed by the write, each answered at once.
    fn send_inner(
        &self,
        peer: usize,
        channel: Channel,
        tag: u32,
        data: &[u8],
        notice: bool,
    ) -> Result<bool> {
        self.shared.check_open()?;
        if peer == self.rank() {
            self.shared.deliver(peer, channel, tag, data.to_vec());
            return Ok(true);
        }
        if notice && self.shared.left_or_gone(peer) {
            return Ok(false);
        }
        let frame = wire::encode_data(channel, tag, data)?;
        let timeout = self.op_timeout();
        let mut slot = lock(&self.out[peer]);
        let conn = match &mut *slot {
            Some(c) => c,
            empty if notice => {
                let deadline = sockets::deadline_after(timeout.min(NOTICE_CONNECT));
                let addr = self.peers[peer];
                match Outgoing::open_to_live(&self.shared, peer, addr, deadline)? {
                    Some(c) => empty.insert(c),
                    None => return Ok(false),
                }
            }
            empty => empty.insert(Outgoing::open(
                &self.shared,
                peer,
                self.peers[peer],
                sockets::deadline_after(timeout),
            )?),
        };
        if let Err(e) = conn.write(&frame, timeout) {
            if let Some(c) = slot.take() {
                c.discard(&self.shared);
            }
            self.shared.check_open()?;
            let closed = matches!(
                e.kind(),
                std::io::ErrorKind::BrokenPipe
                    | std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::ConnectionAborted
            );
            if notice && closed {
                return Ok(false);
            }
            let what = if socket::is_timeout(&e) {
                format!("timed out after {} ms", timeout.as_millis())
            } else {
                e.to_string()
            };
            return Err(Error::remote(format!(
                "bootstrap rank {}: sending to rank {peer} failed: {what}",
                self.rank()
            )));
        }
        Ok(true)
    }

    fn recv_on(&self, peer: usize, channel: Channel, tag: u32) -> Result<Vec<u8>> {
        let deadline = sockets::deadline_after(self.op_timeout());
        self.shared.take(peer, channel, tag, deadline)
    }

    /// Sends `data` to `peer`; messages to one peer with one tag arrive in order.
    pub fn send(&self, peer: usize, tag: u32, data: &[u8]) -> Result<()> {
        self.check_peer(peer)?;
        self.send_on(peer, Channel::User, tag, data)
    }

    /// Sends `data` to `peer` as [`Bootstrap::send`] does, unless the peer is gone: then
    /// nothing is sent and the answer (false) comes at once, without the connect retries of
    /// `send` (a peer that said goodbye or is known gone; one whose listener refuses a
    /// connection, which after init means its process exited or dropped its bootstrap; one
    /// whose connection the write finds closed). For notices that only a live peer needs, such
    /// as the withdrawal of a registered buffer. A new connection is given at most
    /// [`NOTICE_CONNECT`] (a host that answers nothing).
    pub fn send_unless_gone(&self, peer: usize, tag: u32, data: &[u8]) -> Result<bool> {
        self.check_peer(peer)?;
        self.send_inner(peer, Channel::User, tag, data, true)
    }

    /// The next message `peer` sent with `tag`.
    pub fn recv(&self, peer: usize, tag: u32) -> Result<Vec<u8>> {
        self.check_peer(peer)?;
        self.shared.check_open()?;
        self.recv_on(peer, Channel::User, tag)
    }

    /// The next message `peer` sent with `tag` if one is here, without waiting.
    pub fn try_recv(&self, peer: usize, tag: u32) -> Result<Option<Vec<u8>>> {
        self.check_peer(peer)?;
        Ok(self.shared.try_take(peer, Channel::User, tag))
    }

    /// Every rank's `mine`, by rank (lengths may differ). A ring: at step s each rank passes on
    /// the contribution it received at step s−1, tagged with its origin rank.
    pub fn allgather(&self, mine: &[u8]) -> Result<Vec<Vec<u8>>> {
        self.shared.check_open()?;
        if mine.len() > wire::MAX_PAYLOAD {
            return Err(Error::invalid_argument(format!(
                "bootstrap allgather of {} bytes exceeds the limit of {} bytes",
                mine.len(),
                wire::MAX_PAYLOAD
            )));
        }
        let _one_at_a_time = lock(&self.collective);
        self.shared.check_all_alive("allgather")?;
        let (n, r) = (self.nranks(), self.rank());
        let mut all = vec![Vec::new(); n];
        all[r] = mine.to_vec();
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        for step in 0..n.saturating_sub(1) {
            let send_idx = (r + n - step) % n;
            let recv_idx = (r + n - step - 1) % n;
            self.send_on(next, Channel::Allgather, send_idx as u32, &all[send_idx])?;
            all[recv_idx] = self.recv_on(prev, Channel::Allgather, recv_idx as u32)?;
        }
        Ok(all)
    }

    /// Returns once every rank called `barrier`.
    pub fn barrier(&self) -> Result<()> {
        self.shared.check_open()?;
        let _one_at_a_time = lock(&self.collective);
        self.shared.check_all_alive("barrier")?;
        let (n, r) = (self.nranks(), self.rank());
        let (mut dist, mut round) = (1usize, 0u32);
        while dist < n {
            self.send_on((r + dist) % n, Channel::Barrier, round, &[])?;
            self.recv_on((r + n - dist) % n, Channel::Barrier, round)?;
            dist *= 2;
            round += 1;
        }
        Ok(())
    }
}

impl Drop for Bootstrap {
    fn drop(&mut self) {
        self.shared.clear_watcher();
        self.say_goodbye();
        self.shared.close("closed");
    }
}

impl std::fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bootstrap(rank {} of {})", self.rank(), self.nranks())
    }
}
