//! One-sided operations across nodes (`ncclPutSignal`, `ncclSignal` to ranks this rank cannot
//! map): a thread of the communicator's own carries them over the network, the socket network
//! or a plugin alike, on `NCCL_RS_PUT_LANES` connections each way between every pair of ranks
//! (lanes), made at the first window (a collective call) where not every rank maps every other.
//! One connection of the socket network is one socket by default, which carried a GIN put at
//! half of SendRecv's rate, whose channels each have a connection of their own.
//!
//! The sender's stream stages each chunk of a put (at most [`CHUNK`] bytes) in pinned host
//! memory, in one of `NCCL_RS_PUT_DEPTH` slots, then raises the doorbell: the number of
//! chunks staged so far, written after the copy (`cuStreamWriteValue64` fences it). The
//! thread sends every staged chunk, a [`HEADER`] in front (window, offset, bytes, and on the
//! put's last chunk its signal), and counts those whose send completed in `done`. A chunk
//! waits (the wait kernel) until the chunk that last used its slot was sent; the put ends, in
//! its stream, once its last chunk was sent (its source was free once staged; the stream's
//! later work then follows the data on the wire). Puts take their place in the
//! communicator's order (as inside a node), so chunks are staged in issue order and the
//! doorbell only grows.
//!
//! The receiver's thread keeps as many receives posted per peer into pinned host buffers (as
//! many as its pinned budget allows for every peer, at least 2). A message's payload is copied
//! into the window on the thread's own stream, then its signal is written into this rank's pad
//! (in the stream's order, so the data lands first), and the buffer is posted again once the
//! copy is done. Message k to a peer goes on lane k mod lanes, and the receiver takes message k
//! from that lane only after message k - 1: messages of one peer are handled in the order they
//! were sent, whichever lane was faster (so puts keep their order, and a signal follows its
//! data). A header naming
//! no window of this rank, or bytes past the window, is the peer's fault: the communicator's
//! async error.

use crate::bootstrap::Bootstrap;
use crate::cuda::{DevPtr, Device, HostMem, StreamHandle};
use crate::error::{Error, Result};
use crate::net::{Mr, Net, RecvBuf, RecvComm, Request, SendComm, HANDLE_BYTES, PTR_HOST};
use crate::proxy::OnError;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The most payload bytes of one message: a put is cut into chunks of this size.
pub(crate) const CHUNK: usize = 512 << 10;
/// The header in front of every message's payload.
const HEADER: usize = 64;
const SLOT: usize = HEADER + CHUNK;
/// Staging slots of the sender (chunks in flight; `NCCL_RS_PUT_DEPTH`, at most this).
const MAX_DEPTH: usize = 64;
/// Connections each way per pair (`NCCL_RS_PUT_LANES`, at most this).
const MAX_LANES: usize = 16;
/// Pinned bytes of receive buffers for every lane of every peer together, beyond one per lane.
const RECV_BUDGET: usize = 64 << 20;
/// The network tag of every message.
const TAG: u32 = 0x6f6e_6573;
const MAGIC: u64 = 0x6e63_636c_5f70_7574; // "nccl_put"

/// What a message says besides its payload.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Header {
    win: u64,
    offset: u64,
    bytes: u64,
    /// The slots of its signal: a `Channel as u64` (the signal pad's), or a GIN signal id's
    /// channel code (`gin.rs`).
    channel: u64,
    /// The signal count to write at the receiver; 0: no signal (a put's chunks but its last).
    signal: u64,
}

impl Header {
    fn encode(&self) -> [u8; HEADER] {
        let mut b = [0u8; HEADER];
        let words = [
            MAGIC,
            self.win,
            self.offset,
            self.bytes,
            self.channel,
            self.signal,
        ];
        for (i, w) in words.iter().enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
        }
        b
    }

    fn decode(b: &[u8]) -> Option<Header> {
        let word = |i: usize| -> Option<u64> {
            Some(u64::from_le_bytes(
                b.get(i * 8..i * 8 + 8)?.try_into().ok()?,
            ))
        };
        if word(0)? != MAGIC {
            return None;
        }
        Some(Header {
            win: word(1)?,
            offset: word(2)?,
            bytes: word(3)?,
            channel: word(4)?,
            signal: word(5)?,
        })
    }
}

