//! The data path of one connection: a control socket and `nthreads` × `nsocks` data sockets,
//! moved by `nthreads` helper threads.
//!
//! Framing: every message starts with a 16-byte header on the control socket (length, tag, a
//! check word). A message shorter than [`wire::MIN_CHUNK`] follows its header inline on the
//! control socket; a longer one is cut by [`wire::piece`] into one contiguous piece per data
//! socket, which both ends compute from the length alone, so pieces carry no framing. Each
//! socket is a FIFO and both ends walk the messages in the same order, so messages complete in
//! order.
//!
//! Threads: helper thread `t` owns the data sockets `i` with `i % nthreads == t`; thread 0 also
//! owns the control socket. On the sending side `isend` hands the message to every thread;
//! thread 0 writes the header (and an inline payload) and each thread writes its pieces. On the
//! receiving side `irecv` hands the posted buffer to thread 0, which reads the header, learns
//! the length and hands the message to the other threads. A thread with one piece to move uses
//! a blocking call (woken every [`IO_TICK`] to look at its flags); with several it interleaves
//! non-blocking calls over its sockets, backing off when none moves. The last thread to finish
//! its part of a message completes the request and calls the waker.
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

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read};
use std::mem::MaybeUninit;
use std::net::{Shutdown, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::Duration;

use socket2::{Socket, TcpKeepalive};

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
}

struct Shared {
    peer: SocketAddr,
    dev: String,
    nthreads: usize,
    ndata: usize,
    queues: Mutex<Vec<VecDeque<Work>>>,
    cv: Condvar,
    stop: AtomicBool,
    /// The peer closed its sending end cleanly (a [`wire::CLOSE_TAG`] header): nothing more
    /// arrives, and that is no error.
    closed: AtomicBool,
    failed: AtomicBool,
    error: Mutex<Option<Error>>,
    waker: Mutex<Option<Waker>>,
    /// Every socket (control first), to shut them down.
    sockets: Vec<Arc<Socket>>,
}

impl Shared {
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
        let mut q = lock(&self.queues);
        loop {
            if self.quitting() {
                return None;
            }
            if let Some(w) = q[t].pop_front() {
                return Some(w);
            }
            q = self
                .cv
                .wait_timeout(q, IO_TICK)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
    }

    fn push(&self, threads: std::ops::Range<usize>, w: &Work) {
        {
            let mut q = lock(&self.queues);
            for t in threads {
                q[t].push_back(Work {
                    msg: w.msg.clone(),
                    len: w.len,
                    discard: w.discard,
                });
            }
        }
        self.cv.notify_all();
    }

    /// Thread's part of `w` is done; the last part completes the request.
    fn part_done(&self, w: &Work) {
        if w.msg.parts_left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        let result = if w.discard {
            Err(Error::remote(format!(
                "NET/Socket: message of {} bytes from {} does not fit the receive buffer of {} \
                 bytes (device {}); the message was dropped",
                w.len, self.peer, w.msg.cap, self.dev
            )))
        } else {
            Ok(w.len)
        };
        let _ = w.msg.result.set(result);
        self.wake();
    }
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
}

