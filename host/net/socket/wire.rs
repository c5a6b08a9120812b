//! What travels: the handle a listener publishes, the hello that opens every socket of a
//! connection, the header that announces every message on the control socket, and how a
//! message's bytes are cut across the data sockets.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV6};
use std::ops::Range;

use crate::error::{Error, Result};
use crate::net::{Handle, HANDLE_BYTES};

/// Protocol version, in the handle and in every hello (2: the header says whether its
/// payload follows inline).
pub const VERSION: u8 = 3;
const HANDLE_MAGIC: [u8; 8] = *b"NCRSSOCK";
const HELLO_MAGIC: [u8; 8] = *b"NCRSHELO";
/// The check word of a header whose payload travels in pieces on the data sockets, and of one
/// whose payload follows it on the control socket.
const HEADER_CHECK: u32 = 0x4e43_4d48;
const HEADER_CHECK_INLINE: u32 = 0x4e43_4d49;

/// Most helper threads per connection, and most data sockets (NCCL's MAX_THREADS, MAX_SOCKETS).
pub const MAX_THREADS: usize = 16;
pub const MAX_SOCKETS: usize = 64;

/// A message sent in pieces is cut across the data sockets in pieces of at least this many
/// bytes (NCCL's MIN_CHUNKSIZE).
pub const MIN_CHUNK: usize = 64 << 10;

/// By default a sender writes messages shorter than this inline on the control socket, longer
/// ones in pieces (`NCCL_RS_SOCKET_INLINE_BYTES` moves it; each header says which way its
/// payload goes, so the two ends need not agree on it).
pub const DEFAULT_INLINE_BELOW: usize = MIN_CHUNK;

/// The handle: where the listener is, and which listener it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandleInfo {
    pub addr: SocketAddr,
    /// Names the listener, and is its secret: 128 random bits, known only to whoever got the
    /// handle (through the bootstrap). Every hello repeats it, so a stale handle whose port
    /// another listener took, or a stranger who does not have the handle, is refused.
    pub tag: u128,
}

// Layout: magic[8] version family(4|6) port(be16) addr[16] scope(le32) tag(le128),
// zero-padded.
pub fn encode_handle(h: &HandleInfo) -> Handle {
    let mut out = [0u8; HANDLE_BYTES];
    out[0..8].copy_from_slice(&HANDLE_MAGIC);
    out[8] = VERSION;
    out[10..12].copy_from_slice(&h.addr.port().to_be_bytes());
    match h.addr {
        SocketAddr::V4(a) => {
            out[9] = 4;
            out[12..16].copy_from_slice(&a.ip().octets());
        }
        SocketAddr::V6(a) => {
            out[9] = 6;
            out[12..28].copy_from_slice(&a.ip().octets());
            out[28..32].copy_from_slice(&a.scope_id().to_le_bytes());
        }
    }
    out[32..48].copy_from_slice(&h.tag.to_le_bytes());
    out
}

pub fn decode_handle(b: &Handle) -> Result<HandleInfo> {
    if b[0..8] != HANDLE_MAGIC {
        return Err(Error::invalid_argument(
            "NET/Socket: the connection handle was not made by this socket network",
        ));
    }
    if b[8] != VERSION {
        return Err(Error::invalid_argument(format!(
            "NET/Socket: connection handle of protocol version {} (this library speaks {VERSION})",
            b[8]
        )));
    }
    let port = u16::from_be_bytes([b[10], b[11]]);
    let mut a16 = [0u8; 16];
    a16.copy_from_slice(&b[12..28]);
    let addr = match b[9] {
        4 => SocketAddr::new(
            IpAddr::V4(Ipv4Addr::new(a16[0], a16[1], a16[2], a16[3])),
            port,
        ),
        6 => SocketAddr::V6(SocketAddrV6::new(
            Ipv6Addr::from(a16),
            port,
            0,
            u32::from_le_bytes([b[28], b[29], b[30], b[31]]),
        )),
        f => {
            return Err(Error::invalid_argument(format!(
                "NET/Socket: connection handle with unknown address family {f}"
            )))
        }
    };
    if port == 0 || addr.ip().is_unspecified() {
        return Err(Error::invalid_argument(format!(
            "NET/Socket: connection handle names no reachable address ({addr})"
        )));
    }
    let mut tag = [0u8; 16];
    tag.copy_from_slice(&b[32..48]);
    Ok(HandleInfo {
        addr,
        tag: u128::from_le_bytes(tag),
    })
}

/// Bytes of a hello.
pub const HELLO_BYTES: usize = 48;

/// Which connection a socket belongs to: chosen by the connector, unique among its live
/// connections (process id and a per-process counter; never random).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnId {
    pub pid: u32,
    pub serial: u64,
}

/// The first bytes on every socket of a connection, connector to acceptor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub tag: u128,
    pub conn: ConnId,
    /// None: the control socket; Some(i): data socket i.
    pub data_index: Option<usize>,
    pub nthreads: usize,
    pub nsocks: usize,
}

