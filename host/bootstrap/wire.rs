//! What travels on the bootstrap sockets. A frame is a little-endian `u32` body length followed
//! by the body; the body's first byte says which message it is. Encoding and decoding are pure
//! functions (bytes in, message or error out, no socket in sight) so that the decoder can be
//! fuzzed: every length and count in a body is checked against what is really there.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

use crate::error::{Error, NcclResult, Result};

/// "nccl-rs\0": the first field of every control message and of the unique id.
pub(crate) const MAGIC: u64 = 0x6e63_636c_2d72_7300;
/// Bumped whenever a message layout changes, so that two builds never misread each other.
pub(crate) const VERSION: u32 = 4;
/// Most ranks one bootstrap accepts (keeps the root's address table a sane size).
pub(crate) const MAX_RANKS: usize = 1 << 20;
/// Largest body accepted on a connection before it proved to be one of ours (hello, connect).
pub(crate) const MAX_CTRL_BODY: usize = 1024;
/// Largest body of a data frame between ranks.
pub(crate) const MAX_DATA_BODY: usize = 256 << 20;
/// Bytes of a data frame body in front of the payload: type, channel, tag.
pub(crate) const DATA_HEADER: usize = 1 + 1 + 4;
/// Largest payload of one `send` or of one rank's `allgather` contribution.
pub(crate) const MAX_PAYLOAD: usize = MAX_DATA_BODY - DATA_HEADER;
/// Encoded size of a socket address: family, port, 16 address bytes, IPv6 scope id.
pub(crate) const ADDR_BYTES: usize = 1 + 2 + 16 + 4;
/// Encoded size of a [`Member`]: its address and its key.
pub(crate) const MEMBER_BYTES: usize = ADDR_BYTES + 8;
/// Longest error text the root sends back.
pub(crate) const MAX_FAIL_TEXT: usize = 900;

const T_HELLO: u8 = 1;
const T_TABLE: u8 = 2;
const T_FAIL: u8 = 3;
const T_CONNECT: u8 = 4;
const T_DATA: u8 = 5;

/// Which conversation a data frame belongs to; user tags and internal traffic never mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Channel {
    User,
    Allgather,
    Barrier,
    /// Internal set-up traffic (the address tables of a bootstrap with several roots).
    Setup,
    /// A goodbye (empty): the sender closes this connection on purpose (`ncclCommDestroy`),
    /// so its end is no fault.
    Leave,
    /// A fault notice: rank `tag` is gone, and the payload says why (UTF-8).
    Fault,
    /// A RAS query (`tag`: its number; empty), answered from the reader thread.
    Ras,
    /// The answer to RAS query `tag`: the rank's health record.
    RasReply,
    /// A heartbeat (empty) to the ring successor, while hangs are watched
    /// (`NCCL_RS_PEER_HANG_TIMEOUT_MS`): it only says that the sender's process still runs.
    Beat,
}

impl Channel {
    fn to_u8(self) -> u8 {
        match self {
            Channel::User => 0,
            Channel::Allgather => 1,
            Channel::Barrier => 2,
            Channel::Setup => 3,
            Channel::Leave => 4,
            Channel::Fault => 5,
            Channel::Ras => 6,
            Channel::RasReply => 7,
            Channel::Beat => 8,
        }
    }
    fn from_u8(v: u8) -> Option<Channel> {
        match v {
            0 => Some(Channel::User),
            1 => Some(Channel::Allgather),
            2 => Some(Channel::Barrier),
            3 => Some(Channel::Setup),
            4 => Some(Channel::Leave),
            5 => Some(Channel::Fault),
            6 => Some(Channel::Ras),
            7 => Some(Channel::RasReply),
            8 => Some(Channel::Beat),
            _ => None,
        }
    }
}

/// A rank introducing itself to the root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Hello {
    pub nonce: u64,
    pub rank: u32,
    pub nranks: u32,
    /// How long this rank is still willing to wait for the others.
    pub timeout_ms: u64,
    /// Where this rank's own listener accepts peers.
    pub addr: SocketAddr,
}

