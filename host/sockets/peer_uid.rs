//! Who owns the other end of a TCP connection on this host: the kernel's socket diagnostics
//! (netlink `NETLINK_SOCK_DIAG`, a lookup of that one socket by its addresses), or where they
//! are missing the socket tables in `/proc/net`.

use std::net::{IpAddr, SocketAddr};

/// The user id owning the local socket at `peer` that is connected to our `me`; None when no
/// such socket is on this host (a remote peer) or neither source answers.
pub(crate) fn local_peer_uid(peer: SocketAddr, me: SocketAddr) -> Option<u32> {
    match diag_uid(peer, me) {
        Ok(Some(uid)) => Some(uid),
        // No such socket here, or diagnostics that find nothing at all (ENOENT is also what a
        // kernel without TCP diagnostics answers): our own end of the connection tells which.
        Ok(None) => match diag_uid(me, peer) {
            Ok(Some(_)) => None,
            _ => proc_tables_uid(peer, me),
        },
        Err(()) => proc_tables_uid(peer, me),
    }
}

/// `struct inet_diag_sockid` (linux/inet_diag.h): ports and addresses in network order.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct SockId {
    sport: u16,
    dport: u16,
    src: [u32; 4],
    dst: [u32; 4],
    interface: u32,
    cookie: [u32; 2],
}

/// `struct nlmsghdr` + `struct inet_diag_req_v2`.
#[repr(C)]
struct Request {
    len: u32,
    kind: u16,
    flags: u16,
    seq: u32,
    pid: u32,
    family: u8,
    protocol: u8,
    ext: u8,
    pad: u8,
    states: u32,
    id: SockId,
}

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const NLMSG_ERROR: u16 = 2;
/// `struct nlmsghdr`, then in `struct inet_diag_msg` the uid's offset.
const NLMSG_HEADER: usize = 16;
const UID_AT: usize = NLMSG_HEADER + 4 + std::mem::size_of::<SockId>() + 12;
/// In `struct inet_diag_msg`: the socket's state, its id, and the id's bytes that name the two
/// ends (ports and addresses).
const STATE_AT: usize = NLMSG_HEADER + 1;
const FAMILY_AT: usize = NLMSG_HEADER;
const ID_AT: usize = NLMSG_HEADER + 4;
/// `TCP_LISTEN` of the kernel's TCP states.
const TCP_LISTEN: u8 = 10;

/// The address words of `ip` as the kernel keeps them (network order), IPv4 in the first.
fn words(ip: IpAddr) -> [u32; 4] {
    let mut w = [0u32; 4];
    match ip {
        IpAddr::V4(v4) => w[0] = u32::from_ne_bytes(v4.octets()),
        IpAddr::V6(v6) => {
            for (i, c) in v6.octets().chunks(4).enumerate() {
                w[i] = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
            }
        }
    }
    w
}

/// The two ends (source, destination) of the socket a diagnostics answer describes, in the
/// found socket's own family: an IPv4 socket's addresses fill the first word only, whatever
/// family was asked (mapped addresses compare equal in [`same_endpoint`]).
fn answer_ends(answer: &[u8]) -> Option<(SocketAddr, SocketAddr)> {
    let family = i32::from(*answer.get(FAMILY_AT)?);
    let port = |at: usize| Some(u16::from_be_bytes(answer.get(at..at + 2)?.try_into().ok()?));
    let ip = |at: usize| -> Option<IpAddr> {
        match family {
            libc::AF_INET => Some(IpAddr::from(
                <[u8; 4]>::try_from(answer.get(at..at + 4)?).ok()?,
            )),
            libc::AF_INET6 => Some(IpAddr::from(
                <[u8; 16]>::try_from(answer.get(at..at + 16)?).ok()?,
            )),
            _ => None,
        }
    };
    let (sport, dport) = (port(ID_AT)?, port(ID_AT + 2)?);
    let (src, dst) = (ip(ID_AT + 4)?, ip(ID_AT + 20)?);
    Some((SocketAddr::new(src, sport), SocketAddr::new(dst, dport)))
}

