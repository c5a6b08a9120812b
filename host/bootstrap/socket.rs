//! Sockets for the bootstrap: which local address to use, connects that retry until a deadline,
//! and frame I/O in which every read and write is bounded by a deadline. What the socket
//! network uses too (interfaces, listeners, retries, keepalive) is in `crate::sockets`.

use std::io::{self, Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use crate::error::{Error, Result};
use crate::sockets::{describe_interfaces, ifname_matches, interfaces, keepalive, Retry};

use super::wire;

/// Whole milliseconds of `d`, saturating.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Which address family `NCCL_SOCKET_FAMILY` asks for: Some(true) IPv4 only, Some(false)
/// IPv6 only, None either (IPv4 first).
pub(crate) fn family_wanted() -> Option<bool> {
    match crate::env::SOCKET_FAMILY.raw()?.trim() {
        "AF_INET" | "af_inet" | "4" | "inet" => Some(true),
        "AF_INET6" | "af_inet6" | "6" | "inet6" => Some(false),
        other => {
            log::warn!("NCCL_SOCKET_FAMILY={other} is neither AF_INET nor AF_INET6; ignored");
            None
        }
    }
}

/// The address this host offers to the other ranks: the first interface that is up and passes
/// `NCCL_SOCKET_IFNAME` (default: not loopback, not docker*, not virbr*) and
/// `NCCL_SOCKET_FAMILY`, IPv4 before IPv6 (link-local IPv6 is skipped: it needs a scope to be
/// reachable); else the loopback address of the family.
///
/// An `NCCL_SOCKET_IFNAME` that matches no usable interface fails with `ncclInvalidUsage`,
/// naming the value and the interfaces that exist (falling back to loopback would hand the
/// other hosts a root they cannot reach, and their error would name neither).
pub(crate) fn choose_address() -> Result<IpAddr> {
    let spec = crate::env::SOCKET_IFNAME
        .raw()
        .filter(|s| !s.trim().is_empty());
    let family = family_wanted();
    let all = interfaces();
    let usable = |want_v4: bool| {
        all.iter().find(|i| {
            let family_ok = match i.ip {
                IpAddr::V4(_) => want_v4,
                IpAddr::V6(v6) => !want_v4 && (v6.segments()[0] & 0xffc0) != 0xfe80,
            };
            let name_ok = match &spec {
                Some(s) => ifname_matches(s, &i.name),
                None => !i.loopback && ifname_matches("^docker,virbr", &i.name),
            };
            i.up && family_ok && name_ok
        })
    };
    let found = match family {
        Some(v4) => usable(v4),
        None => usable(true).or_else(|| usable(false)),
    };
    match (found, &spec) {
        (Some(i), _) => {
            log::info!("bootstrap: using interface {} address {}", i.name, i.ip);
            Ok(i.ip)
        }
        (None, Some(s)) => {
            let up: Vec<(String, IpAddr)> = all
                .iter()
                .filter(|i| i.up)
                .map(|i| (i.name.clone(), i.ip))
                .collect();
            Err(Error::invalid_usage(format!(
                "bootstrap: NCCL_SOCKET_IFNAME={s} matches no interface that is up with a usable \
                 address{}; interfaces: {}",
                match family {
                    Some(true) => " of NCCL_SOCKET_FAMILY=AF_INET",
                    Some(false) => " of NCCL_SOCKET_FAMILY=AF_INET6",
                    None => "",
                },
                describe_interfaces(&up)
            )))
        }
        (None, None) => Ok(loopback_address()),
    }
}

/// The loopback address of the family `NCCL_SOCKET_FAMILY` asks for (IPv4 unless it asks for
/// IPv6): where a bootstrap among ranks of one process listens.
pub(crate) fn loopback_address() -> IpAddr {
    if family_wanted() == Some(false) {
        IpAddr::V6(Ipv6Addr::LOCALHOST)
    } else {
        IpAddr::V4(Ipv4Addr::LOCALHOST)
    }
}

/// The local address the kernel would use to reach `target` (a UDP connect sends nothing), so
/// that a rank listens on the interface that faces the root. Falls back to `choose_address`.
pub(crate) fn local_ip_toward(target: IpAddr) -> IpAddr {
    if target.is_loopback() {
        return target;
    }
    let any: IpAddr = match target {
        IpAddr::V4(_) => Ipv4Addr::UNSPECIFIED.into(),
        IpAddr::V6(_) => Ipv6Addr::UNSPECIFIED.into(),
    };
    let probe = UdpSocket::bind((any, 0))
        .and_then(|u| u.connect((target, 9)).map(|()| u))
        .and_then(|u| u.local_addr());
    match probe {
        Ok(a) if !a.ip().is_unspecified() => a.ip(),
        // A setting that matches nothing failed the id's making already.
        _ => choose_address().unwrap_or_else(|_| loopback_address()),
    }
}

/// Connects to `addr`, retrying (the listener may not be up yet, or its backlog full) until
/// `deadline`, until the retries of `NCCL_SOCKET_RETRY_CNT` are spent, or until `give_up()`
/// says so; the stream comes back with TCP_NODELAY set.
pub(crate) fn connect(
    addr: SocketAddr,
    deadline: Instant,
    give_up: impl Fn() -> bool,
) -> io::Result<TcpStream> {
    connect_inner(addr, deadline, give_up, false)
}

/// As [`connect`], to a listener that was up before (a peer's, after init): a refusal means
/// nothing listens there any more (its process exited or dropped its bootstrap), and is
/// returned at once ([`io::ErrorKind::ConnectionRefused`]) instead of retried. Linux drops a
/// SYN when a live listener's backlog is full; it never answers one with a reset.
pub(crate) fn connect_to_live(
    addr: SocketAddr,
    deadline: Instant,
    give_up: impl Fn() -> bool,
) -> io::Result<TcpStream> {
    connect_inner(addr, deadline, give_up, true)
}

fn connect_inner(
    addr: SocketAddr,
    deadline: Instant,
    give_up: impl Fn() -> bool,
    refusal_is_final: bool,
) -> io::Result<TcpStream> {
    // One attempt waits at most this long, so that `give_up` is looked at now and then even
    // when SYNs go unanswered.
    const ATTEMPT: Duration = Duration::from_secs(1);
    let retry = Retry::from_env();
    let mut failures = 0u32;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "connect timed out"));
        }
        if give_up() {
            return Err(io::Error::new(
                io::ErrorKind::Interrupted,
                "connect abandoned",
            ));
        }
        match TcpStream::connect_timeout(&addr, left.min(ATTEMPT)) {
            Ok(s) => {
                s.set_nodelay(true)?;
                bound_silence(&s)?;
                return Ok(s);
            }
            Err(e) if refusal_is_final && e.kind() == io::ErrorKind::ConnectionRefused => {
                return Err(e);
            }
            Err(e) => {
                failures += 1;
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() || failures > retry.count {
                    return Err(io::Error::new(
                        e.kind(),
                        format!("{e} (after {failures} attempts)"),
                    ));
                }
                std::thread::sleep(retry.pause(failures).min(left));
            }
        }
    }
}