/// A rank as one other rank knows it: where it listens, and the key of the pair (that rank,
/// this one) that greetings between the two carry (`bootstrap::keys`). The root sends each
/// rank its own table: the keys there are that rank's pairs only (0 in its own entry), and
/// travel only from the root to that rank, never in the unique id nor to another member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Member {
    pub addr: SocketAddr,
    pub key: u64,
}

/// First frame on a rank-to-rank connection: who is calling, for which bootstrap.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Connect {
    pub nonce: u64,
    pub from: u32,
    pub nranks: u32,
    /// The key of the pair (sender, receiver), as the root gave it to both.
    pub key: u64,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Msg<'a> {
    Hello(Hello),
    /// Root to each rank once all arrived: every rank's listen address, by rank, with the key
    /// of its pair with the receiving rank.
    Table {
        nonce: u64,
        members: Vec<Member>,
    },
    /// Root to a rank: the bootstrap cannot complete, and why.
    Fail {
        code: NcclResult,
        message: String,
    },
    Connect(Connect),
    Data {
        channel: Channel,
        tag: u32,
        payload: &'a [u8],
    },
}

fn malformed(what: &str) -> Error {
    Error::remote(format!("malformed bootstrap message: {what}"))
}

/// Builds one frame: reserves the length prefix and patches it at the end.
struct Frame(Vec<u8>);

impl Frame {
    fn new(kind: u8, capacity: usize) -> Frame {
        let mut v = Vec::with_capacity(4 + capacity);
        v.extend_from_slice(&[0; 4]);
        v.push(kind);
        Frame(v)
    }
    fn control(kind: u8, capacity: usize) -> Frame {
        let mut f = Frame::new(kind, 12 + capacity);
        f.u64(MAGIC);
        f.u32(VERSION);
        f
    }
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn member(&mut self, m: &Member) {
        put_member(&mut self.0, m);
    }
    fn finish(mut self) -> Vec<u8> {
        // Bodies are bounded well below 4 GiB by the callers (MAX_RANKS, MAX_PAYLOAD).
        let len = (self.0.len() - 4) as u32;
        self.0[..4].copy_from_slice(&len.to_le_bytes());
        self.0
    }
}

/// Appends the `ADDR_BYTES` encoding of `a`.
pub(crate) fn put_addr(out: &mut Vec<u8>, a: &SocketAddr) {
    let mut ip = [0u8; 16];
    let (family, scope) = match a {
        SocketAddr::V4(v4) => {
            ip[..4].copy_from_slice(&v4.ip().octets());
            (4u8, 0u32)
        }
        SocketAddr::V6(v6) => {
            ip.copy_from_slice(&v6.ip().octets());
            (6u8, v6.scope_id())
        }
    };
    out.push(family);
    out.extend_from_slice(&a.port().to_le_bytes());
    out.extend_from_slice(&ip);
    out.extend_from_slice(&scope.to_le_bytes());
}

/// Appends the `MEMBER_BYTES` encoding of `m`.
fn put_member(out: &mut Vec<u8>, m: &Member) {
    put_addr(out, &m.addr);
    out.extend_from_slice(&m.key.to_le_bytes());
}

/// Bytes of one word (a key, or half a 128-bit secret) in a set-up message.
pub(crate) const WORD_BYTES: usize = 8;

/// A set-up message (bootstraps with several roots): addresses, `ADDR_BYTES` each, then
/// little-endian `u64` words: to a block's leader, the 128-bit secrets of its block pairs (two
/// words each); to any other rank, the key of each of its pairs, by rank.
pub(crate) fn encode_setup(addrs: &[SocketAddr], words: &[u64]) -> Vec<u8> {
    let mut v = Vec::with_capacity(addrs.len() * ADDR_BYTES + words.len() * WORD_BYTES);
    for a in addrs {
        put_addr(&mut v, a);
    }
    for w in words {
        v.extend_from_slice(&w.to_le_bytes());
    }
    v
}

