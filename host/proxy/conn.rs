//! One proxied connection: its host-mapped memory (counters, slot sizes, FIFO) and its network
//! endpoint, and the step machine that moves slots between them.

use super::ops::OpTrack;
use super::timeline::{self, Mark};
use crate::cuda::{DevBuffer, HostMem};
use crate::error::{Error, Result};
use crate::net::{Mr, RecvBuf, RecvComm, Request, SendComm, Waker, PTR_CUDA, PTR_HOST};
use nccl_device::abi::{proxy_proto_parts, CTRL_LINE, NCCL_STEPS, PROTO_SIMPLE, SIZE_LL_LINES};
use std::collections::VecDeque;
use std::os::fd::AsFd;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod layout;
mod mem;

pub(crate) use layout::ConnLayout;
use layout::{counter, slot_words};
pub(crate) use mem::ConnMem;

const STEPS: u64 = NCCL_STEPS as u64;

/// Which way a connection moves data, with its network endpoint.
pub(crate) enum Side {
    Send(Box<dyn SendComm>),
    Recv(Box<dyn RecvComm>),
}

/// Where a connection's FIFO is wanted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FifoPlace {
    /// Pinned host memory mapped into the GPU, registered as `PTR_HOST`.
    Host,
    /// GPU memory the network reads or writes itself (GPU Direct RDMA), registered through a
    /// dmabuf where `dmabuf` (and the device gives one), else as `PTR_CUDA`; received steps
    /// are flushed where `flush`.
    Gpu { dmabuf: bool, flush: bool },
}

/// Where a receive side stands with the oldest step in flight (the front of `inflight`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Front {
    /// Its receive is posted.
    Receiving,
    /// It landed with this many bytes in a GPU FIFO that flushes, and waits for its kernel to
    /// say which protocol it carries (only Simple steps are flushed).
    Landed(usize),
    /// Its flush is posted (the front request is the flush's).
    Flushing,
}

/// A connection the proxy thread drives.
pub(crate) struct NetConn {
    /// The profiler's proxy events of its steps, where a plugin is loaded (dropped before
    /// the memory whose address names it: field order).
    track: Option<OpTrack>,
    side: Side,
    /// The counters and slot sizes, and the FIFO unless it is in GPU memory.
    mem: Arc<HostMem>,
    /// The FIFO in GPU memory (GPU Direct RDMA), kept for the endpoint that registered it
    /// (dropped after it: field order).
    _gpu_fifo: Option<DevBuffer>,
    /// Received steps are flushed (iflush) before the kernel is told of them.
    flush: bool,
    layout: ConnLayout,
    mr: Mr,
    /// Steps posted to the network and steps completed (both count from 0 for the connection's
    /// life, like the kernel's step counters).
    posted: u64,
    done: u64,
    inflight: VecDeque<Request>,
    /// What the front of `inflight` is (receive side).
    front: Front,
    /// The protocol the kernel last announced for the steps it waits for (receive side),
    /// taken as the likely one of steps that land before it says: a flushing FIFO flushes a
    /// step ahead of its kernel while Simple steps flow, and waits for the word otherwise.
    last_proto: Option<u32>,
    /// Flushes posted, and landed steps of a flushing FIFO left unflushed (LL, LL128), for
    /// the logs.
    flushes: u64,
    unflushed: u64,
    /// The tag of its messages: 0, or its key where it shares its network comm with other
    /// connections to the same peer (`super::shared`).
    tag: u32,
    /// It shares its network comm: it posts only the receives its kernel awaits, since a
    /// receive posted ahead for a connection that gets no more data would hold one of the
    /// comm's requests from the others for good.
    shares_comm: bool,
    /// The rank at the other end, and how it is reached (for error messages).
    peer_rank: usize,
    peer: String,
    failed: bool,
    /// Since when steps have waited without any moving (sent: published by the kernel; received:
    /// landed but not released by it), and
    /// whether that was reported: a stuck job says where.
    stalled_since: Option<Instant>,
    stall_reported: bool,
    /// The receive side's head at the last look, to tell a kernel that moves from one that waits.
    seen_head: u64,
    /// When a step of this receive side last landed or was posted: a side in use is tested
    /// on every pass, an idle one only when its kernel waits or the proxy's rotation comes
    /// to it ([`Poll`]).
    last_active: Option<Instant>,
    /// The last awaited-step word put on the timeline ([`super::timeline`]).
    marked_awaited: u64,
}

