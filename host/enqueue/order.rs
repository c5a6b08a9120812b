//! One communicator's launches run one after another, whatever streams they are issued on: its
//! kernels share step counters and FIFOs. After every launch an event this type owns is
//! recorded on the launch's stream; the next launch on another stream waits for it first, and
//! finalize/destroy wait for it to know the communicator's work is done — without ever touching
//! a user's stream after the call that used it (the user may have destroyed it since).

use crate::cuda::{Device, StreamHandle};
use crate::error::{Error, Result};
use std::sync::Mutex;

pub struct StreamOrder {
    device: Device,
    /// The stream of the last launch and the event recorded after it (created on first use).
    last: Mutex<(Option<StreamHandle>, Option<u64>)>,
}

impl StreamOrder {
    pub fn new(device: Device) -> StreamOrder {
        StreamOrder {
            device,
            last: Mutex::new((None, None)),
        }
    }

    /// Runs `launch` on `stream` after everything this communicator launched before.
    pub fn launch(&self, stream: StreamHandle, launch: impl FnOnce() -> Result<()>) -> Result<()> {
        let mut last = self
            .last
            .lock()
            .map_err(|_| Error::internal("launch order poisoned"))?;
        let done = match last.1 {
            Some(e) => e,
            None => {
                let e = self.device.event_create()?;
                last.1 = Some(e);
                e
            }
        };
        if last.0.is_some_and(|p| p != stream) {
            self.device.stream_wait_event(stream, done)?;
        }
        launch()?;
        self.device.event_record(done, stream)?;
        last.0 = Some(stream);
        Ok(())
    }

    /// Waits until everything launched so far has finished.
    pub fn wait_idle(&self) -> Result<()> {
        let last = self
            .last
            .lock()
            .map_err(|_| Error::internal("launch order poisoned"))?;
        match last.1 {
            Some(e) => self.device.event_sync(e),
            None => Ok(()),
        }
    }
}

impl Drop for StreamOrder {
    fn drop(&mut self) {
        if let Ok(last) = self.last.lock() {
            if let Some(e) = last.1 {
                let _ = self.device.event_sync(e);
                let _ = self.device.event_destroy(e);
            }
        }
    }
}