/// Decodes a set-up message of exactly `naddrs` addresses and `nwords` words; any other size
/// is a malformed message.
pub(crate) type Setup = (Vec<SocketAddr>, Vec<u64>);
pub(crate) fn decode_setup(b: &[u8], naddrs: usize, nwords: usize) -> Result<Setup> {
    let want = naddrs
        .checked_mul(ADDR_BYTES)
        .zip(nwords.checked_mul(WORD_BYTES))
        .and_then(|(a, w)| a.checked_add(w));
    if naddrs > MAX_RANKS || nwords > 2 * MAX_RANKS || want != Some(b.len()) {
        return Err(malformed("set-up message size does not match its counts"));
    }
    let mut r = Rd(b);
    let addrs = (0..naddrs).map(|_| r.addr()).collect::<Result<Vec<_>>>()?;
    let words = (0..nwords).map(|_| r.u64()).collect::<Result<Vec<_>>>()?;
    r.end()?;
    Ok((addrs, words))
}

/// Reads an address written by `put_addr`; port 0 or an unknown family is an error.
pub(crate) fn get_addr(b: &[u8]) -> Result<SocketAddr> {
    let mut r = Rd(b);
    r.addr()
}

/// A cursor that never reads past its slice.
struct Rd<'a>(&'a [u8]);

impl<'a> Rd<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(malformed("truncated"));
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Ok(head)
    }
    fn array<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.array::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16> {
        Ok(u16::from_le_bytes(self.array()?))
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.array()?))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.array()?))
    }
    fn member(&mut self) -> Result<Member> {
        Ok(Member {
            addr: self.addr()?,
            key: self.u64()?,
        })
    }
    fn addr(&mut self) -> Result<SocketAddr> {
        let family = self.u8()?;
        let port = self.u16()?;
        let ip: [u8; 16] = self.array()?;
        let scope = self.u32()?;
        if port == 0 {
            return Err(malformed("address with port 0"));
        }
        match family {
            4 => {
                let v4 = Ipv4Addr::new(ip[0], ip[1], ip[2], ip[3]);
                Ok(SocketAddr::new(IpAddr::V4(v4), port))
            }
            6 => Ok(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(ip),
                port,
                0,
                scope,
            ))),
            _ => Err(malformed("unknown address family")),
        }
    }
    fn end(&self) -> Result<()> {
        if self.0.is_empty() {
            Ok(())
        } else {
            Err(malformed("trailing bytes"))
        }
    }
}

/// The body length announced by a frame's 4-byte prefix, if it is within `max`.
pub(crate) fn body_len(prefix: [u8; 4], max: usize) -> Option<usize> {
    let n = u32::from_le_bytes(prefix) as usize;
    (n <= max).then_some(n)
}

/// Largest body of a root's answer to a rank of an `nranks`-rank bootstrap.
pub(crate) fn answer_body_max(nranks: usize) -> usize {
    (1 + 12 + 8 + 4 + nranks.min(MAX_RANKS) * MEMBER_BYTES).max(1 + 12 + 1 + 4 + MAX_FAIL_TEXT)
}

pub(crate) fn encode_hello(h: &Hello) -> Vec<u8> {
    let mut f = Frame::control(T_HELLO, 24 + ADDR_BYTES);
    f.u64(h.nonce);
    f.u32(h.rank);
    f.u32(h.nranks);
    f.u64(h.timeout_ms);
    put_addr(&mut f.0, &h.addr);
    f.finish()
}

pub(crate) fn encode_connect(c: &Connect) -> Vec<u8> {
    let mut f = Frame::control(T_CONNECT, 24);
    f.u64(c.nonce);
    f.u32(c.from);
    f.u32(c.nranks);
    f.u64(c.key);
    f.finish()
}

