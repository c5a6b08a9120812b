//! Which network devices a rank's connections use: the ones nearest its GPU, as NCCL's rings
//! leave each node through the NIC closest to the GPU that sends. Successive channels (ring
//! channels, send/recv connection keys) take successive devices of that set, and each GPU of a
//! node starts at a device of its own (its position among the node's GPUs), so GPUs that share
//! a set of NICs spread their channels over all of them.

use super::gdr::path_to;
use super::Net;
use crate::error::Result;
use crate::topo::System;

/// The devices of `net` that GPU `local` of `system` (its position among the node's GPUs) uses,
/// in the order its channels take them: channel `c` uses entry `c % len`. Devices the topology
/// does not place (virtual interfaces, a plugin's unknown NICs) count as hanging off the CPU.
pub(crate) fn channel_nics(net: &dyn Net, system: &System, local: usize) -> Result<Vec<usize>> {
    let ndevs = net.ndevs();
    let paths = system.paths();
    let mut dist = Vec::with_capacity(ndevs);
    for d in 0..ndevs {
        dist.push(path_to(system, &paths, local, &net.properties(d)?));
    }
    let Some(best) = dist.iter().min().copied() else {
        return Ok(Vec::new());
    };
    let mut near: Vec<usize> = (0..ndevs).filter(|&d| dist[d] == best).collect();
    let start = local % near.len();
    near.rotate_left(start);
    Ok(near)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::{Connecting, Handle, Listener, Properties};

    /// A network whose devices are named, at the PCI paths given; it connects nothing.
    struct Nics(Vec<(&'static str, &'static str)>);

    impl Net for Nics {
        fn name(&self) -> &str {
            "nics"
        }
        fn ndevs(&self) -> usize {
            self.0.len()
        }
        fn properties(&self, dev: usize) -> Result<Properties> {
            let (name, pci) = self.0[dev];
            Ok(Properties {
                name: name.into(),
                pci_path: pci.into(),
                ..Properties::default()
            })
        }
        fn listen(&self, _dev: usize) -> Result<(Handle, Box<dyn Listener>)> {
            Err(crate::error::Error::internal("not a real network"))
        }
        fn connect(&self, _dev: usize, _h: &Handle) -> Result<Box<dyn Connecting>> {
            Err(crate::error::Error::internal("not a real network"))
        }
    }

    /// The DGX-H100 shape: each PCIe switch holds 2 GPUs and 2 NICs. A GPU's channels use the
    /// two NICs of its switch, alternating, the switch's two GPUs starting on different ones;
    /// never a NIC behind another switch.
    #[test]
    fn channels_use_the_nics_nearest_their_gpu_and_alternate() {
        let system = System::synthetic_dgx_h100().expect("synthetic DGX");
        // Named as the topology names them; the list's order is not the topology's.
        let net = Nics(vec![
            ("mlx5_3", ""),
            ("mlx5_0", ""),
            ("mlx5_1", ""),
            ("mlx5_2", ""),
            ("mlx5_7", ""),
        ]);
        let names = |local: usize| -> Vec<&str> {
            channel_nics(&net, &system, local)
                .expect("nics")
                .into_iter()
                .map(|d| net.0[d].0)
                .collect()
        };
        assert_eq!(names(0), ["mlx5_0", "mlx5_1"]);
        assert_eq!(names(1), ["mlx5_1", "mlx5_0"]);
        assert_eq!(names(2), ["mlx5_3", "mlx5_2"]);
        assert_eq!(names(3), ["mlx5_2", "mlx5_3"]);
        assert_eq!(names(7), ["mlx5_7"], "the only NIC of its switch listed");
    }

    /// NICs the topology does not hold (veth pairs, loopback) are all alike: every one is used,
    /// successive channels on successive NICs, each GPU starting at its own.
    #[test]
    fn unplaced_nics_are_all_used_in_turn() {
        let system = System::synthetic_h200x4().expect("synthetic H200 x4");
        let net = Nics(vec![("veth0", ""), ("veth1", ""), ("veth2", "")]);
        assert_eq!(channel_nics(&net, &system, 0).unwrap(), [0, 1, 2]);
        assert_eq!(channel_nics(&net, &system, 1).unwrap(), [1, 2, 0]);
        assert_eq!(channel_nics(&net, &system, 3).unwrap(), [0, 1, 2]);
    }
}