impl Worker {
    fn run(mut self) {
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

    fn ctrl(&self) -> std::result::Result<Arc<Socket>, Halt> {
        self.ctrl
            .clone()
            .ok_or_else(|| Halt::Broken("helper thread without the control socket".into()))
    }

    /// Writes all of `bytes` (a header) on `sock`.
    fn send_all(&self, sock: &Socket, bytes: &[u8]) -> std::result::Result<(), Halt> {
        let mut done = 0;
        while done < bytes.len() {
            match sock.send_with_flags(&bytes[done..], libc::MSG_NOSIGNAL) {
                Ok(n) => done += n,
                Err(e) if would_block(&e) => self.check()?,
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

    /// Reads exactly `buf.len()` bytes (a header) from `sock`.
    fn recv_all(&self, sock: &Socket, buf: &mut [u8]) -> std::result::Result<(), Halt> {
        let mut got = 0;
        while got < buf.len() {
            let mut r: &Socket = sock;
            match r.read(&mut buf[got..]) {
                Ok(0) => {
                    self.check()?;
                    return Err(Halt::Broken(if got == 0 {
                        "the peer closed the connection (waiting for the next message header)"
                            .into()
                    } else {
                        format!(
                            "the peer closed the connection inside a message header ({got} of \
                             {} bytes)",
                            buf.len()
                        )
                    }));
                }
                Ok(n) => got += n,
                Err(e) if would_block(&e) => self.check()?,
                Err(e) => {
                    self.check()?;
                    return Err(Halt::Broken(format!(
                        "receiving a message header: {}",
                        io_text(&e)
                    )));
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
                        Err(e) if would_block(&e) => self.check()?,
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
        if self.t == 0 {
            let ctrl = self.ctrl()?;
            self.send_all(&ctrl, &wire::encode_header(w.len, w.msg.tag))?;
            if wire::inline(w.len) && w.len > 0 {
                self.move_pieces(&mut [self.inline_piece(ctrl, w)])?;
            }
        }
        let mut pieces = self.pieces(w.msg.addr, w.len, false);
        self.move_pieces(&mut pieces)
    }

    fn recv_one(&mut self, mut w: Work) -> std::result::Result<Work, Halt> {
        if self.t == 0 {
            let ctrl = self.ctrl()?;
            let mut hdr = [0u8; HEADER_BYTES];
            self.recv_all(&ctrl, &mut hdr)?;
            let Some((len, tag)) = wire::decode_header(&hdr) else {
                return Err(Halt::Broken(
                    "received a corrupt message header (the stream lost its framing)".into(),
                ));
            };
            if tag == wire::CLOSE_TAG {
                // The sender is gone on purpose: posted receives stay pending, quietly.
                self.shared.closed.store(true, Ordering::Release);
                self.shared.stop.store(true, Ordering::Release);
                self.shared.cv.notify_all();
                return Err(Halt::Quit);
            }
            w.len = len;
            w.discard = len > w.msg.cap;
            if w.discard && self.scratch.is_empty() {
                self.scratch = vec![MaybeUninit::uninit(); SCRATCH_BYTES];
            }
            self.shared.push(1..self.shared.nthreads, &w);
            if wire::inline(len) && len > 0 {
                self.move_pieces(&mut [self.inline_piece(ctrl, &w)])?;
            }
        } else if w.discard && self.scratch.is_empty() {
            self.scratch = vec![MaybeUninit::uninit(); SCRATCH_BYTES];
        }
        let mut pieces = self.pieces(w.msg.addr, w.len, w.discard);
        self.move_pieces(&mut pieces)?;
        Ok(w)
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
/// with ETIMEDOUT. The kernel counts whole seconds: after `every` seconds without hearing from
/// the peer it sends a probe, then one every `every` seconds, and gives up after `probes`
/// unanswered ones, so `every + probes × every` ≈ `t` (at least 2 s). Probes go out only while
/// the socket has no unacknowledged data of its own; a receiving socket never has any, so the
/// receiving end of every connection notices a silent peer within `t`, and its failure raises
/// the communicator's async error and stops its kernels. A sending socket with unacknowledged
/// data is bounded only by TCP's retransmissions (tcp_retries2: about 15 minutes). Setting
/// TCP_USER_TIMEOUT would bound it by `t` too, but that also ends connections whose receiver
/// merely reads late (a zero window), which a rank late to a collective legitimately causes.
pub(super) fn keepalive(s: &Socket, t: Duration) -> io::Result<()> {
    let secs = t
        .as_secs()
        .saturating_add(u64::from(t.subsec_nanos() > 0))
        .max(2);
    let every = (secs / 4).clamp(1, 32_767);
    let probes = (secs / every).saturating_sub(1).clamp(1, 127);
    s.set_keepalive(true)?;
    s.set_tcp_keepalive(
        &TcpKeepalive::new()
            .with_time(Duration::from_secs(every))
            .with_interval(Duration::from_secs(every))
            .with_retries(probes as u32),
    )
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
            queues: Mutex::new((0..nthreads).map(|_| VecDeque::new()).collect()),
            cv: Condvar::new(),
            stop: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            error: Mutex::new(None),
            waker: Mutex::new(None),
            sockets,
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
    fn check_alive(&self) -> Result<()> {
        if let Some(e) = self.shared.error() {
            return Err(e);
        }
        if self.shared.closed.load(Ordering::Acquire) {
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

    fn post(&mut self, addr: usize, cap: usize, tag: u32, mr: Mr) -> Request {
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
        let threads = if self.send {
            0..self.shared.nthreads
        } else {
            0..1
        };
        self.shared.push(
            threads,
            &Work {
                msg,
                len: cap,
                discard: false,
            },
        );
        Request(id)
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
        Ok(Some(self.post(addr, len, tag, mr)))
    }

    pub(super) fn irecv(&mut self, buf: &RecvBuf) -> Result<Option<Request>> {
        self.check_alive()?;
        let addr = self.locate(buf.mr, buf.offset, buf.max_len)?;
        if self.reqs.len() >= MAX_REQUESTS {
            return Ok(None);
        }
        Ok(Some(self.post(addr, buf.max_len, buf.tag, buf.mr)))
    }

    pub(super) fn test(&mut self, req: Request) -> Result<Option<usize>> {
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
                .send_with_flags(&wire::encode_header(0, wire::CLOSE_TAG), libc::MSG_NOSIGNAL);
        }
        self.join();
    }
}