/// How hard a pass of the proxy looks at a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Poll {
    /// Test the network only if the connection is in use: steps landed or were posted lately,
    /// or its kernel waits for one ([`ConnLayout::PROTO`]).
    IfActive(Instant),
    /// Test it whatever its state (the rotation's turn, a pass after a nap).
    Always,
}

/// A receive side whose last step landed (or was posted) this long ago is idle. A test is a
/// system call for the socket network, and a proxy that tested every idle receive of every
/// channel on every pass paid for all of them on each step: 2 nodes x (8 rings + 8 trees) are
/// 24 receives, and an 8-byte AllReduce took 53-76 us against 45-49 us with this rule (2 rank
/// processes as 2 nodes on one H100, results/h100-nodes2-proxy-poll.txt).
const RECV_ACTIVE: Duration = Duration::from_millis(10);

/// A send side whose published steps make no progress for this long logs a warning with its
/// counters (NCCL_RS_PROXY_STALL_WARN_S).
fn stall_warn_after() -> Duration {
    Duration::from_secs(crate::env::RS_PROXY_STALL_WARN_S.int().clamp(1, 86_400) as u64)
}

/// What a send side's size word holds while no step the kernel published fills its slot (the
/// proxy writes it when it takes a step, and at the start). A step published with a release
/// never shows it; an LL step published without one ([`SIZE_LL_LINES`]) may, for a moment,
/// when its tail reached host memory before its size. Every step below a published tail gets a
/// size: connections through a proxy take one slot per Simple step (`slice_steps` is 1 with any
/// network transport), so no slice's rounding skips one.
const SIZE_EMPTY: u64 = u64::MAX;

/// Whether every 16-byte LL line of `step`'s `bytes` in a send side's host FIFO holds the
/// step's flag in both halves (`{data, flag, data, flag}`, flag `step + 1`): the kernel
/// published the step without waiting for its lines to reach host memory, and each half of a
/// line lands whole (an 8-byte store). False where the FIFO is not in host memory.
fn ll_lines_landed(mem: &HostMem, layout: ConnLayout, step: u64, bytes: usize) -> bool {
    let at = layout.slot(step);
    let Some(p) = mem
        .host_ptr(at)
        .filter(|_| bytes <= layout.stride && at + layout.stride <= mem.bytes)
    else {
        return false;
    };
    let flag = nccl_device::prims::ll::flag(step);
    let words = p as *const u32;
    (0..bytes / 16).all(|line| {
        // SAFETY: the line lies inside the step's slot, inside `mem` (checked above); the GPU
        // writes it concurrently, 8 aligned bytes at a time, and a stale read only says "not
        // yet".
        let (a, b) = unsafe {
            (
                std::ptr::read_volatile(words.add(4 * line + 1)),
                std::ptr::read_volatile(words.add(4 * line + 3)),
            )
        };
        a == flag && b == flag
    })
}

/// Whether landed step `step` of a receive side carries Simple (flushed) rather than LL or
/// LL128, from the word its kernel writes before it waits ([`ConnLayout::PROTO`]); where the
/// kernel has not reached the step, `last` (the protocol it said last) decides for Simple and
/// `None` (wait for the word) otherwise.
fn step_is_simple(mem: &HostMem, step: u64, last: &mut Option<u32>) -> Result<Option<bool>> {
    let (end, proto) = proxy_proto_parts(counter(mem, ConnLayout::PROTO)?.load(Ordering::Acquire));
    // The kernel waits for steps from its own counter (no later than `step`, which it has not
    // consumed) up to `end`: one in that range is the protocol it named.
    if step < end {
        *last = Some(proto);
        return Ok(Some(proto == PROTO_SIMPLE));
    }
    Ok((*last == Some(PROTO_SIMPLE)).then_some(true))
}

/// Pops the requests at the front of `inflight` that `finished` says are complete, in order,
/// counting each in `done`; true if any was.
fn retire(
    inflight: &mut VecDeque<Request>,
    done: &mut u64,
    mut finished: impl FnMut(Request) -> Result<bool>,
) -> Result<bool> {
    let mut any = false;
    while let Some(&req) = inflight.front() {
        if !finished(req)? {
            break;
        }
        inflight.pop_front();
        *done += 1;
        any = true;
    }
    Ok(any)
}

