//! [`Stream`]: a CUDA stream (or simulator stream) owned by the program, destroyed when dropped.

use crate::cuda::{Device, StreamHandle};
use crate::error::Result;

/// An ordered queue of work on one device. Work queued before the drop still runs.
#[derive(Debug)]
pub struct Stream {
    device: Device,
    handle: StreamHandle,
    owned: bool,
}

impl Stream {
    /// A new non-blocking stream on `device` (never ordered with the legacy default stream).
    pub fn new(device: &Device) -> Result<Stream> {
        Ok(Stream {
            device: device.clone(),
            handle: device.stream_create()?,
            owned: true,
        })
    }

    /// A new blocking stream on `device` (`cudaStreamCreate`'s default: ordered with the
    /// legacy default stream both ways).
    pub fn new_blocking(device: &Device) -> Result<Stream> {
        Ok(Stream {
            device: device.clone(),
            handle: device.stream_create_blocking()?,
            owned: true,
        })
    }

    /// The legacy default stream of `device` (stream 0); dropping it destroys nothing.
    pub fn legacy(device: &Device) -> Stream {
        Stream {
            device: device.clone(),
            handle: StreamHandle(0),
            owned: false,
        }
    }

    /// A stream the program made otherwise (cudarc's), borrowed: dropping it destroys nothing.
    #[cfg_attr(not(feature = "cudarc"), allow(dead_code))]
    pub(crate) fn borrowed(device: &Device, handle: StreamHandle) -> Stream {
        Stream {
            device: device.clone(),
            handle,
            owned: false,
        }
    }

    /// The device it belongs to.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The raw handle (a `CUstream`), for the raw layer.
    pub fn handle(&self) -> StreamHandle {
        self.handle
    }

    /// Waits until all work queued on it so far has run.
    pub fn synchronize(&self) -> Result<()> {
        self.device.stream_sync(self.handle)
    }

    /// Whether all work queued on it so far has run.
    pub fn is_idle(&self) -> Result<bool> {
        self.device.stream_query(self.handle)
    }

    /// Whether a graph capture is open on it (directly or joined through an event).
    pub fn is_capturing(&self) -> Result<bool> {
        self.device.stream_capturing(self.handle)
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.owned {
            if let Err(e) = self.device.stream_destroy(self.handle) {
                log::warn!("destroying a stream: {e}");
            }
        }
    }
}
