//! What the bootstrap and the socket network both do with sockets: the host's interfaces
//! (getifaddrs) matched against an `NCCL_SOCKET_IFNAME` value and described in errors,
//! listeners, how connects retry, keepalive that bounds a silent peer host, deadlines, and the
//! small-stack threads that serve connections.

mod peer_uid;

use std::ffi::CStr;
use std::fmt::Write as _;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

/// Upper bound for any wait, so that `Instant + Duration` can never overflow.
const FOREVER: Duration = Duration::from_secs(365 * 24 * 3600);

/// `now + d`, with absurdly long durations cut to a year.
pub(crate) fn deadline_after(d: Duration) -> Instant {
    let now = Instant::now();
    now.checked_add(d.min(FOREVER))
        .unwrap_or_else(|| now + Duration::from_secs(3600))
}

/// Does interface `name` pass an `NCCL_SOCKET_IFNAME` value? The value is a comma-separated
/// list of name prefixes; a leading `^` turns it into an exclusion list, a leading `=` (after
/// the `^`, if any) asks for exact names instead of prefixes.
pub(crate) fn ifname_matches(spec: &str, name: &str) -> bool {
    let (exclude, spec) = match spec.strip_prefix('^') {
        Some(rest) => (true, rest),
        None => (false, spec),
    };
    let (exact, spec) = match spec.strip_prefix('=') {
        Some(rest) => (true, rest),
        None => (false, spec),
    };
    let hit = spec
        .split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .any(|p| {
            if exact {
                name == p
            } else {
                name.starts_with(p)
            }
        });
    hit != exclude
}

pub(crate) struct Iface {
    pub(crate) name: String,
    pub(crate) ip: IpAddr,
    pub(crate) up: bool,
    pub(crate) loopback: bool,
}

/// Every address of every interface, from getifaddrs(3); empty if it fails.
pub(crate) fn interfaces() -> Vec<Iface> {
    let mut found = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs only writes the list head into `head`; we free it below, once.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return found;
    }
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs returned, alive until freeifaddrs; its
        // `ifa_name` is a NUL-terminated string and `ifa_addr`, when not null, points to a
        // sockaddr whose family field says which sockaddr_* it really is (read unaligned).
        unsafe {
            let ifa = &*cur;
            cur = ifa.ifa_next;
            if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
                continue;
            }
            let ip = match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sin = std::ptr::read_unaligned(ifa.ifa_addr as *const libc::sockaddr_in);
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)))
                }
                libc::AF_INET6 => {
                    let sin6 = std::ptr::read_unaligned(ifa.ifa_addr as *const libc::sockaddr_in6);
                    IpAddr::V6(Ipv6Addr::from(sin6.sin6_addr.s6_addr))
                }
                _ => continue,
            };
            found.push(Iface {
                name: CStr::from_ptr(ifa.ifa_name).to_string_lossy().into_owned(),
                ip,
                up: ifa.ifa_flags & libc::IFF_UP as u32 != 0,
                loopback: ifa.ifa_flags & libc::IFF_LOOPBACK as u32 != 0,
            });
        }
    }
    // SAFETY: `head` came from a successful getifaddrs and is freed exactly once.
    unsafe { libc::freeifaddrs(head) };
    found
}

/// "eth0 (10.0.0.2, fe80::1), lo (127.0.0.1)": what exists, for error messages.
pub(crate) fn describe_interfaces(all: &[(String, IpAddr)]) -> String {
    let mut names: Vec<&str> = Vec::new();
    for (n, _) in all {
        if !names.contains(&n.as_str()) {
            names.push(n);
        }
    }
    if names.is_empty() {
        return "none".into();
    }
    let mut s = String::new();
    for (i, n) in names.iter().enumerate() {
        let ips: Vec<String> = all
            .iter()
            .filter(|(m, _)| m == n)
            .map(|(_, ip)| ip.to_string())
            .collect();
        let _ = write!(
            s,
            "{}{n} ({})",
            if i > 0 { ", " } else { "" },
            ips.join(", ")
        );
    }
    s
}

/// A listening TCP socket on `addr` (port 0: any free port).
pub(crate) fn listen(addr: SocketAddr, reuse_address: bool) -> io::Result<Socket> {
    let s = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    if reuse_address {
        s.set_reuse_address(true)?;
    }
    s.bind(&addr.into())?;
    // The kernel caps the backlog at somaxconn; ask for plenty so that many ranks connecting
    // at once are not dropped into SYN retries.
    s.listen(4096)?;
    Ok(s)
}

pub(crate) fn local_addr(s: &Socket) -> io::Result<SocketAddr> {
    s.local_addr()?
        .as_socket()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "listener has no IP address"))
}

/// How often and how long `connect` retries: `NCCL_SOCKET_RETRY_CNT` failed attempts at most,
/// pausing between them from 1 ms, doubling, up to `NCCL_SOCKET_RETRY_SLEEP_MSEC` times the
/// attempt number (NCCL's linear back-off, with a fast start for listeners that are just
/// coming up).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Retry {
    pub count: u32,
    pub sleep_ms: u64,
}

impl Retry {
    pub(crate) fn from_env() -> Retry {
        Retry {
            count: crate::env::SOCKET_RETRY_CNT.int().clamp(0, u32::MAX as i64) as u32,
            sleep_ms: crate::env::SOCKET_RETRY_SLEEP_MSEC.int().max(0) as u64,
        }
    }

    /// The pause after failed attempt number `n` (1-based).
    pub(crate) fn pause(&self, n: u32) -> Duration {
        let fast = 1u64 << n.min(20);
        let linear = self.sleep_ms.saturating_mul(n as u64);
        Duration::from_millis(fast.min(linear.max(1)))
    }
}

