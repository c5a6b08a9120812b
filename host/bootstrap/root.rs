//! The bootstrap root: a detached thread that waits for every rank's hello, then answers each
//! rank with the address of its parent in the gather tree (`tree_parent`), and exits: a few
//! dozen bytes per rank, whatever the number of ranks (the ranks gather and spread the address
//! table along the tree themselves, `init.rs`). If a rank's timeout expires before all arrived,
//! it tells every rank that did arrive how many came, and exits.
//!
//! Every connection is challenged first (`doorway.rs`), and a hello counts only with the MAC
//! of the join key over that challenge (`keys.rs`): only a holder of the unique id can take a
//! rank, and a recorded hello is worth nothing on another connection. The answers are MACed
//! over the rank's own challenge in turn, so a rank can tell the real root from a process that
//! listens on its address.
//!
//! A root that no rank reaches within `NCCL_BOOTSTRAP_TIMEOUT_MS` of its start (an id that is
//! never used, or an init that failed before its first message) closes its listener and ends
//! too, so unused ids do not keep a thread and a socket each for ever.

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use socket2::Socket;

use super::doorway::{self, Limits};
use super::keys::{self, Purpose, Secret};
use super::socket;
use super::wire::{self, Answer, Challenge, Hello, Msg};
use crate::error::{Error, NcclResult, Result};
use crate::sockets;

/// How long the root waits to hand one rank its answer (a few dozen bytes: they fit in any
/// socket's buffer, so only a broken connection takes this long).
const ANSWER_WAIT: Duration = Duration::from_secs(1);

/// Bytes of the root's answer to one rank, at most (its frame, with a parent's address): all
/// the root sends a rank, whatever the number of ranks.
#[cfg(test)]
pub(super) const ANSWER_BYTES: usize = 4 + 1 + 12 + 1 + wire::ADDR_BYTES + 8;

/// The parent of local rank `i` in the gather tree (a binary heap): None for rank 0.
pub(super) fn tree_parent(i: usize) -> Option<usize> {
    (i > 0).then(|| (i - 1) / 2)
}

/// The children of local rank `i` in the gather tree of `n` ranks.
pub(super) fn tree_children(i: usize, n: usize) -> impl Iterator<Item = usize> {
    (2 * i + 1..=2 * i + 2).filter(move |&c| c < n)
}

struct Arrival {
    hello: Hello,
    /// The challenge the root sent on this connection.
    c_root: u128,
    stream: TcpStream,
}

/// Starts the root on `listener` (bound to `addr`) for the bootstrap of the id with `nonce`
/// and `secret`.
pub(crate) fn spawn(listener: Socket, addr: SocketAddr, nonce: u64, secret: Secret) -> Result<()> {
    // How long the root waits for its first rank.
    let idle = Duration::from_millis(crate::env::BOOTSTRAP_TIMEOUT_MS.int().max(1) as u64);
    let key = keys::join_key(secret);
    sockets::spawn("nccl-bs-root", move || {
        run(listener, addr, nonce, key, idle)
    })
    .map(|_| ())
    .map_err(|e| Error::system(format!("bootstrap root: cannot start its thread: {e}")))
}

fn run(listener: Socket, addr: SocketAddr, nonce: u64, key: Secret, idle: Duration) {
    let (tx, rx) = mpsc::channel::<Arrival>();
    let stop = Arc::new(AtomicBool::new(false));
    let accepting = match listener.try_clone() {
        Ok(l) => l,
        Err(e) => {
            log::warn!("bootstrap root {addr}: cannot duplicate the listener: {e}");
            return;
        }
    };
    let mut door = RootDoor {
        addr,
        nonce,
        key,
        tx,
        stop: stop.clone(),
        rejections: sockets::Rejections::default(),
    };
    let limits = Limits::bootstrap(wire::MAX_CTRL_BODY);
    if let Err(e) = sockets::spawn("nccl-bs-root-accept", move || {
        doorway::serve(&accepting, limits, &mut door)
    }) {
        log::warn!("bootstrap root {addr}: cannot start the accept thread: {e}");
        return;
    }
    gather(&rx, addr, key, idle);
    stop.store(true, Ordering::SeqCst);
    let _ = listener.shutdown(std::net::Shutdown::Both);
}

