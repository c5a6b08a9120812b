//! One communicator's launches run one after another, whatever streams they are issued on: its
//! kernels share step counters and FIFOs. When a launch goes to a different stream than the
//! previous one, the new stream first waits for an event recorded after the previous launch.

use crate::cuda::{Device, StreamHandle};
use crate::error::{Error, Result};
use std::sync::Mutex;

pub struct StreamOrder {
    device: Device,
    /// The stream of the last launch, and an event this type owns for marking it.
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
        if let Some(prev) = last.0.filter(|&p| p != stream) {
            let e = match last.1 {
                Some(e) => e,
                None => {
                    let e = self.device.event_create()?;
                    last.1 = Some(e);
                    e
                }
            };
            self.device.event_record(e, prev)?;
            self.device.stream_wait_event(stream, e)?;
        }
        launch()?;
        last.0 = Some(stream);
        Ok(())
    }
}

impl Drop for StreamOrder {
    fn drop(&mut self) {
        if let Ok(last) = self.last.lock() {
            if let Some(e) = last.1 {
                let _ = self.device.event_destroy(e);
            }
        }
    }
}
