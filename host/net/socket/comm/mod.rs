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

mod queue;
mod reader;
mod worker;

use queue::*;
use reader::*;
#[cfg(test)]
pub(super) use worker::unacked_for;
use worker::*;

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
use crate::net::{Mr, RecvBuf, Request, Waker, PTR_HOST};

/// A blocking socket call gives up after this long without progress, so that a helper thread
/// looks at its flags now and then (shutting the sockets down wakes it at once anyway).
pub const IO_TICK: Duration = Duration::from_millis(100);
/// Most requests a comm holds before `isend`/`irecv` answer "try again" (NCCL's
/// NCCL_NET_MAX_REQUESTS).
pub const MAX_REQUESTS: usize = 32;
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
/// with ETIMEDOUT (the bootstrap's, [`crate::sockets::keepalive`]). A receiving socket
/// never has unacknowledged data, so the receiving end of every connection notices a silent
/// peer within `t`, and its failure raises the communicator's async error and stops its
/// kernels; a sending socket with data in flight is bounded by the send timeout instead
/// ([`unacked_for`]).
pub(super) fn keepalive(s: &Socket, t: Duration) -> io::Result<()> {
    crate::sockets::keepalive(s, t)
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
                acks_seen: Instant::now(),
            };
            let name = format!("nccl-net-{}{t}", if send { "send" } else { "recv" });
            let handle = crate::sockets::spawn(&name, move || worker.run())
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
                self.shared.finish(&msg, len);
                return Ok(Some(req));
            }
        }
        self.shared.ctrl_queued.fetch_add(1, Ordering::AcqRel);
        let work = Work { msg, len, sent };
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
            let _ = self.ctrl.send_with_flags(
                &wire::encode_header(0, wire::CLOSE_TAG, true),
                libc::MSG_NOSIGNAL,
            );
        }
        self.join();
    }
}