impl NetConn {
    /// [`ConnMem::new`] and [`NetConn::attach`] at once (a connection whose endpoint is up).
    #[cfg(test)]
    pub(crate) fn new(
        side: Side,
        device: &crate::cuda::Device,
        layout: ConnLayout,
        place: FifoPlace,
        peer_rank: usize,
        peer: String,
    ) -> Result<NetConn> {
        let sending = matches!(side, Side::Send(_));
        let mem = ConnMem::new(device, layout, place, sending, &peer)?;
        NetConn::attach(side, mem, peer_rank, peer)
    }

    /// Joins the endpoint `side`, now up, to its memory: registers the FIFO with the network
    /// (a FIFO in GPU memory through its dmabuf where it has one, else as `PTR_CUDA`; one in
    /// host memory as `PTR_HOST`).
    pub(crate) fn attach(
        mut side: Side,
        mem: ConnMem,
        peer_rank: usize,
        peer: String,
    ) -> Result<NetConn> {
        let ConnMem {
            mem,
            gpu,
            layout,
            track,
        } = mem;
        let len = layout.fifo_bytes();
        let (ptr, kind) = match &gpu {
            Some((buf, _, _)) => (buf.ptr() as *mut u8, PTR_CUDA),
            None => (
                mem.host_ptr(ConnLayout::FIFO)
                    .ok_or_else(|| Error::internal("proxied connection without a FIFO"))?,
                PTR_HOST,
            ),
        };
        let fd = gpu.as_ref().and_then(|(_, _, fd)| fd.as_ref());
        // SAFETY: the FIFO (`len` bytes at `ptr`) lies in `mem` or in the GPU buffer, both of
        // which the connection keeps for as long as the endpoint that registers it (field order
        // drops the endpoint first); GPU memory is registered as such (PTR_CUDA / DMABUF),
        // which is why that placement was chosen; the dmabuf stays open for the call.
        let mr = unsafe {
            match (&mut side, fd) {
                (Side::Send(c), Some(fd)) => c.reg_mr_dmabuf(ptr, len, kind, 0, fd.as_fd()),
                (Side::Recv(c), Some(fd)) => c.reg_mr_dmabuf(ptr, len, kind, 0, fd.as_fd()),
                (Side::Send(c), None) => c.reg_mr(ptr, len, kind),
                (Side::Recv(c), None) => c.reg_mr(ptr, len, kind),
            }
        }
        .map_err(|e| match gpu.is_some() {
            true => e.context(format!(
                "registering the GPU FIFO of the connection with {peer} (NCCL_NET_GDR_LEVEL=LOC \
                 keeps FIFOs in host memory)"
            )),
            false => e.context(format!(
                "registering the FIFO of the connection with {peer}"
            )),
        })?;
        // The dmabuf descriptor closes here: the registration holds what it needs.
        let gpu = gpu.map(|(buf, flush, _)| (buf, flush));
        let mut conn = NetConn::with(side, mem, gpu, layout, mr, peer_rank, peer);
        conn.track = track;
        Ok(conn)
    }

    /// `gpu`: the FIFO in GPU memory, and whether its received steps are flushed.
    fn with(
        side: Side,
        mem: Arc<HostMem>,
        gpu: Option<(DevBuffer, bool)>,
        layout: ConnLayout,
        mr: Mr,
        peer_rank: usize,
        peer: String,
    ) -> NetConn {
        let flush = gpu.as_ref().is_some_and(|(_, f)| *f);
        NetConn {
            side,
            mem,
            _gpu_fifo: gpu.map(|(b, _)| b),
            flush,
            layout,
            mr,
            posted: 0,
            done: 0,
            inflight: VecDeque::new(),
            front: Front::Receiving,
            last_proto: None,
            flushes: 0,
            unflushed: 0,
            tag: 0,
            shares_comm: false,
            peer_rank,
            peer,
            failed: false,
            stalled_since: None,
            stall_reported: false,
            seen_head: 0,
            last_active: None,
            marked_awaited: 0,
            track: None,
        }
    }

    /// Tags its messages with `tag`; `shared`: its network comm is shared with other
    /// connections.
    pub(crate) fn with_tag(mut self, tag: u32, shared: bool) -> NetConn {
        self.tag = tag;
        self.shares_comm = shared;
        self
    }

    /// The rank at the other end.
    pub(crate) fn peer_rank(&self) -> usize {
        self.peer_rank
    }

    pub(crate) fn set_waker(&mut self, w: Waker) {
        match &mut self.side {
            Side::Send(c) => c.set_waker(w),
            Side::Recv(c) => c.set_waker(w),
        }
    }

