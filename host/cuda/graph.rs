//! CUDA graphs. The runtime asks whether a stream is capturing, because the launch order of a
//! communicator (comm/order.rs) must not tie a capture to work outside it; capture and
//! replay are here for tests and for Rust programs that drive streams through this crate.

use super::{Device, Imp, StreamHandle};
use crate::error::Result;

/// What runs once a graph is gone: see [`Device::on_graph_release`].
pub type GraphRelease = Box<dyn FnOnce() + Send>;

/// An instantiated graph captured from a stream; destroyed on drop.
pub struct Graph {
    dev: Device,
    graph: u64,
    exec: u64,
}

impl Device {
    /// Whether `s` is capturing into a graph now.
    pub fn stream_capturing(&self, s: StreamHandle) -> Result<bool> {
        dispatch!(self.stream_capturing(s))
    }

    /// The id of the capture open on `s` (unique in this process), None when `s` is not
    /// capturing or its capture was invalidated.
    pub fn capture_id(&self, s: StreamHandle) -> Result<Option<u64>> {
        dispatch!(self.capture_id(s))
    }

    /// Ties `release` to the graph that the capture open on `s` builds: it runs once that
    /// graph and every executable graph instantiated from it are destroyed (at once where the
    /// capture fails), on a thread of CUDA's, so it must not call CUDA. `Ok(Err(release))`:
    /// `s` is not capturing.
    pub fn on_graph_release(
        &self,
        s: StreamHandle,
        release: GraphRelease,
    ) -> Result<std::result::Result<(), GraphRelease>> {
        dispatch!(self.on_graph_release(s, release))
    }

    /// Starts capturing the work issued on `s` into a graph (CUDA's global capture mode).
    pub fn capture_begin(&self, s: StreamHandle) -> Result<()> {
        dispatch!(self.capture_begin(s))
    }

    /// Ends the capture on `s`; the graph is ready to launch.
    pub fn capture_end(&self, s: StreamHandle) -> Result<Graph> {
        let (graph, exec) = dispatch!(self.capture_end(s))?;
        Ok(Graph {
            dev: self.clone(),
            graph,
            exec,
        })
    }
}

impl Graph {
    /// Runs the captured work once more, on `s`.
    pub fn launch(&self, s: StreamHandle) -> Result<()> {
        let exec = self.exec;
        let dev = &self.dev;
        dispatch!(dev.graph_launch(exec, s))
    }

    crate::internal! {
        /// On the simulator, how many nodes the graph holds (None on a GPU): what a captured
        /// call costs, for tests.
        fn sim_node_count(&self) -> Option<usize> {
            match &*self.dev.imp {
                Imp::Sim(d) => d.graph_node_count(self.exec).ok(),
                Imp::Cuda(_) => None,
            }
        }
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        let (graph, exec, dev) = (self.graph, self.exec, &self.dev);
        if let Err(e) = dispatch!(dev.graph_destroy(graph, exec)) {
            log::warn!("destroying a CUDA graph: {e}");
        }
    }
}
