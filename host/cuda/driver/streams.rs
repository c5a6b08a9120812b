//! Streams and events.

use super::*;

impl Streams for Device {
    fn stream_create(&self, blocking: bool) -> Result<StreamHandle> {
        self.make_current()?;
        let mut s = std::ptr::null_mut();
        // CU_STREAM_DEFAULT = 0 (ordered with the legacy stream), CU_STREAM_NON_BLOCKING = 1.
        let flags = if blocking { 0 } else { 1 };
        // SAFETY: out-parameter.
        check(
            unsafe { sys::cuStreamCreate(&mut s, flags) },
            "cuStreamCreate",
        )?;
        Ok(StreamHandle(s as u64))
    }

    fn stream_destroy(&self, s: StreamHandle) -> Result<()> {
        self.make_current()?;
        // SAFETY: s came from stream_create.
        check(
            unsafe { sys::cuStreamDestroy_v2(s.0 as sys::CUstream) },
            "cuStreamDestroy",
        )
    }

    fn stream_sync(&self, s: StreamHandle) -> Result<()> {
        self.make_current()?;
        // SAFETY: s is a stream of this context (or 0).
        check(
            unsafe { sys::cuStreamSynchronize(s.0 as sys::CUstream) },
            "cuStreamSynchronize",
        )
    }

    /// Whether all work on `s` is done (without waiting).
    fn stream_query(&self, s: StreamHandle) -> Result<bool> {
        self.make_current()?;
        // SAFETY: s is a stream of this context (or 0).
        let r = unsafe { sys::cuStreamQuery(s.0 as sys::CUstream) };
        if r == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check(r, "cuStreamQuery").map(|_| true)
    }

    fn write_value64(&self, s: StreamHandle, addr: DevPtr, value: u64) -> Result<()> {
        self.make_current()?;
        // SAFETY: the caller names 8 bytes of device memory (its own or a peer's, mapped here)
        // that stay mapped until the stream passes the write. Flags 0: with the fence.
        check(
            unsafe { sys::cuStreamWriteValue64_v2(s.0 as sys::CUstream, addr, value, 0) },
            "cuStreamWriteValue64",
        )
    }

    fn wait_value64(&self, s: StreamHandle, addr: DevPtr, value: u64) -> Result<()> {
        self.make_current()?;
        // SAFETY: as above. Flags 0: CU_STREAM_WAIT_VALUE_GEQ.
        check(
            unsafe { sys::cuStreamWaitValue64_v2(s.0 as sys::CUstream, addr, value, 0) },
            "cuStreamWaitValue64",
        )
    }

    fn event_create(&self) -> Result<u64> {
        self.event_create_flags(0)
    }

    /// An event for ordering only: recording it costs about 0.3 µs against 1.3 µs for a
    /// timing event (results/h200-driver-call-costs.txt), on every collective call.
    fn event_create_untimed(&self) -> Result<u64> {
        self.event_create_flags(2) // CU_EVENT_DISABLE_TIMING
    }

    fn event_record(&self, e: u64, s: StreamHandle) -> Result<()> {
        self.make_current()?;
        // SAFETY: e and s belong to this context.
        check(
            unsafe { sys::cuEventRecord(e as sys::CUevent, s.0 as sys::CUstream) },
            "cuEventRecord",
        )
    }

    /// Inside a capture: a record node (CU_EVENT_RECORD_EXTERNAL); each launch of the graph
    /// records `e` for waits outside it.
    fn event_record_external(&self, e: u64, s: StreamHandle) -> Result<()> {
        self.make_current()?;
        // SAFETY: e and s belong to this context; 1 = CU_EVENT_RECORD_EXTERNAL.
        check(
            unsafe { sys::cuEventRecordWithFlags(e as sys::CUevent, s.0 as sys::CUstream, 1) },
            "cuEventRecordWithFlags(EXTERNAL)",
        )
    }

    /// Work queued on `s` after this waits until `e` (recorded on any stream) has passed.
    fn stream_wait_event(&self, s: StreamHandle, e: u64) -> Result<()> {
        self.make_current()?;
        // SAFETY: s and e belong to this context.
        check(
            unsafe { sys::cuStreamWaitEvent(s.0 as sys::CUstream, e as sys::CUevent, 0) },
            "cuStreamWaitEvent",
        )
    }

    /// Inside a capture: a wait node (CU_EVENT_WAIT_EXTERNAL); each launch of the graph waits
    /// for `e`'s latest record, made outside the graph or by an earlier launch.
    fn stream_wait_event_external(&self, s: StreamHandle, e: u64) -> Result<()> {
        self.make_current()?;
        // SAFETY: s and e belong to this context; 1 = CU_EVENT_WAIT_EXTERNAL.
        check(
            unsafe { sys::cuStreamWaitEvent(s.0 as sys::CUstream, e as sys::CUevent, 1) },
            "cuStreamWaitEvent(EXTERNAL)",
        )
    }

    /// Whether event `e`'s latest record has happened (without waiting).
    fn event_query(&self, e: u64) -> Result<bool> {
        self.make_current()?;
        // SAFETY: e belongs to this context; the call only looks.
        let r = unsafe { sys::cuEventQuery(e as sys::CUevent) };
        if r == sys::CUresult::CUDA_ERROR_NOT_READY {
            return Ok(false);
        }
        check(r, "cuEventQuery").map(|_| true)
    }

    fn event_sync(&self, e: u64) -> Result<()> {
        self.make_current()?;
        // SAFETY: e belongs to this context.
        check(
            unsafe { sys::cuEventSynchronize(e as sys::CUevent) },
            "cuEventSynchronize",
        )
    }

    fn event_elapsed_ms(&self, start: u64, end: u64) -> Result<f32> {
        self.make_current()?;
        let mut ms = 0f32;
        // SAFETY: both events belong to this context and have completed.
        check(
            unsafe { sys::cuEventElapsedTime(&mut ms, start as sys::CUevent, end as sys::CUevent) },
            "cuEventElapsedTime",
        )?;
        Ok(ms)
    }

    fn event_destroy(&self, e: u64) -> Result<()> {
        self.make_current()?;
        // SAFETY: e came from event_create.
        check(
            unsafe { sys::cuEventDestroy_v2(e as sys::CUevent) },
            "cuEventDestroy",
        )
    }
}

impl Device {
    fn event_create_flags(&self, flags: u32) -> Result<u64> {
        self.make_current()?;
        let mut e = std::ptr::null_mut();
        // SAFETY: out-parameter; flags are CUevent_flags bits.
        check(
            unsafe { sys::cuEventCreate(&mut e, flags) },
            "cuEventCreate",
        )?;
        Ok(e as u64)
    }
}
