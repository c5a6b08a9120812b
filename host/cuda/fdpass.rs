//! Moving a file descriptor from the process that holds it to a peer process of the node: how
//! a registered buffer of CUDA's virtual memory API (whose shareable handle is a POSIX file
//! descriptor, and which has no `cuIpcGetMemHandle` handle) reaches the peers that map it. The
//! simulator's VMM allocations are memfd regions passed the same way.
//!
//! The owner puts a descriptor on [`offer`]: it goes into a process-wide table under a key
//! (random, unlike any on offer) until the [`Offer`] drops. An offer made while
//! nothing else is on offer starts a listener on an abstract Unix socket named from the owner's
//! pid, pid namespace, start time and a random number (drawn again past names in use) and a
//! thread that answers requests on it: a peer connects, sends the key, and receives the
//! descriptor as `SCM_RIGHTS` ancillary data (or a refusal when the key is not offered now).
//! The withdrawal of the last offer stops that thread (woken by an eventfd, joined) and closes
//! the listener, so a process keeps no thread nor socket once its registrations are gone (and
//! its communicators whose connection blocks peer processes map: those stay on offer while
//! the communicator lives, offered anew by `ncclCommResume`). The
//! [`Ticket`] a peer needs (pid, namespace, start time, socket name's number, key, and the
//! descriptor's number in the owner) travels in the registration record over the bootstrap.
//!
//! A peer that asks for a descriptor of an owner that has exited is answered at once: when the
//! owner is of its pid namespace and no process has its pid, or the one that has it started at
//! another time (the pid was reused), [`take`] fails without asking the socket or the pid. The
//! connect to the owner's socket (which waits while a listener's backlog is full) and each
//! request are bounded by a few seconds; a socket nobody listens on refuses at once. (A child
//! the owner forks without exec keeps the listener's socket open, as every close-on-exec
//! descriptor: a request that reaches it after the owner's listener stopped waits out that
//! bound and fails, which only declines the buffer.)
//!
//! Why a socket first: `pidfd_getfd` needs ptrace permission over the owner, which Yama's
//! `ptrace_scope=1` (the default of many distributions) refuses between sibling processes such
//! as the ranks a launcher starts; `SCM_RIGHTS` needs only that both can reach the socket. The
//! listener answers only processes of its own user (`SO_PEERCRED`), and only keys on offer, so
//! a descriptor is never sent after its registration was withdrawn (a number the owner reused
//! for another file cannot be asked for by mistake). Abstract sockets belong to a network
//! namespace: ranks in different network namespaces of one host cannot meet there, and then
//! [`take`] falls back to `pidfd_getfd` (which works where ptrace is allowed: same pid
//! namespace, permissive Yama, or a privileged rank). That fallback names the descriptor by
//! number, so a withdrawal that crosses the request could hand over a reused number's file:
//! the peer's import checks the size it maps against what the record claims, and the socket
//! path (the usual one) has no such window.

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

/// How long a request may take at either end before it is given up: the connect (a listener
/// whose backlog is full), the key, the answer. The listener answers at once; this only bounds
/// a peer or an owner that stopped.
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// The owner's listener answered that the key is not on offer (or that we are another user).
const REFUSED: &str = "the owner refused (not on offer, or another user)";

/// No listener could be started: only the `pidfd_getfd` fallback remains.
const NO_SOCKET: u32 = u32::MAX;

/// The bytes of an encoded [`Ticket`].
pub const TICKET_BYTES: usize = 40;

/// What a peer needs to take an offered descriptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    /// The owner's pid and pid namespace (the inode of its `/proc/self/ns/pid`).
    pub pid: u32,
    pub pid_ns: u64,
    /// When the owner started (clock ticks after boot, `/proc/<pid>/stat`'s 22nd field; 0
    /// where /proc does not say): with the pid, names the owner process, never a later one
    /// that was given its pid.
    pub start: u64,
    /// The random number in the owner's socket name (`NO_SOCKET` when it has none).
    pub sock: u32,
    /// The offer's key in the owner's table: random, so that another process of the user
    /// cannot guess it and take the descriptor.
    pub key: u64,
    /// The descriptor's number in the owner (the `pidfd_getfd` fallback's).
    pub fd: i32,
}

