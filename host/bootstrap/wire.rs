//! What travels on the bootstrap sockets. A frame is a little-endian `u32` body length followed
//! by the body; the body's first byte says which message it is. Encoding and decoding are pure
//! functions (bytes in, message or error out, no socket in sight) so that the decoder can be
//! fuzzed: every length and count in a body is checked against what is really there.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};

use crate::error::{Error, NcclResult, Result};

/// "nccl-rs\0": the first field of every control message and of the unique id.
pub(crate) const MAGIC: u64 = 0x6e63_636c_2d72_7300;
/// Bumped whenever a message layout changes, so that two builds never misread each other.
pub(crate) const VERSION: u32 = 5;
/// Most ranks one bootstrap accepts (keeps the root's address table a sane size).
pub(crate) const MAX_RANKS: usize = 1 << 20;
/// Largest body accepted on a connection before it proved to be one of ours (hello, connect),
/// and of a root's answer.
pub(crate) const MAX_CTRL_BODY: usize = 1024;
/// Largest body of a data frame between ranks.
pub(crate) const MAX_DATA_BODY: usize = 256 << 20;
/// Bytes of a data frame body in front of the payload: type, channel, tag.
pub(crate) const DATA_HEADER: usize = 1 + 1 + 4;
/// Largest payload of one `send` or of one rank's `allgather` contribution.
pub(crate) const MAX_PAYLOAD: usize = MAX_DATA_BODY - DATA_HEADER;
/// Encoded size of a socket address: family, port, 16 address bytes, IPv6 scope id.
pub(crate) const ADDR_BYTES: usize = 1 + 2 + 16 + 4;
/// Longest error text the root sends back.
pub(crate) const MAX_FAIL_TEXT: usize = 900;

const T_HELLO: u8 = 1;
const T_ANSWER: u8 = 2;
const T_FAIL: u8 = 3;
const T_CONNECT: u8 = 4;
const T_DATA: u8 = 5;
const T_CHALLENGE: u8 = 6;
const T_PROOF: u8 = 7;

/// Which conversation a data frame belongs to; user tags and internal traffic never mix.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Channel {
    User,
    Allgather,
    Barrier,
    /// Internal set-up traffic: the address table's gather and spread at init.
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

/// The first frame on every accepted bootstrap connection (root's or rank's): which
/// bootstrap this is, and a fresh challenge the connector's MAC must cover.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Challenge {
    pub nonce: u64,
    pub challenge: u128,
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
    /// The rank's own challenge, which the root's answer must cover.
    pub challenge: u128,
    /// Under the join key, over both challenges and every field above ([`hello_fields`]).
    pub mac: u64,
}

/// The root's answer once every rank arrived: where this rank's parent in the bootstrap's
/// gather tree listens (none for the tree's root, rank 0 of the root's ranks). That is all
/// the root sends a rank, whatever the number of ranks: the table is gathered and spread
/// along the tree (`init.rs`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Answer {
    pub parent: Option<SocketAddr>,
    /// Under the join key, over both challenges, the rank, and the parent ([`answer_fields`]).
    pub mac: u64,
}

/// A rank's greeting on a connection it opened to a peer, after the peer's [`Challenge`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Connect {
    pub nonce: u64,
    pub from: u32,
    pub nranks: u32,
    /// The connector's challenge, which the peer's [`Msg::Proof`] must cover.
    pub challenge: u128,
    /// Under the key of the pair, over both challenges and both ranks ([`greet_fields`]).
    pub mac: u64,
}

#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Msg<'a> {
    Challenge(Challenge),
    Hello(Hello),
    Answer(Answer),
    /// Root to a rank: the bootstrap cannot complete, and why; `mac` as for an answer, over
    /// the code and the text.
    Fail {
        code: NcclResult,
        message: String,
        mac: u64,
    },
    Connect(Connect),
    /// A peer's answer to a greeting: the MAC of the pair over both challenges, for the other
    /// purpose (`keys::Purpose::Proof`).
    Proof {
        mac: u64,
    },
    Data {
        channel: Channel,
        tag: u32,
        payload: &'a [u8],
    },
}

