//! The data path of one connection: a control socket and `nthreads` × `nsocks` data sockets,
//! moved by `nthreads` helper threads.
//!
//! Framing: every message starts with a 16-byte header on the control socket (length, tag, a
//! check word that also says how the payload travels). A message shorter than the sender's
//! inline limit (`NCCL_RS_SOCKET_INLINE_BYTES`, [`wire::DEFAULT_INLINE_BELOW`]) follows its
//! header inline on the control socket; a longer one is cut by [`wire::piece`] into one
//! contiguous piece per data socket, which both ends compute from the length alone, so pieces
//! carry no framing. Each socket is a FIFO and both ends walk the messages in the same order, so
//! messages complete in order.
//!
//! Threads: helper thread `t` owns the data sockets `i` with `i % nthreads == t`; thread 0 also
//! owns the control socket. On the sending side `isend` hands the message to every thread;
//! thread 0 writes the header (and an inline payload) and each thread writes its pieces. On the
//! receiving side the caller's `irecv` and `test` read the control socket without blocking:
//! a header, then an inline payload into the oldest posted buffer, or for a large message hand
//! it to every thread. A thread with one piece to move uses a blocking call (woken every
//! [`IO_TICK`] to look at its flags); with several it interleaves non-blocking calls over its
//! sockets, backing off when none moves. The last thread to finish its part of a message
//! completes the request and calls the waker.
//!
//! Why the caller moves small messages itself: handing one to a sleeping thread and back costs
//! two thread wake-ups per side, several times what loopback TCP takes to move it. So `isend`
//! writes an inline message itself when thread 0 has nothing queued for the control socket
//! (whatever does not go out at once is left to thread 0, which goes on from that byte). A
//! receiving caller that stops polling (an idle proxy asleep, a program waiting on its sends)
//! does not stall the stream: when it has not come by for [`CALLER_AWAY`], thread 0 watches
//! the control socket, reads what arrives the same way and calls the waker. Whoever reads
//! holds `reader`; the caller only tries it, so it never waits on thread 0.
//!
//! Failures: an I/O error or an end of stream records one `ncclRemoteError` naming the peer,
//! shuts every socket down (which wakes the other threads) and calls the waker; from then on
//! every `isend`, `irecv` and `test` of an unfinished request returns that error. `isend` and
//! `irecv` also peek at the control socket, so that a peer that went away while the connection
//! was idle is noticed before new work is posted. Dropping the comm shuts the sockets down and
//! joins the threads.
//!
//! A peer whose host stops answering without closing anything (its link taken down, the host
//! gone) sends no reset and no end of stream: without more, a receive would wait for it forever.
//! So every socket has TCP keepalive probes tuned to the peer timeout
//! (`NCCL_RS_SOCKET_TIMEOUT_MS`, [`keepalive`]): a connection that hears nothing from the peer's
//! host for that long fails with ETIMEDOUT, which the waiting helper thread reports as above.
//! The probes are answered by the peer's kernel, so a peer rank that is merely busy (a late
//! collective) never trips them.
//!
//! Keepalive never probes a socket with unacknowledged data of its own: a sender whose peer's
//! host vanished mid-message would wait on TCP's retransmissions (about 15 minutes). So a
//! sending helper thread that cannot move bytes looks, every [`IO_TICK`] or so, at its
//! socket's TCP_INFO: data in flight and no acknowledgement at all for the send timeout
//! (`NCCL_RS_SOCKET_SEND_TIMEOUT_MS`, [`unacked_for`]) fails the connection as above.
//! TCP_USER_TIMEOUT would bound that too, but Linux also counts a zero window against it: a
//! receiver that merely posts its buffers late (a rank late to a collective, whose peer has
//! filled the socket buffers meanwhile) would end the connection. Its kernel still answers
//! with acknowledgements (of the zero-window probes), and no segment stays unacknowledged
//! then, so the check here never fires on it.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::mem::MaybeUninit;
use std::net::{Shutdown, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use socket2::Socket;

use super::wire::{self, HEADER_BYTES};
use crate::error::{Error, Result};
use crate::transport::net::{Mr, RecvBuf, Request, Waker, PTR_HOST};

/// A blocking socket call gives up after this long without progress, so that a helper thread
/// looks at its flags now and then (shutting the sockets down wakes it at once anyway).
pub const IO_TICK: Duration = Duration::from_millis(100);
/// Most requests a comm holds before `isend`/`irecv` answer "try again" (NCCL's
/// NCCL_NET_MAX_REQUESTS).
pub const MAX_REQUESTS: usize = 32;
/// Bytes a helper thread reads at once when it throws a message away.
const SCRATCH_BYTES: usize = 256 << 10;
/// A receiving caller that has not read the control socket for this long may be asleep: thread
/// 0 then watches the socket and calls the waker when bytes arrive.
pub const CALLER_AWAY: Duration = Duration::from_millis(2);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// What the handshake hands over: the sockets of one connection, in index order.
pub(super) struct Conn {
    pub ctrl: Socket,
    pub data: Vec<Socket>,
    pub nthreads: usize,
    pub peer: SocketAddr,
    pub dev: String,
    /// The peer timeout ([`keepalive`]); None: the kernel's defaults (no probes).
    pub peer_timeout: Option<Duration>,
    /// Sending: how long data in flight may go unacknowledged ([`unacked_for`]); None: TCP's
    /// retransmission limit alone.
    pub send_timeout: Option<Duration>,
    /// Sending: messages shorter than this go inline on the control socket
    /// ([`wire::sends_inline`]); a receiver reads the way from each header.
    pub inline_below: usize,
}

/// One message: where its bytes are (or go), and its outcome.
struct Msg {
    /// Start address inside a registered region.
    addr: usize,
    /// Sending: the length; receiving: the buffer's size.
    cap: usize,
    tag: u32,
    mr: u64,
    /// Helper threads that still have to do their part.
    parts_left: AtomicUsize,
    result: OnceLock<Result<usize>>,
}

/// A thread's part of a message.
struct Work {
    msg: Arc<Msg>,
    /// The message's length (receiving: known once thread 0 read the header).
    len: usize,
    /// Receiving a message longer than its buffer: read and drop its bytes, fail the request.
    discard: bool,
    /// Sending: bytes of the header and inline payload the caller already wrote.
    sent: usize,
}

/// The helper threads' work: each thread's parts of messages, and (receiving) the posted
/// buffers whose header has not been read yet, oldest first.
struct Queues {
    work: Vec<VecDeque<Work>>,
    posted: VecDeque<Arc<Msg>>,
}

struct Shared {
    peer: SocketAddr,
    dev: String,
    nthreads: usize,
    ndata: usize,
    queues: Mutex<Queues>,
    cv: Condvar,
    /// Sending: messages handed to thread 0 whose header and inline payload are not all
    /// written yet; while any are, the caller must not write on the control socket.
    ctrl_queued: AtomicUsize,
    /// Receiving: where the reading of the control socket stands; held by whoever reads it.
    reader: Mutex<Reader>,
    /// Receiving: when the caller last read the control socket ([`Shared::clock_us`]).
    caller_seen_us: AtomicU64,
    /// The time base of `caller_seen_us`.
    epoch: Instant,
    /// Receiving: an eventfd rung when thread 0 gets work, so that watching the control
    /// socket (a blocking poll) never keeps it from its pieces of a large message.
    work_bell: Option<OwnedFd>,
    stop: AtomicBool,
    /// The peer closed its sending end cleanly (a [`wire::CLOSE_TAG`] header): nothing more
    /// arrives, and that is no error.
    closed: AtomicBool,
    failed: AtomicBool,
    error: Mutex<Option<Error>>,
    waker: Mutex<Option<Waker>>,
    /// Every socket (control first), to shut them down.
    sockets: Vec<Arc<Socket>>,
    /// Sending: the bound on unacknowledged data ([`unacked_for`]).
    send_timeout: Option<Duration>,
    /// Sending: [`Conn::inline_below`].
    inline_below: usize,
}

impl Shared {
    fn clock_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Sending: does a `len`-byte message go inline on the control socket?
    fn sends_inline(&self, len: usize) -> bool {
        wire::sends_inline(len, self.inline_below)
    }

    fn quitting(&self) -> bool {
        self.stop.load(Ordering::Acquire) || self.failed.load(Ordering::Acquire)
    }

    fn error(&self) -> Option<Error> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.error).clone()
    }

    fn wake(&self) {
        let w = lock(&self.waker).clone();
        if let Some(w) = w {
            w();
        }
    }

    /// Records the connection's failure (the first one wins; nothing while the comm is being
    /// dropped), shuts every socket down and wakes everyone.
    fn fail(&self, what: impl FnOnce() -> String) {
        if self.stop.load(Ordering::Acquire) {
            return;
        }
        {
            let _q = lock(&self.queues);
            let mut err = lock(&self.error);
            if err.is_some() {
                return;
            }
            *err = Some(Error::remote(format!(
                "NET/Socket: connection with {} (device {}): {}",
                self.peer,
                self.dev,
                what()
            )));
            self.failed.store(true, Ordering::Release);
        }
        self.cv.notify_all();
        for s in &self.sockets {
            let _ = s.shutdown(Shutdown::Both);
        }
        self.wake();
    }

    /// The next part of a message for thread `t`; None once the comm stops or fails.
    fn next(&self, t: usize) -> Option<Work> {
        self.next_job(t, false).map(|j| match j {
            Job::Part(w) => w,
            Job::Listen => unreachable!("listening is thread 0's, receiving"),
        })
    }

    /// Thread `t`'s next part of a message or, with `listen` (thread 0 receiving), a posted
    /// buffer waiting for its header; None once the comm stops or fails.
    fn next_job(&self, t: usize, listen: bool) -> Option<Job> {
        let mut q = lock(&self.queues);
        loop {
            if self.quitting() {
                return None;
            }
            if let Some(w) = q.work[t].pop_front() {
                return Some(Job::Part(w));
            }
            if listen && !q.posted.is_empty() {
                return Some(Job::Listen);
            }
            q = self
                .cv
                .wait_timeout(q, IO_TICK)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    fn push(&self, threads: std::ops::Range<usize>, w: &Work) {
        let to_thread0 = threads.contains(&0);
        {
            let mut q = lock(&self.queues);
            for t in threads {
                q.work[t].push_back(Work {
                    msg: w.msg.clone(),
                    len: w.len,
                    discard: w.discard,
                    sent: w.sent,
                });
            }
        }
        self.cv.notify_all();
        if let (true, Some(fd)) = (to_thread0, &self.work_bell) {
            let one = 1u64.to_ne_bytes();
            // SAFETY: writes 8 bytes from `one` to an eventfd this struct owns. A full counter
            // (EAGAIN) means thread 0 has been rung already.
            let _ = unsafe { libc::write(fd.as_raw_fd(), one.as_ptr().cast(), one.len()) };
        }
    }

    /// Thread's part of `w` is done; the last part completes the request.
    fn part_done(&self, w: &Work) {
        if w.msg.parts_left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        self.finish(&w.msg, w.len, w.discard);
        self.wake();
    }

    /// Completes `msg`: `len` bytes moved, or (`discard`) dropped as too long for its buffer.
    fn finish(&self, msg: &Msg, len: usize, discard: bool) {
        let result = if discard {
            Err(Error::remote(format!(
                "NET/Socket: message of {len} bytes from {} does not fit the receive buffer of {} \
                 bytes (device {}); the message was dropped",
                self.peer, msg.cap, self.dev
            )))
        } else {
            Ok(len)
        };
        let _ = msg.result.set(result);
    }
}

impl Shared {
    /// Reads what the control socket holds, without blocking: headers, inline payloads into
    /// the oldest posted buffers, large messages handed to the threads. A broken stream fails
    /// the connection (the error then comes from `test`).
    fn read_ctrl(&self, ctrl: &Socket, reader: &mut Reader) {
        if self.quitting() {
            return;
        }
        if let Err(what) = self.read_ctrl_inner(ctrl, reader) {
            self.fail(|| what);
        }
    }

    fn read_ctrl_inner(
        &self,
        ctrl: &Socket,
        reader: &mut Reader,
    ) -> std::result::Result<(), String> {
        reader.stash.drained = false;
        loop {
            match &mut reader.reading {
                Reading::Header { buf, got } => {
                    if lock(&self.queues).posted.is_empty() {
                        return Ok(()); // headers are read for posted receives only
                    }
                    while *got < HEADER_BYTES {
                        let mut part = [MaybeUninit::<u8>::uninit(); HEADER_BYTES];
                        let want = &mut part[..HEADER_BYTES - *got];
                        match reader.stash.read(ctrl, want) {
                            Ok(Some(n)) => {
                                for (d, s) in buf[*got..*got + n].iter_mut().zip(&part[..n]) {
                                    // SAFETY: the socket initialized the first n bytes.
                                    *d = unsafe { s.assume_init() };
                                }
                                *got += n;
                            }
                            Ok(None) => return Ok(()),
                            Err(e) => {
                                return Err(format!(
                                    "{} (reading a message header, {got} of {HEADER_BYTES} \
                                     bytes in)",
                                    io_text(&e)
                                ))
                            }
                        }
                    }
                    let Some((len, tag, inline)) = wire::decode_header(buf) else {
                        return Err(
                            "received a corrupt message header (the stream lost its framing)"
                                .into(),
                        );
                    };
                    if tag == wire::CLOSE_TAG {
                        // The sender is gone on purpose: posted receives stay pending, quietly.
                        self.closed.store(true, Ordering::Release);
                        self.stop.store(true, Ordering::Release);
                        self.cv.notify_all();
                        return Ok(());
                    }
                    let Some(msg) = lock(&self.queues).posted.pop_front() else {
                        return Err("a header without a posted receive".into());
                    };
                    let discard = len > msg.cap;
                    if inline {
                        reader.reading = Reading::Payload {
                            msg,
                            len,
                            got: 0,
                            discard,
                        };
                    } else {
                        let w = Work {
                            msg,
                            len,
                            discard,
                            sent: 0,
                        };
                        self.push(0..self.nthreads, &w);
                        reader.reading = Reading::header();
                    }
                }
                Reading::Payload {
                    msg,
                    len,
                    got,
                    discard,
                } => {
                    while *got < *len {
                        let dst = if *discard {
                            if reader.scratch.is_empty() {
                                reader.scratch = vec![MaybeUninit::uninit(); SCRATCH_BYTES];
                            }
                            let n = (*len - *got).min(reader.scratch.len());
                            &mut reader.scratch[..n]
                        } else {
                            // SAFETY: `msg.addr..msg.addr + len` (len <= msg.cap) lies inside
                            // a region registered with this comm (checked by `irecv`), valid
                            // for writes until `dereg_mr` (refused while this request is in
                            // flight); only the holder of `reader` touches it while the
                            // receive is unfinished. MaybeUninit: nothing is claimed about
                            // its contents.
                            unsafe {
                                std::slice::from_raw_parts_mut(
                                    (msg.addr + *got) as *mut MaybeUninit<u8>,
                                    *len - *got,
                                )
                            }
                        };
                        match reader.stash.read(ctrl, dst) {
                            Ok(Some(n)) => *got += n,
                            Ok(None) => return Ok(()),
                            Err(e) => {
                                return Err(format!(
                                    "{} (receiving bytes {got}.. of a {len}-byte inline message)",
                                    io_text(&e)
                                ))
                            }
                        }
                    }
                    self.finish(msg, *len, *discard);
                    reader.reading = Reading::header();
                }
            }
        }
    }
}

/// What a helper thread does next.
enum Job {
    /// Its part of a message.
    Part(Work),
    /// Thread 0, receiving: make sure a caller that went away hears of arriving bytes.
    Listen,
}

/// One non-blocking read: Some(bytes read), None when nothing is there; the end of the
/// stream is an error.
fn read_now(s: &Socket, buf: &mut [MaybeUninit<u8>]) -> io::Result<Option<usize>> {
    loop {
        return match s.recv_with_flags(buf, libc::MSG_DONTWAIT) {
            Ok(0) if !buf.is_empty() => Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed the connection",
            )),
            Ok(n) => Ok(Some(n)),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if would_block(&e) => Ok(None),
            Err(e) => Err(e),
        };
    }
}