impl Ticket {
    pub fn encode(&self) -> [u8; TICKET_BYTES] {
        let mut b = [0u8; TICKET_BYTES];
        b[0..4].copy_from_slice(&self.pid.to_le_bytes());
        b[4..8].copy_from_slice(&self.fd.to_le_bytes());
        b[8..16].copy_from_slice(&self.pid_ns.to_le_bytes());
        b[16..24].copy_from_slice(&self.key.to_le_bytes());
        b[24..28].copy_from_slice(&self.sock.to_le_bytes());
        b[32..40].copy_from_slice(&self.start.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; TICKET_BYTES]) -> Ticket {
        let w4 = |a: usize| u32::from_le_bytes([b[a], b[a + 1], b[a + 2], b[a + 3]]);
        let w8 = |a: usize| u64::from_le_bytes(b[a..a + 8].try_into().unwrap_or_default());
        Ticket {
            pid: w4(0),
            fd: w4(4) as i32,
            pid_ns: w8(8),
            key: w8(16),
            sock: w4(24),
            start: w8(32),
        }
    }
}

/// A failure that only declines a peer's VMM buffer (its caller says why at INFO): neither
/// logged at WARN nor kept as the last error.
fn quiet(what: String) -> Error {
    Error::quiet(crate::error::NcclResult::SystemError, what)
}

/// The inode of this process's pid namespace (0 where /proc does not say).
pub fn pid_namespace() -> u64 {
    use std::os::unix::fs::MetadataExt;
    static NS: OnceLock<u64> = OnceLock::new();
    *NS.get_or_init(|| {
        std::fs::metadata("/proc/self/ns/pid")
            .map(|m| m.ino())
            .unwrap_or(0)
    })
}

/// When process `pid` (of our pid namespace) started, in clock ticks after boot; None when
/// there is no such process.
fn start_time(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) is in parentheses and may hold anything: count from the
    // last ')'. Field 22 is the 20th after it.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// This process's [`start_time`] (0 where /proc does not say).
fn own_start() -> u64 {
    static START: OnceLock<u64> = OnceLock::new();
    *START.get_or_init(|| start_time("self").unwrap_or(0))
}

/// Whether the owner `t` names is known to have exited: its pid is in our namespace and no
/// process has it, or the one that has it started at another time than the owner did.
fn owner_gone(t: &Ticket) -> bool {
    if t.pid_ns != pid_namespace() || t.pid_ns == 0 {
        return false;
    }
    match start_time(&t.pid.to_string()) {
        None => std::path::Path::new("/proc/self/stat").exists(),
        Some(s) => t.start != 0 && s != t.start,
    }
}

/// The descriptors on offer, by key, and the listener that answers for them while any is.
struct State {
    offers: HashMap<u64, OwnedFd>,
    server: Option<Server>,
    /// A listener could not be started (said once at INFO).
    no_socket_said: bool,
}

fn state() -> MutexGuard<'static, State> {
    static T: OnceLock<Mutex<State>> = OnceLock::new();
    T.get_or_init(|| {
        Mutex::new(State {
            offers: HashMap::new(),
            server: None,
            no_socket_said: false,
        })
    })
    .lock()
    .unwrap_or_else(|p| p.into_inner())
}

fn socket_name(pid: u32, pid_ns: u64, start: u64, nonce: u32) -> String {
    format!("ncclrs-fd-{pid}@{pid_ns}.{start}-{nonce}")
}

/// The listener of this process and its thread: started with the first offer, stopped when
/// the last offer is withdrawn (so a process keeps no thread nor socket for registrations it
/// no longer has).
struct Server {
    /// The random number in its name.
    nonce: u32,
    /// Written to stop the thread (an eventfd).
    stop: OwnedFd,
    thread: std::thread::JoinHandle<()>,
}