/// A chunk issued on the host, sent once its stream staged it.
struct Outgoing {
    seq: u64,
    peer: usize,
    header: Header,
}

/// One connection each way with a peer, and the receive buffers of its receiving end.
struct Lane {
    send: Box<dyn SendComm>,
    /// The staging slots, registered with `send`.
    send_mr: Mr,
    recv: Box<dyn RecvComm>,
    /// Its receive buffers (as many as the sender keeps in flight on a lane, within
    /// [`RECV_BUDGET`]).
    bufs: HostMem,
    recv_mr: Mr,
    /// Receives posted, oldest first: (buffer, request).
    posted: VecDeque<(usize, Request)>,
    /// Payloads being copied into windows, oldest first: (buffer, event).
    copying: VecDeque<(usize, u64)>,
    /// Buffers neither posted nor copying.
    free: Vec<usize>,
    events: Vec<u64>,
    device: Device,
}

impl Drop for Lane {
    /// Its registrations and events go before its connections and buffers (the thread's
    /// stream drained first, where it ran).
    fn drop(&mut self) {
        let _ = self.send.dereg_mr(self.send_mr);
        let _ = self.recv.dereg_mr(self.recv_mr);
        for &e in &self.events {
            let _ = self.device.event_destroy(e);
        }
    }
}

/// One peer's lanes, and how many messages went each way (message k takes lane k mod lanes).
struct Link {
    lanes: Vec<Lane>,
    sent: u64,
    received: u64,
}

/// What the thread and the issuing calls share.
struct Inner {
    device: Device,
    rank: usize,
    nranks: usize,
    /// This rank's signal pad (device memory).
    pad: DevPtr,
    /// Chunks staged by the streams so far (written by the streams), and sent (by the thread).
    doorbell: HostMem,
    done: HostMem,
    staging: HostMem,
    /// Staging slots (`NCCL_RS_PUT_DEPTH`).
    depth: usize,
    /// The thread's stream: copies into windows and signal writes.
    stream: StreamHandle,
    /// Chunks issued, not yet sent; the next sequence number.
    queue: Mutex<(VecDeque<Outgoing>, u64)>,
    /// This rank's windows: handle -> (base, bytes).
    windows: Mutex<HashMap<u64, (DevPtr, u64)>>,
    /// The GIN signal words of this rank's device communicator (`[MAX_SIGNALS][nranks]`),
    /// while one lives.
    gin_signals: Mutex<Option<DevPtr>>,
    stop: AtomicBool,
    bell: Mutex<bool>,
    cv: Condvar,
}

impl Drop for Inner {
    /// The last holder (the thread, or `RemotePuts` when connecting failed) destroys the
    /// stream, after the thread drained it.
    fn drop(&mut self) {
        let _ = self.device.stream_destroy(self.stream);
    }
}

impl Inner {
    fn wake(&self) {
        *self.bell.lock().unwrap_or_else(|p| p.into_inner()) = true;
        self.cv.notify_one();
    }
}

/// A communicator's one-sided operations over the network.
pub(crate) struct RemotePuts {
    inner: Arc<Inner>,
    thread: Option<JoinHandle<()>>,
}

/// Every rank's handles for every other: `n` handles per rank, its own slot empty.
fn exchange_handles(bootstrap: &Bootstrap, mine: &[[u8; HANDLE_BYTES]]) -> Result<Vec<Vec<u8>>> {
    let flat: Vec<u8> = mine.iter().flatten().copied().collect();
    let all = bootstrap.allgather(&flat)?;
    let want = mine.len() * HANDLE_BYTES;
    match all.iter().position(|h| h.len() != want) {
        Some(r) => Err(Error::remote(format!(
            "rank {r} sent {} bytes of one-sided network handles, not {want}",
            all[r].len()
        ))),
        None => Ok(all),
    }
}

