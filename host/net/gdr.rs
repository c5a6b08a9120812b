//! GPU Direct RDMA: where a network connection's FIFO lives. A network that takes CUDA pointers
//! (`PTR_CUDA`, or `PTR_DMABUF` with a driver that exports dmabufs) may read and write GPU
//! memory itself; then, where the GPU-to-NIC path is no farther than `NCCL_NET_GDR_LEVEL`
//! (PXB by default), receives land in GPU memory, and sends read it where `NCCL_NET_GDR_READ`
//! allows. Otherwise the FIFO is pinned host memory mapped into the GPU. A GPU-memory receive of
//! a Simple step is flushed (the plugin's `iflush`; LL and LL128 lines carry their own flags,
//! and the proxy learns a step's protocol from its kernel: `crate::proxy`'s conn.rs) before the
//! kernel is told it landed, on GPUs that need it
//! (compute capability below 9.0), or where the plugin (`forceFlush`) or
//! `NCCL_NET_FORCE_FLUSH=1` asks.
//!
//! The decision is per network device and taken once per communicator ([`Policy::new`]); each
//! side of a connection follows its own (NCCL's rule too: the two ends need not agree).

use super::{Net, Properties, PTR_CUDA, PTR_DMABUF};
use crate::cuda::Device;
use crate::topo::{LinkKind, NodeKind, PathType, Paths, System};

/// How one network device's connections place their FIFOs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DevGdr {
    /// Receives land in GPU memory.
    pub recv: bool,
    /// Sends read GPU memory.
    pub send: bool,
    /// GPU-memory receives are flushed before the kernel sees them.
    pub flush: bool,
    /// GPU memory is registered through a dmabuf (regMrDmaBuf), else with regMr(PTR_CUDA).
    pub dmabuf: bool,
}

/// What the decision looks at, gathered from the network, the driver and the topology.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Facts {
    pub ptr_support: u32,
    /// The plugin's forceFlush property.
    pub force_flush_prop: bool,
    /// The network has regMrDmaBuf.
    pub net_dmabuf_reg: bool,
    /// The topology says the GPU can do GPU Direct RDMA.
    pub gpu_gdr: bool,
    /// A network may take this GPU's memory by address (the simulator; on GPUs, a peer-memory
    /// kernel module is loaded).
    pub driver_peer_mem: bool,
    /// The driver exports this GPU's memory as dmabufs.
    pub driver_dmabuf: bool,
    /// Compute capability, major*10+minor.
    pub sm: u32,
    /// The path from the GPU to the network device.
    pub path: PathType,
    /// The GPU reaches another GPU of its node over NVLink, or is its node's only GPU.
    pub nvlink_or_alone: bool,
}

/// The parameters (NCCL_NET_GDR_LEVEL, NCCL_NET_GDR_READ, NCCL_NET_FORCE_FLUSH,
/// NCCL_DMABUF_ENABLE).
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Knobs {
    pub level: PathType,
    pub read: Option<bool>,
    pub force_flush: bool,
    pub dmabuf_enable: bool,
}

impl Knobs {
    pub(crate) fn from_env() -> crate::error::Result<Knobs> {
        let level = crate::env::NET_GDR_LEVEL
            .raw()
            .map(|v| PathType::parse_level("NCCL_NET_GDR_LEVEL", &v))
            .transpose()?
            .unwrap_or(PathType::Pxb);
        Ok(Knobs {
            level,
            read: crate::env::NET_GDR_READ
                .raw()
                .map(|_| crate::env::NET_GDR_READ.int() != 0),
            force_flush: crate::env::NET_FORCE_FLUSH.int() != 0,
            dmabuf_enable: crate::env::DMABUF_ENABLE.int() != 0,
        })
    }
}

