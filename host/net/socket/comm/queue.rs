//! What the caller and the helper threads share: the messages, each thread's queue of work,
//! the connection's state and its failure.

use super::*;

/// One message: where its bytes are (or go), and its outcome.
pub(super) struct Msg {
    /// Start address inside a registered region.
    pub(super) addr: usize,
    /// Sending: the length; receiving: the buffer's size.
    pub(super) cap: usize,
    pub(super) tag: u32,
    pub(super) mr: u64,
    /// Helper threads that still have to do their part.
    pub(super) parts_left: AtomicUsize,
    pub(super) result: OnceLock<Result<usize>>,
}

/// A thread's part of a message.
pub(super) struct Work {
    pub(super) msg: Arc<Msg>,
    /// The message's length (receiving: known once thread 0 read the header).
    pub(super) len: usize,
    /// Sending: bytes of the header and inline payload the caller already wrote.
    pub(super) sent: usize,
}

/// The helper threads' work: each thread's parts of messages, and (receiving) the posted
/// buffers whose header has not been read yet, oldest first.
pub(super) struct Queues {
    pub(super) work: Vec<VecDeque<Work>>,
    pub(super) posted: VecDeque<Arc<Msg>>,
}

pub(super) struct Shared {
    pub(super) peer: SocketAddr,
    pub(super) dev: String,
    pub(super) nthreads: usize,
    pub(super) ndata: usize,
    pub(super) queues: Mutex<Queues>,
    pub(super) cv: Condvar,
    /// Sending: messages handed to thread 0 whose header and inline payload are not all
    /// written yet; while any are, the caller must not write on the control socket.
    pub(super) ctrl_queued: AtomicUsize,
    /// Receiving: where the reading of the control socket stands; held by whoever reads it.
    pub(super) reader: Mutex<Reader>,
    /// Receiving: when the caller last read the control socket ([`Shared::clock_us`]).
    pub(super) caller_seen_us: AtomicU64,
    /// The time base of `caller_seen_us`.
    pub(super) epoch: Instant,
    /// Receiving: an eventfd rung when thread 0 gets work, so that watching the control
    /// socket (a blocking poll) never keeps it from its pieces of a large message.
    pub(super) work_bell: Option<OwnedFd>,
    pub(super) stop: AtomicBool,
    /// The peer closed its sending end cleanly (a [`wire::CLOSE_TAG`] header): nothing more
    /// arrives, and that is no error.
    pub(super) closed: AtomicBool,
    pub(super) failed: AtomicBool,
    pub(super) error: Mutex<Option<Error>>,
    pub(super) waker: Mutex<Option<Waker>>,
    /// Every socket (control first), to shut them down.
    pub(super) sockets: Vec<Arc<Socket>>,
    /// Sending: the bound on unacknowledged data ([`unacked_for`]).
    pub(super) send_timeout: Option<Duration>,
    /// Sending: [`Conn::inline_below`].
    pub(super) inline_below: usize,
}

impl Shared {
    pub(super) fn clock_us(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
    }

    /// Sending: does a `len`-byte message go inline on the control socket?
    pub(super) fn sends_inline(&self, len: usize) -> bool {
        wire::sends_inline(len, self.inline_below)
    }

    pub(super) fn quitting(&self) -> bool {
        self.stop.load(Ordering::Acquire) || self.failed.load(Ordering::Acquire)
    }

    pub(super) fn error(&self) -> Option<Error> {
        if !self.failed.load(Ordering::Acquire) {
            return None;
        }
        lock(&self.error).clone()
    }

    pub(super) fn wake(&self) {
        let w = lock(&self.waker).clone();
        if let Some(w) = w {
            w();
        }
    }

    /// Records the connection's failure (the first one wins; nothing while the comm is being
    /// dropped), shuts every socket down and wakes everyone.
    pub(super) fn fail(&self, what: impl FnOnce() -> String) {
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
    pub(super) fn next(&self, t: usize) -> Option<Work> {
        self.next_job(t, false).map(|j| match j {
            Job::Part(w) => w,
            Job::Listen => unreachable!("listening is thread 0's, receiving"),
        })
    }

    /// Thread `t`'s next part of a message or, with `listen` (thread 0 receiving), a posted
    /// buffer waiting for its header; None once the comm stops or fails.
    pub(super) fn next_job(&self, t: usize, listen: bool) -> Option<Job> {
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

    pub(super) fn push(&self, threads: std::ops::Range<usize>, w: &Work) {
        let to_thread0 = threads.contains(&0);
        {
            let mut q = lock(&self.queues);
            for t in threads {
                q.work[t].push_back(Work {
                    msg: w.msg.clone(),
                    len: w.len,
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
    pub(super) fn part_done(&self, w: &Work) {
        if w.msg.parts_left.fetch_sub(1, Ordering::AcqRel) != 1 {
            return;
        }
        self.finish(&w.msg, w.len);
        self.wake();
    }

    /// Completes `msg`: `len` bytes moved.
    pub(super) fn finish(&self, msg: &Msg, len: usize) {
        let _ = msg.result.set(Ok(len));
    }
}

impl Shared {
    /// Reads what the control socket holds, without blocking: headers, inline payloads into
    /// the oldest posted buffers, large messages handed to the threads. A broken stream fails
    /// the connection (the error then comes from `test`).
    pub(super) fn read_ctrl(&self, ctrl: &Socket, reader: &mut Reader) {
        if self.quitting() {
            return;
        }
        if let Err(what) = self.read_ctrl_inner(ctrl, reader) {
            self.fail(|| what);
        }
    }

    pub(super) fn read_ctrl_inner(
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
                    if len > msg.cap {
                        // Its bytes are not read: a length may claim anything, and the
                        // stream's framing is lost with them, so the connection ends here.
                        let what = format!(
                            "a message of {len} bytes from {} does not fit the receive buffer \
                             of {} bytes (device {}): the connection is closed",
                            self.peer, msg.cap, self.dev
                        );
                        let _ = msg
                            .result
                            .set(Err(Error::remote(format!("NET/Socket: {what}"))));
                        return Err(what);
                    }
                    if inline {
                        reader.reading = Reading::Payload { msg, len, got: 0 };
                    } else {
                        let w = Work { msg, len, sent: 0 };
                        self.push(0..self.nthreads, &w);
                        reader.reading = Reading::header();
                    }
                }
                Reading::Payload { msg, len, got } => {
                    while *got < *len {
                        let dst = {
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
                    self.finish(msg, *len);
                    reader.reading = Reading::header();
                }
            }
        }
    }
}