impl RemotePuts {
    /// Connects every pair of ranks both ways over `net` (collective: every rank calls it at
    /// the same window registration) and starts the thread. Errors of the connections later
    /// go to `on_error` (with the peer).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn connect(
        device: &Device,
        (rank, nranks): (usize, usize),
        pad: DevPtr,
        bootstrap: &Bootstrap,
        (net, dev): (&dyn Net, usize),
        timeout: Duration,
        on_error: OnError,
    ) -> Result<RemotePuts> {
        let lanes = lanes(nranks);
        // Handle `p * lanes + l`: lane l of peer p.
        let mut listeners = Vec::new();
        let mut handles = vec![[0u8; HANDLE_BYTES]; nranks * lanes];
        for (i, h) in handles.iter_mut().enumerate() {
            if i / lanes != rank {
                let (handle, l) = net.listen(dev)?;
                *h = handle;
                listeners.push((i, l));
            }
        }
        let all = exchange_handles(bootstrap, &handles)?;
        let mut connecting = Vec::new();
        for (p, theirs) in all.iter().enumerate().filter(|(p, _)| *p != rank) {
            for l in 0..lanes {
                let at = (rank * lanes + l) * HANDLE_BYTES;
                let mut h = [0u8; HANDLE_BYTES];
                h.copy_from_slice(&theirs[at..at + HANDLE_BYTES]);
                connecting.push((p * lanes + l, net.connect(dev, &h)?));
            }
        }
        let mut sends: Vec<Option<Box<dyn SendComm>>> = (0..nranks * lanes).map(|_| None).collect();
        let mut recvs: Vec<Option<Box<dyn RecvComm>>> = (0..nranks * lanes).map(|_| None).collect();
        let start = Instant::now();
        while !connecting.is_empty() || !listeners.is_empty() {
            let mut i = 0;
            while i < connecting.len() {
                match connecting[i].1.poll()? {
                    Some(c) => sends[connecting.swap_remove(i).0] = Some(c),
                    None => i += 1,
                }
            }
            let mut i = 0;
            while i < listeners.len() {
                match listeners[i].1.accept()? {
                    Some(c) => recvs[listeners.swap_remove(i).0] = Some(c),
                    None => i += 1,
                }
            }
            if start.elapsed() > timeout {
                return Err(Error::remote(format!(
                    "one-sided network connections: {} connect(s) and {} accept(s) still \
                     pending after {timeout:?}",
                    connecting.len(),
                    listeners.len()
                )));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        // By default two chunks in flight per lane.
        let depth = match crate::env::RS_PUT_DEPTH.int() {
            d if d <= 0 => 2 * lanes,
            d => d as usize,
        }
        .clamp(1, MAX_DEPTH);
        let stream = device.stream_create()?;
        let inner = Arc::new(Inner {
            device: device.clone(),
            stream,
            rank,
            nranks,
            pad,
            doorbell: device.alloc_host_mem(8)?,
            done: device.alloc_host_mem(8)?,
            staging: device.alloc_host_mem(depth * SLOT)?,
            depth,
            queue: Mutex::new((VecDeque::new(), 0)),
            windows: Mutex::default(),
            gin_signals: Mutex::default(),
            stop: AtomicBool::new(false),
            bell: Mutex::new(false),
            cv: Condvar::new(),
        });
        // Receive buffers per lane: as many as the sender keeps in flight on a lane, within a
        // budget for all lanes of all peers together (pinned memory grows with the job), and
        // at least one.
        let remote = nranks.saturating_sub(1).max(1) * lanes;
        let per_lane = depth.div_ceil(lanes);
        let recv_depth = (RECV_BUDGET / (SLOT * remote)).clamp(1, per_lane);
        let waker: crate::net::Waker = {
            let inner = Arc::downgrade(&inner);
            Arc::new(move || {
                if let Some(i) = inner.upgrade() {
                    i.wake()
                }
            })
        };
        let mut pairs = sends.into_iter().zip(recvs);
        let mut links: Vec<Option<Link>> = Vec::new();
        for p in 0..nranks {
            let mut made = Vec::new();
            for (send, recv) in pairs.by_ref().take(lanes) {
                if let (Some(send), Some(recv)) = (send, recv) {
                    made.push(open_lane(device, &inner, (send, recv), recv_depth, &waker)?);
                }
            }
            debug_assert!(made.is_empty() == (p == rank));
            links.push((!made.is_empty()).then_some(Link {
                lanes: made,
                sent: 0,
                received: 0,
            }));
        }
        let worker = Worker {
            inner: inner.clone(),
            links,
            in_flight: VecDeque::new(),
            on_error,
        };
        let on_error = worker.on_error.clone();
        let thread = std::thread::Builder::new()
            .name(format!("nccl-onesided-{rank}"))
            .spawn(move || {
                // A panic would leave the streams waiting on `done` for ever: report it.
                let run = std::panic::AssertUnwindSafe(move || worker.run());
                if std::panic::catch_unwind(run).is_err() {
                    let e = Error::internal("the one-sided network thread panicked");
                    on_error(rank, e);
                }
            })
            .map_err(|e| Error::system(format!("starting the one-sided network thread: {e}")))?;
        Ok(RemotePuts {
            inner,
            thread: Some(thread),
        })
    }

    /// A window of this rank that peers may put into (or, with None, no longer: once this
    /// returns, nothing more is copied into it).
    pub(crate) fn set_window(&self, handle: u64, place: Option<(DevPtr, u64)>) -> Result<()> {
        let mut w = self.inner.windows.lock().unwrap_or_else(|p| p.into_inner());
        match place {
            Some(p) => w.insert(handle, p),
            None => w.remove(&handle),
        };
        drop(w);
        match place {
            Some(_) => Ok(()),
            None => self.inner.device.stream_sync(self.inner.stream),
        }
    }

    /// Where GIN signals from peers land (None: no device communicator with GIN any more;
    /// once this returns, nothing more is written there).
    pub(crate) fn set_gin_signals(&self, words: Option<DevPtr>) -> Result<()> {
        *self
            .inner
            .gin_signals
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = words;
        match words {
            Some(_) => Ok(()),
            None => self.inner.device.stream_sync(self.inner.stream),
        }
    }

    /// Whether every chunk staged so far was sent (no host put is in flight).
    pub(crate) fn idle(&self) -> bool {
        let staged = self.inner.queue.lock().unwrap_or_else(|p| p.into_inner()).1;
        self.sent() == staged
    }

    /// Bytes of this rank's window `handle`, if it is registered (windows are symmetric: a
    /// peer's part is as large).
    pub(crate) fn window_bytes(&self, handle: u64) -> Option<u64> {
        let w = self.inner.windows.lock().unwrap_or_else(|p| p.into_inner());
        w.get(&handle).map(|&(_, bytes)| bytes)
    }

    /// The `done` counter's device address: chunks sent so far.
    pub(crate) fn sent_word(&self) -> DevPtr {
        self.inner.done.ptr
    }

    /// Chunks sent so far (what [`RemotePuts::stage`]'s targets are compared with).
    pub(crate) fn sent(&self) -> u64 {
        let v = self.inner.done.load_u64(0).unwrap_or(0);
        std::sync::atomic::fence(Ordering::Acquire);
        v
    }

    /// Queues on `stream` a put of `bytes` at `src` into rank `peer`'s window `win` at
    /// `offset`, then signal count `signal` into the slots of `channel` (the caller counted
    /// it): the chunks staged and announced; `wait(stream, addr, value)` holds the staging of
    /// a chunk until the u64 at `addr` reaches `value` (its slot was sent). Returns the
    /// [`RemotePuts::sent`] value at which the put's last chunk was sent.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn stage(
        &self,
        stream: StreamHandle,
        (src, bytes): (DevPtr, usize),
        peer: usize,
        (win, offset): (u64, usize),
        (channel, signal): (u64, u64),
        wait: &dyn Fn(StreamHandle, DevPtr, u64) -> Result<()>,
    ) -> Result<u64> {
        let (done, doorbell) = (self.inner.done.ptr, self.inner.doorbell.ptr);
        let d = &self.inner.device;
        let chunks = bytes.div_ceil(CHUNK).max(1);
        let mut last = 0;
        for i in 0..chunks {
            let len = (bytes - i * CHUNK).min(CHUNK);
            // A slot is reused once the chunk that last used it was sent. The wait is not
            // made holding the queue: a wait of the GIN thread's own waits for the network
            // thread, which takes the queue to send.
            let seq = self.inner.queue.lock().unwrap_or_else(|p| p.into_inner()).1;
            let depth = self.inner.depth as u64;
            if seq >= depth {
                wait(stream, done, seq - depth + 1)?;
            }
            let mut q = self.inner.queue.lock().unwrap_or_else(|p| p.into_inner());
            if q.1 != seq {
                // Puts take the communicator's order, and GIN excludes the host's own.
                return Err(Error::internal(
                    "one-sided puts staged from two places at once",
                ));
            }
            let slot = self.inner.staging.ptr + ((seq % depth) as usize * SLOT + HEADER) as u64;
            if len > 0 {
                d.copy_dtod_async(slot, src + (i * CHUNK) as u64, len, stream)?;
            }
            d.write_value64(stream, doorbell, seq + 1)?;
            let header = Header {
                win,
                offset: (offset + i * CHUNK) as u64,
                bytes: len as u64,
                channel,
                signal: if i + 1 == chunks { signal } else { 0 },
            };
            q.0.push_back(Outgoing { seq, peer, header });
            q.1 += 1;
            last = seq;
            drop(q);
            self.inner.wake();
        }
        Ok(last + 1)
    }
}

