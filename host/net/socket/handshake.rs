//! Opening a connection without blocking.
//!
//! The connector opens the control socket and every data socket at once (non-blocking
//! connects, refused attempts retried with `NCCL_SOCKET_RETRY_CNT` / `NCCL_SOCKET_RETRY_SLEEP_MSEC`
//! pauses) and writes a 48-byte hello on each: the listener's tag from the handle, the
//! connection's id (the connector's process id and a per-process serial number), the socket's
//! role (control, or data socket i) and the geometry (threads × sockets per thread). Once every
//! hello is written the connection is up; nothing waits for the acceptor, so a connect never
//! depends on the peer calling accept at the same time.
//!
//! The listener accepts whatever arrives, reads each socket's hello without blocking, drops
//! sockets whose hello is wrong (another program, a stale handle), and groups the rest by
//! connection id; a group with its control socket and all its data sockets becomes a receiving
//! comm. Both sides give up after a deadline: the connector when its sockets do not connect in
//! time, the listener when a connection stays incomplete (or a socket sends no hello).

use std::collections::HashMap;
use std::io::{self, Read};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use super::comm::{Comm, Conn};
use super::wire::{self, ConnId, Hello, HELLO_BYTES};
use super::{SocketRecvComm, SocketSendComm};
use crate::error::{Error, Result};
use crate::net::{Connecting, Listener, RecvComm, SendComm};
use crate::sockets::Retry;

/// The most sockets a listener holds while their hellos are awaited, in all and from one
/// address: a new socket past either bound pushes out the oldest waiting one (of that
/// address, or of all), so a flood of silent connections costs a bounded number of
/// descriptors and keeps no real connection out. A real connection brings at most 65 sockets
/// (a control socket and `NCCL_NSOCKS_PERTHREAD` × `NCCL_SOCKET_NTHREADS` ≤ 64), each with
/// its hello written right after its connect.
pub(super) const MAX_PENDING: usize = 512;
pub(super) const MAX_PENDING_PER_SOURCE: usize = 128;
/// Most sockets one `accept` call takes from the backlog before it reads the hellos: a real
/// socket's hello is read in the call that accepted it, before a flood behind it in the
/// backlog can push it out.
const ACCEPTS_PER_CALL: usize = 64;
/// How long an accepted socket may take to send its hello (a real one sends it at once).
pub(super) const HELLO_WAIT: Duration = Duration::from_secs(2);

/// A listener's tag: 128 random bits of its own. It travels only in the handle, through the
/// bootstrap, so a stranger cannot greet a listener as one of its connections, and one handle
/// says nothing of the process's other listeners (a per-process secret masking a counter
/// did: one tag gave the secret away).
pub(super) fn next_tag() -> u128 {
    let (high, low) = (
        crate::sockets::random_nonce(),
        crate::sockets::random_nonce(),
    );
    (u128::from(high) << 64) | u128::from(low)
}

/// A connection's id: this process's, and a random serial (a predictable one would let a
/// process that knows a listener's tag slip a socket into another's connection).
fn next_conn_id() -> ConnId {
    ConnId {
        pid: std::process::id(),
        serial: crate::sockets::random_nonce(),
    }
}

/// A socket whose hello has not fully arrived.
struct Pending {
    sock: Socket,
    peer: SocketAddr,
    buf: [u8; HELLO_BYTES],
    got: usize,
    since: Instant,
}

/// The sockets of one connection that arrived so far.
struct Group {
    ctrl: Option<Socket>,
    peer: SocketAddr,
    data: Vec<Option<Socket>>,
    nthreads: usize,
    nsocks: usize,
    since: Instant,
}

impl Group {
    fn complete(&self) -> bool {
        self.ctrl.is_some() && self.data.iter().all(Option::is_some)
    }
    fn arrived(&self) -> usize {
        usize::from(self.ctrl.is_some()) + self.data.iter().filter(|s| s.is_some()).count()
    }
}

