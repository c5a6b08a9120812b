//! Launching a planned collective in the communicator's order: what a queued launch takes
//! from its communicator when the call is made, since a group may run it later.

use super::graph_reg::{self, GraphRegs};
use super::order::StreamOrder;
use super::plan::LaunchPlan;
use super::Comm;
use crate::cuda::{Device, StreamHandle};
use crate::error::Result;
use crate::proxy::timeline::{self, Mark};
use crate::transport::links::Links;
use crate::transport::net::NetPath;
use crate::transport::regmap::Mark as RegMark;
use std::sync::Arc;

/// The parts of a communicator a launch uses.
pub(crate) struct Launcher {
    device: Device,
    order: Arc<StreamOrder>,
    net: Option<Arc<NetPath>>,
    links: Arc<Links>,
    graph_regs: Arc<GraphRegs>,
}

impl Comm {
    /// What a launch on this communicator needs, to run now or at the group's end.
    pub(crate) fn launcher(&self) -> Launcher {
        Launcher {
            device: self.device.clone(),
            order: self.order.clone(),
            net: self.net.clone(),
            links: self.links.clone(),
            graph_regs: self.graph_regs.clone(),
        }
    }
}

impl Launcher {
    /// Launches `plan` on `stream`, in the communicator's order: first waits for the peers'
    /// graph-registration marks it names (at the group's end every mark of the group went out
    /// when its calls were made), and wakes the proxy where the kernel needs the network.
    pub(crate) fn launch(&self, plan: &LaunchPlan, stream: StreamHandle) -> Result<()> {
        if let Some((peers, seq)) = &plan.graph_wait {
            for &peer in peers {
                graph_reg::await_graph_mark(
                    &self.links,
                    &self.graph_regs,
                    peer,
                    RegMark::Coll,
                    *seq,
                )?;
            }
        }
        let (device, order) = (&self.device, &self.order);
        let (kernel, grid, block, args) = (plan.kernel, plan.grid, plan.block, &plan.args);
        let Some(n) = &self.net else {
            return order.launch(stream, || device.launch(kernel, grid, block, stream, args));
        };
        n.proxy.kick(); // the kernel will need the network: wake the proxy
        timeline::mark(Mark::Launch, 0, 0);
        let r = order.launch(stream, || device.launch(kernel, grid, block, stream, args));
        timeline::mark(Mark::Launched, 0, 0);
        if order.captured() {
            // A graph's replays will not wake the proxy: it keeps its naps short from now on.
            n.proxy.serve_replays();
        }
        r
    }
}
