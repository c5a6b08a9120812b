//! The out-of-band TCP network among the ranks of a communicator.
//!
//! `get_unique_id` starts a root thread listening on this host and returns the id that leads to
//! it. Every rank opens a listener of its own, then calls the root with a hello (magic, version,
//! nonce, rank, nranks, how long it will wait, its listen address). When all ranks arrived the
//! root sends each of them the table of listen addresses and exits; if one rank's timeout
//! expires first, the root tells every rank that arrived how many did, and exits.
//!
//! After that, ranks talk directly: `send` opens a connection to the peer on first use and
//! keeps it; `allgather` is a ring (n−1 steps to the next rank) and `barrier` a dissemination
//! barrier (log2 n rounds), both on the same connections with channels of their own. Every wait
//! is bounded: by the init timeout during `init`, by the operation timeout afterwards
//! (`set_op_timeout`), and a peer that closes its connection is noticed at once.
//!
//! Environment read here: `NCCL_COMM_ID` (`get_unique_id`) and `NCCL_SOCKET_IFNAME` (which
//! interface the root listens on).

mod id;
mod p2p;
mod root;
mod socket;
mod wire;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

pub use id::{get_unique_id, new_root_id, UniqueId, UNIQUE_ID_BYTES};

use crate::error::{Error, Result};
use p2p::{lock, Outgoing, Shared};
use wire::Channel;

/// Default bound of every wait after `init` (and never less than the init timeout).
pub const DEFAULT_OP_TIMEOUT: Duration = Duration::from_secs(300);
/// Extra time a rank gives the root to deliver its verdict after the rank's own timeout (the
/// root counts from the hello's arrival, slightly later than the rank started counting).
const ROOT_GRACE: Duration = Duration::from_secs(1);

/// One rank's end of the bootstrap network. Send + Sync: any thread may call any method.
pub struct Bootstrap {
    shared: std::sync::Arc<Shared>,
    peers: Vec<SocketAddr>,
    /// One lazily opened connection per peer; the lock keeps frames to one peer in order.
    out: Vec<Mutex<Option<Outgoing>>>,
    /// Serialises allgather and barrier: their frames carry no sequence number, so two of them
    /// running at once on one rank would take each other's messages.
    collective: Mutex<()>,
    op_timeout_ms: AtomicU64,
}

const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Bootstrap>();
};

impl Bootstrap {
    /// Joins the bootstrap of `id` as `rank` of `nranks`; every rank calls this with the same
    /// id and nranks, and it returns when all of them arrived. If they do not all arrive within
    /// `timeout`, every rank that did returns an error saying how many came.
    pub fn init(id: &UniqueId, rank: usize, nranks: usize, timeout: Duration) -> Result<Bootstrap> {
        let deadline = socket::deadline_after(timeout);
        let fields = id.fields()?;
        if nranks == 0 || nranks > wire::MAX_RANKS {
            return Err(Error::invalid_argument(format!(
                "bootstrap: nranks {nranks} is not in 1..={}",
                wire::MAX_RANKS
            )));
        }
        if rank >= nranks {
            return Err(Error::invalid_argument(format!(
                "bootstrap: rank {rank} is out of range for {nranks} ranks"
            )));
        }
        if fields.flags & id::FLAG_ROOT_AT_INIT != 0 && rank == 0 {
            let l = socket::listen(fields.root, true).map_err(|e| {
                Error::system(format!(
                    "bootstrap: cannot start the root on {} (NCCL_COMM_ID): {e}",
                    fields.root
                ))
            })?;
            root::spawn(l, fields.root, fields.nonce)?;
        }
        let ip = socket::local_ip_toward(fields.root.ip());
        let listener = socket::listen(SocketAddr::new(ip, 0), false).map_err(|e| {
            Error::system(format!("bootstrap rank {rank}: cannot listen on {ip}: {e}"))
        })?;
        let me = socket::local_addr(&listener)
            .map_err(|e| Error::system(format!("bootstrap rank {rank}: no local address: {e}")))?;
        let shared = Shared::start(rank, nranks, fields.nonce, listener)?;
        // From here on, dropping `bs` on an error path closes what was opened.
        let mut bs = Bootstrap {
            shared,
            peers: Vec::new(),
            out: (0..nranks).map(|_| Mutex::new(None)).collect(),
            collective: Mutex::new(()),
            op_timeout_ms: AtomicU64::new(socket::millis(timeout.max(DEFAULT_OP_TIMEOUT))),
        };
        log::debug!(
            "bootstrap rank {rank}/{nranks}: listening on {me}, root at {}",
            fields.root
        );
        bs.peers = exchange_with_root(fields.root, fields.nonce, rank, nranks, me, deadline)?;
        if nranks > 1 {
            // The ring connection now, so that a broken peer shows at init and the first
            // allgather does not pay for it.
            let next = (rank + 1) % nranks;
            let at_least = socket::deadline_after(ROOT_GRACE);
            let mut slot = lock(&bs.out[next]);
            *slot = Some(Outgoing::open(
                &bs.shared,
                next,
                bs.peers[next],
                deadline.max(at_least),
            )?);
        }
        Ok(bs)
    }

    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    pub fn nranks(&self) -> usize {
        self.shared.nranks
    }