    /// Nothing the kernel published is still to be sent (always true for a receiving side, and
    /// for a failed connection).
    pub(crate) fn drained(&self) -> bool {
        match self.side {
            Side::Recv(_) => true,
            Side::Send(_) => {
                self.failed
                    || counter(&self.mem, ConnLayout::TAIL)
                        .map(|t| t.load(Ordering::Acquire) == self.done)
                        .unwrap_or(true)
            }
        }
    }

    /// Moves whatever can move now; true if anything did. An error is returned once. A
    /// receive side tests the network only when [`Poll`] says so; a send side always looks
    /// (its counters are in host memory, and it tests the network only with sends in flight).
    pub(crate) fn progress(&mut self, poll: Poll) -> Result<bool> {
        if self.failed {
            return Ok(false);
        }
        let r = match self.side {
            Side::Send(_) => self.progress_send(),
            Side::Recv(_) => self.progress_recv(poll),
        };
        if r.is_ok() {
            self.sync_events();
        }
        r.map_err(|e| {
            self.failed = true;
            e.context(format!("network connection with {}", self.peer))
        })
    }

    /// Moves the profiler's proxy events up to the counters ([`OpTrack::sync`]): a send's
    /// steps start when their slot is free for the kernel, are posted, then complete; a
    /// receive's are posted, land (handed to the kernel), then are consumed.
    fn sync_events(&mut self) {
        let Some(track) = &mut self.track else {
            return;
        };
        let marks = match self.side {
            Side::Send(_) => [self.done + STEPS, self.posted, self.done],
            Side::Recv(_) => {
                let head = counter(&self.mem, ConnLayout::HEAD)
                    .map(|h| h.load(Ordering::Acquire))
                    .unwrap_or(0);
                [self.posted, self.done, head.min(self.done)]
            }
        };
        track.sync(marks);
    }

    fn progress_send(&mut self) -> Result<bool> {
        let Side::Send(comm) = &mut self.side else {
            return Ok(false);
        };
        let mem = &*self.mem;
        let mut moved = false;
        // Acquire: the slot's bytes and size were written before the kernel's release of tail
        // (an LL step's without a release: its size word says so, and its lines are checked).
        let tail = counter(mem, ConnLayout::TAIL)?.load(Ordering::Acquire);
        while self.posted < tail && self.posted < self.done + STEPS {
            let size_word = counter(mem, ConnLayout::SIZES + 8 * (self.posted % STEPS) as usize)?;
            let word = size_word.load(Ordering::Acquire);
            if word == SIZE_EMPTY {
                // Published without a release, and its size has not reached host memory yet.
                break;
            }
            let size = (word & !SIZE_LL_LINES) as usize;
            if size > self.layout.stride {
                return Err(Error::internal(format!(
                    "the kernel published a {size}-byte step in a {}-byte slot",
                    self.layout.stride
                )));
            }
            if word & SIZE_LL_LINES != 0 {
                if !ll_lines_landed(mem, self.layout, self.posted, size) {
                    break;
                }
                // The network's reads of the lines come after the flags said they landed (on
                // hosts that reorder loads too).
                fence(Ordering::Acquire);
            }
            let off = self.layout.slot(self.posted) - ConnLayout::FIFO;
            match comm.isend(self.mr, off, size, self.tag)? {
                Some(req) => {
                    if log::log_enabled!(log::Level::Trace) {
                        log::trace!(
                            "send to {}: step {} of {size} bytes, first line {:08x?}",
                            self.peer,
                            self.posted,
                            slot_words(mem, self.layout, self.posted)
                        );
                    }
                    timeline::mark(Mark::SendPosted, self.peer_rank, self.posted);
                    // Taken: the kernel writes this slot's next size only after its head
                    // returns, and an LL one may then land after its tail.
                    size_word.store(SIZE_EMPTY, Ordering::Relaxed);
                    self.inflight.push_back(req);
                    self.posted += 1;
                    moved = true;
                }
                None => break,
            }
        }
        let done_before = self.done;
        moved |= retire(&mut self.inflight, &mut self.done, |r| {
            Ok(comm.test(r)?.is_some())
        })?;
        for step in done_before..self.done {
            timeline::mark(Mark::SendDone, self.peer_rank, step);
        }
        if moved {
            // The slot may be refilled: hand it back to the kernel.
            counter(mem, ConnLayout::HEAD)?.store(self.done, Ordering::Release);
            log::trace!(
                "send to {}: tail {tail} posted {} done {}",
                self.peer,
                self.posted,
                self.done
            );
            self.stalled_since = None;
            self.stall_reported = false;
        } else if tail > self.done {
            let since = *self.stalled_since.get_or_insert_with(Instant::now);
            if !self.stall_reported && since.elapsed() > stall_warn_after() {
                self.stall_reported = true;
                log::warn!(
                    "network send to {} stalled for {:?}: the kernel published step {tail}, {} posted, {} completed ({} in flight); step {}'s first line {:08x?}",
                    self.peer,
                    since.elapsed(),
                    self.posted,
                    self.done,
                    self.inflight.len(),
                    self.done,
                    slot_words(mem, self.layout, self.done)
                );
            }
        }
        Ok(moved)
    }