/// The bytes a hello's MAC covers, with the root's challenge `c_root`.
pub(crate) fn hello_fields(h: &Hello, c_root: u128) -> Vec<u8> {
    let mut v = Vec::with_capacity(64 + ADDR_BYTES);
    v.extend_from_slice(&c_root.to_le_bytes());
    v.extend_from_slice(&h.challenge.to_le_bytes());
    v.extend_from_slice(&h.nonce.to_le_bytes());
    v.extend_from_slice(&h.rank.to_le_bytes());
    v.extend_from_slice(&h.nranks.to_le_bytes());
    v.extend_from_slice(&h.timeout_ms.to_le_bytes());
    put_addr(&mut v, &h.addr);
    v
}

/// The bytes an answer's (or a failure's) MAC covers: both challenges, the rank and what the
/// root says (`said`: the parent's encoded address, or the failure's code and text).
pub(crate) fn answer_fields(c_root: u128, c_rank: u128, rank: u32, said: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(36 + said.len());
    v.extend_from_slice(&c_root.to_le_bytes());
    v.extend_from_slice(&c_rank.to_le_bytes());
    v.extend_from_slice(&rank.to_le_bytes());
    v.extend_from_slice(said);
    v
}

/// What an answer says, as its MAC covers it.
pub(crate) fn parent_bytes(parent: Option<SocketAddr>) -> Vec<u8> {
    let mut v = Vec::with_capacity(ADDR_BYTES);
    if let Some(p) = parent {
        put_addr(&mut v, &p);
    }
    v
}

/// What a failure says, as its MAC covers it.
pub(crate) fn fail_bytes(code: NcclResult, message: &str) -> Vec<u8> {
    let mut v = vec![code as u8];
    v.extend_from_slice(cut_text(message).as_bytes());
    v
}