/// The placement for one device, and a sentence saying why.
pub(crate) fn decide(f: &Facts, k: &Knobs) -> (DevGdr, String) {
    let dmabuf =
        k.dmabuf_enable && f.ptr_support & PTR_DMABUF != 0 && f.net_dmabuf_reg && f.driver_dmabuf;
    let by_address = f.ptr_support & PTR_CUDA != 0 && f.driver_peer_mem;
    let off = |why: String| (DevGdr::default(), format!("GPU Direct RDMA off: {why}"));
    if f.ptr_support & (PTR_CUDA | PTR_DMABUF) == 0 {
        return off("the network takes host pointers only".into());
    }
    if !f.gpu_gdr {
        return off("the GPU does not support it".into());
    }
    if !dmabuf && !by_address {
        return off(
            "neither a peer-memory module (nvidia-peermem) nor a dmabuf the network takes".into(),
        );
    }
    if f.path > k.level {
        return off(format!(
            "GPU-NIC path {} is farther than NCCL_NET_GDR_LEVEL {}",
            f.path, k.level
        ));
    }
    // Sends read GPU memory unless told not to; by default from Ampere on, and before that
    // only where the GPUs talk over NVLink (PCIe reads would compete with their traffic).
    let send = k.read.unwrap_or(f.sm >= 80 || f.nvlink_or_alone);
    let flush = f.force_flush_prop || k.force_flush || f.sm < 90;
    let g = DevGdr {
        recv: true,
        send,
        flush,
        dmabuf,
    };
    let why = format!(
        "GPU Direct RDMA on (GPU-NIC path {} within NCCL_NET_GDR_LEVEL {}): receives in GPU memory{}, sends from {} memory, registered with {}",
        f.path,
        k.level,
        if flush { ", flushed" } else { "" },
        if send { "GPU" } else { "host" },
        if dmabuf { "regMrDmaBuf" } else { "regMr" }
    );
    (g, why)
}

/// Whether a peer-memory kernel module lets a NIC take GPU memory by address.
fn peer_mem_loaded() -> bool {
    [
        "/sys/kernel/mm/memory_peers/nv_mem/version",
        "/sys/module/nvidia_peermem/version",
        "/sys/module/nv_peer_mem/version",
    ]
    .iter()
    .any(|p| std::path::Path::new(p).exists())
}

/// The GPU-to-device path: through the topology's NIC of the same PCI bus id (the last part of
/// the device's `pci_path`) or name; a device the topology does not hold hangs off a CPU, as
/// NCCL places it (PHB on a one-CPU node, else SYS: which CPU is not known).
pub(crate) fn path_to(system: &System, paths: &Paths, g: usize, p: &Properties) -> PathType {
    let busid = p
        .pci_path
        .rsplit('/')
        .next()
        .map(crate::topo::normalize_busid)
        .unwrap_or_default();
    let nic_busid = |net: &crate::topo::Net| {
        system.nodes[net.node]
            .links
            .iter()
            .find(|l| l.kind == LinkKind::Loc && system.nodes[l.to].kind == NodeKind::Nic)
            .map(|l| system.nodes[l.to].id.clone())
    };
    let found = system.nets.iter().position(|n| {
        (!busid.is_empty()
            && nic_busid(n).is_some_and(|b| crate::topo::normalize_busid(&b) == busid))
            || (!p.name.is_empty() && n.name == p.name)
    });
    if let Some(n) = found {
        if let Some(path) = paths.gpu_net.get(g).and_then(|row| row.get(n)) {
            return path.ty;
        }
    }
    let cpus = system
        .nodes
        .iter()
        .filter(|n| n.kind == NodeKind::Cpu)
        .count();
    if cpus <= 1 {
        PathType::Phb
    } else {
        PathType::Sys
    }
}

/// Every network device's placement for this rank's GPU.
#[derive(Clone, Debug, Default)]
pub(crate) struct Policy {
    devs: Vec<DevGdr>,
}

impl Policy {
    /// The policy of `net` for GPU `local` of `system` (its position among the node's GPUs) on
    /// `device`; logged at INFO per device.
    pub(crate) fn new(
        net: &dyn Net,
        system: &System,
        local: usize,
        device: &Device,
    ) -> crate::error::Result<Policy> {
        let knobs = Knobs::from_env()?;
        let props = (0..net.ndevs())
            .map(|d| net.properties(d))
            .collect::<crate::error::Result<Vec<_>>>()?;
        if props
            .iter()
            .all(|p| p.ptr_support & (PTR_CUDA | PTR_DMABUF) == 0)
        {
            // Host pointers only (the socket network): nothing to decide.
            return Ok(Policy {
                devs: vec![DevGdr::default(); props.len()],
            });
        }
        let gpu = system.gpus.get(local);
        let sm = match gpu {
            Some(g) => g.sm,
            None => {
                let (major, minor) = device.props()?.compute_capability;
                major * 10 + minor
            }
        };
        let paths = system.paths();
        let nvlink_or_alone = system.gpus.len() <= 1
            || paths.gpu_gpu.get(local).is_some_and(|row| {
                row.iter()
                    .enumerate()
                    .any(|(o, p)| o != local && p.ty <= PathType::Nvl)
            });
        let mut devs = Vec::with_capacity(props.len());
        for (d, p) in props.into_iter().enumerate() {
            if p.ptr_support & (PTR_CUDA | PTR_DMABUF) == 0 {
                devs.push(DevGdr::default());
                continue;
            }
            let facts = Facts {
                ptr_support: p.ptr_support,
                force_flush_prop: p.force_flush,
                net_dmabuf_reg: net.has_dmabuf_reg(),
                gpu_gdr: gpu.is_none_or(|g| g.gdr),
                driver_peer_mem: device.is_sim() || peer_mem_loaded(),
                driver_dmabuf: device.dmabuf_supported(),
                sm,
                path: path_to(system, &paths, local, &p),
                nvlink_or_alone,
            };
            let (g, why) = decide(&facts, &knobs);
            log::info!(
                target: crate::debug::INIT,
                "NET/{} : GPU {} and device {d} ({}): {why}",
                net.name(),
                device.ordinal,
                p.name
            );
            devs.push(g);
        }
        Ok(Policy { devs })
    }