impl Server {
    fn start() -> Result<Server> {
        let (pid, ns) = (std::process::id(), pid_namespace());
        let mut last = None;
        // The name ends in a random number: another user cannot bind every name we might
        // take first. One still bound (a process that had our pid in another life, our
        // previous listener still stopping, or such a squatter): draw again.
        for _ in 0..64 {
            let nonce = crate::sockets::random_nonce() as u32;
            if nonce == NO_SOCKET {
                continue;
            }
            let name = socket_name(pid, ns, own_start(), nonce);
            let addr = SocketAddr::from_abstract_name(name.as_bytes())
                .map_err(|e| quiet(format!("abstract socket name: {e}")))?;
            match UnixListener::bind_addr(&addr) {
                Ok(l) => {
                    l.set_nonblocking(true)
                        .map_err(|e| quiet(format!("descriptor socket: {e}")))?;
                    // SAFETY: a plain system call; the descriptor is owned at once if valid.
                    let raw = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
                    if raw < 0 {
                        return Err(quiet(format!(
                            "eventfd: {}",
                            std::io::Error::last_os_error()
                        )));
                    }
                    // SAFETY: a fresh descriptor of ours.
                    let stop = unsafe { OwnedFd::from_raw_fd(raw) };
                    let wake = stop
                        .try_clone()
                        .map_err(|e| quiet(format!("dup of an eventfd: {e}")))?;
                    let thread = std::thread::Builder::new()
                        .name("nccl-fdpass".into())
                        .spawn(move || serve(l, wake))
                        .map_err(|e| quiet(format!("starting the descriptor thread: {e}")))?;
                    return Ok(Server {
                        nonce,
                        stop,
                        thread,
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => last = Some(e),
                Err(e) => return Err(quiet(format!("binding the descriptor socket: {e}"))),
            }
        }
        Err(quiet(format!(
            "binding the descriptor socket: every name taken ({last:?})"
        )))
    }

    /// Stops the thread and waits for it (it ends within one request's [`IO_TIMEOUT`]); the
    /// listener closes with it. Called without the state's lock, which the thread takes.
    fn stop(self) {
        let one = 1u64.to_ne_bytes();
        // SAFETY: writes 8 bytes from a live buffer to our eventfd.
        let _ = unsafe { libc::write(self.stop.as_raw_fd(), one.as_ptr().cast(), 8) };
        if self.thread.join().is_err() {
            log::debug!("the descriptor thread panicked");
        }
    }
}

/// Threads this process runs to answer descriptor requests now (0 or 1; tests check that
/// none outlives the offers).
pub fn listener_threads() -> usize {
    usize::from(state().server.is_some())
}

/// The listener's thread: answers one request per connection until told to stop.
fn serve(l: UnixListener, stop: OwnedFd) {
    loop {
        let mut fds = [
            libc::pollfd {
                fd: l.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two pollfd structures of ours, as many as passed.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            log::debug!(
                "descriptor socket poll: {}",
                std::io::Error::last_os_error()
            );
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        match l.accept() {
            Ok((mut s, _)) => {
                if let Err(e) = answer(&mut s) {
                    log::debug!("descriptor request: {e}");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => log::debug!("descriptor socket accept: {e}"),
        }
    }
}

/// The uid of the process at the other end of `s`.
fn peer_uid(s: &UnixStream) -> Option<u32> {
    peer_cred(s).map(|(_, uid)| uid)
}

/// The (pid, uid) of the process at the other end of `s`: for a connection to a listener, the
/// process that made the listener (its pid as seen from our pid namespace, 0 if not seen).
fn peer_cred(s: &UnixStream) -> Option<(u32, u32)> {
    // SAFETY: a plain C structure for which zeroes are valid, filled by getsockopt.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: out-parameters of the size given.
    let r = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            &mut cred as *mut libc::ucred as *mut libc::c_void,
            &mut len,
        )
    };
    (r == 0).then_some((cred.pid as u32, cred.uid))
}

fn answer(s: &mut UnixStream) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(IO_TIMEOUT))?;
    s.set_write_timeout(Some(IO_TIMEOUT))?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if peer_uid(s) != Some(me) {
        return s.write_all(&[0]);
    }
    let mut key = [0u8; 8];
    s.read_exact(&mut key)?;
    // Held while sending: the descriptor cannot be closed under the send.
    let st = state();
    match st.offers.get(&u64::from_le_bytes(key)) {
        Some(fd) => send_fd(s, fd.as_raw_fd()),
        None => s.write_all(&[0]),
    }
}

/// Sends one byte (1) with `fd` attached.
fn send_fd(s: &UnixStream, fd: RawFd) -> std::io::Result<()> {
    let mut byte = [1u8];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr() as *mut libc::c_void,
        iov_len: 1,
    };
    // Room for one descriptor's control message, aligned for cmsghdr.
    let mut ctrl = [0u64; 8];
    // SAFETY: CMSG_SPACE only computes a size.
    let space = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    debug_assert!(space <= std::mem::size_of_val(&ctrl));
    // SAFETY: a plain C structure for which zeroes are valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctrl.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = space as _;
    // SAFETY: msg points at a control buffer of `space` bytes (checked above), so the first
    // header and its data lie inside it; sendmsg reads iov and ctrl, which outlive the call.
    let r = unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as _;
        std::ptr::write_unaligned(libc::CMSG_DATA(c) as *mut RawFd, fd);
        libc::sendmsg(s.as_raw_fd(), &msg, libc::MSG_NOSIGNAL)
    };
    if r == 1 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Receives the answer to a request: the descriptor, or why not.
fn recv_fd(s: &UnixStream) -> std::result::Result<OwnedFd, String> {
    let mut byte = [0u8];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr() as *mut libc::c_void,
        iov_len: 1,
    };
    let mut ctrl = [0u64; 8];
    // SAFETY: a plain C structure for which zeroes are valid.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctrl.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = std::mem::size_of_val(&ctrl) as _;
    // SAFETY: iov and ctrl outlive the call and are as long as msg says.
    let n = unsafe { libc::recvmsg(s.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(format!("recvmsg: {}", std::io::Error::last_os_error()));
    }
    let mut got: Option<OwnedFd> = None;
    // SAFETY: the kernel filled msg_controllen bytes of ctrl; CMSG_FIRSTHDR/NXTHDR stay inside
    // them, and each SCM_RIGHTS message's data holds descriptors now ours (each one owned once).
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const RawFd;
                let len = (*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize;
                for i in 0..len / std::mem::size_of::<RawFd>() {
                    let fd = OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i)));
                    // Any beyond the first are closed as they drop.
                    got.get_or_insert(fd);
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    if msg.msg_flags & libc::MSG_CTRUNC != 0 {
        return Err("the descriptor's control message was truncated".into());
    }
    match (n, byte[0], got) {
        (1, 1, Some(fd)) => Ok(fd),
        (0, _, _) => Err("the owner closed the connection".into()),
        (_, 0, _) => Err(REFUSED.into()),
        _ => Err("an answer without a descriptor".into()),
    }
}

/// A descriptor on offer; withdrawn (and closed) when dropped.
#[derive(Debug)]
pub struct Offer {
    ticket: Ticket,
}

/// Puts `fd` on offer to peer processes (starting the listener if none runs).
pub fn offer(fd: OwnedFd) -> Offer {
    let mut st = state();
    let key = loop {
        let k = crate::sockets::random_nonce();
        if !st.offers.contains_key(&k) {
            break k;
        }
    };
    if st.server.is_none() {
        match Server::start() {
            Ok(s) => st.server = Some(s),
            Err(e) if !st.no_socket_said => {
                st.no_socket_said = true;
                log::info!(
                    "no descriptor socket for registered VMM buffers ({e}): peers take them \
                     with pidfd_getfd where they may"
                );
            }
            Err(_) => {}
        }
    }
    let ticket = Ticket {
        pid: std::process::id(),
        pid_ns: pid_namespace(),
        start: own_start(),
        sock: st.server.as_ref().map_or(NO_SOCKET, |s| s.nonce),
        key,
        fd: fd.as_raw_fd(),
    };
    st.offers.insert(key, fd);
    Offer { ticket }
}

impl Offer {
    pub fn ticket(&self) -> Ticket {
        self.ticket
    }
}

impl Drop for Offer {
    fn drop(&mut self) {
        let stopping = {
            let mut st = state();
            st.offers.remove(&self.ticket.key);
            if st.offers.is_empty() {
                st.server.take()
            } else {
                None
            }
        };
        // The last offer gone: the listener with it (outside the lock its thread takes).
        if let Some(s) = stopping {
            s.stop();
        }
    }
}

/// Test hook: how requests are answered (a peer takes descriptors by `pidfd_getfd` only when
/// false).
static SOCKET_PATH: AtomicBool = AtomicBool::new(true);

/// Takes the descriptor `t` describes into this process: from our own table when we are the
/// owner, else over the owner's socket, else with `pidfd_getfd`.
pub fn take(t: &Ticket) -> Result<OwnedFd> {
    if t.pid == std::process::id() && t.pid_ns == pid_namespace() {
        let st = state();
        let fd = st
            .offers
            .get(&t.key)
            .ok_or_else(|| quiet("the descriptor is no longer on offer".into()))?;
        return fd.try_clone().map_err(|e| quiet(format!("dup: {e}")));
    }
    // An owner that exited took its descriptors with it: said at once, without asking its
    // socket (nothing listens) or its pid (which another process may have now).
    if owner_gone(t) {
        return Err(quiet(format!(
            "the owner of descriptor {} (process {}) has exited",
            t.fd, t.pid
        )));
    }
    let socket = if !SOCKET_PATH.load(Ordering::Relaxed) {
        Err("switched off".to_string())
    } else if t.sock == NO_SOCKET {
        Err("the owner has no descriptor socket".to_string())
    } else {
        via_socket(t)
    };
    let socket_err = match socket {
        Ok(fd) => return Ok(fd),
        // The owner said no: its descriptor's number may belong to another file by now, so
        // pidfd_getfd is not asked for it.
        Err(e) if e == REFUSED => {
            return Err(quiet(format!(
                "taking descriptor {} of process {}: {e}",
                t.fd, t.pid
            )))
        }
        Err(e) => e,
    };
    via_pidfd(t).map_err(|e| {
        quiet(format!(
            "taking descriptor {} of process {}: over its socket: {socket_err}; with \
             pidfd_getfd: {e}",
            t.fd, t.pid
        ))
    })
}

/// Takes the descriptor `t` describes from our own table (we are the owner) or over the
/// owner's socket, and never with `pidfd_getfd`: the ticket's pid and descriptor number are not
/// used to reach into any process. For a descriptor a peer names and that must come from
/// its offer or not at all (NVLS's multicast object, `driver::multicast_import`).
pub fn take_offered(t: &Ticket) -> Result<OwnedFd> {
    if t.pid == std::process::id() && t.pid_ns == pid_namespace() {
        let st = state();
        let fd = st
            .offers
            .get(&t.key)
            .ok_or_else(|| Error::system("the descriptor is no longer on offer"))?;
        return fd
            .try_clone()
            .map_err(|e| Error::system(format!("dup: {e}")));
    }
    if t.sock == NO_SOCKET {
        return Err(Error::system(format!(
            "process {} has no descriptor socket to take its offer from",
            t.pid
        )));
    }
    via_socket(t).map_err(|e| {
        Error::system(format!(
            "taking offer {} of process {} over its descriptor socket: {e}",
            t.key, t.pid
        ))
    })
}

fn via_socket(t: &Ticket) -> std::result::Result<OwnedFd, String> {
    let name = socket_name(t.pid, t.pid_ns, t.start, t.sock);
    let mut s = connect_abstract(&name, IO_TIMEOUT)?;
    // Anyone in the network namespace may bind the name first. The listener must be our
    // user's, and the ticket's process itself where our pid namespaces are the same (across
    // pid namespaces the kernel shows no pid to compare).
    let (pid, uid) = peer_cred(&s).ok_or("no credentials of the socket's owner")?;
    // SAFETY: geteuid cannot fail.
    let me = unsafe { libc::geteuid() };
    if uid != me {
        return Err(format!("the socket belongs to uid {uid}, not ours ({me})"));
    }
    if t.pid_ns == pid_namespace() && pid != t.pid {
        return Err(format!(
            "the socket is held by process {pid}, not by the owner {}",
            t.pid
        ));
    }
    s.set_read_timeout(Some(IO_TIMEOUT))
        .and_then(|_| s.set_write_timeout(Some(IO_TIMEOUT)))
        .and_then(|_| s.write_all(&t.key.to_le_bytes()))
        .map_err(|e| format!("request: {e}"))?;
    recv_fd(&s)
}

/// Connects to the abstract Unix socket `name`, waiting at most `timeout` (a listener whose
/// backlog is full makes a connect wait; one that is gone refuses at once).
fn connect_abstract(name: &str, timeout: Duration) -> std::result::Result<UnixStream, String> {
    use socket2::{Domain, SockAddr, Socket, Type};
    use std::os::unix::ffi::OsStrExt;
    let mut path = vec![0u8];
    path.extend_from_slice(name.as_bytes());
    let addr = SockAddr::unix(std::ffi::OsStr::from_bytes(&path)).map_err(|e| e.to_string())?;
    let s = Socket::new(Domain::UNIX, Type::STREAM, None).map_err(|e| format!("socket: {e}"))?;
    // A Unix socket's connect waits at most its send timeout.
    s.set_write_timeout(Some(timeout))
        .map_err(|e| format!("SO_SNDTIMEO: {e}"))?;
    s.connect(&addr).map_err(|e| format!("connect: {e}"))?;
    Ok(UnixStream::from(OwnedFd::from(s)))
}

fn via_pidfd(t: &Ticket) -> std::result::Result<OwnedFd, String> {
    if t.pid_ns != pid_namespace() {
        return Err("the owner is in another pid namespace".into());
    }
    // SAFETY: plain system calls; the pidfd is closed here and the descriptor returned owned.
    unsafe {
        let pidfd = libc::syscall(libc::SYS_pidfd_open, t.pid as libc::pid_t, 0) as i32;
        if pidfd < 0 {
            return Err(format!("pidfd_open: {}", std::io::Error::last_os_error()));
        }
        // The pid may have passed to another process before the pidfd was opened: the one
        // that has it after (the pidfd's, or a later one) must have started when the owner did.
        if owner_gone(t) {
            libc::close(pidfd);
            return Err(format!("process {} is no longer the owner", t.pid));
        }
        let fd = libc::syscall(libc::SYS_pidfd_getfd, pidfd, t.fd, 0) as i32;
        let err = std::io::Error::last_os_error();
        libc::close(pidfd);
        if fd < 0 {
            return Err(format!("pidfd_getfd: {err}"));
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

/// Test hook (internals): false makes [`take`] skip the socket and use `pidfd_getfd` alone.
pub fn set_socket_path(on: bool) {
    SOCKET_PATH.store(on, Ordering::Relaxed);
}

/// The size of the file behind `fd` (a memfd's length; CUDA's descriptors report 0).
pub fn file_size(fd: BorrowedFd<'_>) -> Result<u64> {
    // SAFETY: a plain C structure for which zeroes are valid, filled by fstat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a live descriptor and an out-parameter.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(quiet(format!("fstat: {}", std::io::Error::last_os_error())));
    }
    Ok(st.st_size as u64)
}

/// Every unit test that offers a descriptor (here and elsewhere in the crate) runs one at a
/// time: one of them counts the listener and asserts that none runs at its start.
#[cfg(test)]
pub(crate) fn one_offering_test_at_a_time() -> MutexGuard<'static, ()> {
    static L: Mutex<()> = Mutex::new(());
    L.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests;
