//! Joining: a rank's bootstrap over one or several unique ids (a root per id, each serving a
//! block of ranks), the merge of the roots' tables, and the staggered start of large jobs.

use super::*;
use crate::sockets;

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
        let deadline = sockets::deadline_after(timeout);
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
            let l = sockets::listen(f0.root, true).map_err(|e| {
                Error::system(format!(
                    "bootstrap: cannot start the root on {} (NCCL_COMM_ID): {e}",
                    f0.root
                ))
            })?;
            root::spawn(l, f0.root, f0.nonce)?;
        }
        let ip = socket::local_ip_toward(fk.root.ip());
        let listener = sockets::listen(SocketAddr::new(ip, 0), false).map_err(|e| {
            Error::system(format!("bootstrap rank {rank}: cannot listen on {ip}: {e}"))
        })?;
        let me = Member {
            addr: sockets::local_addr(&listener).map_err(|e| {
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
            let at_least = sockets::deadline_after(ROOT_GRACE);
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