    /// Device `dev`'s placement (host memory for a device the policy does not know).
    pub(crate) fn dev(&self, dev: usize) -> DevGdr {
        self.devs.get(dev).copied().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::PTR_HOST;

    fn facts() -> Facts {
        Facts {
            ptr_support: PTR_HOST | PTR_CUDA,
            force_flush_prop: false,
            net_dmabuf_reg: false,
            gpu_gdr: true,
            driver_peer_mem: true,
            driver_dmabuf: false,
            sm: 90,
            path: PathType::Pxb,
            nvlink_or_alone: true,
        }
    }

    fn knobs() -> Knobs {
        Knobs {
            level: PathType::Pxb,
            read: None,
            force_flush: false,
            dmabuf_enable: true,
        }
    }

    #[test]
    fn cuda_pointers_within_the_level_use_gpu_memory() {
        let (g, why) = decide(&facts(), &knobs());
        assert_eq!(
            g,
            DevGdr {
                recv: true,
                send: true,
                flush: false,
                dmabuf: false
            },
            "{why}"
        );
        // Ampere and earlier flush; so does forceFlush or NCCL_NET_FORCE_FLUSH.
        assert!(decide(&Facts { sm: 80, ..facts() }, &knobs()).0.flush);
        assert!(
            decide(
                &Facts {
                    force_flush_prop: true,
                    ..facts()
                },
                &knobs()
            )
            .0
            .flush
        );
        assert!(
            decide(
                &facts(),
                &Knobs {
                    force_flush: true,
                    ..knobs()
                }
            )
            .0
            .flush
        );
    }

    #[test]
    fn host_pointers_distance_or_no_driver_keep_host_memory() {
        let off = |f: Facts, k: Knobs| decide(&f, &k).0 == DevGdr::default();
        assert!(off(
            Facts {
                ptr_support: PTR_HOST,
                ..facts()
            },
            knobs()
        ));
        assert!(off(
            Facts {
                path: PathType::Phb,
                ..facts()
            },
            knobs()
        ));
        assert!(off(
            facts(),
            Knobs {
                level: PathType::Loc,
                ..knobs()
            }
        ));
        assert!(off(
            Facts {
                gpu_gdr: false,
                ..facts()
            },
            knobs()
        ));
        assert!(off(
            Facts {
                driver_peer_mem: false,
                ..facts()
            },
            knobs()
        ));
        assert!(!off(
            Facts {
                path: PathType::Sys,
                ..facts()
            },
            Knobs {
                level: PathType::Sys,
                ..knobs()
            }
        ));
    }

    #[test]
    fn gdr_read_follows_its_parameter_and_the_gpu() {
        assert!(
            !decide(
                &facts(),
                &Knobs {
                    read: Some(false),
                    ..knobs()
                }
            )
            .0
            .send
        );
        let volta_pcie = Facts {
            sm: 70,
            nvlink_or_alone: false,
            ..facts()
        };
        assert!(!decide(&volta_pcie, &knobs()).0.send);
        assert!(
            decide(
                &volta_pcie,
                &Knobs {
                    read: Some(true),
                    ..knobs()
                }
            )
            .0
            .send
        );
    }

    #[test]
    fn dmabuf_where_network_and_driver_both_take_it() {
        let f = Facts {
            ptr_support: PTR_HOST | PTR_DMABUF,
            net_dmabuf_reg: true,
            driver_dmabuf: true,
            driver_peer_mem: false,
            ..facts()
        };
        let (g, _) = decide(&f, &knobs());
        assert!(g.recv && g.dmabuf);
        assert!(
            !decide(
                &f,
                &Knobs {
                    dmabuf_enable: false,
                    ..knobs()
                }
            )
            .0
            .recv
        );
        assert!(
            !decide(
                &Facts {
                    driver_dmabuf: false,
                    ..f
                },
                &knobs()
            )
            .0
            .recv
        );
    }
}
