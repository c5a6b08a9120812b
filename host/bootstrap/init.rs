//! Joining: a rank's bootstrap over one or several unique ids (a root per id, each serving a
//! block of ranks), the merge of the roots' tables, and the staggered start of large jobs.

use super::keys::{self, Purpose};
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
            root::spawn(l, f0.root, f0.nonce, f0.secret)?;
        }
        let ip = socket::local_ip_toward(fk.root.ip());
        let listener = sockets::listen(SocketAddr::new(ip, 0), false).map_err(|e| {
            Error::system(format!("bootstrap rank {rank}: cannot listen on {ip}: {e}"))
        })?;
        let me = sockets::local_addr(&listener)
            .map_err(|e| Error::system(format!("bootstrap rank {rank}: no local address: {e}")))?;
        // The first id's nonce names the whole bootstrap, and its secret keys every pair:
        // every rank holds that id.
        let shared = Shared::start(rank, nranks, (f0.nonce, f0.secret), listener)?;
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
        };
        log::debug!(
            "bootstrap rank {rank}/{nranks}: listening on {me}, root at {} ({nids} roots)",
            fk.root
        );
        stagger(plan.size(block), local, abort)?;
        let peers = if nids == 1 {
            bs.single_root_table(&f0, me, deadline, abort)
        } else {
            bs.merge_tables(&fields, &plan, me, deadline, abort)
        }
        // An abort while the table travels says so, as one during the join does.
        .map_err(|e| abort.check().err().unwrap_or(e))?;
        if peers.len() != nranks || peers[rank] != me {
            return Err(Error::remote(format!(
                "bootstrap rank {rank}: the address table does not list this rank at {me}"
            )));
        }
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
                    bs.peers[next],
                    deadline.max(at_least),
                )?);
            }
        }
        Ok(bs)
    }

    /// The address table of a bootstrap with one root: the join, then the tree.
    fn single_root_table(
        &mut self,
        f: &id::IdFields,
        me: SocketAddr,
        deadline: Instant,
        abort: &AbortFlag,
    ) -> Result<Vec<SocketAddr>> {
        let (rank, nranks) = (self.rank(), self.nranks());
        let parent = join_root(f, rank, nranks, me, deadline, abort)?;
        let tree = Tree::new(0, (0..nranks).collect(), rank, parent);
        let all = self.gather_up(&tree, vec![(rank, me)], deadline)?;
        let table = (rank == 0).then(|| whole_table(all, nranks)).transpose()?;
        self.spread_down(&tree, table, deadline)
    }

    /// The address table of a bootstrap with several roots. Each block's root serves its block
    /// as an ordinary bootstrap; the root of id 0 also serves the leaders (first ranks) of the
    /// other blocks, as extra ranks after block 0's. Each root's ranks form a gather tree
    /// (its answers name each rank's parent). A leader gathers its block's addresses up its
    /// block's tree first, then sends all of them up root 0's tree, so rank 0 ends with the
    /// whole table; it spreads down root 0's tree, and each leader spreads it down its block's.
    /// Keys need nothing: every rank holds id 0, whose secret keys every pair.
    fn merge_tables(
        &mut self,
        fields: &[id::IdFields],
        plan: &RootPlan,
        me: SocketAddr,
        deadline: Instant,
        abort: &AbortFlag,
    ) -> Result<Vec<SocketAddr>> {
        let (rank, nranks) = (self.rank(), self.nranks());
        let nids = plan.nids;
        let block = plan.block_of(rank);
        let (start, size) = (plan.start(block), plan.size(block));
        let local = rank - start;
        let n0 = plan.size(0);
        // Root 0's ranks: block 0, then the leader of every other block.
        let root0: Vec<usize> = (0..n0).chain((1..nids).map(|b| plan.start(b))).collect();
        if block == 0 {
            let parent = join_root(&fields[0], rank, root0.len(), me, deadline, abort)?;
            let tree = Tree::new(0, root0, rank, parent);
            let all = self.gather_up(&tree, vec![(rank, me)], deadline)?;
            let table = (rank == 0).then(|| whole_table(all, nranks)).transpose()?;
            return self.spread_down(&tree, table, deadline);
        }
        let parent = join_root(&fields[block], local, size, me, deadline, abort)?;
        let own = Tree::new(block, (start..start + size).collect(), local, parent);
        let mine = self.gather_up(&own, vec![(rank, me)], deadline)?;
        if local != 0 {
            return self.spread_down(&own, None, deadline);
        }
        let guest = n0 + block - 1;
        let parent0 = join_root(&fields[0], guest, root0.len(), me, deadline, abort)?;
        let tree0 = Tree::new(0, root0, guest, parent0);
        self.gather_up(&tree0, mine, deadline)?;
        let table = self.spread_down(&tree0, None, deadline)?;
        self.spread_down(&own, Some(table), deadline)
    }

    /// The gather half of a tree's allgather of addresses: waits for every child's list (its
    /// subtree's addresses, by global rank), adds `mine`, sends the lot to the parent, and
    /// returns it (at the tree's root: everything).
    fn gather_up(
        &mut self,
        tree: &Tree,
        mine: Vec<(usize, SocketAddr)>,
        deadline: Instant,
    ) -> Result<Vec<(usize, SocketAddr)>> {
        let nranks = self.nranks();
        // The root answers up to the earliest rank's deadline: the tree gets a grace past it.
        let deadline = deadline.max(sockets::deadline_after(ROOT_GRACE));
        let mut all = mine;
        for c in tree.children() {
            let from = tree.ranks[c];
            let b = self
                .shared
                .take(from, Channel::Setup, tree.tag_up(), deadline)?;
            let got = wire::decode_indexed(&b, nranks)?;
            // A child's list starts with the child itself: where to send the table later.
            match got.first() {
                Some(&(r, a)) if r == from => self.peers[from] = a,
                _ => {
                    return Err(Error::remote(format!(
                        "bootstrap rank {}: rank {from}'s address list does not start with \
                         its own",
                        self.rank()
                    )))
                }
            }
            all.extend(got);
        }
        if let Some((to, at)) = tree.parent {
            self.peers[to] = at;
            self.send_on(
                to,
                Channel::Setup,
                tree.tag_up(),
                &wire::encode_indexed(&all),
            )?;
        }
        Ok(all)
    }

    /// The spread half: the whole table from the parent (or `table`, at the tree's root, or
    /// at a leader that has it from root 0's tree), passed on to every child.
    fn spread_down(
        &mut self,
        tree: &Tree,
        table: Option<Vec<SocketAddr>>,
        deadline: Instant,
    ) -> Result<Vec<SocketAddr>> {
        let nranks = self.nranks();
        let deadline = deadline.max(sockets::deadline_after(ROOT_GRACE));
        let table = match (table, tree.parent) {
            (Some(t), _) => t,
            (None, Some((p, at))) => {
                let b = self
                    .shared
                    .take(p, Channel::Setup, tree.tag_down(), deadline)?;
                let t = wire::decode_addrs(&b, nranks)?;
                if t[p] != at {
                    return Err(Error::remote(format!(
                        "bootstrap rank {}: the table puts rank {p} at {}, the root at {at}",
                        self.rank(),
                        t[p],
                    )));
                }
                t
            }
            (None, None) => return Err(Error::internal("bootstrap: a tree root with no table")),
        };
        let frame = wire::encode_addrs(&table);
        for c in tree.children() {
            self.send_on(tree.ranks[c], Channel::Setup, tree.tag_down(), &frame)?;
        }
        Ok(table)
    }
}