/// Waits up to `limit` for `s` to become readable (bytes, an end of stream or an error), or for
/// `bell` to ring (then drained). True when `s` is readable.
fn readable(s: &Socket, bell: Option<&OwnedFd>, limit: Duration) -> bool {
    let mut fds = [
        libc::pollfd {
            fd: s.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        },
        libc::pollfd {
            fd: bell.map_or(-1, |b| b.as_raw_fd()),
            events: libc::POLLIN,
            revents: 0,
        },
    ];
    let ms = libc::c_int::try_from(limit.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: two pollfds, nfds says two; a negative fd is ignored by poll.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), 2, ms) };
    if rc > 0 && fds[1].revents != 0 {
        if let Some(b) = bell {
            let mut count = [0u8; 8];
            // SAFETY: reads at most 8 bytes into `count` from an eventfd (non-blocking).
            let _ = unsafe { libc::read(b.as_raw_fd(), count.as_mut_ptr().cast(), count.len()) };
        }
    }
    rc > 0 && fds[0].revents != 0
}

/// A non-blocking eventfd; None where the system refuses one (thread 0 then notices its work
/// within [`IO_TICK`]).
fn eventfd() -> Option<OwnedFd> {
    // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor we own.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    // SAFETY: `fd` was just created and nothing else owns it.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Why a helper thread stopped working on a message.
enum Halt {
    /// The comm stops or already failed: leave quietly.
    Quit,
    /// This thread saw the connection break.
    Broken(String),
}

/// A call that should be repeated: nothing moved before the socket's IO_TICK timeout (EAGAIN),
/// or a signal. ETIMEDOUT is no such thing on Linux: it is the kernel giving up on the
/// connection (keepalive probes or retransmissions unanswered), an error.
fn would_block(e: &io::Error) -> bool {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => true,
        io::ErrorKind::TimedOut => e.raw_os_error() != Some(libc::ETIMEDOUT),
        _ => false,
    }
}

