//! The unique id (`ncclUniqueId`): 128 opaque bytes that tell every rank where the bootstrap
//! root listens, a nonce that tells one bootstrap from another, and the bootstrap's secret:
//! every key of the bootstrap comes from it (`keys.rs`), and it never goes on the wire, so a
//! process that reaches the root's port without the id cannot join, nor can a process that
//! listens there first pass as the root.
//!
//! Layout (little-endian): magic u64 | version u32 | flags u32 | nonce u64 | root address
//! (`wire::ADDR_BYTES`) | zero | secret (16 bytes at 48) | zeros. Ids built from
//! `NCCL_COMM_ID` are written deterministically (their secret from `NCCL_RS_COMM_SECRET`), so
//! that every process that builds one from the same settings gets the very same bytes.

use std::fmt;
use std::net::{SocketAddr, ToSocketAddrs};

use super::keys::{self, Secret};
use super::{root, socket, wire};
use crate::error::{Error, Result};
use crate::sockets;

/// The size of a [`UniqueId`] (`NCCL_UNIQUE_ID_BYTES`).
pub const UNIQUE_ID_BYTES: usize = 128;

/// `ncclUniqueId`.
#[derive(Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct UniqueId {
    /// The id's bytes, to send to the other ranks out of band.
    pub internal: [u8; UNIQUE_ID_BYTES],
}

/// Flag: no root was started for this id; rank 0 starts it in `Bootstrap::init` (NCCL_COMM_ID).
pub(crate) const FLAG_ROOT_AT_INIT: u32 = 1;
/// The nonce of ids built from NCCL_COMM_ID: fixed, because every process builds its own id.
const COMM_ID_NONCE: u64 = 0x434f_4d4d_5f49_4400;
/// The secret of ids built from NCCL_COMM_ID when `NCCL_RS_COMM_SECRET` is not set: public,
/// so such a bootstrap keeps out nobody (a warning says so).
const COMM_ID_PUBLIC_SECRET: Secret = Secret([0x7075_626c_6963_3030, 0x7075_626c_6963_3031]);

const OFF_VERSION: usize = 8;
const OFF_FLAGS: usize = 12;
const OFF_NONCE: usize = 16;
const OFF_ADDR: usize = 24;
const OFF_SECRET: usize = 48;
const _: () = assert!(OFF_ADDR + wire::ADDR_BYTES <= OFF_SECRET);

/// What an id says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct IdFields {
    pub root: SocketAddr,
    pub nonce: u64,
    pub flags: u32,
    /// Every key of the bootstrap derives from it (`keys.rs`).
    pub secret: Secret,
}

fn le_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

fn le_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

impl UniqueId {
    pub(crate) fn encode(f: &IdFields) -> UniqueId {
        let mut v = Vec::with_capacity(UNIQUE_ID_BYTES);
        v.extend_from_slice(&wire::MAGIC.to_le_bytes());
        v.extend_from_slice(&wire::VERSION.to_le_bytes());
        v.extend_from_slice(&f.flags.to_le_bytes());
        v.extend_from_slice(&f.nonce.to_le_bytes());
        wire::put_addr(&mut v, &f.root);
        v.resize(OFF_SECRET, 0);
        v.extend_from_slice(&f.secret.0[0].to_le_bytes());
        v.extend_from_slice(&f.secret.0[1].to_le_bytes());
        let mut internal = [0u8; UNIQUE_ID_BYTES];
        internal[..v.len()].copy_from_slice(&v);
        UniqueId { internal }
    }

    pub(crate) fn fields(&self) -> Result<IdFields> {
        let b = &self.internal;
        if le_u64(b, 0) != wire::MAGIC {
            return Err(Error::invalid_argument(
                "a unique id that was never produced by ncclGetUniqueId (wrong magic)",
            ));
        }
        let version = le_u32(b, OFF_VERSION);
        if version != wire::VERSION {
            return Err(Error::invalid_argument(format!(
                "unique id of bootstrap version {version}, this build speaks {}",
                wire::VERSION
            )));
        }
        let root = wire::get_addr(&b[OFF_ADDR..OFF_ADDR + wire::ADDR_BYTES]).map_err(|e| {
            Error::invalid_argument(format!("unique id holds no valid address: {}", e.message))
        })?;
        Ok(IdFields {
            root,
            nonce: le_u64(b, OFF_NONCE),
            flags: le_u32(b, OFF_FLAGS),
            secret: Secret([le_u64(b, OFF_SECRET), le_u64(b, OFF_SECRET + 8)]),
        })
    }

    /// The id's bytes without its secret: what may name the communicator to others (a net
    /// plugin's comm id, RAS) without telling anything of the secret.
    pub fn public_bytes(&self) -> &[u8] {
        &self.internal[..OFF_SECRET]
    }