/// One root's ranks as a gather tree (a binary heap over their local numbers, `root.rs`).
struct Tree {
    /// Which root (0 for a single root): the tags of its messages.
    id: usize,
    /// Global rank of each local number.
    ranks: Vec<usize>,
    local: usize,
    /// The parent's global rank and address (None: this rank is the tree's root).
    parent: Option<(usize, SocketAddr)>,
}

impl Tree {
    /// `parent`: the address the root's answer named (None: this rank is the tree's root).
    fn new(id: usize, ranks: Vec<usize>, local: usize, parent: Option<SocketAddr>) -> Tree {
        let parent = root::tree_parent(local)
            .zip(parent)
            .map(|(p, at)| (ranks[p], at));
        Tree {
            id,
            parent,
            ranks,
            local,
        }
    }
    fn children(&self) -> impl Iterator<Item = usize> {
        root::tree_children(self.local, self.ranks.len())
    }
    fn tag_up(&self) -> u32 {
        0x100 + 2 * self.id as u32
    }
    fn tag_down(&self) -> u32 {
        0x101 + 2 * self.id as u32
    }
}

/// The table gathered at the tree's root: every rank exactly once.
fn whole_table(all: Vec<(usize, SocketAddr)>, nranks: usize) -> Result<Vec<SocketAddr>> {
    let mut table: Vec<Option<SocketAddr>> = vec![None; nranks];
    for (r, a) in all {
        if table[r].replace(a).is_some() {
            return Err(Error::remote(format!(
                "bootstrap: rank {r} appears twice in the gathered table"
            )));
        }
    }
    table
        .into_iter()
        .enumerate()
        .map(|(r, a)| {
            a.ok_or_else(|| Error::remote(format!("bootstrap: rank {r} missing from the table")))
        })
        .collect()
}

