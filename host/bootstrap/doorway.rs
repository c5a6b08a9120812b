//! A listener's doorway: one thread accepts every connection, sends it a challenge, and waits
//! with poll(2) for its first frame; only a connection whose first frame the listener's owner
//! admits goes on (to a reader thread, or to the root's gather). A stranger who opens
//! thousands of connections and says nothing therefore costs no thread, a bounded number of
//! descriptors, and no real rank its place:
//!
//! - a connection has `wait` to send its first frame (`NCCL_RS_BOOTSTRAP_HANDSHAKE_MS`);
//! - at most `pending` connections wait at once, and at most `per_source` from one address: a
//!   new one past either bound pushes out the oldest waiting one (of that address, or of all)
//!   once that one has waited a quarter of `wait`, else the new one is refused; so a real
//!   rank, which answers its challenge within a round trip, gets in even while silent
//!   connections keep the doorway full, and a rank that was refused or pushed out (it sees
//!   its connection close before its answer) connects again after a pause;
//! - at most 64 connections are accepted per wake, then the waiting ones are read, and an
//!   accept error (out of descriptors) rests the listener for 50 ms instead of spinning;
//! - every drop is counted and logged with a rate limit (`sockets::Rejections`).

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use socket2::Socket;

use crate::sockets;

/// The longest a doorway sleeps without asking its owner whether to stop.
const STOP_CHECK: Duration = Duration::from_secs(1);

/// How many connections a doorway lets wait, in all and from one address.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    pub pending: usize,
    pub per_source: usize,
    /// How long a connection may take to send its first frame.
    pub wait: Duration,
    /// Largest first frame's body.
    pub max_frame: usize,
}

impl Limits {
    /// The bootstrap's: 1024 waiting, 256 from one address, fewer where the process may
    /// hold few descriptors (an eighth of its soft limit, so that a flood cannot take the
    /// descriptors the job needs); `wait` from the environment.
    pub(crate) fn bootstrap(max_frame: usize) -> Limits {
        let pending = sockets::descriptor_share(1024);
        Limits {
            pending,
            per_source: (pending / 4).max(1),
            wait: super::socket::handshake_wait(),
            max_frame,
        }
    }
}

/// What a doorway asks of its owner.
pub(crate) trait Owner {
    /// Whether to stop: asked whenever the listener wakes the doorway (the owner shuts it down
    /// to stop it) and at least every [`STOP_CHECK`].
    fn stopped(&self) -> bool;
    /// A fresh challenge: its value, and the frame that carries it. None: no random source
    /// (the connection is dropped).
    fn challenge(&mut self) -> Option<(u128, Vec<u8>)>;
    /// A connection's first frame body, with the challenge it was sent; the stream is in
    /// blocking mode again. Err(why): refused (the owner has closed or dropped the stream).
    fn admit(&mut self, stream: TcpStream, challenge: u128, body: Vec<u8>) -> Result<(), String>;
    /// Logs a dropped or refused connection (rate-limited by the owner).
    fn rejected(&mut self, from: SocketAddr, why: &str);
}

/// A connection waiting for its first frame.
struct Waiting {
    stream: TcpStream,
    from: SocketAddr,
    challenge: u128,
    /// The frame so far: its 4-byte length, then its body.
    buf: Vec<u8>,
    until: Instant,
}

/// Accepts on `listener` until `owner.stopped()`; see the module text.
pub(crate) fn serve(listener: &Socket, limits: Limits, owner: &mut dyn Owner) {
    if let Err(e) = listener.set_nonblocking(true) {
        log::warn!("bootstrap: cannot make a listener non-blocking: {e}");
        return;
    }
    let mut waiting: VecDeque<Waiting> = VecDeque::new();
    let mut fds: Vec<libc::pollfd> = Vec::new();
    // After an accept error (out of descriptors, ...) the listener is left alone for a while:
    // the connection that failed stays queued, and polling it at once would spin.
    let mut listener_rests_until: Option<Instant> = None;
    let accept_errors = sockets::Rejections::default();
    while !owner.stopped() {
        let now = Instant::now();
        if listener_rests_until.is_some_and(|t| t <= now) {
            listener_rests_until = None;
        }
        // Drop those past their time.
        while let Some(i) = waiting.iter().position(|w| w.until <= now) {
            let w = waiting.remove(i).expect("position is in range");
            owner.rejected(w.from, "no answer to the challenge in time");
        }
        // The owner stops a doorway by shutting its listener down, which wakes the poll; the
        // 1 s cap is a safety net only. (A 50 ms one cost 4,096 ranks as threads 80,000
        // wake-ups a second, both cores of this machine: their hellos missed the deadline.)
        let next = waiting
            .iter()
            .map(|w| w.until)
            .chain(listener_rests_until)
            .min();
        let wait = next.map_or(STOP_CHECK, |t| {
            t.saturating_duration_since(now).min(STOP_CHECK)
        });
        fds.clear();
        // A resting listener is polled for nothing (fd -1 is skipped by poll).
        fds.push(pollfd(match listener_rests_until {
            None => listener.as_raw_fd(),
            Some(_) => -1,
        }));
        fds.extend(waiting.iter().map(|w| pollfd(w.stream.as_raw_fd())));
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd structures.
        let n = unsafe {
            libc::poll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                wait.as_millis().max(1) as i32,
            )
        };
        if n <= 0 {
            continue;
        }
        // The waiting ones first (indices shift as they leave), newest to oldest.
        for i in (0..waiting.len()).rev() {
            if fds[i + 1].revents == 0 {
                continue;
            }
            match read_some(&mut waiting[i], limits.max_frame) {
                Ok(false) => {}
                Ok(true) => {
                    let w = waiting.remove(i).expect("index is in range");
                    let body = w.buf[4..].to_vec();
                    if let Err(e) = w.stream.set_nonblocking(false) {
                        owner.rejected(w.from, &format!("cannot make it blocking: {e}"));
                        continue;
                    }
                    let from = w.from;
                    if let Err(why) = owner.admit(w.stream, w.challenge, body) {
                        owner.rejected(from, &why);
                    }
                }
                Err(why) => {
                    let w = waiting.remove(i).expect("index is in range");
                    owner.rejected(w.from, &why);
                }
            }
        }
        if fds[0].revents != 0 {
            if let Err(e) = accept_some(listener, &limits, &mut waiting, owner) {
                if !owner.stopped() {
                    accept_errors.warn(|| format!("bootstrap: accept failed: {e}"));
                }
                listener_rests_until = Some(sockets::deadline_after(ACCEPT_REST));
            }
        }
    }
}