/// An I/O error for a message; a connection timeout says what it means.
fn io_text(e: &io::Error) -> String {
    if e.raw_os_error() == Some(libc::ETIMEDOUT) {
        format!(
            "{e}: the peer's host stopped answering (link down or host gone; see \
             NCCL_RS_SOCKET_TIMEOUT_MS)"
        )
    } else {
        e.to_string()
    }
}

/// How long `s` has had data in flight without any acknowledgement from its peer's host, when
/// that is at least `t` (TCP_INFO: unacknowledged segments, time since the last ACK). None
/// while the peer acknowledges, or when nothing is in flight: a zero window (a receiver that
/// does not read) leaves nothing unacknowledged, and its kernel answers the window probes.
pub(super) fn unacked_for(s: &Socket, t: Duration) -> Option<Duration> {
    let mut info = MaybeUninit::<libc::tcp_info>::zeroed();
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: `info` is writable for `len` bytes, and the kernel writes at most `len` bytes
    // of a tcp_info there (fewer on older kernels; the rest stays zero).
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            info.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return None;
    }
    // SAFETY: zero-initialised, then (partly) filled by the kernel: every bit pattern is a
    // valid tcp_info (plain integers).
    let info = unsafe { info.assume_init() };
    let silent = Duration::from_millis(info.tcpi_last_ack_recv.into());
    (info.tcpi_unacked > 0 && silent >= t).then_some(silent)
}

