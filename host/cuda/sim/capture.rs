//! Stream capture into simulated graphs, and their replay.

use super::*;

impl Capture for Device {
    fn stream_capturing(&self, s: StreamHandle) -> Result<bool> {
        Ok(self.stream(s)?.capturing())
    }

    /// The id of the capture open on `s`.
    fn capture_id(&self, s: StreamHandle) -> Result<Option<u64>> {
        let stream = self.stream(s)?;
        let open = stream.capturing() && !stream.invalidated.load(Ordering::SeqCst);
        Ok(open.then(|| lock(&stream.capture_extra).0))
    }

    /// Runs `release` when the graph the capture open on `s` makes is destroyed (at once if
    /// the capture fails). Not capturing: `release` comes back.
    fn on_graph_release(
        &self,
        s: StreamHandle,
        release: GraphRelease,
    ) -> Result<std::result::Result<(), GraphRelease>> {
        let stream = self.stream(s)?;
        if !stream.capturing() || stream.invalidated.load(Ordering::SeqCst) {
            return Ok(Err(release));
        }
        lock(&stream.capture_extra).1.push(release);
        Ok(Ok(()))
    }

    fn capture_begin(&self, s: StreamHandle) -> Result<()> {
        let stream = self.stream(s)?;
        let mut c = lock(&stream.capture);
        if c.is_some() {
            return Err(Error::invalid_usage("the stream is capturing already"));
        }
        if s.0 == 0 {
            return Err(Error::cuda(format!(
                "capture of the legacy stream: {CAPTURE_UNSUPPORTED}"
            )));
        }
        stream.invalidated.store(false, Ordering::SeqCst);
        *c = Some(Vec::new());
        *lock(&stream.capture_extra) = (NEXT_ID.fetch_add(1, Ordering::Relaxed), Vec::new());
        Ok(())
    }

    /// Ends the capture; the graph is its launches, replayed in order.
    fn capture_end(&self, s: StreamHandle) -> Result<(u64, u64)> {
        let stream = self.stream(s)?;
        let jobs = lock(&stream.capture)
            .take()
            .ok_or_else(|| Error::invalid_usage("the stream is not capturing"))?;
        let releases = std::mem::take(&mut lock(&stream.capture_extra).1);
        if stream.invalidated.swap(false, Ordering::SeqCst) {
            // No graph: what was tied to it is released now (as CUDA destroys the graph).
            releases.into_iter().for_each(|r| r());
            return Err(Error::cuda(format!(
                "cuStreamEndCapture: {CAPTURE_INVALIDATED}"
            )));
        }
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed) << 8 | 0x9;
        let mut reg = lock(registry());
        reg.graphs.insert(id, Arc::new(jobs));
        reg.graph_releases.insert(id, releases);
        Ok((id, id))
    }

    fn graph_launch(&self, exec: u64, s: StreamHandle) -> Result<()> {
        let jobs = lock(registry())
            .graphs
            .get(&exec)
            .cloned()
            .ok_or_else(|| Error::invalid_argument(format!("unknown graph {exec:#x}")))?;
        let stream = self.stream(s)?;
        for j in jobs.iter() {
            stream.push_replayable(j.clone());
        }
        Ok(())
    }

    fn graph_destroy(&self, graph: u64, _exec: u64) -> Result<()> {
        let releases = {
            let mut reg = lock(registry());
            reg.graphs.remove(&graph);
            reg.graph_releases.remove(&graph)
        };
        // Outside the registry's lock, as CUDA runs user objects' destructors on a thread of
        // its own.
        releases.into_iter().flatten().for_each(|r| r());
        Ok(())
    }
}

impl Device {
    /// How many nodes (launches, copies, external event waits and records) a graph holds:
    /// tests check with it what a captured call costs.
    pub fn graph_node_count(&self, exec: u64) -> Result<usize> {
        lock(registry())
            .graphs
            .get(&exec)
            .map(|g| g.len())
            .ok_or_else(|| Error::invalid_argument(format!("unknown graph {exec:#x}")))
    }
}