/// A listening endpoint of the socket network.
pub struct SocketListener {
    sock: Socket,
    addr: SocketAddr,
    tag: u128,
    dev: String,
    timeout: Duration,
    /// Handed to the connections it accepts (`Conn::peer_timeout`, `Conn::send_timeout`).
    peer_timeout: Option<Duration>,
    send_timeout: Option<Duration>,
    pending: Vec<Pending>,
    /// Most sockets awaiting hellos, in all and from one address: [`MAX_PENDING`] and
    /// [`MAX_PENDING_PER_SOURCE`], fewer where the process may hold few descriptors
    /// (`sockets::descriptor_share`, read once).
    pending_cap: (usize, usize),
    groups: HashMap<ConnId, Group>,
    /// The sockets dropped so far (warned about a few at a time).
    rejections: crate::sockets::Rejections,
}

enum HelloRead {
    Wait,
    Done,
    Drop(String),
}

impl SocketListener {
    pub(super) fn new(sock: Socket, tag: u128, dev: String, timeout: Duration) -> Result<Self> {
        sock.set_nonblocking(true).map_err(|e| {
            Error::system(format!("NET/Socket: making the listener non-blocking: {e}"))
        })?;
        let addr = crate::sockets::local_addr(&sock)
            .map_err(|e| Error::system(format!("NET/Socket: listener address: {e}")))?;
        Ok(SocketListener {
            sock,
            addr,
            tag,
            dev,
            timeout,
            peer_timeout: None,
            send_timeout: None,
            pending: Vec::new(),
            pending_cap: {
                let cap = crate::sockets::descriptor_share(MAX_PENDING);
                (cap, MAX_PENDING_PER_SOURCE.min(cap))
            },
            groups: HashMap::new(),
            rejections: Default::default(),
        })
    }

    /// The connections it accepts fail when their peer's host is silent for `peer` (see
    /// `comm::keepalive`), or leaves data they send unacknowledged for `send` (see
    /// `comm::unacked_for`); None (the default) leaves the kernel's defaults.
    pub(super) fn with_timeouts(mut self, peer: Option<Duration>, send: Option<Duration>) -> Self {
        self.peer_timeout = peer;
        self.send_timeout = send;
        self
    }

