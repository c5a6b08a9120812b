//! [`Event`]: a CUDA event (or simulator event) owned by the program, destroyed when dropped.

use super::stream::Stream;
use crate::cuda::Device;
use crate::error::{Error, Result};

/// A marker in a stream's work: recorded on a stream, it happens once the work queued there
/// before it has run. Timed, so two of them measure the time between (`cudaEventCreate`).
#[derive(Debug)]
pub struct Event {
    device: Device,
    raw: u64,
}

impl Event {
    /// A new timing event on `device`.
    pub fn new(device: &Device) -> Result<Event> {
        Ok(Event {
            device: device.clone(),
            raw: device.event_create()?,
        })
    }

    /// The device it belongs to.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Records it on `stream` (of the same device): it happens once the work queued there
    /// so far has run.
    pub fn record(&self, stream: &Stream) -> Result<()> {
        self.same_device("Event::record: the stream", stream.device())?;
        self.device.event_record(self.raw, stream.handle())
    }

    /// Waits until it has happened (at once if it was never recorded).
    pub fn synchronize(&self) -> Result<()> {
        self.device.event_sync(self.raw)
    }

    /// Whether it has happened, without waiting.
    pub fn is_complete(&self) -> Result<bool> {
        self.device.event_query(self.raw)
    }

    /// Milliseconds from this event to `end`, both recorded and complete.
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32> {
        self.same_device("Event::elapsed_ms: the end event", end.device())?;
        self.device.event_elapsed_ms(self.raw, end.raw)
    }

    fn same_device(&self, what: &str, other: &Device) -> Result<()> {
        if other.ordinal != self.device.ordinal {
            return Err(Error::invalid_argument(format!(
                "{what} is on device {} but the event is on device {}",
                other.ordinal, self.device.ordinal
            )));
        }
        Ok(())
    }
}

impl Stream {
    /// Makes work queued on this stream from now on wait until `event` has happened (the
    /// event may be of another device: `cudaStreamWaitEvent`).
    pub fn wait(&self, event: &Event) -> Result<()> {
        self.device().stream_wait_event(self.handle(), event.raw)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if let Err(e) = self.device.event_destroy(self.raw) {
            log::warn!("destroying an event: {e}");
        }
    }
}
