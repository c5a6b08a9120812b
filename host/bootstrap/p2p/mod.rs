//! Rank-to-rank traffic. Each rank listens; a sender opens one connection per peer on first
//! use, introduces itself with a `Connect` frame, then sends data frames on it. On the receiving
//! side an accept thread hands every connection to a reader thread of its own, which files the
//! frames into a mailbox keyed by (sender, channel, tag); `take` waits on that mailbox with a
//! deadline. Because readers always drain their sockets, two ranks sending to each other at
//! once never deadlock, and a peer that closes its end is noticed at once.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::BufReader;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use socket2::Socket;

use super::keys::{self, Secret};
use super::socket;
use super::wire::{self, Channel, Connect, Msg};
use crate::error::{Error, Result};
use crate::sockets;

mod conns;
use conns::accept_loop;
pub(crate) use conns::Outgoing;

/// Locks, recovering from poisoning: nothing here panics while holding a lock, and the data
/// behind each lock stays consistent between statements.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

type Key = (usize, Channel, u32);

#[derive(Default)]
struct Mailbox {
    queues: HashMap<Key, VecDeque<Vec<u8>>>,
    /// Per peer: open incoming connections, and why the last one closed.
    live: HashMap<usize, (u32, Option<String>)>,
    /// Peers that said goodbye: the end of their connections is no fault.
    left: HashSet<usize>,
    /// Bytes delivered from each peer and not yet taken.
    queued: HashMap<usize, usize>,
    /// Peers known to be gone (their connection ended without a goodbye, or another rank said
    /// so), and why: waits on them, and every allgather and barrier, fail at once.
    dead: HashMap<usize, String>,
    /// Peers whose reader waits for room (their bytes in the mailbox are over the budget).
    paused: HashSet<usize>,
    /// Callers of `take` waiting for a message.
    takers: usize,
    /// RAS answers (peer, query) a gather still waits for: any other RAS answer (one that came
    /// after its asker gave up) is dropped on arrival instead of staying here for ever.
    ras_awaited: HashSet<(usize, u32)>,
}

/// Records `rank` as gone (the first reason stays); whether this is news.
fn mark_dead(mb: &mut Mailbox, rank: usize, why: &str) -> bool {
    match mb.dead.entry(rank) {
        std::collections::hash_map::Entry::Occupied(_) => false,
        std::collections::hash_map::Entry::Vacant(v) => {
            v.insert(why.to_string());
            true
        }
    }
}

/// A peer gone without a goodbye (its process died, or it aborted): what a watcher hears.
#[derive(Clone, Debug)]
pub(crate) struct Fault {
    pub dead: usize,
    /// Not gone but silent: the rank's heartbeats stopped (`why` says for how long).
    pub hung: bool,
    /// The rank that saw it go, when another rank reported it; None when it was us.
    pub reported_by: Option<usize>,
    pub why: String,
}

/// Called (from a reader thread, no lock held) for every peer found gone.
pub(crate) type Watcher = Arc<dyn Fn(Fault) + Send + Sync>;
/// Called (from a reader thread) for a RAS query: the asking rank, the query's number and
/// its payload.
pub(crate) type RasResponder = Arc<dyn Fn(usize, u32, &[u8]) + Send + Sync>;

/// Every socket this rank has open, so that `close` can shut them all down at once without
/// taking the per-peer send locks (a blocked send may be holding one).
#[derive(Default)]
struct Registry {
    closed: Option<&'static str>,
    next: u64,
    socks: HashMap<u64, TcpStream>,
}

