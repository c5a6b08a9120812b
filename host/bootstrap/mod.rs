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
//! (`NCCL_RS_BOOTSTRAP_OP_TIMEOUT_MS`, `set_op_timeout`), and a peer that closes its
//! connection is noticed at once.
//!
//! Several roots (`ncclCommInitRankScalable`): ranks split into one contiguous block per unique
//! id ([`RootPlan`]); each block bootstraps with its own root as above, except that the root of
//! the first id also takes the first rank of every other block as an extra member. Rank 0 thus
//! learns every block's first rank and they learn rank 0; they send rank 0 their block's table,
//! rank 0 sends the complete table back, and each first rank forwards it within its block. No
//! root handles more than its block (plus one rank per other block).
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
mod id;
mod keys;
mod p2p;
mod ras;
mod root;
pub(crate) mod socket;
mod wire;

#[cfg(test)]
mod tests;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub use abort::AbortFlag;
#[cfg(feature = "internals")]
pub use id::new_local_root_id;
#[cfg(not(feature = "internals"))]
pub(crate) use id::new_local_root_id;
pub(crate) use id::random_nonce;
pub use id::{get_unique_id, new_root_id, UniqueId, UNIQUE_ID_BYTES};

use crate::error::{Error, Result};
pub(crate) use p2p::Fault;
use p2p::{lock, Outgoing, Shared};
use wire::{Channel, Member};

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
    /// Every rank's listen address and the key of its pair with this rank, by rank (this
    /// rank's own entry: key 0).
    peers: Vec<Member>,
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
    /// The block-pair secrets this rank received at a several-root init (tests ask what a
    /// member could derive keys from).
    #[cfg(test)]
    setup_secrets: Mutex<Vec<keys::Secret>>,
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
        Bootstrap::init_scalable(
            std::slice::from_ref(id),
            rank,
            nranks,
            timeout,
            &AbortFlag::new(),
        )
    }

    /// `init`, stopped promptly (with an error) when `abort` is set.
    pub fn init_with(
        id: &UniqueId,
        rank: usize,
        nranks: usize,
        timeout: Duration,
        abort: &AbortFlag,
    ) -> Result<Bootstrap> {
        Bootstrap::init_scalable(std::slice::from_ref(id), rank, nranks, timeout, abort)
    }

    /// Joins a bootstrap served by several roots, one per id (`ncclCommInitRankScalable`):
    /// every rank passes the same ids, and rank r talks to the root of id
    /// [`RootPlan::block_of`]`(r)` — ranks split into `ids.len()` contiguous blocks, the first
    /// `nranks % ids.len()` one rank larger, as NCCL documents. See the module text for how the
    /// blocks' tables are merged. With one id this is the ordinary bootstrap.
    pub fn init_scalable(
        ids: &[UniqueId],
        rank: usize,
        nranks: usize,
        timeout: Duration,
        abort: &AbortFlag,
    ) -> Result<Bootstrap> {
        let deadline = socket::deadline_after(timeout);
        if ids.is_empty() {
            return Err(Error::invalid_argument("bootstrap: no unique id given"));
        }
        let fields: Vec<id::IdFields> = ids.iter().map(|i| i.fields()).collect::<Result<_>>()?;
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
        // An NCCL_COMM_ID id names one fixed root: several of them would all be that root.
        let nids = if fields[0].flags & id::FLAG_ROOT_AT_INIT != 0 {
            1
        } else {
            ids.len()
        };
        if nids > nranks {
            return Err(Error::invalid_argument(format!(
                "bootstrap: {nids} unique ids for only {nranks} ranks (at most one id per rank)"
            )));
        }
        abort.check()?;
        let plan = RootPlan::new(nranks, nids);
        let block = plan.block_of(rank);
        let local = rank - plan.start(block);
        let (f0, fk) = (fields[0], fields[block]);
        if f0.flags & id::FLAG_ROOT_AT_INIT != 0 && rank == 0 {
            let l = socket::listen(f0.root, true).map_err(|e| {
                Error::system(format!(
                    "bootstrap: cannot start the root on {} (NCCL_COMM_ID): {e}",
                    f0.root
                ))
            })?;
            root::spawn(l, f0.root, f0.nonce)?;
        }
        let ip = socket::local_ip_toward(fk.root.ip());
        let listener = socket::listen(SocketAddr::new(ip, 0), false).map_err(|e| {
            Error::system(format!("bootstrap rank {rank}: cannot listen on {ip}: {e}"))
        })?;
        let me = Member {
            addr: socket::local_addr(&listener).map_err(|e| {
                Error::system(format!("bootstrap rank {rank}: no local address: {e}"))
            })?,
            key: 0,
        };
        // The first id's nonce names the whole bootstrap: every rank knows it.
        let shared = Shared::start(rank, nranks, f0.nonce, listener)?;
        let closer = shared.clone();
        let hook = abort.hook(move || closer.close("aborted"));
        // From here on, dropping `bs` on an error path closes what was opened.
        let mut bs = Bootstrap {
            shared,
            peers: vec![me; nranks],
            out: (0..nranks).map(|_| Mutex::new(None)).collect(),
            collective: Mutex::new(()),
            op_timeout_ms: AtomicU64::new(socket::millis(op_timeout_from_env(timeout))),
            notices: (Mutex::new(0), Condvar::new()),
            _abort_hook: hook,
            #[cfg(test)]
            setup_secrets: Mutex::new(Vec::new()),
        };
        log::debug!(
            "bootstrap rank {rank}/{nranks}: listening on {}, root at {} ({nids} roots)",
            me.addr,
            fk.root
        );
        stagger(plan.size(block), local, abort)?;
        let peers = if nids == 1 {
            exchange_with_root(f0.root, f0.nonce, rank, nranks, me.addr, deadline, abort)?
        } else {
            bs.merge_tables(&fields, &plan, me.addr, deadline, abort)?
        };
        if peers.len() != nranks || peers[rank] != me {
            return Err(Error::remote(format!(
                "bootstrap rank {rank}: the address table does not list this rank at {}",
                me.addr
            )));
        }
        bs.shared.learn(
            peers
                .iter()
                .enumerate()
                .filter(|&(r, _)| r != rank)
                .map(|(r, m)| (r, m.key)),
        );
        bs.peers = peers;
        if nranks > 1 {
            // The ring connection now, so that a broken peer shows at init and the first
            // allgather does not pay for it.
            let next = (rank + 1) % nranks;
            let at_least = socket::deadline_after(ROOT_GRACE);
            let mut slot = lock(&bs.out[next]);
            if slot.is_none() {
                *slot = Some(Outgoing::open(
                    &bs.shared,
                    next,
                    bs.peers[next].addr,
                    deadline.max(at_least),
                )?);
            }
        }
        Ok(bs)
    }

    /// The address table of a bootstrap with several roots. Each block's root serves its block
    /// as an ordinary bootstrap; the root of id 0 also serves the leaders (first ranks) of the
    /// other blocks, as extra ranks after block 0's. So rank 0 learns every leader, and every
    /// leader rank 0. Leaders send rank 0 their block's addresses; rank 0 sends the whole
    /// address table to block 0 and to the leaders, and each leader forwards it to its block.
    ///
    /// Keys: a pair in one block has its key from that block's root, a pair of root 0's ranks
    /// (block 0 and the leaders) from root 0; these keys never leave the two ranks. Any other
    /// pair (two blocks, not both served by root 0) has a key derived from the secret of its
    /// two blocks, which rank 0 draws: rank 0 keys block 0's members and sends each leader its
    /// block's secrets, with which the leader keys its members. A member gets the keys of its
    /// own pairs only, so no member can derive another's; rank 0 and the leaders can.
    fn merge_tables(
        &mut self,
        fields: &[id::IdFields],
        plan: &RootPlan,
        me: SocketAddr,
        deadline: Instant,
        abort: &AbortFlag,
    ) -> Result<Vec<Member>> {
        const TAG_BLOCK: u32 = 1;
        const TAG_FULL: u32 = 2;
        let (rank, nranks) = (self.rank(), self.nranks());
        let nids = plan.nids;
        let block = plan.block_of(rank);
        let (start, size) = (plan.start(block), plan.size(block));
        let local = rank - start;
        let n0 = plan.size(0);
        let guests = nids - 1;
        // Root 0's ranks: block 0, then the leader of every other block.
        let root0_rank = |i: usize| if i < n0 { i } else { plan.start(i - n0 + 1) };
        let f = fields[block];
        let own_n = if block == 0 { n0 + guests } else { size };
        // known[r]: rank r's address and the key of our pair came from a root.
        let mut known = vec![false; nranks];
        let table = exchange_with_root(f.root, f.nonce, local, own_n, me, deadline, abort)?;
        for (i, m) in table.iter().enumerate() {
            let r = if block == 0 { root0_rank(i) } else { start + i };
            self.peers[r] = *m;
            known[r] = true;
        }
        if block != 0 && local == 0 {
            let f0 = fields[0];
            let guest = n0 + block - 1;
            let t0 =
                exchange_with_root(f0.root, f0.nonce, guest, n0 + guests, me, deadline, abort)?;
            for (i, m) in t0.iter().enumerate() {
                let r = root0_rank(i);
                if r != rank {
                    self.peers[r] = *m;
                    known[r] = true;
                }
            }
        }
        // Greetings from these ranks are checked while the tables are merged.
        self.shared.learn(
            (0..nranks)
                .filter(|&r| known[r] && r != rank)
                .map(|r| (r, self.peers[r].key)),
        );
        // The key of each of `r`'s pairs, by rank, from the secrets of its block's pairs.
        let keys_of = |r: usize, row: &[keys::Secret]| -> Vec<u64> {
            (0..nranks)
                .map(|x| keys::pair_key(row[plan.block_of(x)], r, x))
                .collect()
        };
        let (addrs, mine) = if rank == 0 {
            let mut addrs: Vec<SocketAddr> = self.peers.iter().map(|m| m.addr).collect();
            for j in 1..nids {
                let b = self
                    .shared
                    .take(plan.start(j), Channel::Setup, TAG_BLOCK, deadline)?;
                let (t, _) = wire::decode_setup(&b, plan.size(j), 0)?;
                addrs[plan.start(j)..plan.start(j) + plan.size(j)].copy_from_slice(&t);
            }
            let s0 = keys::Secret::draw()?;
            let row_of = |b: usize| -> Vec<keys::Secret> {
                (0..nids)
                    .map(|c| keys::block_pair_secret(s0, b, c))
                    .collect()
            };
            // Block 0's members get their own keys; a leader gets its block's secrets, to key
            // its members the same way.
            let row0 = row_of(0);
            for r in 1..n0 {
                let msg = wire::encode_setup(&addrs, &keys_of(r, &row0));
                self.send_on(r, Channel::Setup, TAG_FULL, &msg)?;
            }
            for j in 1..nids {
                let words: Vec<u64> = row_of(j).iter().flat_map(|s| s.0).collect();
                let msg = wire::encode_setup(&addrs, &words);
                self.send_on(plan.start(j), Channel::Setup, TAG_FULL, &msg)?;
            }
            (addrs, keys_of(0, &row0))
        } else if local == 0 {
            let mine: Vec<SocketAddr> = self.peers[start..start + size]
                .iter()
                .map(|m| m.addr)
                .collect();
            self.send_on(
                0,
                Channel::Setup,
                TAG_BLOCK,
                &wire::encode_setup(&mine, &[]),
            )?;
            let b = self.shared.take(0, Channel::Setup, TAG_FULL, deadline)?;
            let (addrs, words) = wire::decode_setup(&b, nranks, 2 * nids)?;
            let row: Vec<keys::Secret> = words
                .chunks_exact(2)
                .map(|w| keys::Secret([w[0], w[1]]))
                .collect();
            for r in start + 1..start + size {
                let msg = wire::encode_setup(&addrs, &keys_of(r, &row));
                self.send_on(r, Channel::Setup, TAG_FULL, &msg)?;
            }
            #[cfg(test)]
            lock(&self.setup_secrets).extend_from_slice(&row);
            (addrs, keys_of(rank, &row))
        } else {
            let b = self
                .shared
                .take(start, Channel::Setup, TAG_FULL, deadline)?;
            wire::decode_setup(&b, nranks, nranks)?
        };
        let mut derived = Vec::with_capacity(nranks);
        for r in 0..nranks {
            if known[r] {
                // What a root said wins, and the relayed table must agree with it.
                if addrs[r] != self.peers[r].addr {
                    return Err(Error::remote(format!(
                        "bootstrap rank {rank}: the merged table puts rank {r} at {}, its root \
                         at {}",
                        addrs[r], self.peers[r].addr
                    )));
                }
                continue;
            }
            let key = mine[r];
            self.peers[r] = Member {
                addr: addrs[r],
                key,
            };
            derived.push((r, key));
        }
        self.shared.learn(derived);
        Ok(self.peers.clone())
    }

    pub fn rank(&self) -> usize {
        self.shared.rank
    }

    pub fn nranks(&self) -> usize {
        self.shared.nranks
    }

    /// The listen address of every rank, by rank.
    pub fn peer_addresses(&self) -> Vec<SocketAddr> {
        self.peers.iter().map(|m| m.addr).collect()
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
                let deadline = socket::deadline_after(timeout.min(NOTICE_CONNECT));
                let addr = self.peers[peer].addr;
                match Outgoing::open_to_live(&self.shared, peer, addr, deadline)? {
                    Some(c) => empty.insert(c),
                    None => return Ok(false),
                }
            }
            empty => empty.insert(Outgoing::open(
                &self.shared,
                peer,
                self.peers[peer].addr,
                socket::deadline_after(timeout),
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
        let deadline = socket::deadline_after(self.op_timeout());
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

    /// Closes every socket of this rank; waiting and later calls fail instead of hanging.
    /// No goodbye, so the peers take this rank for gone, as if its process had died — unless
    /// it aborts because of a fault (`after_fault`: its communicator already holds an error, or
    /// a peer is known gone): then the notices of that fault go out first, and it says goodbye,
    /// so that survivors keep naming the rank that really failed, not the first one to abort
    /// after it.
    pub fn abort(&self, after_fault: bool) {
        self.shared.clear_watcher();
        if after_fault || self.shared.any_gone() {
            self.finish_notices(NOTICE_GRACE);
            self.say_goodbye();
        }
        self.shared.close("aborted");
    }

    /// Waits, at most `grace`, for the fault notices being sent (`tell_everyone`).
    fn finish_notices(&self, grace: Duration) {
        let (count, done) = &self.notices;
        let until = Instant::now() + grace;
        let mut n = lock(count);
        while *n > 0 {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                log::debug!("rank {}: {} fault notices unsent at abort", self.rank(), *n);
                return;
            }
            n = done
                .wait_timeout(n, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    /// From now on, a peer that goes without a goodbye (its process died, it aborted, its host
    /// vanished and keepalive gave up) is reported to `on_fault`, once per peer, and to every
    /// other rank: a rank that sees a peer's connection end tells everyone, so ranks that had
    /// no connection to the dead one learn of it too. Waits on a dead rank, and every allgather
    /// and barrier, then fail at once. `on_fault` runs on a bootstrap thread.
    pub(crate) fn watch(self: &Arc<Self>, on_fault: impl Fn(Error) + Send + Sync + 'static) {
        let me = self.rank();
        let this = Arc::downgrade(self);
        self.shared.set_watcher(Arc::new(move |f: Fault| {
            let bs = this.upgrade();
            let at = bs
                .as_ref()
                .and_then(|b| b.peers.get(f.dead))
                .map(|m| format!(" (bootstrap at {})", m.addr))
                .unwrap_or_default();
            let err = match f.reported_by {
                None if f.hung => Error::remote(format!("rank {me}: {}{at}", f.why)),
                None => Error::remote(format!(
                    "rank {me}: peer rank {}{at} is gone (process died or aborted, or its host \
                     stopped answering): {}",
                    f.dead, f.why
                )),
                Some(by) => Error::remote(format!(
                    "rank {me}: peer rank {}{at} is gone, as rank {by} saw: {}",
                    f.dead, f.why
                )),
            };
            // The notices first: `on_fault` may lead to an abort, which lets them finish.
            if let (None, Some(bs)) = (f.reported_by, bs) {
                bs.tell_everyone(f);
            }
            on_fault(err);
        }));
    }

    /// Why `peer` is known to be gone (it died, aborted, or was reported hung), if it is.
    pub(crate) fn gone(&self, peer: usize) -> Option<String> {
        self.shared.gone(peer)
    }

    /// Another layer (the network transport) found `peer` failed: it is recorded as gone, as if
    /// its bootstrap connection had ended, and every other rank is told (once). The watcher is
    /// not called: the layer that saw it reports its own, more precise error.
    pub(crate) fn peer_failed(self: &Arc<Self>, peer: usize, why: &str) {
        if peer == self.rank() || peer >= self.nranks() {
            return;
        }
        if self.shared.mark_gone(peer, why) {
            self.clone().tell_everyone(Fault {
                dead: peer,
                hung: false,
                reported_by: None,
                why: why.to_string(),
            });
        }
    }

    /// From now on, until this bootstrap closes, a thread sends a heartbeat to the ring
    /// successor every `after` / 4 (at most 5 s), and watches the ring predecessor's: when none
    /// came for `after` while `busy()` (an operation of the communicator is outstanding), the
    /// predecessor is reported as a fault ("rank N has not responded for T s"), as one whose
    /// connection ended (`watch`): the communicator's async error and kernel abort flag here,
    /// a notice to every other rank. This catches a rank whose process is stopped (SIGSTOP, a
    /// debugger) or wholly stuck, which keeps its connections open and its kernel answering
    /// TCP, so nothing else sees it. The heartbeats are sent and read by threads of their own,
    /// so an application thread that is merely slow (or blocked in a collective) never trips it.
    /// A predecessor is watched only once its first heartbeat came (it watches too); a
    /// pause of this rank's own thread (this process stopped) restarts the count.
    ///
    /// Only the successor watches, and it may have nothing outstanding while another rank
    /// waits on the silent one (a receive from it, or a group the successor is not in). So a
    /// successor that is not busy reports the silence too, after `2 × after`: any rank waiting
    /// on a stopped rank learns of it within twice the bound, and a stopped rank is a fault
    /// after `2 × after` even where nobody waits.
    pub(crate) fn watch_hangs(
        self: &Arc<Self>,
        after: Duration,
        busy: impl Fn() -> bool + Send + 'static,
    ) {
        let (n, r) = (self.nranks(), self.rank());
        if n < 2 || after.is_zero() {
            return;
        }
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        let period = (after / 4).clamp(Duration::from_millis(20), Duration::from_secs(5));
        let (this, shared) = (Arc::downgrade(self), self.shared.clone());
        let spawned = socket::spawn("nccl-bs-beat", move || {
            let mut last = Instant::now();
            loop {
                let Some(bs) = this.upgrade() else { return };
                if bs.shared.is_closed() {
                    return;
                }
                let now = Instant::now();
                if now.duration_since(last) > period + after / 2 {
                    // This thread could not run for a while (this process was stopped, or
                    // starved): what it did not read meanwhile says nothing about the peer.
                    bs.shared.forgive(prev);
                }
                last = now;
                if bs.shared.gone(next).is_none() {
                    if let Err(e) = bs.send_on(next, Channel::Beat, 0, &[]) {
                        log::debug!("rank {r}: heartbeat to rank {next}: {e}");
                    }
                }
                if let Some(silent) = bs.shared.silent_for(prev) {
                    if silent >= after
                        && bs.shared.gone(prev).is_none()
                        && (silent >= after * 2 || busy())
                    {
                        bs.shared.hung(
                            prev,
                            format!(
                                "rank {prev} has not responded for {:.1} s (its process is \
                                 stopped or stuck; NCCL_RS_PEER_HANG_TIMEOUT_MS={})",
                                silent.as_secs_f64(),
                                after.as_millis()
                            ),
                        );
                    }
                }
                drop(bs);
                // Short naps, so that a closed bootstrap ends this thread soon.
                let wake = Instant::now() + period;
                while Instant::now() < wake {
                    std::thread::sleep(
                        wake.saturating_duration_since(Instant::now())
                            .min(Duration::from_millis(50)),
                    );
                    if this.strong_count() == 0 || shared.is_closed() {
                        return;
                    }
                }
            }
        });
        if let Err(e) = spawned {
            log::warn!("rank {r}: cannot start the heartbeat thread: {e}");
        }
    }

    /// Stops reporting faults (the watcher is dropped).
    pub(crate) fn unwatch(&self) {
        self.shared.clear_watcher();
    }

    /// Sends a fault notice to every rank but ourselves and the dead one, from a thread of its
    /// own (a rank that is slow to read must not hold up the reader that saw the fault).
    fn tell_everyone(self: Arc<Self>, f: Fault) {
        *lock(&self.notices.0) += 1;
        let this = self.clone();
        let spawned = socket::spawn("nccl-bs-fault", move || {
            let why = wire::cut_text(&f.why).as_bytes();
            for r in (0..this.nranks()).filter(|&r| r != this.rank() && r != f.dead) {
                if let Err(e) = this.send_on(r, Channel::Fault, f.dead as u32, why) {
                    log::debug!("rank {}: fault notice to rank {r}: {e}", this.rank());
                }
            }
            this.notice_done();
        });
        if let Err(e) = spawned {
            log::warn!("bootstrap: cannot start the fault notice thread: {e}");
            self.notice_done();
        }
    }

    fn notice_done(&self) {
        let (count, done) = &self.notices;
        let mut n = lock(count);
        *n = n.saturating_sub(1);
        done.notify_all();
    }

    /// Tells every peer we hold a connection to that its end is coming on purpose. Best
    /// effort and quick: a peer that does not take the frame at once is skipped.
    fn say_goodbye(&self) {
        if self.shared.is_closed() {
            return;
        }
        let Ok(frame) = wire::encode_data(Channel::Leave, 0, &[]) else {
            return;
        };
        for slot in &self.out {
            // A send stuck on this connection holds its lock; skip it rather than wait.
            if let Ok(mut conn) = slot.try_lock() {
                if let Some(c) = conn.as_mut() {
                    let _ = c.write(&frame, Duration::from_millis(100));
                }
            }
        }
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

/// The hello to the root and its answer: the address table, or why there is none.
fn exchange_with_root(
    root: SocketAddr,
    nonce: u64,
    rank: usize,
    nranks: usize,
    me: SocketAddr,
    deadline: Instant,
    abort: &AbortFlag,
) -> Result<Vec<Member>> {
    let stream = socket::connect(root, deadline, || abort.is_aborted()).map_err(|e| {
        abort.check().err().unwrap_or_else(|| {
            Error::remote(format!(
                "bootstrap rank {rank}: cannot reach the root at {root}: {e}"
            ))
        })
    })?;
    // Abort shuts the socket down, which ends the wait for the root's answer at once.
    let _hook = match stream.try_clone() {
        Ok(s) => Some(abort.hook(move || {
            let _ = s.shutdown(std::net::Shutdown::Both);
        })),
        Err(_) => None,
    };
    let hello = wire::Hello {
        nonce,
        rank: rank as u32,
        nranks: nranks as u32,
        timeout_ms: socket::millis(deadline.saturating_duration_since(Instant::now())),
        addr: me,
    };
    let late = deadline + ROOT_GRACE;
    socket::write_frame(&stream, &wire::encode_hello(&hello), late).map_err(|e| {
        Error::remote(format!(
            "bootstrap rank {rank}: cannot talk to the root at {root}: {e}"
        ))
    })?;
    let body = socket::read_frame(&stream, wire::answer_body_max(nranks), late).map_err(|e| {
        if let Err(aborted) = abort.check() {
            aborted
        } else if socket::is_timeout(&e) {
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
        wire::Msg::Table { nonce: n, members } if n == nonce && members.len() == nranks => {
            Ok(members)
        }
        wire::Msg::Fail { code, message } => Err(Error::new(
            code,
            format!("bootstrap rank {rank}: {message}"),
        )),
        _ => Err(Error::remote(format!(
            "bootstrap rank {rank}: the root at {root} answered nonsense"
        ))),
    }
}

/// How ranks are spread over several unique ids (NCCL's rule): `nranks / nids` ranks per id,
/// and the first `nranks % nids` ids one more; rank r uses the id of the block it falls in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RootPlan {
    pub nranks: usize,
    pub nids: usize,
}

impl RootPlan {
    /// `nids` must be in 1..=nranks.
    pub fn new(nranks: usize, nids: usize) -> RootPlan {
        RootPlan {
            nranks,
            nids: nids.clamp(1, nranks.max(1)),
        }
    }
    fn per(&self) -> (usize, usize) {
        (self.nranks / self.nids, self.nranks % self.nids)
    }
    /// First rank of block `k`.
    pub fn start(&self, k: usize) -> usize {
        let (rpr, rmr) = self.per();
        k * rpr + k.min(rmr)
    }
    /// Ranks in block `k`.
    pub fn size(&self, k: usize) -> usize {
        let (rpr, rmr) = self.per();
        rpr + usize::from(k < rmr)
    }
    /// The block (the index of the unique id) of `rank`.
    pub fn block_of(&self, rank: usize) -> usize {
        let (rpr, rmr) = self.per();
        let rlim = rmr * (rpr + 1);
        if rank < rlim {
            rank / (rpr + 1)
        } else {
            rmr + (rank - rlim) / rpr.max(1)
        }
    }
}

/// NCCL_UID_STAGGER_THRESHOLD / _RATE: when more ranks than the threshold share one root, each
/// waits `local / rate` seconds before its hello, so the root sees at most `rate` hellos per
/// second.
fn stagger(block_size: usize, local: usize, abort: &AbortFlag) -> Result<()> {
    let threshold = crate::env::UID_STAGGER_THRESHOLD.int().max(0) as usize;
    let rate = crate::env::UID_STAGGER_RATE.int();
    if block_size <= threshold || rate <= 0 || local == 0 {
        return Ok(());
    }
    abort.sleep(Duration::from_micros(
        (local as u64).saturating_mul(1_000_000) / rate as u64,
    ))
}