/// `NCCL_RS_SOCKET_TIMEOUT_MS` (keepalive) and `NCCL_RS_SOCKET_SEND_TIMEOUT_MS` (unacknowledged
/// data): how long a connection's peer host may be silent before the connection fails; None:
/// no bound (0).
pub(crate) fn silence_bounds() -> (Option<Duration>, Option<Duration>) {
    let bound = |p: crate::env::Param| match p.int() {
        ms if ms <= 0 => None,
        ms => Some(Duration::from_millis(ms as u64)),
    };
    (
        bound(crate::env::RS_SOCKET_TIMEOUT_MS),
        bound(crate::env::RS_SOCKET_SEND_TIMEOUT_MS),
    )
}

/// Bounds how long a bootstrap connection's peer host may be silent (see [`silence_bounds`]):
/// keepalive probes for an idle connection (a reader waiting on a peer whose host vanished
/// gets ETIMEDOUT, which ends the connection and reports the peer gone), and TCP_USER_TIMEOUT
/// for one with data in flight (without it, TCP retransmits for about 15 minutes). Linux also
/// lets TCP_USER_TIMEOUT decide when unanswered keepalive probes end a connection, so it is
/// the smaller of the two bounds. A zero window (a receiver that does not read) counts too on
/// recent kernels; the bootstrap's readers always drain their sockets (up to
/// `NCCL_RS_BOOTSTRAP_QUEUE_BYTES` waiting per peer), so only a peer past that budget for the
/// whole bound is cut off.
pub(crate) fn bound_silence(s: &TcpStream) -> io::Result<()> {
    let (idle, unacked) = silence_bounds();
    let s = socket2::SockRef::from(s);
    if let Some(t) = idle {
        keepalive(&s, t)?;
    }
    let user = unacked.map(|u| idle.map_or(u, |i| i.min(u)));
    if let Some(t) = user {
        s.set_tcp_user_timeout(Some(t.max(Duration::from_millis(1))))?;
    }
    Ok(())
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "timed out")
}

/// Arms `s`'s read timeout for what is left until `deadline`.
fn arm_read(s: &TcpStream, deadline: Instant) -> io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(timed_out());
    }
    s.set_read_timeout(Some(left))
}

