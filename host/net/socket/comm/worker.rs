//! The helper threads: each moves its pieces of messages over its data sockets, thread 0
//! also the control socket's headers and inline payloads.

use super::*;

/// What a helper thread does next.
pub(super) enum Job {
    /// Its part of a message.
    Part(Work),
    /// Thread 0, receiving: make sure a caller that went away hears of arriving bytes.
    Listen,
}

/// One non-blocking read: Some(bytes read), None when nothing is there; the end of the
/// stream is an error.
pub(super) fn read_now(s: &Socket, buf: &mut [MaybeUninit<u8>]) -> io::Result<Option<usize>> {
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
pub(super) fn readable(s: &Socket, bell: Option<&OwnedFd>, limit: Duration) -> bool {
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
pub(super) fn eventfd() -> Option<OwnedFd> {
    // SAFETY: eventfd takes no pointers; a non-negative result is a new descriptor we own.
    let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
    // SAFETY: `fd` was just created and nothing else owns it.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Why a helper thread stopped working on a message.
pub(super) enum Halt {
    /// The comm stops or already failed: leave quietly.
    Quit,
    /// This thread saw the connection break.
    Broken(String),
}

/// A call that should be repeated: nothing moved before the socket's IO_TICK timeout (EAGAIN),
/// or a signal. ETIMEDOUT is no such thing on Linux: it is the kernel giving up on the
/// connection (keepalive probes or retransmissions unanswered), an error.
pub(super) fn would_block(e: &io::Error) -> bool {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted => true,
        io::ErrorKind::TimedOut => e.raw_os_error() != Some(libc::ETIMEDOUT),
        _ => false,
    }
}

/// An I/O error for a message; a connection timeout says what it means.
pub(super) fn io_text(e: &io::Error) -> String {
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
pub(in crate::net::socket) fn unacked_for(s: &Socket, t: Duration) -> Option<Duration> {
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
pub(super) struct Piece {
    pub(super) sock: Arc<Socket>,
    /// None: the control socket; Some(i): data socket i.
    pub(super) index: Option<usize>,
    /// Next address to move (inside a registered region).
    pub(super) addr: usize,
    pub(super) left: usize,
    /// Where the piece sits in its message, for error messages.
    pub(super) range: (usize, usize),
    pub(super) len: usize,
}

impl Piece {
    pub(super) fn describe(&self, send: bool) -> String {
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

pub(super) struct Worker {
    pub(super) t: usize,
    pub(super) send: bool,
    pub(super) shared: Arc<Shared>,
    pub(super) ctrl: Option<Arc<Socket>>,
    pub(super) socks: Vec<(usize, Arc<Socket>)>,
    /// When the sockets' acknowledgements were last looked at ([`Worker::acked`]).
    pub(super) acks_seen: Instant,
}

impl Worker {
    pub(super) fn run(mut self) {
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

    pub(super) fn check(&self) -> std::result::Result<(), Halt> {
        if self.shared.quitting() {
            Err(Halt::Quit)
        } else {
            Ok(())
        }
    }

    /// Sending with a send timeout: whether it is time (every [`IO_TICK`]) to look at the
    /// acknowledgements of the sockets that take no bytes ([`Worker::acked`]).
    pub(super) fn acks_due(&mut self) -> bool {
        if !self.send || self.shared.send_timeout.is_none() || self.acks_seen.elapsed() < IO_TICK {
            return false;
        }
        self.acks_seen = Instant::now();
        true
    }

    /// Sending, while `sock` takes no bytes: fails the connection when its data in flight went
    /// unacknowledged for the send timeout ([`unacked_for`]).
    pub(super) fn acked(
        &self,
        sock: &Socket,
        what: impl FnOnce() -> String,
    ) -> std::result::Result<(), Halt> {
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

    pub(super) fn ctrl(&self) -> std::result::Result<Arc<Socket>, Halt> {
        self.ctrl
            .clone()
            .ok_or_else(|| Halt::Broken("helper thread without the control socket".into()))
    }

    /// Writes all of `bytes` (a header) on `sock`.
    pub(super) fn send_all(
        &mut self,
        sock: &Socket,
        bytes: &[u8],
    ) -> std::result::Result<(), Halt> {
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
    pub(super) fn step(&mut self, p: &mut Piece, flags: libc::c_int) -> io::Result<usize> {
        let n = if self.send {
            // SAFETY: `p.addr..p.addr + p.left` lies inside a region registered with this comm
            // (checked by `isend` against the registration), which the caller of `reg_mr`
            // keeps valid for reads until `dereg_mr` (refused while this request is in flight)
            // or the comm's drop (which joins this thread first). Only reads happen through it.
            let buf = unsafe { std::slice::from_raw_parts(p.addr as *const u8, p.left) };
            p.sock.send_with_flags(buf, flags | libc::MSG_NOSIGNAL)?
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

    pub(super) fn broken(&self, p: &Piece, e: io::Error) -> Halt {
        if self.shared.quitting() {
            return Halt::Quit;
        }
        Halt::Broken(format!("{}: {}", p.describe(self.send), io_text(&e)))
    }

    /// Moves every piece to its end.
    pub(super) fn move_pieces(&mut self, pieces: &mut [Piece]) -> std::result::Result<(), Halt> {
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
    pub(super) fn pieces(&self, addr: usize, len: usize) -> Vec<Piece> {
        self.socks
            .iter()
            .filter_map(|(i, s)| {
                let r = wire::piece(len, self.shared.ndata, *i);
                (!r.is_empty()).then(|| Piece {
                    sock: s.clone(),
                    index: Some(*i),
                    addr: addr + r.start,
                    left: r.len(),
                    range: (r.start, r.end),
                    len,
                })
            })
            .collect()
    }

    pub(super) fn inline_piece(&self, ctrl: Arc<Socket>, w: &Work) -> Piece {
        Piece {
            sock: ctrl,
            index: None,
            addr: w.msg.addr,
            left: w.len,
            range: (0, w.len),
            len: w.len,
        }
    }

    pub(super) fn send_one(&mut self, w: &Work) -> std::result::Result<(), Halt> {
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
        let mut pieces = self.pieces(w.msg.addr, w.len);
        self.move_pieces(&mut pieces)
    }

    /// Receiving, threads other than 0: this thread's pieces of a message.
    pub(super) fn recv_one(&mut self, w: Work) -> std::result::Result<Work, Halt> {
        let mut pieces = self.pieces(w.msg.addr, w.len);
        self.move_pieces(&mut pieces)?;
        Ok(w)
    }

    /// Receiving, thread 0: moves its pieces of large messages, and calls the waker when bytes
    /// arrive on the control socket while the caller is away.
    pub(super) fn run_listener(mut self) {
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
    pub(super) fn listen(&mut self) -> std::result::Result<(), Halt> {
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
