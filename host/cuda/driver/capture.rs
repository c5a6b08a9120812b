//! Stream capture into CUDA graphs, and the graphs.

use super::*;

impl Capture for Device {
    /// Whether `s` is capturing into a CUDA graph (an invalidated capture counts: it still
    /// refuses what a live one refuses).
    fn stream_capturing(&self, s: StreamHandle) -> Result<bool> {
        self.make_current()?;
        let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        // SAFETY: s is a stream of this context (or 0); out-parameter.
        check(
            unsafe { sys::cuStreamIsCapturing(s.0 as sys::CUstream, &mut st) },
            "cuStreamIsCapturing",
        )?;
        Ok(st != sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }

    fn capture_id(&self, s: StreamHandle) -> Result<Option<u64>> {
        Ok(self.capture_info(s)?.map(|(id, _)| id))
    }

    /// Ties `release` to the graph the capture open on `s` builds, through a user object the
    /// graph owns: CUDA runs it once that graph and every executable graph made from it are
    /// destroyed. Not capturing: `release` comes back.
    fn on_graph_release(
        &self,
        s: StreamHandle,
        release: GraphRelease,
    ) -> Result<std::result::Result<(), GraphRelease>> {
        let Some((_, graph)) = self.capture_info(s)? else {
            return Ok(Err(release));
        };
        unsafe extern "C" fn run_release(p: *mut c_void) {
            // SAFETY: `p` is the box made below, given to this destructor alone, once.
            let f = unsafe { Box::from_raw(p as *mut GraphRelease) };
            f();
        }
        let p = Box::into_raw(Box::new(release)) as *mut c_void;
        let mut obj = std::ptr::null_mut();
        // SAFETY: `p` lives until the destructor takes it; CUDA requires the no-sync flag.
        let made = check(
            unsafe {
                sys::cuUserObjectCreate(
                    &mut obj,
                    p,
                    Some(run_release),
                    1,
                    sys::CUuserObject_flags::CU_USER_OBJECT_NO_DESTRUCTOR_SYNC as u32,
                )
            },
            "cuUserObjectCreate",
        );
        if let Err(e) = made {
            // SAFETY: not given to CUDA: still ours alone.
            let f = unsafe { Box::from_raw(p as *mut GraphRelease) };
            drop(f);
            return Err(e);
        }
        // SAFETY: graph is the open capture's; our one reference moves to it.
        let moved = check(
            unsafe {
                sys::cuGraphRetainUserObject(
                    graph,
                    obj,
                    1,
                    sys::CUuserObjectRetain_flags::CU_GRAPH_USER_OBJECT_MOVE as u32,
                )
            },
            "cuGraphRetainUserObject",
        );
        if let Err(e) = moved {
            // Our reference is still ours: releasing it runs `release` now.
            // SAFETY: obj was created above with one reference.
            unsafe { sys::cuUserObjectRelease(obj, 1) };
            return Err(e);
        }
        Ok(Ok(()))
    }

    /// Starts capturing `s` into a graph (CUDA's default, global capture mode).
    fn capture_begin(&self, s: StreamHandle) -> Result<()> {
        self.make_current()?;
        let mode = sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
        // SAFETY: s is a stream of this context.
        check(
            unsafe { sys::cuStreamBeginCapture_v2(s.0 as sys::CUstream, mode) },
            "cuStreamBeginCapture",
        )
    }

    /// Ends the capture on `s` and instantiates it: (graph, executable graph).
    fn capture_end(&self, s: StreamHandle) -> Result<(u64, u64)> {
        self.make_current()?;
        let mut graph = std::ptr::null_mut();
        // SAFETY: s is capturing (else CUDA reports it); out-parameter.
        check(
            unsafe { sys::cuStreamEndCapture(s.0 as sys::CUstream, &mut graph) },
            "cuStreamEndCapture",
        )?;
        let mut exec = std::ptr::null_mut();
        // Another stream's capture may still be open (one per rank, ended one by one).
        let relaxed = RelaxedCapture::enter();
        // SAFETY: graph came from the capture just ended; out-parameter.
        let r = unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
        drop(relaxed);
        if let Err(e) = check(r, "cuGraphInstantiate") {
            // SAFETY: graph is ours and instantiated nowhere.
            unsafe { sys::cuGraphDestroy(graph) };
            return Err(e);
        }
        Ok((graph as u64, exec as u64))
    }

    fn graph_launch(&self, exec: u64, s: StreamHandle) -> Result<()> {
        self.make_current()?;
        // SAFETY: exec came from capture_end and lives until graph_destroy.
        check(
            unsafe { sys::cuGraphLaunch(exec as sys::CUgraphExec, s.0 as sys::CUstream) },
            "cuGraphLaunch",
        )
    }

    fn graph_destroy(&self, graph: u64, exec: u64) -> Result<()> {
        self.make_current()?;
        // SAFETY: both came from capture_end and are destroyed once.
        check(
            unsafe { sys::cuGraphExecDestroy(exec as sys::CUgraphExec) },
            "cuGraphExecDestroy",
        )?;
        // SAFETY: as above.
        check(
            unsafe { sys::cuGraphDestroy(graph as sys::CUgraph) },
            "cuGraphDestroy",
        )
    }
}

impl Device {
    /// The id of the capture open on `s` and the graph it builds (an invalidated capture has
    /// none).
    fn capture_info(&self, s: StreamHandle) -> Result<Option<(u64, sys::CUgraph)>> {
        self.make_current()?;
        let mut st = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let (mut id, mut graph) = (0, std::ptr::null_mut());
        // SAFETY: s is a stream of this context (or 0); out-parameters, the optional
        // dependency outputs left out.
        check(
            unsafe {
                sys::cuStreamGetCaptureInfo_v2(
                    s.0 as sys::CUstream,
                    &mut st,
                    &mut id,
                    &mut graph,
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                )
            },
            "cuStreamGetCaptureInfo",
        )?;
        let active = st == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE;
        Ok((active && !graph.is_null()).then_some((id, graph)))
    }
}