/// Lanes per pair: `NCCL_RS_PUT_LANES`, or by default 32 connections each way spread over
/// the peers, 1 to 8 per peer (as SendRecv spreads its channels). On one H100 as 2 nodes over
/// `lo`, a GIN put of 128 MiB moved 4.8-6.0 GB/s on 1 lane, 12.6-13.2 on 4, 15.9-16.5 on 8
/// and 17.1-17.5 on 16, against SendRecv's 13.3 (results/h100-s34-gin-lanes.txt).
fn lanes(nranks: usize) -> usize {
    match crate::env::RS_PUT_LANES.int() {
        l if l <= 0 => (32 / nranks.saturating_sub(1).max(1)).clamp(1, 8),
        l => (l as usize).min(MAX_LANES),
    }
}

/// A lane over `send` and `recv`: the staging slots registered for sending, `recv_depth`
/// receive buffers of its own registered for receiving, the thread woken by both.
fn open_lane(
    device: &Device,
    inner: &Inner,
    (mut send, mut recv): (Box<dyn SendComm>, Box<dyn RecvComm>),
    recv_depth: usize,
    waker: &crate::net::Waker,
) -> Result<Lane> {
    let staging = inner.staging.host_ptr(0).unwrap_or(std::ptr::null_mut());
    let bufs = device.alloc_host_mem(recv_depth * SLOT)?;
    let host = bufs.host_ptr(0).unwrap_or(std::ptr::null_mut());
    // SAFETY: both regions live as long as the lane (the thread's, dropped before `inner` and
    // `bufs`).
    let send_mr = unsafe { send.reg_mr(staging, inner.depth * SLOT, PTR_HOST)? };
    // SAFETY: as above.
    let recv_mr = match unsafe { recv.reg_mr(host, recv_depth * SLOT, PTR_HOST) } {
        Ok(mr) => mr,
        Err(e) => {
            let _ = send.dereg_mr(send_mr);
            return Err(e);
        }
    };
    send.set_waker(waker.clone());
    recv.set_waker(waker.clone());
    let mut lane = Lane {
        send,
        send_mr,
        recv,
        bufs,
        recv_mr,
        posted: VecDeque::new(),
        copying: VecDeque::new(),
        free: (0..recv_depth).collect(),
        events: Vec::with_capacity(recv_depth),
        device: device.clone(),
    };
    // Made into the lane, so that a failure here releases what was made (its drop).
    for _ in 0..recv_depth {
        lane.events.push(device.event_create_untimed()?);
    }
    Ok(lane)
}

