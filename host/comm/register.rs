//! User buffer registration (`ncclCommRegister` / `ncclCommDeregister`). Registering tells the
//! communicator a buffer will be used in its operations: a send/recv between registered
//! buffers of ranks that map each other's memory skips the FIFO (the sender writes into the
//! receiver's buffer; see the send/recv enqueue and the device's `prims::direct`), and so do
//! the p2p connections of ring and tree collectives on Simple steps between registered output
//! buffers (the sender writes into its successor's output). Unregistered buffers, and
//! registered ones whose peer did not register, take the FIFO as before. Operations captured
//! in a CUDA graph count as registered (NCCL_GRAPH_REGISTER; comm/graph_reg.rs).
//! `NCCL_LOCAL_REGISTER=0` keeps the records but turns the zero-copy path off.

use crate::cuda::{DevPtr, Device};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::sync::Mutex;

/// What `register` returns: an opaque, non-zero number, unique within the communicator.
pub type RegHandle = u64;

#[derive(Default)]
struct Table {
    /// The last handle given.
    last: RegHandle,
    /// handle → (buffer, bytes).
    buffers: HashMap<RegHandle, (DevPtr, usize)>,
}

/// A communicator's registered buffers.
#[derive(Default)]
pub struct Registrations {
    table: Mutex<Table>,
    /// NCCL_LOCAL_REGISTER: registered buffers may take the zero-copy path.
    zero_copy: bool,
    /// NCCL_GRAPH_REGISTER: buffers of operations captured in a CUDA graph count as
    /// registered.
    graph: bool,
}

impl Registrations {
    /// An empty table; `zero_copy` from NCCL_LOCAL_REGISTER, `graph` from
    /// NCCL_GRAPH_REGISTER.
    pub fn new(zero_copy: bool, graph: bool) -> Registrations {
        Registrations {
            zero_copy,
            graph,
            ..Registrations::default()
        }
    }

    /// Whether a send or receive of `bytes` at `buff` may take the zero-copy path: a
    /// registered buffer, or (graph registration) any buffer of a captured operation. A
    /// captured buffer needs nothing registered for peers of this process (they address it
    /// as it is); peers in other processes get its record at capture (comm/graph_reg.rs).
    pub fn p2p_zero_copy(&self, buff: DevPtr, bytes: usize, captured: bool) -> bool {
        self.zero_copy(buff, bytes) || (self.graph && captured && bytes > 0)
    }

    /// Whether a ring collective's output buffer (`bytes` at `buff`) may take the zero-copy
    /// path: registered, or (graph registration) the call is captured, which `captured` tells
    /// (asked only then).
    pub fn coll_zero_copy(
        &self,
        buff: DevPtr,
        bytes: usize,
        captured: impl FnOnce() -> Result<bool>,
    ) -> Result<bool> {
        Ok(self.zero_copy(buff, bytes) || (self.graph && bytes > 0 && captured()?))
    }

    /// NCCL_GRAPH_REGISTER: buffers of captured operations count as registered.
    pub fn graph_enabled(&self) -> bool {
        self.graph
    }

    /// NCCL_LOCAL_REGISTER: registered buffers may take the zero-copy path.
    pub fn zero_copy_enabled(&self) -> bool {
        self.zero_copy
    }

    /// Whether an operation on `bytes` at `buff` may take the zero-copy path: the range lies
    /// inside one registered buffer and NCCL_LOCAL_REGISTER allows it.
    pub fn zero_copy(&self, buff: DevPtr, bytes: usize) -> bool {
        self.zero_copy && bytes > 0 && self.covers(buff, bytes)
    }

    /// Records `bytes` at `buff`, which must be memory of `device`.
    pub fn register(&self, device: &Device, buff: DevPtr, bytes: usize) -> Result<RegHandle> {
        if buff == 0 {
            return Err(Error::invalid_argument(
                "ncclCommRegister: buff is a null pointer",
            ));
        }
        if bytes == 0 {
            return Err(Error::invalid_argument("ncclCommRegister: size is 0"));
        }
        buff.checked_add(bytes as u64 - 1).ok_or_else(|| {
            Error::invalid_argument(format!("ncclCommRegister: {buff:#x} + {bytes} overflows"))
        })?;
        match device.pointer_extent(buff, bytes)? {
            Some((d, avail)) if d == device.ordinal && avail >= bytes => {}
            Some((d, avail)) if d == device.ordinal => {
                return Err(Error::invalid_argument(format!(
                    "ncclCommRegister: buff {buff:#x} is too short: {bytes} bytes registered, \
                     its allocation holds {avail} from there"
                )))
            }
            Some((d, _)) => {
                return Err(Error::invalid_argument(format!(
                    "ncclCommRegister: {buff:#x} is on device {d}, the communicator on device {}",
                    device.ordinal
                )))
            }
            None => {
                return Err(Error::invalid_argument(format!(
                    "ncclCommRegister: {buff:#x} is not device memory ({bytes} bytes)"
                )))
            }
        }
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        t.last += 1;
        let h = t.last;
        t.buffers.insert(h, (buff, bytes));
        Ok(h)
    }

    /// A fresh handle that records no buffer: a graph registration's, which peers in other
    /// processes know by it (unique among this communicator's registrations) and which does
    /// not make the buffer count as registered outside its graph.
    pub fn fresh_handle(&self) -> RegHandle {
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        t.last += 1;
        t.last
    }

    /// Whether `bytes` at `buff` lie inside one registered buffer.
    pub fn covers(&self, buff: DevPtr, bytes: usize) -> bool {
        let Some(end) = buff.checked_add(bytes as u64) else {
            return false;
        };
        let t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        t.buffers
            .values()
            .any(|&(b, n)| b <= buff && end <= b + n as u64)
    }

    /// Forgets a registration made on this communicator.
    pub fn deregister(&self, handle: RegHandle) -> Result<()> {
        let mut t = self.table.lock().unwrap_or_else(|p| p.into_inner());
        t.buffers.remove(&handle).map(|_| ()).ok_or_else(|| {
            Error::invalid_argument(format!(
                "ncclCommDeregister: handle {handle:#x} is not a registration of this communicator"
            ))
        })
    }
}