/// The member table for one rank (its pairs' keys); `members.len()` must not exceed
/// `MAX_RANKS` (the root only builds tables from validated hellos).
pub(crate) fn encode_table(nonce: u64, members: &[Member]) -> Vec<u8> {
    let mut f = Frame::control(T_TABLE, 12 + members.len() * MEMBER_BYTES);
    f.u64(nonce);
    f.u32(members.len() as u32);
    for m in members {
        f.member(m);
    }
    f.finish()
}

pub(crate) fn encode_fail(code: NcclResult, message: &str) -> Vec<u8> {
    let text = cut_text(message).as_bytes();
    let mut f = Frame::control(T_FAIL, 5 + text.len());
    f.u8(code as u8);
    f.u32(text.len() as u32);
    f.0.extend_from_slice(text);
    f.finish()
}

/// `text` cut to `MAX_FAIL_TEXT` bytes at a char boundary (error and fault texts on the wire).
pub(crate) fn cut_text(text: &str) -> &str {
    let mut end = text.len().min(MAX_FAIL_TEXT);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// A data frame; Err(invalid_argument) when the payload is over `MAX_PAYLOAD`.
pub(crate) fn encode_data(channel: Channel, tag: u32, payload: &[u8]) -> Result<Vec<u8>> {
    if payload.len() > MAX_PAYLOAD {
        return Err(Error::invalid_argument(format!(
            "bootstrap message of {} bytes exceeds the limit of {MAX_PAYLOAD} bytes",
            payload.len()
        )));
    }
    let mut f = Frame::new(T_DATA, DATA_HEADER + payload.len());
    f.u8(channel.to_u8());
    f.u32(tag);
    f.0.extend_from_slice(payload);
    Ok(f.finish())
}

fn code_from_u8(v: u8) -> NcclResult {
    match v {
        1 => NcclResult::UnhandledCudaError,
        2 => NcclResult::SystemError,
        3 => NcclResult::InternalError,
        4 => NcclResult::InvalidArgument,
        5 => NcclResult::InvalidUsage,
        // A failure that says "success" or "in progress" is nonsense: report it as remote.
        _ => NcclResult::RemoteError,
    }
}

/// Decodes one frame body (without its length prefix). Pure; never panics on any input.
pub(crate) fn decode(body: &[u8]) -> Result<Msg<'_>> {
    let mut r = Rd(body);
    let kind = r.u8()?;
    if kind == T_DATA {
        let channel = Channel::from_u8(r.u8()?).ok_or_else(|| malformed("unknown channel"))?;
        let tag = r.u32()?;
        return Ok(Msg::Data {
            channel,
            tag,
            payload: r.0,
        });
    }
    if r.u64()? != MAGIC {
        return Err(malformed("wrong magic"));
    }
    let version = r.u32()?;
    if version != VERSION {
        return Err(malformed(&format!(
            "version {version}, this build speaks {VERSION}"
        )));
    }
    let msg = match kind {
        T_HELLO => Msg::Hello(Hello {
            nonce: r.u64()?,
            rank: r.u32()?,
            nranks: r.u32()?,
            timeout_ms: r.u64()?,
            addr: r.addr()?,
        }),
        T_CONNECT => Msg::Connect(Connect {
            nonce: r.u64()?,
            from: r.u32()?,
            nranks: r.u32()?,
            key: r.u64()?,
        }),
        T_TABLE => {
            let nonce = r.u64()?;
            let count = r.u32()? as usize;
            // Check the count against the bytes really present before allocating for it.
            if count > MAX_RANKS || r.0.len() != count * MEMBER_BYTES {
                return Err(malformed("member table size does not match its count"));
            }
            let mut members = Vec::with_capacity(count);
            for _ in 0..count {
                members.push(r.member()?);
            }
            Msg::Table { nonce, members }
        }
        T_FAIL => {
            let code = code_from_u8(r.u8()?);
            let len = r.u32()? as usize;
            let text = r.take(len)?;
            Msg::Fail {
                code,
                message: String::from_utf8_lossy(text).into_owned(),
            }
        }
        _ => return Err(malformed("unknown message type")),
    };
    r.end()?;
    Ok(msg)
}