pub(crate) struct Shared {
    pub rank: usize,
    pub nranks: usize,
    pub nonce: u64,
    /// The unique id's secret: the key of every pair derives from it (`keys::pair_key`).
    secret: Secret,
    /// Most bytes one peer may have waiting in the mailbox: past it, its reader stops reading
    /// (TCP then holds the sender back) until some are taken.
    queue_budget: AtomicUsize,
    taken: Condvar,
    closed: AtomicBool,
    mailbox: Mutex<Mailbox>,
    arrived: Condvar,
    /// Told when a reader pauses for room or a taker starts waiting: what tests wait for
    /// (`wait_until`) instead of sleeping. Nothing else waits on it.
    watched: Condvar,
    registry: Mutex<Registry>,
    listener: Socket,
    watcher: Mutex<Option<Watcher>>,
    /// When each peer was last heard from (any frame; ms since `epoch`, 0: never), and
    /// whether a heartbeat ([`Channel::Beat`]) came from it yet.
    heard: Vec<(AtomicU64, AtomicBool)>,
    epoch: Instant,
    /// Answers a RAS query from (rank, query number); None: RAS is not served.
    ras: Mutex<Option<RasResponder>>,
}

impl Shared {
    /// Takes over the rank's listener and starts accepting peers.
    pub(crate) fn start(
        rank: usize,
        nranks: usize,
        (nonce, secret): (u64, Secret),
        listener: Socket,
    ) -> Result<Arc<Shared>> {
        let accepting = listener
            .try_clone()
            .map_err(|e| Error::system(format!("bootstrap: cannot duplicate a listener: {e}")))?;
        let shared = Arc::new(Shared {
            rank,
            nranks,
            nonce,
            secret,
            queue_budget: AtomicUsize::new(queue_budget_from_env()),
            taken: Condvar::new(),
            closed: AtomicBool::new(false),
            mailbox: Mutex::new(Mailbox::default()),
            arrived: Condvar::new(),
            watched: Condvar::new(),
            registry: Mutex::new(Registry::default()),
            listener,
            watcher: Mutex::new(None),
            heard: (0..nranks)
                .map(|_| (AtomicU64::new(0), AtomicBool::new(false)))
                .collect(),
            epoch: Instant::now(),
            ras: Mutex::new(None),
        });
        let s = shared.clone();
        sockets::spawn("nccl-bs-accept", move || accept_loop(s, accepting))
            .map_err(|e| Error::system(format!("bootstrap: cannot start a thread: {e}")))?;
        Ok(shared)
    }