    /// The listen address of every rank, by rank.
    pub fn peer_addresses(&self) -> &[SocketAddr] {
        &self.peers
    }

    /// Bound of every wait from now on (default: the larger of `DEFAULT_OP_TIMEOUT` and the
    /// init timeout).
    pub fn set_op_timeout(&self, timeout: Duration) {
        self.op_timeout_ms
            .store(socket::millis(timeout).max(1), Ordering::Relaxed);
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
        self.shared.check_open()?;
        if peer == self.rank() {
            self.shared.deliver(peer, channel, tag, data.to_vec());
            return Ok(());
        }
        let frame = wire::encode_data(channel, tag, data)?;
        let timeout = self.op_timeout();
        let mut slot = lock(&self.out[peer]);
        let conn = match &mut *slot {
            Some(c) => c,
            empty => empty.insert(Outgoing::open(
                &self.shared,
                peer,
                self.peers[peer],
                socket::deadline_after(timeout),
            )?),
        };
        if let Err(e) = conn.write(&frame, timeout) {
            if let Some(c) = slot.take() {
                c.discard(&self.shared);
            }
            self.shared.check_open()?;
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
        Ok(())
    }

    fn recv_on(&self, peer: usize, channel: Channel, tag: u32) -> Result<Vec<u8>> {
        let deadline = socket::deadline_after(self.op_timeout());
        self.shared.take(peer, channel, tag, deadline)
    }

    /// Sends `data` to `peer`; messages to one peer with one tag arrive in order.
    pub fn send(&self, peer: usize, tag: u32, data: &[u8]) -> Result<()> {
        self.check_peer(peer)?;
        self.send_on(peer, Channel::User, tag, data)
    }

    /// The next message `peer` sent with `tag`.
    pub fn recv(&self, peer: usize, tag: u32) -> Result<Vec<u8>> {
        self.check_peer(peer)?;
        self.shared.check_open()?;
        self.recv_on(peer, Channel::User, tag)
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

    /// Closes every socket of this rank; waiting and later calls fail instead of hanging.
    pub fn abort(&self) {
        self.shared.close("aborted");
    }
}

impl Drop for Bootstrap {
    fn drop(&mut self) {
        self.shared.close("closed");
    }
}

impl std::fmt::Debug for Bootstrap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bootstrap(rank {} of {})", self.rank(), self.nranks())
    }
}

/// The hello to the root and its answer: the address table, or why there is none.
fn exchange_with_root(
    root: SocketAddr,
    nonce: u64,
    rank: usize,
    nranks: usize,
    me: SocketAddr,
    deadline: Instant,
) -> Result<Vec<SocketAddr>> {
    let stream = socket::connect(root, deadline, || false).map_err(|e| {
        Error::remote(format!(
            "bootstrap rank {rank}: cannot reach the root at {root}: {e}"
        ))
    })?;
    let hello = wire::Hello {
        nonce,
        rank: rank as u32,
        nranks: nranks as u32,
        timeout_ms: socket::millis(deadline.saturating_duration_since(Instant::now())),
        listen: me,
    };
    let late = deadline + ROOT_GRACE;
    socket::write_frame(&stream, &wire::encode_hello(&hello), late).map_err(|e| {
        Error::remote(format!(
            "bootstrap rank {rank}: cannot talk to the root at {root}: {e}"
        ))
    })?;
    let body = socket::read_frame(&stream, wire::answer_body_max(nranks), late).map_err(|e| {
        if socket::is_timeout(&e) {
            Error::remote(format!(
                "bootstrap rank {rank}: no answer from the root at {root} in time \
                 (not all {nranks} ranks arrived?)"
            ))
        } else {
            Error::remote(format!(
                "bootstrap rank {rank}: lost the root at {root}: {e}"
            ))
        }
    })?;
    match wire::decode(&body)? {
        wire::Msg::Table { nonce: n, addrs } if n == nonce && addrs.len() == nranks => Ok(addrs),
        wire::Msg::Fail { code, message } => Err(Error::new(
            code,
            format!("bootstrap rank {rank}: {message}"),
        )),
        _ => Err(Error::remote(format!(
            "bootstrap rank {rank}: the root at {root} answered nonsense"
        ))),
    }
}