/// Part of a message on one socket.
struct Piece {
    sock: Arc<Socket>,
    /// None: the control socket; Some(i): data socket i.
    index: Option<usize>,
    /// Next address to move (inside a registered region).
    addr: usize,
    left: usize,
    /// Receiving into the scratch buffer (dropping the bytes).
    discard: bool,
    /// Where the piece sits in its message, for error messages.
    range: (usize, usize),
    len: usize,
}

impl Piece {
    fn describe(&self, send: bool) -> String {
        let (start, end) = self.range;
        let sock = match self.index {
            None => "the control socket".to_string(),
            Some(i) => format!("data socket {i}"),
        };
        format!(
            "{} bytes {start}..{end} of a {}-byte message on {sock} ({} bytes left)",
            if send { "sending" } else { "receiving" },
            self.len,
            self.left
        )
    }
}

struct Worker {
    t: usize,
    send: bool,
    shared: Arc<Shared>,
    ctrl: Option<Arc<Socket>>,
    socks: Vec<(usize, Arc<Socket>)>,
    scratch: Vec<MaybeUninit<u8>>,
    /// When the sockets' acknowledgements were last looked at ([`Worker::acked`]).
    acks_seen: Instant,
}

impl Worker {
    fn run(mut self) {
        if !self.send && self.t == 0 {
            return self.run_listener();
        }
        while let Some(w) = self.shared.next(self.t) {
            let outcome = if self.send {
                self.send_one(&w).map(|()| w)
            } else {
                self.recv_one(w)
            };
            match outcome {
                Ok(w) => self.shared.part_done(&w),
                Err(Halt::Quit) => return,
                Err(Halt::Broken(what)) => {
                    self.shared.fail(|| what);
                    return;
                }
            }
        }
    }

    fn check(&self) -> std::result::Result<(), Halt> {
        if self.shared.quitting() {
            Err(Halt::Quit)
        } else {
            Ok(())
        }
    }

    /// Sending with a send timeout: whether it is time (every [`IO_TICK`]) to look at the
    /// acknowledgements of the sockets that take no bytes ([`Worker::acked`]).
    fn acks_due(&mut self) -> bool {
        if !self.send || self.shared.send_timeout.is_none() || self.acks_seen.elapsed() < IO_TICK
        {
            return false;
        }
        self.acks_seen = Instant::now();
        true
    }

    /// Sending, while `sock` takes no bytes: fails the connection when its data in flight went
    /// unacknowledged for the send timeout ([`unacked_for`]).
    fn acked(&self, sock: &Socket, what: impl FnOnce() -> String) -> std::result::Result<(), Halt> {
        let Some(t) = self.shared.send_timeout else {
            return Ok(());
        };
        match unacked_for(sock, t) {
            Some(silent) => Err(Halt::Broken(format!(
                "{}: no acknowledgement from the peer's host for {:.1} s with data in flight \
                 (link down or host gone; see NCCL_RS_SOCKET_SEND_TIMEOUT_MS)",
                what(),
                silent.as_secs_f64()
            ))),
            None => Ok(()),
        }
    }

    fn ctrl(&self) -> std::result::Result<Arc<Socket>, Halt> {
        self.ctrl
            .clone()
            .ok_or_else(|| Halt::Broken("helper thread without the control socket".into()))
    }

    /// Writes all of `bytes` (a header) on `sock`.
    fn send_all(&mut self, sock: &Socket, bytes: &[u8]) -> std::result::Result<(), Halt> {
        let mut done = 0;
        while done < bytes.len() {
            match sock.send_with_flags(&bytes[done..], libc::MSG_NOSIGNAL) {
                Ok(n) => done += n,
                Err(e) if would_block(&e) => {
                    self.check()?;
                    if self.acks_due() {
                        self.acked(sock, || "sending a message header".into())?;
                    }
                }
                Err(e) => {
                    return Err(Halt::Broken(format!(
                        "sending a message header: {}",
                        io_text(&e)
                    )))
                }
            }
        }
        Ok(())
    }

