//! User buffer registration (`ncclCommRegister` / `ncclCommDeregister`). Registering tells the
//! communicator a buffer will be used in its operations; NCCL uses that for zero-copy paths.
//! We check and record the buffer; the data paths still copy through the FIFOs, which is
//! correct for registered and unregistered buffers alike (registration is a hint in NCCL too).

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
}

impl Registrations {
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