/// The root's side of its doorway: challenges, and hellos checked before they count.
struct RootDoor {
    addr: SocketAddr,
    nonce: u64,
    key: Secret,
    tx: Sender<Arrival>,
    stop: Arc<AtomicBool>,
    rejections: sockets::Rejections,
}

impl doorway::Owner for RootDoor {
    fn stopped(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    fn challenge(&mut self) -> Option<(u128, Vec<u8>)> {
        let c = keys::random_u128().ok()?;
        let frame = wire::encode_challenge(&Challenge {
            nonce: self.nonce,
            challenge: c,
        });
        Some((c, frame))
    }

    fn admit(
        &mut self,
        stream: TcpStream,
        c_root: u128,
        body: Vec<u8>,
    ) -> std::result::Result<(), String> {
        let hello = match wire::decode(&body) {
            Ok(Msg::Hello(h)) => h,
            Ok(_) => return Err("not a hello".into()),
            Err(e) => return Err(e.message),
        };
        // The nonce first: a rank of another id (stale) is told so by the challenge it got.
        if hello.nonce != self.nonce {
            return Err("a hello for another unique id".into());
        }
        let want = keys::mac(
            self.key,
            Purpose::Hello,
            &[&wire::hello_fields(&hello, c_root)],
        );
        if !keys::same_mac(want, hello.mac) {
            return Err(format!(
                "a hello as rank {} without the unique id's proof (not a rank of this job)",
                hello.rank
            ));
        }
        let (rank, nranks) = (hello.rank as usize, hello.nranks as usize);
        if nranks == 0 || nranks > wire::MAX_RANKS || rank >= nranks {
            refuse(
                &stream,
                (self.key, c_root, &hello),
                NcclResult::InvalidArgument,
                &format!("rank {rank} of {nranks} ranks is out of range"),
            );
            return Err(format!("rank {rank} of {nranks} ranks"));
        }
        let _ = stream.set_nodelay(true);
        // The root thread is gone once the bootstrap completed or failed.
        let _ = self.tx.send(Arrival {
            hello,
            c_root,
            stream,
        });
        Ok(())
    }

    fn rejected(&mut self, from: SocketAddr, why: &str) {
        let addr = self.addr;
        self.rejections
            .warn(|| format!("bootstrap root {addr}: dropping a connection from {from}: {why}"));
    }
}

/// Tells a rank why it cannot join, MACed as the root's word; best effort.
fn refuse(
    stream: &TcpStream,
    (key, c_root, h): (Secret, u128, &Hello),
    code: NcclResult,
    text: &str,
) {
    let said = wire::fail_bytes(code, text);
    let fields = wire::answer_fields(c_root, h.challenge, h.rank, &said);
    let mac = keys::mac(key, Purpose::Fail, &[&fields]);
    let deadline = sockets::deadline_after(ANSWER_WAIT);
    let _ = socket::write_frame(stream, &wire::encode_fail(code, text, mac), deadline);
}

struct Joined {
    stream: TcpStream,
    hello: Hello,
    c_root: u128,
}

/// Waits for all ranks, answers them. Returns when the bootstrap completed or failed, or when
/// no rank arrived within `idle`.
fn gather(rx: &mpsc::Receiver<Arrival>, addr: SocketAddr, key: Secret, idle: Duration) {
    let mut joined: Vec<Option<Joined>> = Vec::new();
    let mut count = 0usize;
    // The earliest moment at which some arrived rank gives up, and that rank.
    let mut expiry: Option<(Instant, usize)> = None;
    let mut first_arrival: Option<Instant> = None;
    let unused_until = sockets::deadline_after(idle);
    loop {
        let until = match expiry {
            None => unused_until,
            Some((at, _)) => at,
        };
        let next = rx.recv_timeout(until.saturating_duration_since(Instant::now()));
        let a = match next {
            Ok(a) => a,
            Err(RecvTimeoutError::Timeout) if expiry.is_none() => {
                log::info!(
                    "bootstrap root {addr}: no rank arrived within {} ms \
                     (NCCL_BOOTSTRAP_TIMEOUT_MS); closing it",
                    socket::millis(idle)
                );
                return;
            }
            Err(RecvTimeoutError::Timeout) => {
                let (who, waited) = match (expiry, first_arrival) {
                    (Some((_, r)), Some(t)) => (r, t.elapsed()),
                    _ => (0, Duration::ZERO),
                };
                let missing: Vec<String> = joined
                    .iter()
                    .enumerate()
                    .filter(|(_, j)| j.is_none())
                    .map(|(r, _)| r.to_string())
                    .take(16)
                    .collect();
                let more = joined.len() - count;
                let message = format!(
                    "bootstrap timed out: only {count} of {} ranks arrived at the root {addr} \
                     within {} ms, before rank {who}'s timeout expired (missing ranks: {}{})",
                    joined.len(),
                    socket::millis(waited),
                    missing.join(", "),
                    if more > missing.len() { ", ..." } else { "" },
                );
                log::warn!("{message}");
                for j in joined.iter().flatten() {
                    refuse(&j.stream, j.who(key), NcclResult::RemoteError, &message);
                }
                return;
            }
            Err(RecvTimeoutError::Disconnected) => {
                log::warn!("bootstrap root {addr}: the accept thread stopped");
                for j in joined.iter().flatten() {
                    refuse(
                        &j.stream,
                        j.who(key),
                        NcclResult::SystemError,
                        "the bootstrap root failed",
                    );
                }
                return;
            }
        };
        let (rank, nranks) = (a.hello.rank as usize, a.hello.nranks as usize);
        if joined.is_empty() {
            joined.resize_with(nranks, || None);
        } else if nranks != joined.len() {
            log::warn!(
                "bootstrap root {addr}: rank {rank} says nranks={nranks}, earlier ranks said {}",
                joined.len()
            );
            refuse(
                &a.stream,
                (key, a.c_root, &a.hello),
                NcclResult::InvalidUsage,
                &format!(
                    "rank {rank} called with nranks={nranks} but other ranks with nranks={}",
                    joined.len()
                ),
            );
            continue;
        }
        if joined[rank].is_some() {
            log::warn!("bootstrap root {addr}: rank {rank} arrived twice");
            refuse(
                &a.stream,
                (key, a.c_root, &a.hello),
                NcclResult::InvalidUsage,
                &format!("rank {rank} joined the same bootstrap twice"),
            );
            continue;
        }
        let now = Instant::now();
        first_arrival.get_or_insert(now);
        let gives_up = now
            .checked_add(Duration::from_millis(a.hello.timeout_ms))
            .unwrap_or_else(|| sockets::deadline_after(Duration::MAX));
        if expiry.is_none_or(|(at, _)| gives_up < at) {
            expiry = Some((gives_up, rank));
        }
        joined[rank] = Some(Joined {
            stream: a.stream,
            hello: a.hello,
            c_root: a.c_root,
        });
        count += 1;
        if count == joined.len() {
            break;
        }
    }
    let addrs: Vec<SocketAddr> = joined.iter().flatten().map(|j| j.hello.addr).collect();
    log::info!(
        "bootstrap root {addr}: all {} ranks arrived; sending each its parent in the gather tree",
        addrs.len()
    );
    for (rank, j) in joined.iter().enumerate() {
        let Some(j) = j else { continue };
        let parent = tree_parent(rank).map(|p| addrs[p]);
        let said = wire::parent_bytes(parent);
        let fields = wire::answer_fields(j.c_root, j.hello.challenge, j.hello.rank, &said);
        let mac = keys::mac(key, Purpose::Answer, &[&fields]);
        let frame = wire::encode_answer(&Answer { parent, mac });
        // Each rank's own short deadline: one that stopped reading holds up no other.
        if let Err(e) = socket::write_frame(&j.stream, &frame, sockets::deadline_after(ANSWER_WAIT))
        {
            // That rank will fail on its own; the others can still go on.
            log::warn!("bootstrap root {addr}: cannot send rank {rank} its answer: {e}");
        }
    }
}

impl Joined {
    fn who(&self, key: Secret) -> (Secret, u128, &Hello) {
        (key, self.c_root, &self.hello)
    }
}