/// TCP keepalive such that a connection whose peer's host answers nothing for about `t` fails
/// with ETIMEDOUT. The kernel counts whole seconds: after `every` seconds without hearing from
/// the peer it sends a probe, then one every `every` seconds, and gives up after `probes`
/// unanswered ones, so `every + probes × every` ≈ `t` (at least 2 s). Probes go out only while
/// the socket has no unacknowledged data of its own, and they are answered by the peer's
/// kernel, so a peer rank that is merely busy (or stopped) never trips them.
pub(crate) fn keepalive(s: &Socket, t: Duration) -> io::Result<()> {
    let secs = t
        .as_secs()
        .saturating_add(u64::from(t.subsec_nanos() > 0))
        .max(2);
    let every = (secs / 4).clamp(1, 32_767);
    let probes = (secs / every).saturating_sub(1).clamp(1, 127);
    s.set_keepalive(true)?;
    s.set_tcp_keepalive(
        &socket2::TcpKeepalive::new()
            .with_time(Duration::from_secs(every))
            .with_interval(Duration::from_secs(every))
            .with_retries(probes as u32),
    )
}

/// Spawns a helper thread with a small stack (many of them exist at once with many ranks).
pub(crate) fn spawn(
    name: &str,
    f: impl FnOnce() + Send + 'static,
) -> io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name(name.to_string())
        .stack_size(256 << 10)
        .spawn(f)
}

/// 64 random bits, for the secrets that key connections (the bootstrap's nonces, the socket
/// network's tags): /dev/urandom, else a hash of time, pid and a counter under std's randomly
/// keyed hasher.
pub(crate) fn random_nonce() -> u64 {
    let mut b = [0u8; 8];
    if std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut b))
        .is_ok()
    {
        return u64::from_le_bytes(b);
    }
    static COUNTER: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    h.write_u32(std::process::id());
    h.write_u64(COUNTER.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    h.finish()
}

/// The connections one listener dropped (no hello, a wrong one, a stranger), warned about
/// without letting a flood of them fill the log: each of the first few, then one line at each
/// power of two, with the count.
#[derive(Debug, Default)]
pub(crate) struct Rejections(std::sync::atomic::AtomicU64);

/// Rejections each warned about before only powers of two are.
const REJECTIONS_EACH: u64 = 8;

impl Rejections {
    /// Counts one, and warns with `what()` when its turn says so.
    pub(crate) fn warn(&self, what: impl FnOnce() -> String) {
        let n = self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if !Self::worth_a_line(n) {
            return;
        }
        match n <= REJECTIONS_EACH {
            true => log::warn!("{}", what()),
            false => log::warn!(
                "{} ({n} connections dropped so far; only some are logged)",
                what()
            ),
        }
    }

    /// Whether the `n`th rejection (from 1) gets a line.
    fn worth_a_line(n: u64) -> bool {
        n <= REJECTIONS_EACH || n.is_power_of_two()
    }

    /// How many were counted.
    #[cfg(test)]
    fn count(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// `want` descriptors, or an eighth of this process's soft limit on open descriptors if that
/// is fewer (at least 16): what one listener may hold for connections that have not yet said
/// who they are.
pub(crate) fn descriptor_share(want: usize) -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit with a valid rlimit structure.
    let soft = match unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } {
        0 => usize::try_from(lim.rlim_cur).unwrap_or(usize::MAX),
        _ => 1024,
    };
    want.min(soft / 8).max(16)
}

pub(crate) use peer_uid::local_peer_uid;

/// `text` safe to print on a terminal: reports and errors carry peers' words (host names,
/// error messages), and a control character among them (an escape sequence) would be the
/// terminal's command; each but newline and tab is shown as `\u{..}` instead.
pub(crate) fn printable(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            '\n' | '\t' => c.to_string(),
            c if c.is_control() => c.escape_unicode().to_string(),
            c => c.to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A flood of rejections writes a few lines, not one each: the first 8, then 16, 32, 64.
    #[test]
    fn rejections_are_warned_about_a_few_at_a_time() {
        let r = Rejections::default();
        for _ in 0..100 {
            r.warn(|| String::from("test rejection"));
        }
        let lines: Vec<u64> = (1..=100).filter(|&n| Rejections::worth_a_line(n)).collect();
        assert_eq!(r.count(), 100);
        assert_eq!(lines, [1, 2, 3, 4, 5, 6, 7, 8, 16, 32, 64]);
    }

    #[test]
    fn ifname_spec() {
        assert!(ifname_matches("eth", "eth0"));
        assert!(ifname_matches("ib,eth", "eth1"));
        assert!(!ifname_matches("ib", "eth0"));
        assert!(!ifname_matches("^eth", "eth0"));
        assert!(ifname_matches("^eth", "ib0"));
        assert!(ifname_matches("=eth0", "eth0"));
        assert!(!ifname_matches("=eth0", "eth01"));
        assert!(!ifname_matches("^=eth0", "eth0"));
        assert!(ifname_matches("^=eth0", "eth01"));
        assert!(!ifname_matches("^docker,virbr", "docker0"));
        assert!(ifname_matches("^docker,virbr", "enp1s0"));
    }

    #[test]
    fn retry_pauses_start_fast_and_grow_linearly() {
        let r = Retry {
            count: 34,
            sleep_ms: 100,
        };
        assert_eq!(r.pause(1), Duration::from_millis(2));
        assert_eq!(r.pause(5), Duration::from_millis(32));
        assert_eq!(r.pause(12), Duration::from_millis(1200));
        let zero = Retry {
            count: 1,
            sleep_ms: 0,
        };
        assert_eq!(zero.pause(3), Duration::from_millis(1));
    }
}
