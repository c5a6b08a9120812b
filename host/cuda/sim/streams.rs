//! Simulated streams (a worker thread each) and events.

use super::*;

impl Streams for Device {
    fn stream_create(&self, blocking: bool) -> Result<StreamHandle> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed) << 8 | 0x5;
        lock(registry())
            .streams
            .insert(id, Stream::start(self.ordinal, blocking));
        Ok(StreamHandle(id))
    }

    fn stream_destroy(&self, s: StreamHandle) -> Result<()> {
        if s.0 == 0 {
            return Err(Error::invalid_argument(
                "the default stream cannot be destroyed",
            ));
        }
        let st = self.stream(s)?;
        lock(registry()).streams.remove(&s.0);
        // Work already queued still runs (as cuStreamDestroy promises); then the worker ends.
        lock(&st.q).closed = true;
        st.cv.notify_all();
        Ok(())
    }

    fn stream_sync(&self, s: StreamHandle) -> Result<()> {
        self.stream(s)?.sync()
    }

    fn stream_query(&self, s: StreamHandle) -> Result<bool> {
        self.stream(s)?.idle()
    }

    fn write_value64(&self, s: StreamHandle, addr: DevPtr, value: u64) -> Result<()> {
        let word = self.word(addr)?;
        self.stream(s)?.push_replayable(Arc::new(move || {
            Box::new(move || {
                // SAFETY: `word` was 8 aligned bytes of live memory when the write was queued,
                // and (as on a GPU) the caller keeps it until the stream passed the write.
                // Release: the stream's earlier writes are seen first.
                unsafe { &*(word as *const AtomicU64) }.store(value, Ordering::Release);
                Ok(())
            })
        }));
        Ok(())
    }

    fn wait_value64(&self, s: StreamHandle, addr: DevPtr, value: u64) -> Result<()> {
        let word = self.word(addr)?;
        self.stream(s)?.push_replayable(Arc::new(move || {
            Box::new(move || {
                // SAFETY: as in `write_value64`.
                let w = unsafe { &*(word as *const AtomicU64) };
                while w.load(Ordering::Acquire) < value {
                    std::thread::yield_now();
                }
                Ok(())
            })
        }));
        Ok(())
    }

    fn event_create(&self) -> Result<u64> {
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed) << 8 | 0xe;
        lock(registry())
            .events
            .insert(id, Arc::new(Event::default()));
        Ok(id)
    }

    fn event_record(&self, e: u64, s: StreamHandle) -> Result<()> {
        let ev = self.event(e)?;
        let stream = self.stream(s)?;
        if stream.capturing() {
            // A point inside the graph: waits of the same capture may follow it.
            lock(&ev.state).captured_on = Some(Arc::as_ptr(&stream) as usize);
            return Ok(());
        }
        stream.push(issue_record(&ev));
        Ok(())
    }

    /// A record that a capture keeps as an event record node (CU_EVENT_RECORD_EXTERNAL): each
    /// launch of the graph records `e`, usable outside the graph. Only inside a capture.
    fn event_record_external(&self, e: u64, s: StreamHandle) -> Result<()> {
        self.external_node(e, s, "record", issue_record)
    }

    fn stream_wait_event(&self, s: StreamHandle, e: u64) -> Result<()> {
        let ev = self.event(e)?;
        let stream = self.stream(s)?;
        let (target, captured_on) = {
            let st = lock(&ev.state);
            (st.issued, st.captured_on)
        };
        match (stream.capturing(), captured_on) {
            (false, None) => {}
            (false, Some(_)) => return Err(Error::cuda(format!("stream wait: {CAPTURED_EVENT}"))),
            (true, None) => return Err(Error::cuda(format!("stream wait: {CAPTURE_ISOLATION}"))),
            // Within one stream's capture, stream order already holds.
            (true, Some(on)) if on == Arc::as_ptr(&stream) as usize => return Ok(()),
            (true, Some(_)) => {
                return Err(Error::invalid_usage(
                    "the simulator captures one stream at a time (no fork/join across streams)",
                ))
            }
        }
        stream.push(Box::new(move || {
            ev.wait_for(target);
            Ok(())
        }));
        Ok(())
    }

    /// A wait that a capture keeps as an event wait node (CU_EVENT_WAIT_EXTERNAL): each launch
    /// of the graph waits for `e`'s latest record at the launch. Only inside a capture.
    fn stream_wait_event_external(&self, s: StreamHandle, e: u64) -> Result<()> {
        self.external_node(e, s, "wait", issue_wait)
    }

    fn event_query(&self, e: u64) -> Result<bool> {
        Self::unsafe_in_global_capture("event query")?;
        let ev = self.event(e)?;
        let st = lock(&ev.state);
        Ok(st.done >= st.issued)
    }

    fn event_sync(&self, e: u64) -> Result<()> {
        let ev = self.event(e)?;
        let (target, captured_on) = {
            let st = lock(&ev.state);
            (st.issued, st.captured_on)
        };
        if captured_on.is_some() {
            return Err(Error::cuda(format!("event synchronize: {CAPTURED_EVENT}")));
        }
        ev.wait_for(target);
        Ok(())
    }

    fn event_elapsed_ms(&self, start: u64, end: u64) -> Result<f32> {
        let (a, b) = (
            lock(&self.event(start)?.state).at,
            lock(&self.event(end)?.state).at,
        );
        match (a, b) {
            (Some(a), Some(b)) => Ok(b.saturating_duration_since(a).as_secs_f32() * 1e3),
            _ => Err(Error::invalid_usage("event not completed")),
        }
    }

    fn event_destroy(&self, e: u64) -> Result<()> {
        lock(registry()).events.remove(&e);
        Ok(())
    }
}

impl Device {
    /// Adds to the capture open on `s` a node that issues `issue(e)` at each launch.
    fn external_node(
        &self,
        e: u64,
        s: StreamHandle,
        what: &str,
        issue: fn(&Arc<Event>) -> Job,
    ) -> Result<()> {
        let ev = self.event(e)?;
        let stream = self.stream(s)?;
        if !stream.capturing() {
            return Err(Error::cuda(format!(
                "an external event {what} outside a capture (CUDA_ERROR_INVALID_VALUE)"
            )));
        }
        stream.push_replayable(Arc::new(move || issue(&ev)));
        Ok(())
    }
}