    /// One call moving bytes of `p`; `flags` adds MSG_DONTWAIT for a non-blocking attempt.
    fn step(&mut self, p: &mut Piece, flags: libc::c_int) -> io::Result<usize> {
        let n = if self.send {
            // SAFETY: `p.addr..p.addr + p.left` lies inside a region registered with this comm
            // (checked by `isend` against the registration), which the caller of `reg_mr`
            // keeps valid for reads until `dereg_mr` (refused while this request is in flight)
            // or the comm's drop (which joins this thread first). Only reads happen through it.
            let buf = unsafe { std::slice::from_raw_parts(p.addr as *const u8, p.left) };
            p.sock.send_with_flags(buf, flags | libc::MSG_NOSIGNAL)?
        } else if p.discard {
            let n = p.left.min(self.scratch.len());
            p.sock.recv_with_flags(&mut self.scratch[..n], flags)?
        } else {
            // SAFETY: `p.addr..p.addr + p.left` lies inside a region registered with this comm
            // (checked by `irecv`), valid for writes until `dereg_mr` (refused while this
            // request is in flight) or the comm's drop (which joins this thread first). The
            // slice is typed MaybeUninit, so no claim is made about its contents, and only
            // this thread touches this byte range while the request is in flight.
            let buf =
                unsafe { std::slice::from_raw_parts_mut(p.addr as *mut MaybeUninit<u8>, p.left) };
            p.sock.recv_with_flags(buf, flags)?
        };
        if n == 0 && !self.send {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed the connection",
            ));
        }
        p.addr += n;
        p.left -= n;
        Ok(n)
    }

    fn broken(&self, p: &Piece, e: io::Error) -> Halt {
        if self.shared.quitting() {
            return Halt::Quit;
        }
        Halt::Broken(format!("{}: {}", p.describe(self.send), io_text(&e)))
    }

    /// Moves every piece to its end.
    fn move_pieces(&mut self, pieces: &mut [Piece]) -> std::result::Result<(), Halt> {
        let mut idle = 0u32;
        loop {
            let active = pieces.iter().filter(|p| p.left > 0).count();
            if active == 0 {
                return Ok(());
            }
            if active == 1 {
                // One socket to serve: block on it.
                for p in pieces.iter_mut().filter(|p| p.left > 0) {
                    match self.step(p, 0) {
                        Ok(_) => {}
                        Err(e) if would_block(&e) => {
                            self.check()?;
                            if self.acks_due() {
                                self.acked(&p.sock, || p.describe(true))?;
                            }
                        }
                        Err(e) => return Err(self.broken(p, e)),
                    }
                }
                continue;
            }
            let mut moved = false;
            for p in pieces.iter_mut().filter(|p| p.left > 0) {
                match self.step(p, libc::MSG_DONTWAIT) {
                    Ok(n) => moved |= n > 0,
                    Err(e) if would_block(&e) => {}
                    Err(e) => return Err(self.broken(p, e)),
                }
            }
            if moved {
                idle = 0;
            } else {
                idle += 1;
                self.check()?;
                if self.acks_due() {
                    for p in pieces.iter().filter(|p| p.left > 0) {
                        self.acked(&p.sock, || p.describe(true))?;
                    }
                }
                if idle < 32 {
                    std::thread::yield_now();
                } else {
                    std::thread::sleep(Duration::from_micros(10 * u64::from(idle.min(52) - 31)));
                }
            }
        }
    }

    /// This thread's pieces of a `len`-byte message starting at `addr`.
    fn pieces(&self, addr: usize, len: usize, discard: bool) -> Vec<Piece> {
        self.socks
            .iter()
            .filter_map(|(i, s)| {
                let r = wire::piece(len, self.shared.ndata, *i);
                (!r.is_empty()).then(|| Piece {
                    sock: s.clone(),
                    index: Some(*i),
                    addr: addr + r.start,
                    left: r.len(),
                    discard,
                    range: (r.start, r.end),
                    len,
                })
            })
            .collect()
    }

    fn inline_piece(&self, ctrl: Arc<Socket>, w: &Work) -> Piece {
        Piece {
            sock: ctrl,
            index: None,
            addr: w.msg.addr,
            left: w.len,
            discard: w.discard,
            range: (0, w.len),
            len: w.len,
        }
    }

    fn send_one(&mut self, w: &Work) -> std::result::Result<(), Halt> {
        let inline = self.shared.sends_inline(w.len);
        if self.t == 0 {
            let ctrl = self.ctrl()?;
            let hdr = wire::encode_header(w.len, w.msg.tag, inline);
            self.send_all(&ctrl, hdr.get(w.sent..).unwrap_or(&[]))?;
            if inline && w.len > 0 {
                // The caller may have written the first bytes already.
                let skip = w.sent.saturating_sub(HEADER_BYTES).min(w.len);
                let mut p = self.inline_piece(ctrl, w);
                p.addr += skip;
                p.left -= skip;
                self.move_pieces(&mut [p])?;
            }
            self.shared.ctrl_queued.fetch_sub(1, Ordering::AcqRel);
        }
        if inline {
            return Ok(());
        }
        let mut pieces = self.pieces(w.msg.addr, w.len, false);
        self.move_pieces(&mut pieces)
    }

    /// Receiving, threads other than 0: this thread's pieces of a message.
    fn recv_one(&mut self, w: Work) -> std::result::Result<Work, Halt> {
        if w.discard && self.scratch.is_empty() {
            self.scratch = vec![MaybeUninit::uninit(); SCRATCH_BYTES];
        }
        let mut pieces = self.pieces(w.msg.addr, w.len, w.discard);
        self.move_pieces(&mut pieces)?;
        Ok(w)
    }

    /// Receiving, thread 0: moves its pieces of large messages, and calls the waker when bytes
    /// arrive on the control socket while the caller is away.
    fn run_listener(mut self) {
        while let Some(job) = self.shared.next_job(0, true) {
            let outcome = match job {
                Job::Part(w) => self.recv_one(w).map(|w| self.shared.part_done(&w)),
                Job::Listen => self.listen(),
            };
            match outcome {
                Ok(()) => {}
                Err(Halt::Quit) => return,
                Err(Halt::Broken(what)) => {
                    self.shared.fail(|| what);
                    return;
                }
            }
        }
    }

    /// Receives are posted. While the caller comes by, nothing to do but wait for work; once it
    /// stayed away for [`CALLER_AWAY`], wait (a tick at most) for the control socket to become
    /// readable, read it, and call the waker.
    fn listen(&mut self) -> std::result::Result<(), Halt> {
        let shared = self.shared.clone();
        let away = Duration::from_micros(
            shared
                .clock_us()
                .saturating_sub(shared.caller_seen_us.load(Ordering::Acquire)),
        );
        if away >= CALLER_AWAY {
            let ctrl = self.ctrl()?;
            // Bytes read ahead may already hold what the posted receives wait for.
            let stashed = !lock(&shared.reader).stash.is_empty();
            if !stashed && !readable(&ctrl, shared.work_bell.as_ref(), IO_TICK) {
                return self.check();
            }
            shared.read_ctrl(&ctrl, &mut lock(&shared.reader));
            shared.wake();
            return self.check();
        }
        // Give the caller time to come (pushed work wakes us at once).
        let q = lock(&shared.queues);
        if q.work[0].is_empty() && !shared.quitting() {
            drop(shared.cv.wait_timeout(q, CALLER_AWAY - away));
        }
        self.check()
    }
}