fn pollfd(fd: i32) -> libc::pollfd {
    libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    }
}

/// How long a listener rests after an accept error.
const ACCEPT_REST: Duration = Duration::from_millis(50);
/// Most connections accepted per wake: then the waiting ones' answers are read, so a flood
/// that connects as fast as it is accepted cannot keep real ranks' hellos unread.
const ACCEPTS_PER_WAKE: usize = 64;

/// Accepts up to [`ACCEPTS_PER_WAKE`] connections, each sent its challenge and set waiting;
/// Err on an accept error other than "none left" (out of descriptors, ...).
fn accept_some(
    listener: &Socket,
    limits: &Limits,
    waiting: &mut VecDeque<Waiting>,
    owner: &mut dyn Owner,
) -> io::Result<()> {
    let mut taken = 0;
    while taken < ACCEPTS_PER_WAKE {
        let (sock, addr) = match listener.accept() {
            Ok(a) => a,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        taken += 1;
        let Some(from) = addr.as_socket() else {
            continue;
        };
        let stream: TcpStream = sock.into();
        if !make_room(waiting, from.ip(), limits, owner) {
            owner.rejected(from, "too many connections waiting; try again");
            continue;
        }
        let Some((challenge, frame)) = owner.challenge() else {
            owner.rejected(from, "no random challenge could be drawn");
            continue;
        };
        // A fresh socket's send buffer takes a challenge whole; anything else is not a peer.
        if stream.set_nonblocking(true).is_err()
            || (&stream).write(&frame).ok() != Some(frame.len())
        {
            owner.rejected(from, "cannot send it its challenge");
            continue;
        }
        waiting.push_back(Waiting {
            stream,
            from,
            challenge,
            buf: Vec::new(),
            until: sockets::deadline_after(limits.wait),
        });
    }
    Ok(())
}

/// Makes room for a connection from `ip`: when that address has `per_source` waiting, or all
/// have `pending`, the oldest waiting one (of that address, or of all) is pushed out, if it
/// has waited a quarter of `wait` (a real rank answers long before: a flood's connections age
/// past it); else the new one is refused (false), and its rank, if it is one, knocks again
/// after a pause. Without that age, thousands of ranks arriving at once on a busy host pushed
/// one another out before any could answer.
fn make_room(
    waiting: &mut VecDeque<Waiting>,
    ip: IpAddr,
    limits: &Limits,
    owner: &mut dyn Owner,
) -> bool {
    let same = waiting.iter().filter(|w| w.from.ip() == ip).count();
    let full_here = same >= limits.per_source.max(1);
    if !full_here && waiting.len() < limits.pending.max(1) {
        return true;
    }
    let old_enough = sockets::deadline_after(limits.wait - limits.wait / 4);
    // The oldest waiting one (of `ip` when that address is full) if it is old enough.
    let out = waiting
        .iter()
        .position(|w| !full_here || w.from.ip() == ip)
        .filter(|&i| waiting[i].until <= old_enough);
    match out {
        Some(i) => {
            let w = waiting.remove(i).expect("index is in range");
            owner.rejected(
                w.from,
                "pushed out by a newer connection (too many waiting)",
            );
            true
        }
        None => false,
    }
}

/// Reads what arrived; Ok(true) once the first frame is whole.
fn read_some(w: &mut Waiting, max_frame: usize) -> Result<bool, String> {
    let mut chunk = [0u8; 512];
    loop {
        let want = if w.buf.len() < 4 {
            4 - w.buf.len()
        } else {
            let mut p = [0u8; 4];
            p.copy_from_slice(&w.buf[..4]);
            let len = super::wire::body_len(p, max_frame)
                .ok_or_else(|| format!("a first frame over {max_frame} bytes"))?;
            4 + len - w.buf.len()
        };
        if want == 0 {
            return Ok(true);
        }
        let take = want.min(chunk.len());
        match (&w.stream).read(&mut chunk[..take]) {
            Ok(0) => return Err("closed before its first frame".into()),
            Ok(n) => w.buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
}