    /// The key of the pair (`rank`, this rank), from the id's secret.
    fn key_with(&self, rank: usize) -> Secret {
        keys::pair_key(self.secret, self.rank, rank)
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    /// Err once `close` ran: later operations fail instead of hanging.
    pub(crate) fn check_open(&self) -> Result<()> {
        if !self.is_closed() {
            return Ok(());
        }
        let why = lock(&self.registry).closed.unwrap_or("closed");
        Err(Error::remote(format!(
            "bootstrap of rank {} was {why}",
            self.rank
        )))
    }

    /// Remembers a socket for `close`; None (and the caller drops it) once closed.
    pub(crate) fn register(&self, s: &TcpStream) -> Option<u64> {
        let mut reg = lock(&self.registry);
        if reg.closed.is_some() {
            return None;
        }
        let copy = s.try_clone().ok()?;
        reg.next += 1;
        let id = reg.next;
        reg.socks.insert(id, copy);
        Some(id)
    }

    pub(crate) fn unregister(&self, id: u64) {
        lock(&self.registry).socks.remove(&id);
    }

    /// Shuts down every socket and the listener, wakes every waiter. Idempotent.
    pub(crate) fn close(&self, why: &'static str) {
        {
            let mut reg = lock(&self.registry);
            if reg.closed.is_some() {
                return;
            }
            reg.closed = Some(why);
            self.closed.store(true, Ordering::SeqCst);
            for (_, s) in reg.socks.drain() {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
        // Wakes the accept thread out of accept() (Linux returns EINVAL there).
        let _ = self.listener.shutdown(Shutdown::Both);
        // Taking the mailbox lock orders this notify after any waiter's check of `closed`.
        drop(lock(&self.mailbox));
        self.arrived.notify_all();
    }

    pub(crate) fn deliver(&self, from: usize, channel: Channel, tag: u32, msg: Vec<u8>) {
        let mut mb = lock(&self.mailbox);
        if channel == Channel::RasReply && !mb.ras_awaited.contains(&(from, tag)) {
            return;
        }
        *mb.queued.entry(from).or_default() += msg.len();
        mb.queues
            .entry((from, channel, tag))
            .or_default()
            .push_back(msg);
        drop(mb);
        self.arrived.notify_all();
    }

    /// From now on (until [`Shared::retire_ras`]) the answer of `from` to RAS query `tag` is
    /// kept when it comes.
    pub(crate) fn await_ras(&self, from: usize, tag: u32) {
        lock(&self.mailbox).ras_awaited.insert((from, tag));
    }

    /// The answer of `from` to RAS query `tag` is no longer awaited: one already here is
    /// dropped, one still to come will be.
    pub(crate) fn retire_ras(&self, from: usize, tag: u32) {
        let mut mb = lock(&self.mailbox);
        mb.ras_awaited.remove(&(from, tag));
        if let Some(q) = mb.queues.remove(&(from, Channel::RasReply, tag)) {
            let bytes: usize = q.iter().map(Vec::len).sum();
            if let Some(n) = mb.queued.get_mut(&from) {
                *n = n.saturating_sub(bytes);
            }
            drop(mb);
            self.taken.notify_all();
        }
    }

    /// Waits while `from` has more than the budget waiting in the mailbox; false once closed.
    fn wait_for_room(&self, from: usize) -> bool {
        let mut mb = lock(&self.mailbox);
        let room = loop {
            if self.is_closed() {
                break false;
            }
            let budget = self.queue_budget.load(Ordering::Relaxed);
            if mb.queued.get(&from).copied().unwrap_or(0) <= budget {
                break true;
            }
            if mb.paused.insert(from) {
                self.watched.notify_all();
            }
            mb = self
                .taken
                .wait_timeout(mb, Duration::from_millis(100))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        };
        mb.paused.remove(&from);
        room
    }

    /// Waits until `done` holds of (the peers whose reader is paused for room, the number of
    /// takers waiting), or `deadline`: whether it held. Tests wait so for a state of the
    /// mailbox instead of sleeping.
    #[cfg(test)]
    pub(crate) fn wait_until(
        &self,
        deadline: Instant,
        done: impl Fn(&HashSet<usize>, usize) -> bool,
    ) -> bool {
        let mut mb = lock(&self.mailbox);
        while !done(&mb.paused, mb.takers) {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            mb = self
                .watched
                .wait_timeout(mb, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// Bytes from `from` waiting in the mailbox.
    #[cfg(test)]
    pub(crate) fn queued_from(&self, from: usize) -> usize {
        lock(&self.mailbox).queued.get(&from).copied().unwrap_or(0)
    }

    /// Sets the per-peer budget of waiting bytes (tests; else `NCCL_RS_BOOTSTRAP_QUEUE_BYTES`).
    #[cfg(test)]
    pub(crate) fn set_queue_budget(&self, bytes: usize) {
        self.queue_budget.store(bytes, Ordering::Relaxed);
    }

    /// The next message from `from` on (channel, tag) if one is queued.
    pub(crate) fn try_take(&self, from: usize, channel: Channel, tag: u32) -> Option<Vec<u8>> {
        let key = (from, channel, tag);
        let mut mb = lock(&self.mailbox);
        let q = mb.queues.get_mut(&key)?;
        let m = q.pop_front()?;
        if q.is_empty() {
            mb.queues.remove(&key);
        }
        if let Some(n) = mb.queued.get_mut(&from) {
            *n = n.saturating_sub(m.len());
        }
        drop(mb);
        self.taken.notify_all();
        Some(m)
    }

    /// The next message from `from` on (channel, tag), waiting until `deadline`.
    pub(crate) fn take(
        &self,
        from: usize,
        channel: Channel,
        tag: u32,
        deadline: Instant,
    ) -> Result<Vec<u8>> {
        let key = (from, channel, tag);
        let mut mb = lock(&self.mailbox);
        loop {
            if let Some(q) = mb.queues.get_mut(&key) {
                if let Some(m) = q.pop_front() {
                    if q.is_empty() {
                        mb.queues.remove(&key);
                    }
                    if let Some(n) = mb.queued.get_mut(&from) {
                        *n = n.saturating_sub(m.len());
                    }
                    drop(mb);
                    self.taken.notify_all();
                    return Ok(m);
                }
            }
            self.check_open()?;
            if let Some(why) = mb.dead.get(&from) {
                return Err(Error::remote(format!(
                    "bootstrap rank {}: rank {from} is gone ({why}); it cannot send the awaited \
                     message ({channel:?} tag {tag})",
                    self.rank
                )));
            }
            if matches!(channel, Channel::Allgather | Channel::Barrier) {
                if let Some((dead, why)) = mb.dead.iter().next() {
                    return Err(Error::remote(format!(
                        "bootstrap rank {}: rank {dead} is gone ({why}), so no {channel:?} of \
                         all ranks can complete",
                        self.rank
                    )));
                }
            }
            if let Some((0, Some(why))) = mb.live.get(&from) {
                return Err(Error::remote(format!(
                    "bootstrap rank {}: rank {from} closed its connection ({why}) before \
                     sending the awaited message ({channel:?} tag {tag})",
                    self.rank
                )));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::remote(format!(
                    "bootstrap rank {}: timed out waiting for a message from rank {from} \
                     ({channel:?} tag {tag})",
                    self.rank
                )));
            }
            mb.takers += 1;
            self.watched.notify_all();
            mb = self
                .arrived
                .wait_timeout(mb, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            mb.takers -= 1;
        }
    }

    fn peer_opened(&self, from: usize) {
        let mut mb = lock(&self.mailbox);
        let e = mb.live.entry(from).or_default();
        e.0 += 1;
        e.1 = None;
    }

    fn peer_closed(&self, from: usize, why: String) {
        let gone = {
            let mut mb = lock(&self.mailbox);
            let e = mb.live.entry(from).or_default();
            e.0 = e.0.saturating_sub(1);
            e.1 = Some(why.clone());
            // Our own close ends every connection: that is no fault of the peer's.
            // Reported once per peer, however many of its connections end.
            !self.is_closed() && !mb.left.contains(&from) && mark_dead(&mut mb, from, &why)
        };
        self.arrived.notify_all();
        if gone {
            self.notify(Fault {
                dead: from,
                hung: false,
                reported_by: None,
                why: format!("its bootstrap connection ended without a goodbye: {why}"),
            });
        }
    }

    fn peer_left(&self, from: usize) {
        lock(&self.mailbox).left.insert(from);
    }

    /// Another rank says `fault.dead` is gone.
    fn reported(&self, fault: Fault) {
        if fault.dead == self.rank || self.is_closed() {
            return;
        }
        let first = mark_dead(&mut lock(&self.mailbox), fault.dead, &fault.why);
        self.arrived.notify_all();
        if first {
            self.notify(fault);
        }
    }

    fn notify(&self, fault: Fault) {
        let w = lock(&self.watcher).clone();
        match w {
            Some(w) => w(fault),
            None => log::debug!(
                "bootstrap rank {}: rank {} is gone ({}), nobody watches",
                self.rank,
                fault.dead,
                fault.why
            ),
        }
    }

    /// Installs the function told about every peer found gone from now on.
    pub(crate) fn set_watcher(&self, w: Watcher) {
        *lock(&self.watcher) = Some(w);
    }

    /// Drops the watcher and the RAS responder (they may hold what owns this bootstrap).
    pub(crate) fn clear_watcher(&self) {
        lock(&self.watcher).take();
        lock(&self.ras).take();
    }

    pub(crate) fn set_ras_responder(&self, r: RasResponder) {
        *lock(&self.ras) = Some(r);
    }

    /// Records `rank` as gone (waits on it fail from now on); whether this is news. Nobody is
    /// notified: the caller reports it.
    pub(crate) fn mark_gone(&self, rank: usize, why: &str) -> bool {
        if self.is_closed() {
            return false;
        }
        let news = mark_dead(&mut lock(&self.mailbox), rank, why);
        self.arrived.notify_all();
        news
    }

    /// An error if some peer is known to be gone: a collective of all ranks (`what`) cannot
    /// complete then, and must not first wait on a connection to a rank that left.
    pub(crate) fn check_all_alive(&self, what: &str) -> Result<()> {
        match lock(&self.mailbox).dead.iter().next() {
            Some((dead, why)) => Err(Error::remote(format!(
                "bootstrap rank {}: rank {dead} is gone ({why}), so no {what} of all ranks can \
                 complete",
                self.rank
            ))),
            None => Ok(()),
        }
    }

    /// Whether some peer is known to be gone.
    pub(crate) fn any_gone(&self) -> bool {
        !lock(&self.mailbox).dead.is_empty()
    }

    fn now_ms(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis())
            .unwrap_or(u64::MAX)
            .max(1)
    }

    /// A frame came from `from` (a heartbeat: `beat`).
    fn heard_from(&self, from: usize, beat: bool) {
        if let Some((at, beats)) = self.heard.get(from) {
            at.store(self.now_ms(), Ordering::Relaxed);
            if beat {
                beats.store(true, Ordering::Relaxed);
            }
        }
    }

    /// Counts `rank`'s silence from now (after this rank itself could not look for a while).
    pub(crate) fn forgive(&self, rank: usize) {
        if let Some((at, _)) = self.heard.get(rank) {
            at.store(self.now_ms(), Ordering::Relaxed);
        }
    }

    /// How long nothing came from `rank`, once it sent a heartbeat (None before: a peer that
    /// never sent one does not watch hangs, and its silence means nothing).
    pub(crate) fn silent_for(&self, rank: usize) -> Option<Duration> {
        let (at, beats) = self.heard.get(rank)?;
        if !beats.load(Ordering::Relaxed) {
            return None;
        }
        let since = self.now_ms().saturating_sub(at.load(Ordering::Relaxed));
        Some(Duration::from_millis(since))
    }

    /// `rank` is silent (its heartbeats stopped) while this rank waits on the communicator:
    /// recorded as gone, and reported like a peer whose connection ended (`why` says so).
    pub(crate) fn hung(&self, rank: usize, why: String) {
        if self.mark_gone(rank, &why) {
            self.notify(Fault {
                dead: rank,
                hung: true,
                reported_by: None,
                why,
            });
        }
    }

    /// Why `rank` is known to be gone, if it is.
    pub(crate) fn gone(&self, rank: usize) -> Option<String> {
        lock(&self.mailbox).dead.get(&rank).cloned()
    }

    /// Whether `rank` said goodbye or is known to be gone.
    pub(crate) fn left_or_gone(&self, rank: usize) -> bool {
        let mb = lock(&self.mailbox);
        mb.left.contains(&rank) || mb.dead.contains_key(&rank)
    }
}

/// Default of `NCCL_RS_BOOTSTRAP_QUEUE_BYTES`: 1 GiB waiting per peer (a frame may be 256 MiB).
const QUEUE_BUDGET: usize = 1 << 30;

fn queue_budget_from_env() -> usize {
    match crate::env::RS_BOOTSTRAP_QUEUE_BYTES.raw() {
        Some(_) => crate::env::RS_BOOTSTRAP_QUEUE_BYTES.int().max(0) as usize,
        None => QUEUE_BUDGET,
    }
}