/// A registered region.
#[derive(Clone, Copy, Debug)]
struct Region {
    addr: usize,
    len: usize,
}

/// One end of a connection (both `SendComm` and `RecvComm` are this, with `send` telling which).
pub(super) struct Comm {
    send: bool,
    shared: Arc<Shared>,
    ctrl: Arc<Socket>,
    threads: Vec<JoinHandle<()>>,
    mrs: HashMap<u64, Region>,
    next_mr: u64,
    reqs: HashMap<u64, Arc<Msg>>,
    next_req: u64,
    /// When `check_alive` last peeked at the control socket.
    last_peek: Option<Instant>,
}

/// How often `isend` and `irecv` peek at the control socket for a peer that went away.
const PEEK_EVERY: Duration = Duration::from_millis(1);

/// The receiving end's place in the control socket's stream, and where the bytes of a message
/// too long for its buffer go.
struct Reader {
    reading: Reading,
    scratch: Vec<MaybeUninit<u8>>,
    stash: Stash,
}

/// Bytes read from the control socket ahead of the message being parsed. A small message's
/// header and payload come in one read this way (one system call instead of three: header,
/// payload, and the next header's "nothing yet").
struct Stash {
    buf: Box<[u8]>,
    /// The unconsumed bytes are `buf[start..end]`.
    start: usize,
    end: usize,
    /// The socket had no more bytes at the last read of this pass: the next read of the pass
    /// answers "nothing there" without a system call (bytes that arrive meanwhile are read
    /// on the next pass).
    drained: bool,
}

/// The stash's size: a small message with its header, and the start of the next.
const STASH_BYTES: usize = 8 << 10;

impl Stash {
    fn new() -> Stash {
        Stash {
            buf: vec![0; STASH_BYTES].into_boxed_slice(),
            start: 0,
            end: 0,
            drained: false,
        }
    }

    fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Like [`read_now`], served from the stash first; a read for fewer bytes than the stash
    /// holds refills it, a larger one goes straight into `dst`.
    fn read(&mut self, s: &Socket, dst: &mut [MaybeUninit<u8>]) -> io::Result<Option<usize>> {
        if dst.is_empty() {
            return Ok(Some(0));
        }
        if self.is_empty() {
            if self.drained {
                return Ok(None);
            }
            if dst.len() >= self.buf.len() {
                let got = read_now(s, dst)?;
                self.drained = got.is_none_or(|n| n < dst.len());
                return Ok(got);
            }
            // SAFETY: the stash's bytes are initialized (zeroed at creation); viewing them as
            // MaybeUninit for the socket to overwrite is sound.
            let room = unsafe {
                std::slice::from_raw_parts_mut(
                    self.buf.as_mut_ptr() as *mut MaybeUninit<u8>,
                    self.buf.len(),
                )
            };
            let Some(n) = read_now(s, room)? else {
                self.drained = true;
                return Ok(None);
            };
            self.drained = n < self.buf.len();
            (self.start, self.end) = (0, n);
        }
        let n = dst.len().min(self.end - self.start);
        for (d, b) in dst[..n].iter_mut().zip(&self.buf[self.start..self.start + n]) {
            d.write(*b);
        }
        self.start += n;
        Ok(Some(n))
    }
}

/// A receiving end's place in the control socket's stream.
enum Reading {
    /// `got` bytes of the next header.
    Header { buf: [u8; HEADER_BYTES], got: usize },
    /// `got` of the `len` bytes of an inline message for `msg` (`discard`: too long for it).
    Payload {
        msg: Arc<Msg>,
        len: usize,
        got: usize,
        discard: bool,
    },
}

impl Reading {
    fn header() -> Reading {
        Reading::Header {
            buf: [0; HEADER_BYTES],
            got: 0,
        }
    }
}

/// Makes a connected socket blocking with [`IO_TICK`] timeouts, no Nagle delay, and keepalive
/// probes for `peer_timeout`.
fn ready(s: &Socket, peer_timeout: Option<Duration>) -> io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(IO_TICK))?;
    s.set_write_timeout(Some(IO_TICK))?;
    if let Some(t) = peer_timeout {
        keepalive(s, t)?;
    }
    s.set_nodelay(true)
}

/// TCP keepalive such that a connection whose peer's host answers nothing for about `t` fails
/// with ETIMEDOUT (the bootstrap's, [`crate::bootstrap::socket::keepalive`]). A receiving socket
/// never has unacknowledged data, so the receiving end of every connection notices a silent
/// peer within `t`, and its failure raises the communicator's async error and stops its
/// kernels; a sending socket with data in flight is bounded by the send timeout instead
/// ([`unacked_for`]).
pub(super) fn keepalive(s: &Socket, t: Duration) -> io::Result<()> {
    crate::bootstrap::socket::keepalive(s, t)
}