    pub(super) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Takes up to [`ACCEPTS_PER_CALL`] connections from the backlog, each making room for
    /// itself among those awaiting hellos (see [`MAX_PENDING`]).
    fn take_new(&mut self) -> Result<()> {
        for _ in 0..ACCEPTS_PER_CALL {
            match self.sock.accept() {
                Ok((s, from)) => {
                    let Some(peer) = from.as_socket() else {
                        continue;
                    };
                    if let Err(e) = s.set_nonblocking(true).and_then(|()| s.set_nodelay(true)) {
                        self.rejections.warn(|| {
                            format!("NET/Socket: listener {}: dropping {peer}: {e}", self.addr)
                        });
                        continue;
                    }
                    self.make_room(peer);
                    self.pending.push(Pending {
                        sock: s,
                        peer,
                        buf: [0; HELLO_BYTES],
                        got: 0,
                        since: Instant::now(),
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::ConnectionAborted
                    ) =>
                {
                    continue
                }
                Err(e) => {
                    return Err(Error::system(format!(
                        "NET/Socket: accepting on {} (device {}): {e}",
                        self.addr, self.dev
                    )))
                }
            }
        }
        Ok(())
    }

    /// Pushes out the oldest socket awaiting its hello from `peer`'s address when that address
    /// has [`MAX_PENDING_PER_SOURCE`] waiting, else the oldest of all at [`MAX_PENDING`].
    fn make_room(&mut self, peer: SocketAddr) {
        let oldest = |it: &mut dyn Iterator<Item = (usize, &Pending)>| {
            it.min_by_key(|(_, p)| p.since).map(|(i, _)| i)
        };
        let (cap, per_source) = self.pending_cap;
        let same = self
            .pending
            .iter()
            .filter(|p| p.peer.ip() == peer.ip())
            .count();
        let out = if same >= per_source {
            oldest(
                &mut self
                    .pending
                    .iter()
                    .enumerate()
                    .filter(|(_, p)| p.peer.ip() == peer.ip()),
            )
        } else if self.pending.len() >= cap {
            oldest(&mut self.pending.iter().enumerate())
        } else {
            None
        };
        if let Some(i) = out {
            let p = self.pending.swap_remove(i);
            self.rejections.warn(|| {
                format!(
                    "NET/Socket: listener {}: dropping {}: pushed out by a newer socket (too \
                     many awaiting their hellos)",
                    self.addr, p.peer
                )
            });
        }
    }

    /// Reads what arrived of the pending hellos; files the complete ones into groups.
    fn read_hellos(&mut self) {
        let mut i = 0;
        while i < self.pending.len() {
            let p = &mut self.pending[i];
            let outcome = loop {
                let mut r: &Socket = &p.sock;
                match r.read(&mut p.buf[p.got..]) {
                    Ok(0) => break HelloRead::Drop("closed before its hello".into()),
                    Ok(n) => {
                        p.got += n;
                        if p.got == HELLO_BYTES {
                            break HelloRead::Done;
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break HelloRead::Wait,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => break HelloRead::Drop(e.to_string()),
                }
            };
            match outcome {
                HelloRead::Wait if p.since.elapsed() <= HELLO_WAIT.min(self.timeout) => i += 1,
                HelloRead::Wait => {
                    let p = self.pending.swap_remove(i);
                    self.rejections.warn(|| {
                        format!(
                            "NET/Socket: listener {}: dropping {}: no hello within {:?}",
                            self.addr,
                            p.peer,
                            HELLO_WAIT.min(self.timeout)
                        )
                    });
                }
                HelloRead::Drop(why) => {
                    let p = self.pending.swap_remove(i);
                    self.rejections.warn(|| {
                        format!(
                            "NET/Socket: listener {}: dropping {}: {why}",
                            self.addr, p.peer
                        )
                    });
                }
                HelloRead::Done => {
                    let p = self.pending.swap_remove(i);
                    self.adopt(p);
                }
            }
        }
    }

    /// Files a socket whose hello arrived into its connection's group.
    fn adopt(&mut self, p: Pending) {
        let hello = match wire::decode_hello(&p.buf) {
            Ok(h) if h.tag == self.tag => h,
            Ok(_) => {
                self.rejections.warn(|| {
                    format!(
                        "NET/Socket: listener {}: dropping {}: its handle names another listener",
                        self.addr, p.peer
                    )
                });
                return;
            }
            Err(why) => {
                self.rejections.warn(|| {
                    format!(
                        "NET/Socket: listener {}: dropping {}: {why}",
                        self.addr, p.peer
                    )
                });
                return;
            }
        };
        let group = self.groups.entry(hello.conn).or_insert_with(|| Group {
            ctrl: None,
            peer: p.peer,
            data: (0..hello.nthreads * hello.nsocks).map(|_| None).collect(),
            nthreads: hello.nthreads,
            nsocks: hello.nsocks,
            since: p.since,
        });
        if (group.nthreads, group.nsocks) != (hello.nthreads, hello.nsocks) {
            self.rejections.warn(|| format!("NET/Socket: listener {}: dropping {}: its connection said {}x{} sockets, this \
                 socket says {}x{}",
                self.addr,
                p.peer,
                group.nthreads,
                group.nsocks,
                hello.nthreads,
                hello.nsocks
            ));
            return;
        }
        let slot = match hello.data_index {
            None => &mut group.ctrl,
            Some(i) => &mut group.data[i],
        };
        if slot.is_some() {
            self.rejections.warn(|| {
                format!(
                    "NET/Socket: listener {}: dropping {}: a second socket in the same role",
                    self.addr, p.peer
                )
            });
            return;
        }
        *slot = Some(p.sock);
        if hello.data_index.is_none() {
            group.peer = p.peer;
        }
    }
}

impl Listener for SocketListener {
    fn accept(&mut self) -> Result<Option<Box<dyn RecvComm>>> {
        self.take_new()?;
        self.read_hellos();
        let done = self
            .groups
            .iter()
            .find(|(_, g)| g.complete())
            .map(|(id, _)| *id);
        if let Some(id) = done {
            let Some(g) = self.groups.remove(&id) else {
                return Ok(None);
            };
            let Some(ctrl) = g.ctrl else {
                return Ok(None);
            };
            let conn = Conn {
                ctrl,
                data: g.data.into_iter().flatten().collect(),
                nthreads: g.nthreads,
                peer: g.peer,
                dev: self.dev.clone(),
                peer_timeout: self.peer_timeout,
                send_timeout: self.send_timeout,
                // A receiving end: each header says how its payload travels.
                inline_below: wire::DEFAULT_INLINE_BELOW,
            };
            log::info!(
                "NET/Socket: accepted a connection from {} on {} ({} threads x {} sockets)",
                g.peer,
                self.addr,
                g.nthreads,
                g.nsocks
            );
            let comm = Comm::start(conn, false)?;
            return Ok(Some(Box::new(SocketRecvComm(comm))));
        }
        let stale = self
            .groups
            .iter()
            .find(|(_, g)| g.since.elapsed() > self.timeout)
            .map(|(id, _)| *id);
        if let Some(id) = stale {
            if let Some(g) = self.groups.remove(&id) {
                return Err(Error::remote(format!(
                    "NET/Socket: the connection from {} to {} (device {}) stayed incomplete for \
                     {:?}: {} of its {} sockets arrived",
                    g.peer,
                    self.addr,
                    self.dev,
                    self.timeout,
                    g.arrived(),
                    g.data.len() + 1
                )));
            }
        }
        Ok(None)
    }
}

enum Stage {
    /// (Re)connect at this time.
    Start(Instant),
    Connecting,
    Hello,
    Done,
}

/// One socket of a connection being opened.
struct Attempt {
    sock: Option<Socket>,
    stage: Stage,
    hello: [u8; HELLO_BYTES],
    sent: usize,
    failures: u32,
}

/// A connection being opened; see the module's description.
pub struct SocketConnecting {
    target: SocketAddr,
    dev: String,
    nthreads: usize,
    attempts: Vec<Attempt>,
    deadline: Instant,
    timeout: Duration,
    retry: Retry,
    /// Handed to the connection once open (`Conn::peer_timeout`, `Conn::send_timeout`).
    peer_timeout: Option<Duration>,
    send_timeout: Option<Duration>,
    /// `Conn::inline_below`.
    inline_below: usize,
}

fn retryable(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::TimedOut
            | io::ErrorKind::AddrInUse
    )
}

impl SocketConnecting {
    pub(super) fn new(
        target: SocketAddr,
        tag: u128,
        dev: String,
        nthreads: usize,
        nsocks: usize,
        timeout: Duration,
        retry: Retry,
    ) -> Result<Self> {
        let conn = next_conn_id();
        let now = Instant::now();
        let attempts = std::iter::once(None)
            .chain((0..nthreads * nsocks).map(Some))
            .map(|data_index| Attempt {
                sock: None,
                stage: Stage::Start(now),
                hello: wire::encode_hello(&Hello {
                    tag,
                    conn,
                    data_index,
                    nthreads,
                    nsocks,
                }),
                sent: 0,
                failures: 0,
            })
            .collect();
        let mut c = SocketConnecting {
            target,
            dev,
            nthreads,
            attempts,
            deadline: crate::sockets::deadline_after(timeout),
            timeout,
            retry,
            peer_timeout: None,
            send_timeout: None,
            inline_below: wire::DEFAULT_INLINE_BELOW,
        };
        for i in 0..c.attempts.len() {
            c.advance(i)?;
        }
        Ok(c)
    }

    /// The connection fails when its peer's host is silent for `peer` (see
    /// `comm::keepalive`), or leaves data it sends unacknowledged for `send` (see
    /// `comm::unacked_for`); None (the default) leaves the kernel's defaults.
    pub(super) fn with_timeouts(mut self, peer: Option<Duration>, send: Option<Duration>) -> Self {
        self.peer_timeout = peer;
        self.send_timeout = send;
        self
    }

    /// The connection writes messages shorter than `below` inline on its control socket
    /// ([`wire::sends_inline`]; [`wire::DEFAULT_INLINE_BELOW`] unless set).
    pub(super) fn with_inline_below(mut self, below: usize) -> Self {
        self.inline_below = below;
        self
    }

    fn role(i: usize) -> String {
        match i {
            0 => "the control socket".into(),
            i => format!("data socket {}", i - 1),
        }
    }

    /// Socket `i` failed with `e`: schedule a retry, or give up.
    fn failed(&mut self, i: usize, e: io::Error) -> Result<()> {
        let a = &mut self.attempts[i];
        a.sock = None;
        a.sent = 0;
        a.failures += 1;
        let connecting = !matches!(a.stage, Stage::Hello);
        if connecting && retryable(&e) && a.failures <= self.retry.count {
            a.stage = Stage::Start(Instant::now() + self.retry.pause(a.failures));
            return Ok(());
        }
        Err(Error::remote(format!(
            "NET/Socket: connecting {} to {} (device {}) failed after {} attempt(s): {e}",
            Self::role(i),
            self.target,
            self.dev,
            a.failures
        )))
    }

    /// Moves socket `i` as far as it goes without blocking.
    fn advance(&mut self, i: usize) -> Result<()> {
        loop {
            let a = &mut self.attempts[i];
            match a.stage {
                Stage::Done => return Ok(()),
                Stage::Start(at) => {
                    if Instant::now() < at {
                        return Ok(());
                    }
                    let s = Socket::new(
                        Domain::for_address(self.target),
                        Type::STREAM,
                        Some(Protocol::TCP),
                    )
                    .and_then(|s| s.set_nonblocking(true).map(|()| s))
                    .map_err(|e| Error::system(format!("NET/Socket: creating a socket: {e}")))?;
                    let _ = s.set_nodelay(true);
                    let r = s.connect(&self.target.into());
                    a.sock = Some(s);
                    match r {
                        Ok(()) => a.stage = Stage::Hello,
                        Err(e)
                            if e.raw_os_error() == Some(libc::EINPROGRESS)
                                || e.kind() == io::ErrorKind::WouldBlock =>
                        {
                            a.stage = Stage::Connecting
                        }
                        Err(e) => self.failed(i, e)?,
                    }
                }
                Stage::Connecting => {
                    let Some(s) = &a.sock else {
                        a.stage = Stage::Start(Instant::now());
                        continue;
                    };
                    match s.take_error() {
                        Ok(Some(e)) | Err(e) => self.failed(i, e)?,
                        Ok(None) => match s.peer_addr() {
                            Ok(_) => a.stage = Stage::Hello,
                            Err(e) if e.raw_os_error() == Some(libc::ENOTCONN) => return Ok(()),
                            Err(e) => self.failed(i, e)?,
                        },
                    }
                }
                Stage::Hello => {
                    let Some(s) = &a.sock else {
                        a.stage = Stage::Start(Instant::now());
                        continue;
                    };
                    match s.send_with_flags(
                        &a.hello[a.sent..],
                        libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT,
                    ) {
                        Ok(n) => {
                            a.sent += n;
                            if a.sent == HELLO_BYTES {
                                a.stage = Stage::Done;
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                        Err(e) => self.failed(i, e)?,
                    }
                }
            }
        }
    }
}

impl Connecting for SocketConnecting {
    fn poll(&mut self) -> Result<Option<Box<dyn SendComm>>> {
        for i in 0..self.attempts.len() {
            self.advance(i)?;
        }
        if self.attempts.iter().all(|a| matches!(a.stage, Stage::Done)) {
            let mut socks = self.attempts.iter_mut().filter_map(|a| a.sock.take());
            let Some(ctrl) = socks.next() else {
                return Err(Error::internal("NET/Socket: connection without sockets"));
            };
            let conn = Conn {
                ctrl,
                data: socks.collect(),
                nthreads: self.nthreads,
                peer: self.target,
                dev: self.dev.clone(),
                peer_timeout: self.peer_timeout,
                send_timeout: self.send_timeout,
                inline_below: self.inline_below,
            };
            if conn.data.len() + 1 != self.attempts.len() {
                return Err(Error::internal(
                    "NET/Socket: a connected socket went missing",
                ));
            }
            let comm = Comm::start(conn, true)?;
            return Ok(Some(Box::new(SocketSendComm(comm))));
        }
        if Instant::now() >= self.deadline {
            let done = self
                .attempts
                .iter()
                .filter(|a| matches!(a.stage, Stage::Done))
                .count();
            return Err(Error::remote(format!(
                "NET/Socket: connecting to {} (device {}) timed out after {:?}: {} of {} sockets \
                 connected",
                self.target,
                self.dev,
                self.timeout,
                done,
                self.attempts.len()
            )));
        }
        Ok(None)
    }
}