    /// Posts receives into the free slots of a receive side (nothing for a send side); true
    /// if any was. The proxy posts for every connection before it completes any, so that a
    /// comm several connections share sees all of their awaited steps at once.
    pub(crate) fn post(&mut self) -> Result<bool> {
        if self.failed || !matches!(self.side, Side::Recv(_)) {
            return Ok(false);
        }
        self.post_recv().map_err(|e| {
            self.failed = true;
            e.context(format!("network connection with {}", self.peer))
        })
    }

    fn post_recv(&mut self) -> Result<bool> {
        let Side::Recv(comm) = &mut self.side else {
            return Ok(false);
        };
        let mem = &*self.mem;
        let mut moved = false;
        let head = counter(mem, ConnLayout::HEAD)?.load(Ordering::Acquire);
        // The steps below `awaited` are ones the kernel said it reads ([`ConnLayout::PROTO`]).
        let (awaited, _) =
            proxy_proto_parts(counter(mem, ConnLayout::PROTO)?.load(Ordering::Acquire));
        while self.posted < head + STEPS {
            let buf = RecvBuf {
                mr: self.mr,
                offset: self.layout.slot(self.posted) - ConnLayout::FIFO,
                max_len: self.layout.stride,
                tag: self.tag,
            };
            let req = if self.posted < awaited {
                comm.irecv_awaited(buf)?
            } else if self.shares_comm {
                break;
            } else {
                comm.irecv(&[buf])?
            };
            match req {
                Some(req) => {
                    self.inflight.push_back(req);
                    self.posted += 1;
                    moved = true;
                }
                None => break,
            }
        }
        comm.note_waiting(self.tag, self.posted < awaited);
        if moved {
            self.last_active = Some(Instant::now());
        }
        Ok(moved)
    }

    /// Completes landed steps; the receives were posted by [`NetConn::post`] earlier in the
    /// same pass (a posting marks the side active).
    fn progress_recv(&mut self, poll: Poll) -> Result<bool> {
        let mut moved = false;
        let mem = &*self.mem;
        let (awaited, _) =
            proxy_proto_parts(counter(mem, ConnLayout::PROTO)?.load(Ordering::Acquire));
        let test = match poll {
            Poll::Always => true,
            Poll::IfActive(now) => {
                awaited > self.done
                    || !matches!(self.front, Front::Receiving)
                    || self
                        .last_active
                        .is_some_and(|t| now.saturating_duration_since(t) < RECV_ACTIVE)
            }
        };
        if awaited > self.marked_awaited {
            // The kernel's word for a new step: when it started waiting, for the timeline.
            self.marked_awaited = awaited;
            timeline::mark(Mark::Awaited, self.peer_rank, awaited - 1);
        }
        if !test {
            return Ok(moved);
        }
        let Side::Recv(comm) = &mut self.side else {
            return Ok(false);
        };
        let head = counter(mem, ConnLayout::HEAD)?.load(Ordering::Acquire);
        // Steps complete in order; a landed Simple step of a GPU FIFO that needs it is flushed
        // first, and counts as done once its flush completed.
        while let Some(&req) = self.inflight.front() {
            let bytes = match self.front {
                Front::Flushing => {
                    if comm.test(req)?.is_none() {
                        break;
                    }
                    None
                }
                Front::Landed(bytes) => Some(bytes),
                Front::Receiving => {
                    let Some(sizes) = comm.test(req)? else { break };
                    if log::log_enabled!(log::Level::Trace) {
                        log::trace!(
                            "recv from {}: step {} landed, {sizes:?} bytes, first line {:08x?}",
                            self.peer,
                            self.done,
                            slot_words(mem, self.layout, self.done)
                        );
                    }
                    // The network says how many bytes the peer sent into the slot (at most
                    // the `stride` posted); more is a peer or network gone wrong, and the
                    // size would be used as the step's flush length.
                    let got = sizes.first().copied().unwrap_or(0);
                    if got > self.layout.stride {
                        return Err(Error::remote(format!(
                            "recv from rank {} ({}): step {} landed as {got} bytes in a {}-byte \
                             slot",
                            self.peer_rank, self.peer, self.done, self.layout.stride
                        )));
                    }
                    Some(got)
                }
            };
            if let Some(bytes) = bytes.filter(|&b| self.flush && b > 0) {
                let Some(simple) = step_is_simple(mem, self.done, &mut self.last_proto)? else {
                    // The kernel has not said yet: hold the step (it is not published, so
                    // the kernel will ask for it and say).
                    self.front = Front::Landed(bytes);
                    break;
                };
                if !simple {
                    self.unflushed += 1;
                } else {
                    let buf = RecvBuf {
                        mr: self.mr,
                        offset: self.layout.slot(self.done) - ConnLayout::FIFO,
                        max_len: bytes,
                        tag: self.tag,
                    };
                    if let Some(f) = comm.iflush(&[buf])? {
                        self.flushes += 1;
                        if let Some(front) = self.inflight.front_mut() {
                            *front = f;
                        }
                        self.front = Front::Flushing;
                        moved = true;
                        continue;
                    }
                }
            }
            self.inflight.pop_front();
            self.front = Front::Receiving;
            timeline::mark(Mark::RecvLanded, self.peer_rank, self.done);
            self.done += 1;
            moved = true;
        }
        if moved {
            self.last_active = Some(Instant::now());
            // The bytes landed (the network's completion ordered them before us): publish.
            fence(Ordering::SeqCst);
            counter(mem, ConnLayout::TAIL)?.store(self.done, Ordering::Release);
            log::trace!(
                "recv from {}: head {head} posted {} done {}",
                self.peer,
                self.posted,
                self.done
            );
        }
        self.watch_recv(moved || head != self.seen_head, head);
        Ok(moved)
    }