/// The owner of the socket at `peer` connected to `me`, asked of the kernel's TCP diagnostics
/// by both ends' addresses: Ok(None) when the kernel has no such socket, Err when the
/// diagnostics cannot be asked (then the tables are read).
fn diag_uid(peer: SocketAddr, me: SocketAddr) -> Result<Option<u32>, ()> {
    let family = match (peer, me) {
        (SocketAddr::V4(_), SocketAddr::V4(_)) => libc::AF_INET,
        (SocketAddr::V6(_), SocketAddr::V6(_)) => libc::AF_INET6,
        _ => return Err(()),
    };
    // SAFETY: socket(2) with constant arguments.
    let fd = unsafe {
        libc::socket(
            libc::AF_NETLINK,
            libc::SOCK_DGRAM | libc::SOCK_CLOEXEC,
            libc::NETLINK_SOCK_DIAG,
        )
    };
    if fd < 0 {
        return Err(());
    }
    // SAFETY: fd is ours, closed once when `owned` drops.
    let _owned = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
    let req = Request {
        len: std::mem::size_of::<Request>() as u32,
        kind: SOCK_DIAG_BY_FAMILY,
        flags: libc::NLM_F_REQUEST as u16,
        seq: 1,
        pid: 0,
        family: family as u8,
        protocol: libc::IPPROTO_TCP as u8,
        ext: 0,
        pad: 0,
        states: !0,
        id: SockId {
            sport: peer.port().to_be(),
            dport: me.port().to_be(),
            src: words(peer.ip()),
            dst: words(me.ip()),
            interface: 0,
            cookie: [!0, !0],
        },
    };
    // SAFETY: a sockaddr_nl of zeros but its family is the kernel's address; `req` is plain
    // data of its declared length.
    let sent = unsafe {
        let mut to: libc::sockaddr_nl = std::mem::zeroed();
        to.nl_family = libc::AF_NETLINK as u16;
        libc::sendto(
            fd,
            (&req as *const Request).cast(),
            std::mem::size_of::<Request>(),
            0,
            (&to as *const libc::sockaddr_nl).cast(),
            std::mem::size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if sent < 0 {
        return Err(());
    }
    let mut buf = [0u8; 512];
    // SAFETY: recv into a buffer of its length; the kernel answers a request at once.
    let got = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), 0) };
    let answer = buf.get(..usize::try_from(got).map_err(|_| ())?).ok_or(())?;
    let u16_at = |i: usize| Some(u16::from_ne_bytes(answer.get(i..i + 2)?.try_into().ok()?));
    let u32_at = |i: usize| Some(u32::from_ne_bytes(answer.get(i..i + 4)?.try_into().ok()?));
    match u16_at(4).ok_or(())? {
        // The kernel found no such socket (ENOENT); any other error: it cannot tell.
        NLMSG_ERROR => match u32_at(NLMSG_HEADER).map(|e| e as i32) {
            Some(e) if e == -libc::ENOENT => Ok(None),
            _ => Err(()),
        },
        // Only the connected socket of exactly these two ends: the kernel's lookup falls back
        // to a listener on the source address and port, which any remote client could name
        // as its source port.
        SOCK_DIAG_BY_FAMILY => {
            let (src, dst) = answer_ends(answer).ok_or(())?;
            let ends = same_endpoint(src, peer) && same_endpoint(dst, me);
            match answer.get(STATE_AT) {
                Some(&state) if ends && state != TCP_LISTEN => u32_at(UID_AT).map(Some).ok_or(()),
                _ => Ok(None),
            }
        }
        _ => Err(()),
    }
}

/// [`local_peer_uid`] from the kernel's socket tables (`/proc/net/tcp`, `/proc/net/tcp6`),
/// where the socket diagnostics are not built in: a read walks the kernel's whole table of
/// connections (0.4 of a core at 100 reads a second on a small host).
fn proc_tables_uid(peer: SocketAddr, me: SocketAddr) -> Option<u32> {
    ["/proc/net/tcp", "/proc/net/tcp6"]
        .iter()
        .find_map(|table| {
            let text = std::fs::read_to_string(table).ok()?;
            text.lines().skip(1).find_map(|line| {
                let f: Vec<&str> = line.split_whitespace().collect();
                let (local, remote) = (proc_addr(f.get(1)?)?, proc_addr(f.get(2)?)?);
                (same_endpoint(local, peer) && same_endpoint(remote, me))
                    .then(|| f.get(7)?.parse().ok())
                    .flatten()
            })
        })
}

/// An address as `/proc/net/tcp*` prints it: the IP's 32-bit words in hex, each in the host's
/// byte order, a colon, the port in hex.
fn proc_addr(field: &str) -> Option<SocketAddr> {
    let (ip_hex, port_hex) = field.split_once(':')?;
    let port = u16::from_str_radix(port_hex, 16).ok()?;
    let mut bytes = Vec::with_capacity(16);
    for i in (0..ip_hex.len()).step_by(8) {
        let word = u32::from_str_radix(ip_hex.get(i..i + 8)?, 16).ok()?;
        bytes.extend_from_slice(&word.to_ne_bytes());
    }
    let ip = match bytes.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?),
        16 => IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

/// Whether two endpoints are the same, an IPv4 one and its IPv4-mapped IPv6 form alike.
fn same_endpoint(a: SocketAddr, b: SocketAddr) -> bool {
    let canon = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    };
    a.port() == b.port() && canon(a.ip()) == canon(b.ip())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{TcpListener, TcpStream};

    /// Both sources name our uid as the owner of a loopback connection's far end, and the
    /// diagnostics find nothing for an end that does not exist.
    #[test]
    fn the_owner_of_a_loopback_connection() {
        // SAFETY: geteuid has no preconditions.
        let me_uid = unsafe { libc::geteuid() };
        let l = TcpListener::bind("127.0.0.1:0").expect("listen on loopback");
        let _client = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let (server, peer) = l.accept().expect("accept");
        let me = server.local_addr().expect("local");
        assert_eq!(proc_tables_uid(peer, me), Some(me_uid));
        match diag_uid(peer, me) {
            Ok(uid) => assert_eq!(uid, Some(me_uid)),
            Err(()) => println!("no socket diagnostics in this kernel: the tables answer"),
        }
        assert_eq!(local_peer_uid(peer, me), Some(me_uid));
        let nobody = SocketAddr::new(peer.ip(), 1);
        assert_eq!(local_peer_uid(nobody, me), None);
        // A client claiming a listener's address and port as its own is no local client (the
        // kernel's lookup would fall back to the listener).
        let listener = l.local_addr().expect("listener");
        assert_eq!(diag_uid(listener, me).unwrap_or(None), None, "the listener");
        assert_eq!(local_peer_uid(listener, me), None, "the listener");
        // A dual-stack listener sees an IPv4 client as IPv4-mapped IPv6; the kernel answers
        // with the client's IPv4 socket: still the owner.
        if let Ok(l6) = TcpListener::bind("[::]:0") {
            let port = l6.local_addr().expect("addr").port();
            let _c = TcpStream::connect(("127.0.0.1", port)).expect("connect over IPv4");
            let (s6, peer6) = l6.accept().expect("accept");
            let me6 = s6.local_addr().expect("local");
            assert!(peer6.is_ipv6(), "{peer6}");
            assert_eq!(local_peer_uid(peer6, me6), Some(me_uid), "{peer6} -> {me6}");
        }
    }
}