/// The bytes a greeting's MAC (and its proof's) covers: the acceptor's challenge, the
/// connector's, the connector's rank, the acceptor's, and the bootstrap's size.
pub(crate) fn greet_fields(c_acc: u128, c_conn: u128, from: u32, to: u32, n: u32) -> Vec<u8> {
    let mut v = Vec::with_capacity(44);
    v.extend_from_slice(&c_acc.to_le_bytes());
    v.extend_from_slice(&c_conn.to_le_bytes());
    v.extend_from_slice(&from.to_le_bytes());
    v.extend_from_slice(&to.to_le_bytes());
    v.extend_from_slice(&n.to_le_bytes());
    v
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
    fn u128(&mut self, v: u128) {
        self.0.extend_from_slice(&v.to_le_bytes());
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

/// A table of addresses, `ADDR_BYTES` each, by index (the address table spread down the
/// gather tree).
pub(crate) fn encode_addrs(addrs: &[SocketAddr]) -> Vec<u8> {
    let mut v = Vec::with_capacity(addrs.len() * ADDR_BYTES);
    for a in addrs {
        put_addr(&mut v, a);
    }
    v
}

/// Decodes a table of exactly `n` addresses; any other size is a malformed message.
pub(crate) fn decode_addrs(b: &[u8], n: usize) -> Result<Vec<SocketAddr>> {
    if n > MAX_RANKS || n.checked_mul(ADDR_BYTES) != Some(b.len()) {
        return Err(malformed("address table size does not match its count"));
    }
    let mut r = Rd(b);
    let addrs = (0..n).map(|_| r.addr()).collect::<Result<Vec<_>>>()?;
    r.end()?;
    Ok(addrs)
}

/// Bytes of one entry of an indexed address list.
const INDEXED_BYTES: usize = 4 + ADDR_BYTES;

/// Addresses with their indices (a subtree's addresses, gathered up the tree).
pub(crate) fn encode_indexed(entries: &[(usize, SocketAddr)]) -> Vec<u8> {
    let mut v = Vec::with_capacity(entries.len() * INDEXED_BYTES);
    for (i, a) in entries {
        v.extend_from_slice(&(*i as u32).to_le_bytes());
        put_addr(&mut v, a);
    }
    v
}

/// Decodes an indexed address list whose indices are all below `n`.
pub(crate) fn decode_indexed(b: &[u8], n: usize) -> Result<Vec<(usize, SocketAddr)>> {
    if !b.len().is_multiple_of(INDEXED_BYTES) || b.len() / INDEXED_BYTES > n {
        return Err(malformed("indexed address list of a wrong size"));
    }
    let mut r = Rd(b);
    let mut out = Vec::with_capacity(b.len() / INDEXED_BYTES);
    while !r.0.is_empty() {
        let i = r.u32()? as usize;
        if i >= n {
            return Err(malformed("index out of range in an address list"));
        }
        out.push((i, r.addr()?));
    }
    Ok(out)
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
    fn u128(&mut self) -> Result<u128> {
        Ok(u128::from_le_bytes(self.array()?))
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

pub(crate) fn encode_challenge(c: &Challenge) -> Vec<u8> {
    let mut f = Frame::control(T_CHALLENGE, 24);
    f.u64(c.nonce);
    f.u128(c.challenge);
    f.finish()
}

pub(crate) fn encode_hello(h: &Hello) -> Vec<u8> {
    let mut f = Frame::control(T_HELLO, 48 + ADDR_BYTES);
    f.u64(h.nonce);
    f.u32(h.rank);
    f.u32(h.nranks);
    f.u64(h.timeout_ms);
    put_addr(&mut f.0, &h.addr);
    f.u128(h.challenge);
    f.u64(h.mac);
    f.finish()
}

pub(crate) fn encode_answer(a: &Answer) -> Vec<u8> {
    let mut f = Frame::control(T_ANSWER, 9 + ADDR_BYTES);
    match a.parent {
        Some(p) => {
            f.u8(1);
            put_addr(&mut f.0, &p);
        }
        None => f.u8(0),
    }
    f.u64(a.mac);
    f.finish()
}

pub(crate) fn encode_connect(c: &Connect) -> Vec<u8> {
    let mut f = Frame::control(T_CONNECT, 40);
    f.u64(c.nonce);
    f.u32(c.from);
    f.u32(c.nranks);
    f.u128(c.challenge);
    f.u64(c.mac);
    f.finish()
}

pub(crate) fn encode_proof(mac: u64) -> Vec<u8> {
    let mut f = Frame::control(T_PROOF, 8);
    f.u64(mac);
    f.finish()
}

pub(crate) fn encode_fail(code: NcclResult, message: &str, mac: u64) -> Vec<u8> {
    let text = cut_text(message).as_bytes();
    let mut f = Frame::control(T_FAIL, 13 + text.len());
    f.u8(code as u8);
    f.u32(text.len() as u32);
    f.0.extend_from_slice(text);
    f.u64(mac);
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
        T_CHALLENGE => Msg::Challenge(Challenge {
            nonce: r.u64()?,
            challenge: r.u128()?,
        }),
        T_HELLO => Msg::Hello(Hello {
            nonce: r.u64()?,
            rank: r.u32()?,
            nranks: r.u32()?,
            timeout_ms: r.u64()?,
            addr: r.addr()?,
            challenge: r.u128()?,
            mac: r.u64()?,
        }),
        T_ANSWER => {
            let parent = match r.u8()? {
                0 => None,
                1 => Some(r.addr()?),
                _ => return Err(malformed("answer with a bad parent flag")),
            };
            Msg::Answer(Answer {
                parent,
                mac: r.u64()?,
            })
        }
        T_CONNECT => Msg::Connect(Connect {
            nonce: r.u64()?,
            from: r.u32()?,
            nranks: r.u32()?,
            challenge: r.u128()?,
            mac: r.u64()?,
        }),
        T_PROOF => Msg::Proof { mac: r.u64()? },
        T_FAIL => {
            let code = code_from_u8(r.u8()?);
            let len = r.u32()? as usize;
            let text = r.take(len)?;
            Msg::Fail {
                code,
                message: String::from_utf8_lossy(text).into_owned(),
                mac: r.u64()?,
            }
        }
        _ => return Err(malformed("unknown message type")),
    };
    r.end()?;
    Ok(msg)
}