    /// The root's address and the nonce; Err(invalid_argument) for bytes that are not an id.
    pub fn decode(&self) -> Result<(SocketAddr, u64)> {
        self.fields().map(|f| (f.root, f.nonce))
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Not through `fields()`: that would log a warning for every bad id printed.
        let b = &self.internal;
        let addr = wire::get_addr(&b[OFF_ADDR..OFF_ADDR + wire::ADDR_BYTES]);
        match addr {
            Ok(a) if le_u64(b, 0) == wire::MAGIC => write!(
                f,
                "UniqueId(root {a}, nonce {:#018x})",
                le_u64(b, OFF_NONCE)
            ),
            _ => write!(f, "UniqueId(<not a bootstrap id>)"),
        }
    }
}

/// The id for `NCCL_COMM_ID=host:port`: no root is started now; rank 0 starts it at init.
pub(crate) fn id_from_comm_id(value: &str) -> Result<UniqueId> {
    let v = value.trim();
    let bad = |why: String| {
        Error::invalid_argument(format!(
            "NCCL_COMM_ID={v:?} is not a usable <ip>:<port> ({why})"
        ))
    };
    let root = match v.parse::<SocketAddr>() {
        Ok(a) => a,
        Err(_) => {
            let all: Vec<SocketAddr> = v
                .to_socket_addrs()
                .map_err(|e| bad(e.to_string()))?
                .collect();
            *all.iter()
                .find(|a| a.is_ipv4())
                .or_else(|| all.first())
                .ok_or_else(|| bad("the name resolves to nothing".into()))?
        }
    };
    if root.port() == 0 {
        return Err(bad("port 0".into()));
    }
    Ok(UniqueId::encode(&IdFields {
        root,
        nonce: COMM_ID_NONCE,
        flags: FLAG_ROOT_AT_INIT,
        secret: comm_id_secret(),
    }))
}

/// The secret of an NCCL_COMM_ID bootstrap: from `NCCL_RS_COMM_SECRET` (any text the job's
/// processes share, which the job's launcher must keep from other users), or a public one,
/// with a warning (once per process): anyone who reaches the root's address can then join.
fn comm_id_secret() -> Secret {
    match crate::env::RS_COMM_SECRET.raw() {
        Some(text) if !text.is_empty() => {
            // Two PRF outputs of the text under fixed keys: the same in every process.
            let a = keys::siphash24(Secret([0x636f_6d6d, 0x7365_6372_6574]), text.as_bytes());
            let b = keys::siphash24(Secret([0x636f_6d6d, 0x7365_6372_6575]), text.as_bytes());
            Secret([a, b])
        }
        _ => {
            static WARNED: std::sync::Once = std::sync::Once::new();
            WARNED.call_once(|| {
                log::warn!(
                    "NCCL_COMM_ID is set without NCCL_RS_COMM_SECRET: any process that reaches \
                     the root's address can join this job as a rank; set NCCL_RS_COMM_SECRET to \
                     the same private text in every rank"
                )
            });
            COMM_ID_PUBLIC_SECRET
        }
    }
}

/// `ncclGetUniqueId`. Starts the bootstrap root (a detached thread listening on this host's
/// address, see `socket::choose_address`) and returns the id that leads the ranks to it. With
/// `NCCL_COMM_ID=ip:port` set, the id encodes that address instead and the root is started by
/// the rank 0 that calls `Bootstrap::init`.
pub fn get_unique_id() -> Result<UniqueId> {
    if let Some(v) = crate::env::COMM_ID.raw() {
        if !v.trim().is_empty() {
            return id_from_comm_id(&v);
        }
    }
    new_root_id()
}

/// Starts a fresh root on this host and returns its id, whatever `NCCL_COMM_ID` says: for ids
/// made inside the library (communicator split, ...), where the fixed NCCL_COMM_ID address
/// would clash with the bootstrap that is already using it.
pub fn new_root_id() -> Result<UniqueId> {
    new_root_id_on(socket::choose_address()?)
}

crate::internal! {
    /// As [`new_root_id`], with the root on the loopback address: for communicators whose ranks
    /// are all in this process (`ncclCommInitAll`), whose bootstrap need not leave the host, nor
    /// depend on an interface being up. (Public with `internals`: the tests' ids, which must
    /// never lead to the machine's own interfaces.)
    fn new_local_root_id() -> Result<UniqueId> {
        new_root_id_on(socket::loopback_address())
    }
}

fn new_root_id_on(ip: std::net::IpAddr) -> Result<UniqueId> {
    let listener = sockets::listen(SocketAddr::new(ip, 0), false)
        .map_err(|e| Error::system(format!("bootstrap root: cannot listen on {ip}: {e}")))?;
    let root = sockets::local_addr(&listener)
        .map_err(|e| Error::system(format!("bootstrap root: no local address: {e}")))?;
    let nonce = sockets::random_nonce();
    let secret = Secret::draw()?;
    root::spawn(listener, root, nonce, secret)?;
    Ok(UniqueId::encode(&IdFields {
        root,
        nonce,
        flags: 0,
        secret,
    }))
}