/// Writes a whole frame, giving up at `deadline` (the stream is then unusable).
pub(crate) fn write_frame(s: &TcpStream, frame: &[u8], deadline: Instant) -> io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(timed_out());
    }
    s.set_write_timeout(Some(left))?;
    let mut w = s;
    w.write_all(frame).map_err(|e| match e.kind() {
        io::ErrorKind::WouldBlock => timed_out(),
        _ => e,
    })
}

/// Reads one frame body of at most `max` bytes. `arm` runs before every read (to set a
/// timeout). Ok(None): the peer closed the connection cleanly between frames.
fn read_frame_with<R: Read>(
    r: &mut R,
    max: usize,
    mut arm: impl FnMut() -> io::Result<()>,
) -> io::Result<Option<Vec<u8>>> {
    let mut fill = |buf: &mut [u8]| -> io::Result<usize> {
        loop {
            arm()?;
            match r.read(buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // A socket read timeout surfaces as EAGAIN.
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(timed_out()),
                Err(e) => return Err(e),
            }
        }
    };
    let eof = |got: usize, want: usize| {
        io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("connection closed inside a frame ({got} of {want} bytes)"),
        )
    };
    let mut prefix = [0u8; 4];
    let mut got = 0;
    while got < 4 {
        match fill(&mut prefix[got..])? {
            0 if got == 0 => return Ok(None),
            0 => return Err(eof(got, 4)),
            n => got += n,
        }
    }
    let Some(len) = wire::body_len(prefix, max) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "frame of {} bytes exceeds the limit of {max}",
                u32::from_le_bytes(prefix)
            ),
        ));
    };
    // Grow the buffer with what really arrives: the length came from the peer.
    let mut body = Vec::with_capacity(len.min(64 << 10));
    while body.len() < len {
        let start = body.len();
        body.resize(start + (len - start).min(1 << 20), 0);
        let n = fill(&mut body[start..])?;
        if n == 0 {
            return Err(eof(start, len));
        }
        body.truncate(start + n);
    }
    Ok(Some(body))
}

/// Reads one frame body from `s`, failing at `deadline` or on EOF.
pub(crate) fn read_frame(s: &TcpStream, max: usize, deadline: Instant) -> io::Result<Vec<u8>> {
    let mut r = s;
    read_frame_with(&mut r, max, || arm_read(s, deadline))?
        .ok_or_else(|| io::Error::new(io::ErrorKind::UnexpectedEof, "connection closed by peer"))
}

/// Reads one frame body from a buffered stream with no timeout (the caller's waits carry the
/// deadlines). Ok(None) on a clean close between frames.
pub(crate) fn read_frame_untimed<R: Read>(r: &mut R, max: usize) -> io::Result<Option<Vec<u8>>> {
    read_frame_with(r, max, || Ok(()))
}

/// Is this I/O error a timeout (as opposed to a broken connection)?
pub(crate) fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock
    )
}

/// The pause before the `n`th new try at a listener that closed our connection at its door
/// (full of waiting connections): 10 ms, doubling, at most 320 ms, less a share that differs
/// from thread to thread so that ranks turned away together do not come back together.
pub(crate) fn knock_pause(n: u32) -> Duration {
    use std::hash::{BuildHasher, Hasher};
    let base = 10u64 << n.clamp(1, 6).saturating_sub(1);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(n);
    Duration::from_millis(base - h.finish() % (base / 2 + 1))
}

/// Default of `NCCL_RS_BOOTSTRAP_HANDSHAKE_MS`.
const HANDSHAKE_WAIT_MS: i64 = 2000;