// Layout: magic[8] version kind index nthreads nsocks pad[3] tag(le128) pid(le32) pad[4]
// serial(le64).
pub fn encode_hello(h: &Hello) -> [u8; HELLO_BYTES] {
    let mut out = [0u8; HELLO_BYTES];
    out[0..8].copy_from_slice(&HELLO_MAGIC);
    out[8] = VERSION;
    out[9] = u8::from(h.data_index.is_some());
    out[10] = h.data_index.unwrap_or(0) as u8;
    out[11] = h.nthreads as u8;
    out[12] = h.nsocks as u8;
    out[16..32].copy_from_slice(&h.tag.to_le_bytes());
    out[32..36].copy_from_slice(&h.conn.pid.to_le_bytes());
    out[40..48].copy_from_slice(&h.conn.serial.to_le_bytes());
    out
}

/// A hello, or why it is not one.
pub fn decode_hello(b: &[u8; HELLO_BYTES]) -> std::result::Result<Hello, String> {
    if b[0..8] != HELLO_MAGIC {
        return Err("not a socket-network hello".into());
    }
    if b[8] != VERSION {
        return Err(format!("protocol version {} (expected {VERSION})", b[8]));
    }
    let (nthreads, nsocks) = (b[11] as usize, b[12] as usize);
    if !(1..=MAX_THREADS).contains(&nthreads) || nsocks == 0 || nthreads * nsocks > MAX_SOCKETS {
        return Err(format!("{nthreads} threads x {nsocks} sockets"));
    }
    let data_index = match b[9] {
        0 => None,
        1 if (b[10] as usize) < nthreads * nsocks => Some(b[10] as usize),
        _ => return Err(format!("socket kind {} index {}", b[9], b[10])),
    };
    let le64 = |r: Range<usize>| {
        let mut x = [0u8; 8];
        x.copy_from_slice(&b[r]);
        u64::from_le_bytes(x)
    };
    let mut tag = [0u8; 16];
    tag.copy_from_slice(&b[16..32]);
    Ok(Hello {
        tag: u128::from_le_bytes(tag),
        conn: ConnId {
            pid: u32::from_le_bytes([b[32], b[33], b[34], b[35]]),
            serial: le64(40..48),
        },
        data_index,
        nthreads,
        nsocks,
    })
}

/// Bytes of a message header on the control socket.
pub const HEADER_BYTES: usize = 16;
/// The tag of the header a sending end writes when it closes cleanly: the receiving end then
/// stops reading without an error (a peer that dies writes none, and its end of the stream is an
/// error). Data messages never carry it.
pub const CLOSE_TAG: u32 = u32::MAX;

// Layout: len(le64) tag(le32) check(le32); the check word says whether the payload follows
// inline.
pub fn encode_header(len: usize, tag: u32, inline: bool) -> [u8; HEADER_BYTES] {
    let mut out = [0u8; HEADER_BYTES];
    out[0..8].copy_from_slice(&(len as u64).to_le_bytes());
    out[8..12].copy_from_slice(&tag.to_le_bytes());
    let check = match inline {
        true => HEADER_CHECK_INLINE,
        false => HEADER_CHECK,
    };
    out[12..16].copy_from_slice(&check.to_le_bytes());
    out
}

/// (length, tag, inline), or None when the bytes are not a header (the stream lost its
/// framing).
pub fn decode_header(b: &[u8; HEADER_BYTES]) -> Option<(usize, u32, bool)> {
    let inline = match u32::from_le_bytes([b[12], b[13], b[14], b[15]]) {
        HEADER_CHECK_INLINE => true,
        HEADER_CHECK => false,
        _ => return None,
    };
    let mut len = [0u8; 8];
    len.copy_from_slice(&b[0..8]);
    let len = usize::try_from(u64::from_le_bytes(len)).ok()?;
    if len > isize::MAX as usize {
        return None;
    }
    Some((len, u32::from_le_bytes([b[8], b[9], b[10], b[11]]), inline))
}

/// Does a sender whose limit is `inline_below` write a `len`-byte message inline, right after
/// its header on the control socket? An empty one always.
pub fn sends_inline(len: usize, inline_below: usize) -> bool {
    len == 0 || len < inline_below
}

/// The bytes of a `len`-byte message sent in pieces that data socket `index` of `nsocks`
/// carries: pieces of ceil(len / nsocks) bytes rounded up to 4 KiB and at least [`MIN_CHUNK`],
/// in socket order, so that a message just over the threshold uses the first sockets only.
/// Both ends compute it, so pieces need no framing of their own.
pub fn piece(len: usize, nsocks: usize, index: usize) -> Range<usize> {
    if nsocks == 0 {
        return 0..0;
    }
    let chunk = len
        .div_ceil(nsocks)
        .max(MIN_CHUNK)
        .next_multiple_of(4096)
        .min(len);
    let start = chunk.saturating_mul(index).min(len);
    start..start.saturating_add(chunk).min(len)
}

/// Which helper thread serves data socket `index` (NCCL's: socket i to thread i mod nthreads,
/// so that the first sockets, which small messages use, are spread over the threads).
pub fn thread_of(index: usize, nthreads: usize) -> usize {
    index % nthreads.max(1)
}
