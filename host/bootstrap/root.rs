//! The bootstrap root: a detached thread that waits for every rank's hello, then sends each
//! rank the table of all ranks' listen addresses, with the keys of that rank's pairs
//! (`keys::pair_key` under a secret the root drew at its start, which never leaves it), and
//! exits. If a rank's timeout expires before
//! all arrived, it tells every rank that did arrive how many came, and exits.
//!
//! A root that no rank reaches within `NCCL_BOOTSTRAP_TIMEOUT_MS` of its start (an id that is
//! never used, or an init that failed before its first message) closes its listener and ends
//! too, so unused ids do not keep a thread and a socket each for ever.
//!
//! Connections are read by one short-lived thread each, so a silent or slow connection never
//! holds up the others; anything that is not a valid hello is logged and dropped.

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use socket2::Socket;

use super::keys::{self, Secret};
use super::socket;
use super::wire::{self, Hello, Member, Msg};
use crate::error::{Error, NcclResult, Result};
use crate::sockets;

/// How long the root waits to hand a rank its answer.
const ANSWER_WAIT: Duration = Duration::from_secs(10);

struct Arrival {
    hello: Hello,
    stream: TcpStream,
}

/// Starts the root on `listener` (bound to `addr`) for the bootstrap identified by `nonce`.
pub(crate) fn spawn(listener: Socket, addr: SocketAddr, nonce: u64) -> Result<()> {
    // How long the root waits for its first rank.
    let idle = Duration::from_millis(crate::env::BOOTSTRAP_TIMEOUT_MS.int().max(1) as u64);
    // Drawn now, known to this thread only: every pair's key comes from it.
    let secret = Secret::draw()?;
    sockets::spawn("nccl-bs-root", move || {
        run(listener, addr, nonce, secret, idle)
    })
    .map(|_| ())
    .map_err(|e| Error::system(format!("bootstrap root: cannot start its thread: {e}")))
}

fn run(listener: Socket, addr: SocketAddr, nonce: u64, secret: Secret, idle: Duration) {
    let (tx, rx) = mpsc::channel::<Arrival>();
    let stop = Arc::new(AtomicBool::new(false));
    let accepting = match listener.try_clone() {
        Ok(l) => l,
        Err(e) => {
            log::warn!("bootstrap root {addr}: cannot duplicate the listener: {e}");
            return;
        }
    };
    let stop2 = stop.clone();
    if let Err(e) = sockets::spawn("nccl-bs-root-accept", move || {
        accept_loop(accepting, addr, nonce, tx, stop2)
    }) {
        log::warn!("bootstrap root {addr}: cannot start the accept thread: {e}");
        return;
    }
    gather(&rx, addr, nonce, secret, idle);
    stop.store(true, Ordering::SeqCst);
    // Wakes the accept thread out of accept() (Linux returns EINVAL there) and frees the port.
    let _ = listener.shutdown(std::net::Shutdown::Both);
}