    /// A receive side whose landed steps the kernel does not release (head) for the stall
    /// time warns once with its counters and the first line of the step the kernel waits on.
    fn watch_recv(&mut self, progressed: bool, head: u64) {
        self.seen_head = head;
        if let Front::Landed(bytes) = self.front {
            // A landed step held for its kernel's word on its protocol (a flushing GPU FIFO).
            if progressed {
                self.stalled_since = None;
                self.stall_reported = false;
            }
            let since = *self.stalled_since.get_or_insert_with(Instant::now);
            if !self.stall_reported && since.elapsed() > stall_warn_after() {
                self.stall_reported = true;
                let (end, proto) = proxy_proto_parts(
                    counter(&self.mem, ConnLayout::PROTO)
                        .map(|c| c.load(Ordering::Acquire))
                        .unwrap_or(0),
                );
                log::warn!(
                    "network receive from {}: step {} landed ({bytes} bytes) {:?} ago and waits for its kernel to say its protocol (last word: steps below {end}, protocol {proto}; kernel released {head})",
                    self.peer,
                    self.done,
                    since.elapsed()
                );
            }
            return;
        }
        if progressed || self.done == head {
            self.stalled_since = None;
            self.stall_reported = false;
            return;
        }
        let since = *self.stalled_since.get_or_insert_with(Instant::now);
        if !self.stall_reported && since.elapsed() > stall_warn_after() {
            self.stall_reported = true;
            let lines: Vec<String> = (head..self.done.min(head + STEPS))
                .map(|s| format!("step {s}: {:08x?}", slot_words(&self.mem, self.layout, s)))
                .collect();
            log::warn!(
                "network receive from {}: the kernel has not released step {head} for {:?} although {} steps landed ({} posted); first lines of the landed steps: {}",
                self.peer,
                since.elapsed(),
                self.done,
                self.posted,
                lines.join(", ")
            );
        }
    }
}

impl Drop for NetConn {
    fn drop(&mut self) {
        if self.flushes + self.unflushed > 0 {
            log::debug!(
                "network receive from {}: {} steps flushed from GPU memory, {} LL/LL128 steps not",
                self.peer,
                self.flushes,
                self.unflushed
            );
        }
        let r = match &mut self.side {
            Side::Send(c) => c.dereg_mr(self.mr),
            Side::Recv(c) => c.dereg_mr(self.mr),
        };
        if let Err(e) = r {
            log::debug!("deregistering a proxied FIFO: {e}");
        }
    }
}

#[cfg(test)]
mod tests;