/// How long an accepted connection may take to answer its challenge with its hello or
/// greeting (a rank does so within a round trip): `NCCL_RS_BOOTSTRAP_HANDSHAKE_MS`, 2 s by
/// default.
pub(crate) fn handshake_wait() -> Duration {
    let ms = match crate::env::RS_BOOTSTRAP_HANDSHAKE_MS.raw() {
        Some(_) => crate::env::RS_BOOTSTRAP_HANDSHAKE_MS.int(),
        None => HANDSHAKE_WAIT_MS,
    };
    Duration::from_millis(ms.max(1) as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sockets::{deadline_after, listen, local_addr};
    use crate::test_aids::skipped;

    #[test]
    fn connections_bound_a_silent_peer_host() {
        let l = listen(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)), false).unwrap();
        let addr = local_addr(&l).unwrap();
        let s = connect(addr, deadline_after(Duration::from_secs(10)), || false).unwrap();
        let (idle, unacked) = silence_bounds();
        let r = socket2::SockRef::from(&s);
        assert_eq!(r.keepalive().unwrap(), idle.is_some());
        // TCP_USER_TIMEOUT also ends keepalive's count on Linux: never above the idle bound.
        assert_eq!(
            r.tcp_user_timeout().unwrap(),
            unacked.map(|u| idle.map_or(u, |i| i.min(u)))
        );
    }

    const NO_NETNS: &str = "network namespaces cannot be made here";

    /// A network namespace of this test's own (`ip netns`), deleted when dropped: the address
    /// choice is tested on interfaces the test made, never on the machine's own.
    struct Netns(String);

    impl Netns {
        /// `nccl-rs-unit-<pid>-<tag>` with loopback up, or why it cannot be made here.
        fn new(tag: &str) -> std::result::Result<Netns, String> {
            let ns = Netns(format!("nccl-rs-unit-{}-{tag}", std::process::id()));
            let _ = std::process::Command::new("ip")
                .args(["netns", "del", &ns.0])
                .output();
            ns.ip_top(&["netns", "add", &ns.0])?;
            ns.ip(&["link", "set", "lo", "up"])?;
            Ok(ns)
        }

        fn ip_top(&self, args: &[&str]) -> std::result::Result<(), String> {
            let out = std::process::Command::new("ip")
                .args(args)
                .output()
                .map_err(|e| format!("cannot run ip: {e}"))?;
            match out.status.success() {
                true => Ok(()),
                false => Err(format!(
                    "`ip {}`: {}",
                    args.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                )),
            }
        }

        /// `ip -n <ns> args`.
        fn ip(&self, args: &[&str]) -> std::result::Result<(), String> {
            let mut all = vec!["-n", &self.0];
            all.extend_from_slice(args);
            self.ip_top(&all)
        }

        /// Runs `f` on a thread that entered the namespace (setns: that thread only).
        fn run<R: Send>(&self, f: impl FnOnce() -> R + Send) -> R {
            use std::os::fd::AsRawFd;
            std::thread::scope(|s| {
                s.spawn(|| {
                    let fd = std::fs::File::open(format!("/var/run/netns/{}", self.0))
                        .expect("the namespace's handle");
                    // SAFETY: setns(2) on a valid descriptor, for the calling thread.
                    let r = unsafe { libc::setns(fd.as_raw_fd(), libc::CLONE_NEWNET) };
                    assert_eq!(r, 0, "setns: {}", io::Error::last_os_error());
                    f()
                })
                .join()
                .expect("the namespace's thread")
            })
        }
    }

    impl Drop for Netns {
        fn drop(&mut self) {
            let _ = self.ip_top(&["netns", "del", &self.0]);
        }
    }

    /// In a namespace of the test's own with one interface besides loopback, the choice is that
    /// interface's address, a listener binds it, and a target on loopback is reached from
    /// loopback; with loopback alone the choice falls back to it.
    #[test]
    fn address_choice_is_usable() {
        let made = Netns::new("ac").and_then(|ns| {
            ns.ip(&[
                "link", "add", "nrs0", "type", "veth", "peer", "name", "nrs1",
            ])?;
            ns.ip(&["addr", "add", "10.213.250.1/24", "dev", "nrs0"])?;
            ns.ip(&["link", "set", "nrs0", "up"])?;
            ns.ip(&["link", "set", "nrs1", "up"])?;
            Ok(ns)
        });
        let ns = match made {
            Ok(ns) => ns,
            Err(why) => return skipped(NO_NETNS, &format!("address_choice_is_usable: {why}")),
        };
        ns.run(|| {
            let ip = choose_address().expect("an address");
            assert_eq!(ip, IpAddr::from(Ipv4Addr::new(10, 213, 250, 1)));
            let l = listen(SocketAddr::new(ip, 0), false).expect("listen on chosen address");
            let a = local_addr(&l).expect("local addr");
            assert_eq!(a.ip(), ip);
            assert_eq!(
                local_ip_toward(Ipv4Addr::LOCALHOST.into()),
                IpAddr::from(Ipv4Addr::LOCALHOST)
            );
        });
        drop(ns);
        let only_lo = match Netns::new("lo") {
            Ok(ns) => ns,
            Err(why) => return skipped(NO_NETNS, &format!("address_choice_is_usable: {why}")),
        };
        only_lo.run(|| {
            // (Unless NCCL_SOCKET_FAMILY asks for IPv6.)
            if family_wanted() != Some(false) {
                let ip = choose_address().expect("an address");
                assert_eq!(
                    ip,
                    IpAddr::from(Ipv4Addr::LOCALHOST),
                    "the loopback fallback"
                );
            }
        });
    }
}