impl Comm {
    /// Starts the helper threads of a connection.
    pub(super) fn start(conn: Conn, send: bool) -> Result<Comm> {
        let Conn {
            ctrl,
            data,
            nthreads,
            peer,
            dev,
            peer_timeout,
            send_timeout,
            inline_below,
        } = conn;
        for s in std::iter::once(&ctrl).chain(&data) {
            ready(s, peer_timeout).map_err(|e| {
                Error::system(format!(
                    "NET/Socket: setting up a socket of the connection with {peer}: {e}"
                ))
            })?;
        }
        let ctrl = Arc::new(ctrl);
        let data: Vec<Arc<Socket>> = data.into_iter().map(Arc::new).collect();
        let mut sockets = vec![ctrl.clone()];
        sockets.extend(data.iter().cloned());
        let shared = Arc::new(Shared {
            peer,
            dev,
            nthreads,
            ndata: data.len(),
            queues: Mutex::new(Queues {
                work: (0..nthreads).map(|_| VecDeque::new()).collect(),
                posted: VecDeque::new(),
            }),
            cv: Condvar::new(),
            ctrl_queued: AtomicUsize::new(0),
            reader: Mutex::new(Reader {
                reading: Reading::header(),
                scratch: Vec::new(),
                stash: Stash::new(),
            }),
            caller_seen_us: AtomicU64::new(0),
            epoch: Instant::now(),
            work_bell: if send { None } else { eventfd() },
            stop: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            error: Mutex::new(None),
            waker: Mutex::new(None),
            sockets,
            send_timeout,
            inline_below,
        });
        let mut comm = Comm {
            send,
            shared: shared.clone(),
            ctrl: ctrl.clone(),
            threads: Vec::with_capacity(nthreads),
            mrs: HashMap::new(),
            next_mr: 1,
            reqs: HashMap::new(),
            next_req: 1,
            last_peek: None,
        };
        for t in 0..nthreads {
            let worker = Worker {
                t,
                send,
                shared: shared.clone(),
                ctrl: (t == 0).then(|| ctrl.clone()),
                socks: data
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| wire::thread_of(*i, nthreads) == t)
                    .map(|(i, s)| (i, s.clone()))
                    .collect(),
                scratch: Vec::new(),
                acks_seen: Instant::now(),
            };
            let name = format!("nccl-net-{}{t}", if send { "send" } else { "recv" });
            let handle = crate::bootstrap::socket::spawn(&name, move || worker.run())
                .map_err(|e| Error::system(format!("NET/Socket: starting thread {name}: {e}")))?;
            comm.threads.push(handle);
        }
        Ok(comm)
    }

    pub(super) fn peer(&self) -> SocketAddr {
        self.shared.peer
    }

    pub(super) fn set_waker(&mut self, waker: Waker) {
        *lock(&self.shared.waker) = Some(waker);
    }

    pub(super) fn reg_mr(&mut self, ptr: *mut u8, len: usize, kind: u32) -> Result<Mr> {
        if kind != PTR_HOST {
            return Err(Error::invalid_argument(format!(
                "NET/Socket: can only register host memory (NCCL_PTR_HOST), not pointer kind \
                 {kind}"
            )));
        }
        let addr = ptr as usize;
        if (addr == 0 && len > 0) || addr.checked_add(len).is_none() || len > isize::MAX as usize {
            return Err(Error::invalid_argument(format!(
                "NET/Socket: cannot register {len} bytes at {ptr:p}"
            )));
        }
        let id = self.next_mr;
        self.next_mr += 1;
        self.mrs.insert(id, Region { addr, len });
        Ok(Mr(id))
    }

    pub(super) fn dereg_mr(&mut self, mr: Mr) -> Result<()> {
        if !self.mrs.contains_key(&mr.0) {
            return Err(Error::invalid_argument(format!(
                "NET/Socket: region {} is not registered with this comm",
                mr.0
            )));
        }
        // Receives posted into the region whose message has not begun are withdrawn: a proxy
        // keeps receives posted ahead, and deregisters its FIFO when its connection closes.
        {
            let mut q = lock(&self.shared.queues);
            q.posted.retain(|m| {
                if m.mr != mr.0 {
                    return true;
                }
                let _ = m.result.set(Err(Error::quiet(
                    crate::error::NcclResult::InvalidUsage,
                    format!(
                        "NET/Socket: receive withdrawn: region {} deregistered",
                        mr.0
                    ),
                )));
                false
            });
        }
        let busy = self
            .reqs
            .values()
            .filter(|m| m.mr == mr.0 && m.result.get().is_none())
            .count();
        if busy > 0 {
            if self.shared.error().is_none() {
                return Err(Error::invalid_usage(format!(
                    "NET/Socket: region {} is still used by {busy} request(s) in flight",
                    mr.0
                )));
            }
            // The connection broke: its threads are leaving; once they are gone nothing
            // touches the region any more.
            self.join();
        }
        self.mrs.remove(&mr.0);
        Ok(())
    }

    /// The address of bytes `offset..offset + len` of `mr`.
    fn locate(&self, mr: Mr, offset: usize, len: usize) -> Result<usize> {
        let r = self.mrs.get(&mr.0).ok_or_else(|| {
            Error::invalid_argument(format!(
                "NET/Socket: region {} is not registered with this comm",
                mr.0
            ))
        })?;
        match offset.checked_add(len) {
            Some(end) if end <= r.len => Ok(r.addr + offset),
            _ => Err(Error::invalid_argument(format!(
                "NET/Socket: bytes {offset}..+{len} lie outside region {} of {} bytes",
                mr.0, r.len
            ))),
        }
    }

    /// Fails if the connection broke, or if the peer went away while it was idle.
    fn check_alive(&mut self) -> Result<()> {
        if let Some(e) = self.shared.error() {
            return Err(e);
        }
        if self.shared.closed.load(Ordering::Acquire) {
            return Ok(());
        }
        // A peek is a system call: a busy connection looks once per PEEK_EVERY (its transfers
        // see a failure anyway). A receiving end with bytes read ahead is not at the end of
        // its stream yet, whatever the socket says.
        let now = Instant::now();
        if self
            .last_peek
            .is_some_and(|t| now.saturating_duration_since(t) < PEEK_EVERY)
        {
            return Ok(());
        }
        self.last_peek = Some(now);
        if !self.send
            && self
                .shared
                .reader
                .try_lock()
                .map_or(true, |r| !r.stash.is_empty())
        {
            return Ok(());
        }
        let mut probe = [MaybeUninit::<u8>::uninit(); 1];
        match self
            .ctrl
            .recv_with_flags(&mut probe, libc::MSG_PEEK | libc::MSG_DONTWAIT)
        {
            Ok(0) if self.send => {
                self.shared
                    .fail(|| "the peer closed the connection".to_string());
                Err(self.shared.error().unwrap_or_else(|| {
                    Error::remote(format!(
                        "NET/Socket: {} closed the connection",
                        self.shared.peer
                    ))
                }))
            }
            // Receiving: the messages already in flight may still complete, but no further
            // header can arrive.
            Ok(0) => Err(Error::remote(format!(
                "NET/Socket: connection with {} (device {}): the peer closed the connection; no \
                 further message can arrive",
                self.shared.peer, self.shared.dev
            ))),
            Ok(_) => Ok(()),
            Err(e) if would_block(&e) => Ok(()),
            Err(e) => {
                self.shared.fail(|| io_text(&e));
                Err(self.shared.error().unwrap_or_else(|| {
                    Error::remote(format!("NET/Socket: {}: {e}", self.shared.peer))
                }))
            }
        }
    }

    fn new_msg(&mut self, addr: usize, cap: usize, tag: u32, mr: Mr) -> (Request, Arc<Msg>) {
        let msg = Arc::new(Msg {
            addr,
            cap,
            tag,
            mr: mr.0,
            parts_left: AtomicUsize::new(self.shared.nthreads),
            result: OnceLock::new(),
        });
        let id = self.next_req;
        self.next_req += 1;
        self.reqs.insert(id, msg.clone());
        (Request(id), msg)
    }

    pub(super) fn isend(
        &mut self,
        mr: Mr,
        offset: usize,
        len: usize,
        tag: u32,
    ) -> Result<Option<Request>> {
        self.check_alive()?;
        let addr = self.locate(mr, offset, len)?;
        if self.reqs.len() >= MAX_REQUESTS {
            return Ok(None);
        }
        let (req, msg) = self.new_msg(addr, len, tag, mr);
        let mut sent = 0;
        if self.shared.sends_inline(len) && self.shared.ctrl_queued.load(Ordering::Acquire) == 0 {
            sent = self.write_inline(addr, len, tag)?;
            if sent == HEADER_BYTES + len {
                self.shared.finish(&msg, len, false);
                return Ok(Some(req));
            }
        }
        self.shared.ctrl_queued.fetch_add(1, Ordering::AcqRel);
        let work = Work {
            msg,
            len,
            discard: false,
            sent,
        };
        self.shared.push(0..self.shared.nthreads, &work);
        Ok(Some(req))
    }

    /// The caller's fast path: writes as much of an inline message (header and payload) as the
    /// control socket takes without blocking; thread 0 is idle on it (nothing queued).
    fn write_inline(&self, addr: usize, len: usize, tag: u32) -> Result<usize> {
        let hdr = wire::encode_header(len, tag, true);
        // SAFETY: `addr..addr + len` lies inside a region registered with this comm (checked
        // by `isend`), which the caller of `reg_mr` keeps valid for reads until `dereg_mr`
        // (refused while this request is in flight). Only reads happen through it.
        let payload = unsafe { std::slice::from_raw_parts(addr as *const u8, len) };
        let bufs = [io::IoSlice::new(&hdr), io::IoSlice::new(payload)];
        match self
            .ctrl
            .send_vectored_with_flags(&bufs, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL)
        {
            Ok(n) => Ok(n),
            Err(e) if would_block(&e) => Ok(0),
            Err(e) => {
                self.shared
                    .fail(|| format!("sending a {len}-byte message on the control socket: {e}"));
                Err(self.shared.error().unwrap_or_else(|| {
                    Error::remote(format!("NET/Socket: {}: {e}", self.shared.peer))
                }))
            }
        }
    }

    pub(super) fn irecv(&mut self, buf: &RecvBuf) -> Result<Option<Request>> {
        self.check_alive()?;
        let addr = self.locate(buf.mr, buf.offset, buf.max_len)?;
        if self.reqs.len() >= MAX_REQUESTS {
            return Ok(None);
        }
        let (req, msg) = self.new_msg(addr, buf.max_len, buf.tag, buf.mr);
        let first = {
            let mut q = lock(&self.shared.queues);
            q.posted.push_back(msg);
            q.posted.len() == 1
        };
        // Thread 0 waits for a first posted receive before it watches the socket for an absent
        // caller; later ones it sees by itself. The caller reads what arrived at its next
        // `test`, so posting costs no system call.
        if first {
            self.shared.cv.notify_all();
        }
        Ok(Some(req))
    }

    /// The caller's turn at the control socket (unless thread 0 is reading it right now).
    fn read_ctrl(&mut self) {
        let shared = &*self.shared;
        shared
            .caller_seen_us
            .store(shared.clock_us(), Ordering::Release);
        if let Ok(mut reader) = shared.reader.try_lock() {
            shared.read_ctrl(&self.ctrl, &mut reader);
        }
    }

    pub(super) fn test(&mut self, req: Request) -> Result<Option<usize>> {
        if !self.send {
            self.read_ctrl();
        }
        let Some(msg) = self.reqs.get(&req.0) else {
            return Err(Error::invalid_usage(format!(
                "NET/Socket: request {} is not in flight on this comm (already completed?)",
                req.0
            )));
        };
        if let Some(r) = msg.result.get() {
            let r = r.clone();
            self.reqs.remove(&req.0);
            return r.map(Some);
        }
        match self.shared.error() {
            Some(e) => Err(e),
            None => Ok(None),
        }
    }

    fn join(&mut self) {
        {
            let _q = lock(&self.shared.queues);
            self.shared.stop.store(true, Ordering::Release);
        }
        self.shared.cv.notify_all();
        for s in &self.shared.sockets {
            let _ = s.shutdown(Shutdown::Both);
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // A sending end that closes in good order says so, so that the peer's posted receives
        // end quietly instead of failing (best effort: never when broken or with requests in
        // flight, whose bytes the header would cut into).
        if self.send && self.shared.error().is_none() && self.reqs.is_empty() {
            let _ = self
                .ctrl
                .send_with_flags(&wire::encode_header(0, wire::CLOSE_TAG, true), libc::MSG_NOSIGNAL);
        }
        self.join();
    }
}