fn accept_loop(
    listener: Socket,
    addr: SocketAddr,
    nonce: u64,
    tx: Sender<Arrival>,
    stop: Arc<AtomicBool>,
) {
    let gate = socket::Gate::new(socket::MAX_HANDSHAKES);
    let rejections = Arc::new(sockets::Rejections::default());
    loop {
        // A bounded number of connections in their hello at once (see `socket::Gate`).
        let Some(permit) = gate.enter(|| stop.load(Ordering::SeqCst)) else {
            return;
        };
        let accepted = listener.accept();
        if stop.load(Ordering::SeqCst) {
            return;
        }
        match accepted {
            Ok((sock, _)) => {
                let stream: TcpStream = sock.into();
                let (tx, rejections) = (tx.clone(), rejections.clone());
                if let Err(e) = sockets::spawn("nccl-bs-root-conn", move || {
                    let hello = read_hello(&stream, (addr, nonce), &rejections);
                    drop(permit);
                    if let Some(hello) = hello {
                        // The root thread is gone once the bootstrap completed or failed.
                        let _ = tx.send(Arrival { hello, stream });
                    }
                }) {
                    log::warn!("bootstrap root {addr}: cannot start a connection thread: {e}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                log::warn!("bootstrap root {addr}: accept failed: {e}");
                // Out of file descriptors and the like: do not spin.
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// Tells a rank why it cannot join; best effort.
fn refuse(stream: &TcpStream, code: NcclResult, message: &str) {
    let deadline = sockets::deadline_after(Duration::from_secs(1));
    let _ = socket::write_frame(stream, &wire::encode_fail(code, message), deadline);
}

/// The hello of a connection, if it is a valid one for this root (else it is refused or
/// dropped, with a warning).
fn read_hello(
    stream: &TcpStream,
    (addr, nonce): (SocketAddr, u64),
    rejections: &sockets::Rejections,
) -> Option<Hello> {
    let peer = stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_else(|_| "?".into());
    let _ = stream.set_nodelay(true);
    let body = match socket::read_frame(
        stream,
        wire::MAX_CTRL_BODY,
        sockets::deadline_after(socket::handshake_wait()),
    ) {
        Ok(b) => b,
        Err(e) => {
            rejections
                .warn(|| format!("bootstrap root {addr}: dropping connection from {peer}: {e}"));
            return None;
        }
    };
    let hello = match wire::decode(&body) {
        Ok(Msg::Hello(h)) => h,
        Ok(_) => {
            rejections.warn(|| {
                format!("bootstrap root {addr}: dropping connection from {peer}: not a hello")
            });
            return None;
        }
        Err(e) => {
            rejections.warn(|| {
                format!(
                    "bootstrap root {addr}: dropping connection from {peer}: {}",
                    e.message
                )
            });
            return None;
        }
    };
    if hello.nonce != nonce {
        rejections.warn(|| {
            format!("bootstrap root {addr}: {peer} brought the nonce of another unique id")
        });
        refuse(
            stream,
            NcclResult::InvalidUsage,
            &format!("the bootstrap root at {addr} belongs to another unique id (stale id?)"),
        );
        return None;
    }
    let (rank, nranks) = (hello.rank as usize, hello.nranks as usize);
    if nranks == 0 || nranks > wire::MAX_RANKS || rank >= nranks {
        rejections.warn(|| format!("bootstrap root {addr}: {peer} says rank {rank} of {nranks}"));
        refuse(
            stream,
            NcclResult::InvalidArgument,
            &format!("rank {rank} of {nranks} ranks is out of range"),
        );
        return None;
    }
    Some(hello)
}

struct Joined {
    stream: TcpStream,
    addr: SocketAddr,
}

/// Waits for all ranks, answers them. Returns when the bootstrap completed or failed, or when
/// no rank arrived within `idle`.
fn gather(
    rx: &mpsc::Receiver<Arrival>,
    addr: SocketAddr,
    nonce: u64,
    secret: Secret,
    idle: Duration,
) {
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
                    refuse(&j.stream, NcclResult::RemoteError, &message);
                }
                return;
            }
            Err(RecvTimeoutError::Disconnected) => {
                log::warn!("bootstrap root {addr}: the accept thread stopped");
                for j in joined.iter().flatten() {
                    refuse(
                        &j.stream,
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
            addr: a.hello.addr,
        });
        count += 1;
        if count == joined.len() {
            break;
        }
    }
    let addrs: Vec<SocketAddr> = joined.iter().flatten().map(|j| j.addr).collect();
    log::info!(
        "bootstrap root {addr}: all {} ranks arrived; sending the address tables",
        addrs.len()
    );
    let deadline = sockets::deadline_after(ANSWER_WAIT);
    // One table per rank, made when it is sent: rank i's lists the keys of its pairs only.
    let mut table: Vec<Member> = Vec::with_capacity(addrs.len());
    for (rank, j) in joined.iter().enumerate() {
        if let Some(j) = j {
            table.clear();
            table.extend(addrs.iter().enumerate().map(|(peer, &a)| Member {
                addr: a,
                key: if peer == rank {
                    0
                } else {
                    keys::pair_key(secret, rank, peer)
                },
            }));
            let frame = wire::encode_table(nonce, &table);
            if let Err(e) = socket::write_frame(&j.stream, &frame, deadline) {
                // That rank will fail on its own; the others can still go on.
                log::warn!("bootstrap root {addr}: cannot send the table to rank {rank}: {e}");
            }
        }
    }
}