impl Drop for RemotePuts {
    fn drop(&mut self) {
        self.inner.stop.store(true, Ordering::Release);
        self.inner.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread's state.
struct Worker {
    inner: Arc<Inner>,
    links: Vec<Option<Link>>,
    /// Chunks being sent, oldest first: (sequence, peer, lane, request).
    in_flight: VecDeque<(u64, usize, usize, Request)>,
    on_error: OnError,
}

impl Drop for Worker {
    /// The lanes' buffers go only after the copies the stream queued from them: drained
    /// first, whether the thread ended or panicked.
    fn drop(&mut self) {
        let _ = self.inner.device.stream_sync(self.inner.stream);
        self.links.clear();
    }
}

impl Worker {
    fn run(mut self) {
        crate::clock::fine_timer_slack();
        let mut nap = Duration::from_micros(1);
        while !self.inner.stop.load(Ordering::Acquire) {
            match self.progress() {
                Ok(true) => nap = Duration::from_micros(1),
                Ok(false) => {
                    let mut rung = self.inner.bell.lock().unwrap_or_else(|p| p.into_inner());
                    if !*rung {
                        rung = match self.inner.cv.wait_timeout(rung, nap) {
                            Ok((g, _)) => g,
                            Err(p) => p.into_inner().0,
                        };
                    }
                    *rung = false;
                    // Streams staging chunks ring no bell: poll them often while any is queued.
                    let queued = !self.inner.queue.lock().map_or(true, |q| q.0.is_empty());
                    // While a device communicator's GIN lives, kernels wait on what arrives:
                    // receives are polled often (NCCL's proxy spins); otherwise idle naps
                    // grow to 2 ms.
                    let gin = self.inner.gin_signals.lock().is_ok_and(|g| g.is_some());
                    nap = match (queued, gin) {
                        (true, _) => Duration::from_micros(2),
                        (false, true) => (nap * 2).min(Duration::from_micros(20)),
                        (false, false) => (nap * 2).min(Duration::from_millis(2)),
                    };
                }
                Err((peer, e)) => {
                    let what = format!("one-sided operations across nodes, with rank {peer}");
                    (self.on_error)(peer, e.context(what));
                    break;
                }
            }
        }
        // The lanes go with the worker (its drop, after a panic too).
    }

    /// One pass over sends and receives: whether anything moved; an error names its peer.
    fn progress(&mut self) -> std::result::Result<bool, (usize, Error)> {
        let mut moved = self.progress_sends()?;
        for p in 0..self.links.len() {
            moved |= self.progress_receives(p).map_err(|e| (p, e))?;
        }
        Ok(moved)
    }

    fn progress_sends(&mut self) -> std::result::Result<bool, (usize, Error)> {
        let inner = self.inner.clone();
        let mut moved = false;
        // The doorbell's value, then (acquire) the staged bytes it announces.
        let staged = inner.doorbell.load_u64(0).unwrap_or(0);
        std::sync::atomic::fence(Ordering::Acquire);
        while self.in_flight.len() < inner.depth {
            let mut q = inner.queue.lock().unwrap_or_else(|p| p.into_inner());
            let Some(o) = q.0.front().filter(|o| o.seq < staged) else {
                break;
            };
            let (seq, peer, header) = (o.seq, o.peer, o.header);
            let link = self.links[peer].as_mut().ok_or((peer, no_link(peer)))?;
            let at = (seq as usize % inner.depth) * SLOT;
            let head = inner.staging.host_ptr(at).ok_or((peer, no_link(peer)))?;
            // SAFETY: the slot's header bytes, which only this thread writes, between the
            // stream's staging of the chunk and the send's completion.
            unsafe { std::ptr::copy_nonoverlapping(header.encode().as_ptr(), head, HEADER) };
            let len = HEADER + header.bytes as usize;
            let lane = (link.sent % link.lanes.len() as u64) as usize;
            let l = &mut link.lanes[lane];
            let Some(req) = l
                .send
                .isend(l.send_mr, at, len, TAG)
                .map_err(|e| (peer, e))?
            else {
                break;
            };
            link.sent += 1;
            q.0.pop_front();
            self.in_flight.push_back((seq, peer, lane, req));
            moved = true;
        }
        while let Some(&(seq, peer, lane, req)) = self.in_flight.front() {
            let link = self.links[peer].as_mut().ok_or((peer, no_link(peer)))?;
            if link.lanes[lane]
                .send
                .test(req)
                .map_err(|e| (peer, e))?
                .is_none()
            {
                break;
            }
            self.in_flight.pop_front();
            let p = inner.done.host_ptr(0).ok_or((peer, no_link(peer)))? as *mut u64;
            // SAFETY: an aligned u64 of the live mapping, read by the wait kernels.
            unsafe { std::ptr::write_volatile(p, seq + 1) };
            moved = true;
        }
        Ok(moved)
    }

    /// Peer `p`'s receives: the landed ones copied into their windows and signalled, the
    /// copied ones posted again.
    fn progress_receives(&mut self, p: usize) -> Result<bool> {
        let inner = self.inner.clone();
        let stream = inner.stream;
        let Some(link) = self.links[p].as_mut() else {
            return Ok(false);
        };
        let d = &inner.device;
        let mut moved = false;
        for l in link.lanes.iter_mut() {
            while let Some(&(buf, e)) = l.copying.front() {
                if !d.event_query(e)? {
                    break;
                }
                l.copying.pop_front();
                l.free.push(buf);
            }
            while let Some(buf) = l.free.pop() {
                let b = RecvBuf {
                    mr: l.recv_mr,
                    offset: buf * SLOT,
                    max_len: SLOT,
                    tag: TAG,
                };
                match l.recv.irecv(&[b])? {
                    Some(req) => l.posted.push_back((buf, req)),
                    None => {
                        l.free.push(buf);
                        break;
                    }
                }
            }
        }
        // The peer's messages in the order it sent them: the next one is on its lane's
        // oldest receive.
        loop {
            let i = (link.received % link.lanes.len() as u64) as usize;
            let Some(&(buf, req)) = link.lanes[i].posted.front() else {
                break;
            };
            let Some(sizes) = link.lanes[i].recv.test(req)? else {
                break;
            };
            link.received += 1;
            let lane = &mut link.lanes[i];
            lane.posted.pop_front();
            let len = sizes.first().copied().unwrap_or(0);
            let at = buf * SLOT;
            let host = lane.bufs.host_ptr(at).ok_or_else(|| no_link(p))?;
            // SAFETY: the buffer's header, landed and not posted again yet.
            let head = unsafe { std::slice::from_raw_parts(host, HEADER.min(len)) };
            let h = Header::decode(head)
                .filter(|h| h.bytes.checked_add(HEADER as u64) == Some(len as u64))
                .ok_or_else(|| Error::remote(format!("rank {p} sent a malformed put")))?;
            if h.bytes > 0 {
                // Held while the copy is queued: a deregistration that removed the window
                // and then drained the stream has seen every copy into it.
                let windows = inner.windows.lock().unwrap_or_else(|p| p.into_inner());
                let Some(&(base, size)) = windows.get(&h.win) else {
                    return Err(Error::remote(format!(
                        "rank {p} put into window {:#x}, which rank {} has not registered",
                        h.win, inner.rank
                    )));
                };
                if h.offset.checked_add(h.bytes).is_none_or(|end| end > size) {
                    return Err(Error::remote(format!(
                        "rank {p} put {} bytes at offset {} of window {:#x} ({size} bytes here)",
                        h.bytes, h.offset, h.win
                    )));
                }
                let src = lane.bufs.ptr + (at + HEADER) as u64;
                d.copy_dtod_async(base + h.offset, src, h.bytes as usize, stream)?;
                drop(windows);
            }
            if h.signal != 0 {
                // Held until the write is queued: a device communicator's drop clears the
                // GIN words and then drains the stream, before their memory goes.
                let gin = inner.gin_signals.lock().unwrap_or_else(|p| p.into_inner());
                d.write_value64(stream, signal_slot(&inner, *gin, p, h.channel)?, h.signal)?;
            }
            d.event_record(lane.events[buf], stream)?;
            lane.copying.push_back((buf, lane.events[buf]));
            moved = true;
        }
        Ok(moved)
    }
}

/// Where a signal of rank `p` on `channel` is written: its slot of the signal pad's channel,
/// or of a GIN signal id among `gin` (this rank's device communicator's signal words).
fn signal_slot(inner: &Inner, gin: Option<DevPtr>, p: usize, channel: u64) -> Result<DevPtr> {
    let n = inner.nranks as u64;
    if channel < super::onesided::CHANNELS as u64 {
        return Ok(inner.pad + 8 * (channel * n + p as u64));
    }
    let id = channel.wrapping_sub(super::gin::GIN_CHANNEL_BASE);
    match gin {
        Some(w) if id < nccl_device::api::MAX_SIGNALS as u64 => Ok(w + 8 * (id * n + p as u64)),
        _ => Err(Error::remote(format!(
            "rank {p} sent a signal on channel {channel}, which rank {} has no slots for (no \
             device communicator with GIN here, or an id past {})",
            inner.rank,
            nccl_device::api::MAX_SIGNALS
        ))),
    }
}

fn no_link(peer: usize) -> Error {
    Error::internal(format!("no one-sided network connection with rank {peer}"))
}