/// The hello to the root (`local` of the root's `n` ranks) and its answer: the address of this
/// rank's parent in the gather tree, or why there is none. The root's challenge is answered
/// with the join key's MAC, and its answer must carry the MAC over ours: a process that
/// listens on the root's address without the id is refused by name. A connection closed
/// before the answer (pushed out of a full doorway) is opened again, until `deadline`.
fn join_root(
    f: &id::IdFields,
    local: usize,
    n: usize,
    me: SocketAddr,
    deadline: Instant,
    abort: &AbortFlag,
) -> Result<Option<SocketAddr>> {
    let root = f.root;
    let late = deadline + ROOT_GRACE;
    let mut knocks = 0u32;
    loop {
        match try_join_root(f, local, n, me, deadline, abort) {
            Err(Joining::Closed(_)) if Instant::now() < deadline => {
                knocks += 1;
                abort.sleep(socket::knock_pause(knocks))?;
                continue;
            }
            Err(Joining::Closed(e)) if socket::is_timeout(&e) || Instant::now() >= late => {
                return Err(Error::remote(format!(
                    "bootstrap rank {local}: no answer from the root at {root} in time \
                     (not all {n} ranks arrived? or this rank's NCCL_RS_COMM_SECRET differs \
                     from the others')"
                )))
            }
            Err(Joining::Closed(e)) => {
                return Err(abort.check().err().unwrap_or_else(|| {
                    Error::remote(format!(
                        "bootstrap rank {local}: lost the root at {root}: {e}"
                    ))
                }))
            }
            Err(Joining::Failed(e)) => return Err(abort.check().err().unwrap_or(e)),
            Ok(parent) => return Ok(parent),
        }
    }
}

/// Why one try at the root did not give an answer.
enum Joining {
    /// The connection ended, or timed out, before an answer.
    Closed(std::io::Error),
    Failed(Error),
}

fn try_join_root(
    f: &id::IdFields,
    local: usize,
    n: usize,
    me: SocketAddr,
    deadline: Instant,
    abort: &AbortFlag,
) -> std::result::Result<Option<SocketAddr>, Joining> {
    let (root, rank) = (f.root, local);
    let stream = socket::connect(root, deadline, || abort.is_aborted()).map_err(|e| {
        Joining::Failed(abort.check().err().unwrap_or_else(|| {
            Error::remote(format!(
                "bootstrap rank {rank}: cannot reach the root at {root}: {e}"
            ))
        }))
    })?;
    // Abort shuts the socket down, which ends the wait for the root's answer at once.
    let _hook = match stream.try_clone() {
        Ok(s) => Some(abort.hook(move || {
            let _ = s.shutdown(std::net::Shutdown::Both);
        })),
        Err(_) => None,
    };
    let late = deadline + ROOT_GRACE;
    let forged = |what: &str| {
        Joining::Failed(Error::remote(format!(
            "bootstrap rank {rank}: the process at the root's address {root} {what}: it is \
             not the root of this unique id (a forged root, or a stale id?)"
        )))
    };
    let body = socket::read_frame(&stream, wire::MAX_CTRL_BODY, late).map_err(Joining::Closed)?;
    let c_root = match wire::decode(&body) {
        Ok(wire::Msg::Challenge(c)) if c.nonce == f.nonce => c.challenge,
        Ok(wire::Msg::Challenge(_)) => {
            return Err(Joining::Failed(Error::invalid_usage(format!(
                "bootstrap rank {rank}: the bootstrap root at {root} belongs to another unique \
                 id (stale id?)"
            ))))
        }
        _ => return Err(forged("sent no challenge")),
    };
    let key = keys::join_key(f.secret);
    let mut hello = wire::Hello {
        nonce: f.nonce,
        rank: rank as u32,
        nranks: n as u32,
        timeout_ms: socket::millis(deadline.saturating_duration_since(Instant::now())),
        addr: me,
        challenge: keys::random_u128().map_err(Joining::Failed)?,
        mac: 0,
    };
    hello.mac = keys::mac(key, Purpose::Hello, &[&wire::hello_fields(&hello, c_root)]);
    socket::write_frame(&stream, &wire::encode_hello(&hello), late).map_err(Joining::Closed)?;
    let body = socket::read_frame(&stream, wire::MAX_CTRL_BODY, late).map_err(Joining::Closed)?;
    let proof = |purpose, said: &[u8]| {
        let fields = wire::answer_fields(c_root, hello.challenge, hello.rank, said);
        keys::mac(key, purpose, &[&fields])
    };
    match wire::decode(&body) {
        Ok(wire::Msg::Answer(a)) => {
            let valid =
                keys::same_mac(a.mac, proof(Purpose::Answer, &wire::parent_bytes(a.parent)));
            match valid && a.parent.is_some() == (rank > 0) {
                true => Ok(a.parent),
                false => Err(forged("answered without the unique id's proof")),
            }
        }
        Ok(wire::Msg::Fail { code, message, mac }) => {
            match keys::same_mac(mac, proof(Purpose::Fail, &wire::fail_bytes(code, &message))) {
                true => Err(Joining::Failed(Error::new(
                    code,
                    format!("bootstrap rank {rank}: {message}"),
                ))),
                false => Err(forged(&format!(
                    "refused us without the unique id's proof (\"{}\")",
                    crate::sockets::printable(&message)
                ))),
            }
        }
        _ => Err(forged("answered nonsense")),
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
