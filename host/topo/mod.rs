//! The node's topology: GPUs, NVLink and NVSwitch, the PCI tree, NICs and CPUs (NUMA nodes), and
//! the best path between every pair of GPUs and NICs.
//!
//! Entry points:
//! - [`System::detect`]`(&probe)`: the machine this process runs on. GPUs come from a
//!   [`GpuProbe`] (the runtime passes the GPUs of the communicator through [`StaticGpus`], whose
//!   NVLink facts come from NVML loaded at run time, see [`detect::Nvml`]; tests inject synthetic
//!   machines); the PCI tree, NUMA nodes and NICs come from sysfs. `NCCL_TOPO_FILE`, when set,
//!   replaces detection with that file; `NCCL_TOPO_DUMP_FILE` receives the result.
//! - [`System::from_xml`]`(text)` / [`System::to_xml`]: NCCL's topology XML
//!   (`<system version="1"><cpu><pci><gpu><nvlink/></gpu></pci><pci><nic><net/></nic></pci></cpu></system>`).
//! - [`System::paths`]: every GPU→GPU and GPU→NET path ([`Path`]: NCCL's path types LOC, NVL, NVB,
//!   PIX, PXB, PHB, SYS, NET and the bottleneck bandwidth), which `graph` and `tune` use.
//!
//! Bandwidths are in GB/s per direction, latencies in µs.

pub mod detect;
pub mod synthetic;
pub mod xml;

// For the tests, through the `internals` feature.
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use detect::{GpuInfo, GpuProbe, NvLinkInfo, StaticGpus, Sysfs};
pub use xml::XmlNode;

use crate::error::{Error, Result};
use std::collections::VecDeque;
use std::fmt;

/// NCCL's path types, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PathType {
    /// The same device.
    Loc,
    /// NVLink, directly or through NVSwitch.
    Nvl,
    /// NVLink through another GPU.
    Nvb,
    /// Chip-to-chip link to the CPU.
    C2c,
    /// At most one PCIe switch.
    Pix,
    /// Several PCIe switches, not through a CPU.
    Pxb,
    /// Through another GPU's NVLink and then PCIe (PCI x NVLink).
    Pxn,
    /// Through a PCIe host bridge (the CPU).
    Phb,
    /// Across CPUs (QPI/UPI/xGMI).
    Sys,
    /// Across the network.
    Net,
    /// Disconnected.
    Dis,
}

impl PathType {
    pub const ALL: [PathType; 11] = [
        PathType::Loc,
        PathType::Nvl,
        PathType::Nvb,
        PathType::C2c,
        PathType::Pix,
        PathType::Pxb,
        PathType::Pxn,
        PathType::Phb,
        PathType::Sys,
        PathType::Net,
        PathType::Dis,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PathType::Loc => "LOC",
            PathType::Nvl => "NVL",
            PathType::Nvb => "NVB",
            PathType::C2c => "C2C",
            PathType::Pix => "PIX",
            PathType::Pxb => "PXB",
            PathType::Pxn => "PXN",
            PathType::Phb => "PHB",
            PathType::Sys => "SYS",
            PathType::Net => "NET",
            PathType::Dis => "DIS",
        }
    }

    /// A level as `NCCL_P2P_LEVEL` and `NCCL_NET_GDR_LEVEL` accept it: a path type name (any
    /// case) or the legacy integers (0 LOC, 1 PIX, 2 PXB, 3 PHB, 4 and above SYS).
    pub fn parse_level(var: &str, v: &str) -> Result<PathType> {
        let t = v.trim();
        if let Some(n) = crate::env::parse_int(t) {
            return match n {
                0 => Ok(PathType::Loc),
                1 => Ok(PathType::Pix),
                2 => Ok(PathType::Pxb),
                3 => Ok(PathType::Phb),
                n if n >= 4 => Ok(PathType::Sys),
                _ => Err(Error::invalid_argument(format!(
                    "{var}={v}: a level is LOC, NVL, PIX, PXB, PHB, SYS or 0-4"
                ))),
            };
        }
        PathType::ALL
            .into_iter()
            .find(|p| p.as_str().eq_ignore_ascii_case(t))
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "{var}={v}: a level is LOC, NVL, PIX, PXB, PHB, SYS or 0-4"
                ))
            })
    }
}

impl fmt::Display for PathType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NodeKind {
    Gpu,
    /// A PCIe switch.
    Pci,
    /// All NVSwitches of the node, merged into one.
    Nvs,
    Cpu,
    /// A network card (PCI device); its ports are `Net` nodes.
    Nic,
    Net,
}

impl NodeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeKind::Gpu => "GPU",
            NodeKind::Pci => "PCI",
            NodeKind::Nvs => "NVS",
            NodeKind::Cpu => "CPU",
            NodeKind::Nic => "NIC",
            NodeKind::Net => "NET",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LinkKind {
    /// Inside a device (NIC to its port).
    Loc,
    Nvl,
    C2c,
    Pci,
    /// Between CPUs.
    Sys,
}

impl LinkKind {
    pub fn as_str(self) -> &'static str {
        match self {
            LinkKind::Loc => "LOC",
            LinkKind::Nvl => "NVL",
            LinkKind::C2c => "C2C",
            LinkKind::Pci => "PCI",
            LinkKind::Sys => "SYS",
        }
    }
}

/// A directed link to node `to`.
#[derive(Clone, Debug, PartialEq)]
pub struct Link {
    pub to: usize,
    pub kind: LinkKind,
    /// GB/s in this direction.
    pub bw: f64,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub kind: NodeKind,
    /// PCI bus id, NUMA id (CPU), or net name.
    pub id: String,
    pub links: Vec<Link>,
}

/// A GPU of the node.
#[derive(Clone, Debug, PartialEq)]
pub struct Gpu {
    /// CUDA device ordinal.
    pub dev: i32,
    /// The communicator rank it serves (as the XML's `rank`).
    pub rank: usize,
    /// Compute capability, major*10+minor (90 for H100/H200).
    pub sm: u32,
    /// GPUDirect RDMA capable.
    pub gdr: bool,
    pub busid: String,
    /// Its node in [`System::nodes`].
    pub node: usize,
}

/// A network port (NCCL's NET): what the net transport opens.
#[derive(Clone, Debug, PartialEq)]
pub struct Net {
    pub name: String,
    /// Index in the network plugin's device list.
    pub dev: i32,
    /// Mbit/s.
    pub speed: u64,
    pub port: i32,
    pub gdr: bool,
    pub node: usize,
}

impl Net {
    /// GB/s.
    pub fn bw(&self) -> f64 {
        self.speed as f64 / 8000.0
    }
}

/// The best path between two nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct Path {
    pub ty: PathType,
    /// The bottleneck bandwidth, GB/s.
    pub bw: f64,
    /// The directed links traversed, as (node, link index in that node).
    pub links: Vec<(usize, usize)>,
}

/// Paths from every GPU to every GPU and to every NET, indexed by position in
/// [`System::gpus`] / [`System::nets`].
#[derive(Clone, Debug)]
pub struct Paths {
    pub gpu_gpu: Vec<Vec<Path>>,
    pub gpu_net: Vec<Vec<Path>>,
}

/// One node's topology.
#[derive(Clone, Debug)]
pub struct System {
    /// The XML it was built from (what `NCCL_TOPO_DUMP_FILE` receives).
    pub xml: XmlNode,
    pub nodes: Vec<Node>,
    /// In rank order (then device order).
    pub gpus: Vec<Gpu>,
    pub nets: Vec<Net>,
}

/// GB/s of one NVLink of a GPU of compute capability `sm`, per direction, as NCCL's kernels reach
/// it (4×H200: 18 links give NVIDIA NCCL 362 GB/s busbw at 4 GiB).
pub fn nvlink_bw(sm: u32) -> f64 {
    match sm {
        0..=69 => 18.0,
        70..=79 => 20.0,
        80..=85 => 20.0,
        86..=89 => 12.0,
        90..=99 => 20.6,
        _ => 40.1,
    }
}

/// NVLinks one GPU of compute capability `sm` has.
pub fn max_nvlinks(sm: u32) -> u32 {
    match sm {
        0..=69 => 4,
        70..=79 => 6,
        80..=85 => 12,
        86..=89 => 4,
        _ => 18,
    }
}

/// GB/s of a PCIe link from sysfs-style speed ("16.0 GT/s PCIe", "8 GT/s") and width, as DMA
/// reaches it (about 75% of the raw rate: Gen3 x16 12 GB/s, Gen4 24, Gen5 48).
pub fn pci_bw(speed: Option<&str>, width: Option<i64>) -> f64 {
    let gts = speed
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse::<f64>().ok())
        .filter(|g| *g > 0.0)
        .unwrap_or(16.0);
    let width = width.filter(|w| *w > 0).unwrap_or(16) as f64;
    gts * width / 8.0 * 0.75
}

/// GB/s between two CPU sockets.
fn sys_bw(arch: Option<&str>, vendor: Option<&str>) -> f64 {
    match (arch, vendor) {
        (Some("ppc64" | "ppc64le"), _) => 32.0,
        (Some("aarch64" | "arm64"), _) => 6.0,
        (_, Some("AuthenticAMD")) => 16.0,
        _ => 10.0,
    }
}

const GPU_CLASSES: [&str; 2] = ["0x0302", "0x0300"];
const NVSWITCH_CLASS: &str = "0x068000";

fn is_gpu_class(class: &str) -> bool {
    GPU_CLASSES.iter().any(|c| class.starts_with(c))
}

/// `0000:07:00.0` in lower case with a 4-digit domain (NVML writes 8).
pub fn normalize_busid(b: &str) -> String {
    let b = b.trim().to_ascii_lowercase();
    match b.split_once(':') {
        Some((dom, rest)) if dom.len() > 4 && dom.chars().all(|c| c.is_ascii_hexdigit()) => {
            let d = u32::from_str_radix(dom, 16).unwrap_or(0);
            format!("{d:04x}:{rest}")
        }
        _ => b,
    }
}

impl System {
    /// Parses NCCL's topology XML.
    pub fn from_xml(text: &str) -> Result<System> {
        System::from_xml_node(XmlNode::parse(text)?)
    }

    /// Builds the node graph from an XML tree.
    pub fn from_xml_node(xml: XmlNode) -> Result<System> {
        if xml.name != "system" {
            return Err(Error::invalid_argument(format!(
                "topology XML: the root is <{}>, expected <system>",
                xml.name
            )));
        }
        let mut b = Builder::default();
        let mut cpus = Vec::new();
        for cpu in xml.children.iter().filter(|c| c.name == "cpu") {
            let id = cpu.attr("numaid").unwrap_or("-1").to_string();
            let n = b.add(NodeKind::Cpu, &id);
            cpus.push((n, sys_bw(cpu.attr("arch"), cpu.attr("vendor"))));
            for c in &cpu.children {
                b.walk(c, n, None)?;
            }
        }
        if cpus.is_empty() && !xml.children.is_empty() {
            return Err(Error::invalid_argument(
                "topology XML: <system> has no <cpu>",
            ));
        }
        for i in 0..cpus.len() {
            for j in 0..cpus.len() {
                if i != j {
                    let bw = cpus[i].1.min(cpus[j].1);
                    b.link(cpus[i].0, cpus[j].0, LinkKind::Sys, bw);
                }
            }
        }
        b.resolve_nvlinks(cpus.first().map(|c| c.0))?;
        let mut gpus = b.gpus;
        gpus.sort_by_key(|g| (g.rank, g.dev));
        for w in gpus.windows(2) {
            if w[0].rank == w[1].rank {
                return Err(Error::invalid_argument(format!(
                    "topology XML: GPUs {} and {} both have rank {}",
                    w[0].busid, w[1].busid, w[0].rank
                )));
            }
        }
        let mut nets = b.nets;
        nets.sort_by_key(|n| n.dev);
        Ok(System {
            xml,
            nodes: b.nodes,
            gpus,
            nets,
        })
    }

    /// NCCL's topology XML of this system.
    pub fn to_xml(&self) -> String {
        self.xml.to_text()
    }

    /// The lowest compute capability among the GPUs.
    pub fn min_sm(&self) -> u32 {
        self.gpus.iter().map(|g| g.sm).min().unwrap_or(0)
    }

    /// The best path from every GPU to every GPU and NET.
    pub fn paths(&self) -> Paths {
        let gpu_nodes: Vec<usize> = self.gpus.iter().map(|g| g.node).collect();
        let net_nodes: Vec<usize> = self.nets.iter().map(|n| n.node).collect();
        let mut gpu_gpu = Vec::new();
        let mut gpu_net = Vec::new();
        for &g in &gpu_nodes {
            let all = self.paths_from(g);
            let pick = |targets: &[usize]| -> Vec<Path> {
                targets
                    .iter()
                    .map(|&t| {
                        all[t].clone().unwrap_or(Path {
                            ty: PathType::Dis,
                            bw: 0.0,
                            links: Vec::new(),
                        })
                    })
                    .collect()
            };
            gpu_gpu.push(pick(&gpu_nodes));
            gpu_net.push(pick(&net_nodes));
        }
        Paths { gpu_gpu, gpu_net }
    }

    /// Best paths from node `src` to every node: lowest path type, then highest bandwidth, then
    /// fewest hops. GPUs relay only NVLink to NVLink (NVB); NICs only lead to their own ports;
    /// NET ports relay nothing.
    pub fn paths_from(&self, src: usize) -> Vec<Option<Path>> {
        #[derive(Clone)]
        struct Label {
            ty: PathType,
            bw: f64,
            hops: u32,
            switches: u32,
            prev: Option<(usize, usize)>,
        }
        fn better(a: &Label, b: &Label) -> bool {
            if a.ty != b.ty {
                return a.ty < b.ty;
            }
            if (a.bw - b.bw).abs() > 1e-9 {
                return a.bw > b.bw;
            }
            a.hops < b.hops
        }
        let n = self.nodes.len();
        let mut labels: Vec<Option<Label>> = vec![None; n];
        labels[src] = Some(Label {
            ty: PathType::Loc,
            bw: f64::INFINITY,
            hops: 0,
            switches: 0,
            prev: None,
        });
        let mut queue = VecDeque::from([src]);
        let mut rounds = 0usize;
        while let Some(u) = queue.pop_front() {
            rounds += 1;
            if rounds > 64 * n * n + 64 {
                break; // cannot happen on a sane graph; keeps a malformed one from spinning
            }
            let Some(lu) = labels[u].clone() else {
                continue;
            };
            let kind = self.nodes[u].kind;
            for (li, link) in self.nodes[u].links.iter().enumerate() {
                let v = link.to;
                if v == src {
                    continue;
                }
                if u != src {
                    let relay_ok = match kind {
                        NodeKind::Gpu => link.kind == LinkKind::Nvl && lu.ty <= PathType::Nvb,
                        NodeKind::Nic => self.nodes[v].kind == NodeKind::Net,
                        NodeKind::Net => false,
                        NodeKind::Nvs => link.kind == LinkKind::Nvl,
                        NodeKind::Pci | NodeKind::Cpu => true,
                    };
                    if !relay_ok {
                        continue;
                    }
                }
                let mut switches = lu.switches;
                let mut hop = match link.kind {
                    LinkKind::Loc => PathType::Loc,
                    LinkKind::Nvl => PathType::Nvl,
                    LinkKind::C2c => PathType::C2c,
                    LinkKind::Pci => PathType::Pix,
                    LinkKind::Sys => PathType::Sys,
                };
                if u != src {
                    match kind {
                        NodeKind::Gpu => hop = hop.max(PathType::Nvb),
                        NodeKind::Pci => {
                            switches += 1;
                            if switches > 1 {
                                hop = hop.max(PathType::Pxb);
                            }
                        }
                        NodeKind::Cpu => hop = hop.max(PathType::Phb),
                        _ => {}
                    }
                }
                let cand = Label {
                    ty: lu.ty.max(hop),
                    bw: lu.bw.min(link.bw),
                    hops: lu.hops + 1,
                    switches,
                    prev: Some((u, li)),
                };
                let replace = match &labels[v] {
                    None => true,
                    Some(old) => better(&cand, old),
                };
                if replace {
                    labels[v] = Some(cand);
                    queue.push_back(v);
                }
            }
        }
        (0..n)
            .map(|t| {
                let l = labels[t].as_ref()?;
                let mut links = Vec::new();
                let mut cur = l.prev;
                while let Some((u, li)) = cur {
                    links.push((u, li));
                    if links.len() > n {
                        return None;
                    }
                    cur = labels[u].as_ref().and_then(|x| x.prev);
                }
                links.reverse();
                Some(Path {
                    ty: l.ty,
                    bw: if t == src { f64::INFINITY } else { l.bw },
                    links,
                })
            })
            .collect()
    }

    /// Logs the topology at NCCL_DEBUG=INFO, in NCCL's indented form.
    pub fn log(&self) {
        if !log::log_enabled!(log::Level::Info) {
            return;
        }
        let max_bw = self
            .nodes
            .iter()
            .flat_map(|n| n.links.iter())
            .filter(|l| l.kind == LinkKind::Nvl)
            .map(|l| l.bw)
            .fold(0.0, f64::max);
        log::info!(
            "=== System : {} GPUs, {} NICs, max NVLink bw {max_bw:.1} ===",
            self.gpus.len(),
            self.nets.len()
        );
        for line in self.describe() {
            log::info!("{line}");
        }
    }

    /// The topology as lines: every node with its links.
    pub fn describe(&self) -> Vec<String> {
        let mut out = Vec::new();
        for n in &self.nodes {
            out.push(format!("{}/{}", n.kind.as_str(), n.id));
            for l in &n.links {
                let t = &self.nodes[l.to];
                out.push(format!(
                    "+ {}[{:.1}] - {}/{}",
                    l.kind.as_str(),
                    l.bw,
                    t.kind.as_str(),
                    t.id
                ));
            }
        }
        for g in &self.gpus {
            out.push(format!(
                "GPU {} rank {} sm {} busid {}",
                g.dev, g.rank, g.sm, g.busid
            ));
        }
        for net in &self.nets {
            out.push(format!(
                "NET/{} {} speed {} Mbps port {} gdr {}",
                net.dev, net.name, net.speed, net.port, net.gdr as u8
            ));
        }
        out
    }
}

#[derive(Default)]
struct Builder {
    nodes: Vec<Node>,
    gpus: Vec<Gpu>,
    nets: Vec<Net>,
    /// (gpu node, sm, target busid, count, tclass)
    nvlinks: Vec<(usize, u32, String, u32, String)>,
}

impl Builder {
    fn add(&mut self, kind: NodeKind, id: &str) -> usize {
        self.nodes.push(Node {
            kind,
            id: id.to_string(),
            links: Vec::new(),
        });
        self.nodes.len() - 1
    }

    /// A link each way, adding bandwidth to an existing link of the same kind.
    fn link(&mut self, a: usize, b: usize, kind: LinkKind, bw: f64) {
        if let Some(l) = self.nodes[a]
            .links
            .iter_mut()
            .find(|l| l.to == b && l.kind == kind)
        {
            l.bw += bw;
        } else {
            self.nodes[a].links.push(Link { to: b, kind, bw });
        }
    }

    fn link2(&mut self, a: usize, b: usize, kind: LinkKind, bw: f64) {
        self.link(a, b, kind, bw);
        self.link(b, a, kind, bw);
    }

    /// One element under a CPU or a PCI switch (`parent`), with the bandwidth of the PCI link
    /// above it when it is a `<pci>`.
    fn walk(&mut self, x: &XmlNode, parent: usize, _up: Option<f64>) -> Result<()> {
        match x.name.as_str() {
            "pci" => {
                let busid = normalize_busid(x.attr("busid").unwrap_or(""));
                let class = x.attr("class").unwrap_or("");
                let bw = pci_bw(x.attr("link_speed"), x.attr_int("link_width"));
                if let Some(g) = x.children.iter().find(|c| c.name == "gpu") {
                    let n = self.add(NodeKind::Gpu, &busid);
                    self.link2(n, parent, LinkKind::Pci, bw);
                    self.gpu(g, n, &busid)?;
                } else if let Some(nic) = x.children.iter().find(|c| c.name == "nic") {
                    let n = self.add(NodeKind::Nic, &busid);
                    self.link2(n, parent, LinkKind::Pci, bw);
                    self.nic(nic, n)?;
                } else if class.starts_with("0x0604") {
                    let n = self.add(NodeKind::Pci, &busid);
                    self.link2(n, parent, LinkKind::Pci, bw);
                    for c in &x.children {
                        self.walk(c, n, Some(bw))?;
                    }
                } else {
                    for c in &x.children {
                        self.walk(c, parent, Some(bw))?;
                    }
                }
            }
            "nic" => {
                // A NIC without a PCI device of its own (virtual): attach to the parent.
                let n = self.add(NodeKind::Nic, "virtual");
                self.link2(n, parent, LinkKind::Pci, pci_bw(None, None));
                self.nic(x, n)?;
            }
            _ => {}
        }
        Ok(())
    }

    fn gpu(&mut self, g: &XmlNode, node: usize, busid: &str) -> Result<()> {
        let bad =
            |what: &str| Error::invalid_argument(format!("topology XML: <gpu> of {busid}: {what}"));
        let dev = g.attr_int("dev").ok_or_else(|| bad("no dev"))?;
        let sm = g.attr_int("sm").ok_or_else(|| bad("no sm"))?;
        let rank = g.attr_int("rank").unwrap_or(dev);
        if dev < 0 || !(10..10000).contains(&sm) || rank < 0 {
            return Err(bad("dev, sm or rank out of range"));
        }
        self.gpus.push(Gpu {
            dev: dev as i32,
            rank: rank as usize,
            sm: sm as u32,
            gdr: g.attr_int("gdr").unwrap_or(1) != 0,
            busid: busid.to_string(),
            node,
        });
        for l in g.children.iter().filter(|c| c.name == "nvlink") {
            let target = normalize_busid(l.attr("target").unwrap_or(""));
            let count = l.attr_int("count").unwrap_or(1).clamp(0, 1024) as u32;
            let tclass = l.attr("tclass").unwrap_or("0x030200").to_string();
            self.nvlinks
                .push((node, sm as u32, target, count, tclass.to_ascii_lowercase()));
        }
        Ok(())
    }

    fn nic(&mut self, nic: &XmlNode, node: usize) -> Result<()> {
        for net in nic.children.iter().filter(|c| c.name == "net") {
            let name = net.attr("name").unwrap_or("net").to_string();
            let dev = net.attr_int("dev").unwrap_or(self.nets.len() as i64);
            let speed = net.attr_int("speed").unwrap_or(0).max(0) as u64;
            let n = self.add(NodeKind::Net, &format!("{dev}"));
            let bw = speed as f64 / 8000.0;
            self.link2(node, n, LinkKind::Loc, bw.max(0.001));
            self.nets.push(Net {
                name,
                dev: dev as i32,
                speed,
                port: net.attr_int("port").unwrap_or(1) as i32,
                gdr: net.attr_int("gdr").unwrap_or(0) != 0,
                node: n,
            });
        }
        Ok(())
    }

    fn resolve_nvlinks(&mut self, first_cpu: Option<usize>) -> Result<()> {
        let mut nvs = None;
        let mut links = std::mem::take(&mut self.nvlinks);
        // A GPU reporting more links to its peers than it has (NV18 to each of 3 peers on an
        // 18-link GPU) sees an NVSwitch fabric through per-pair counts: model the switch.
        for gpu in self.gpus.iter().map(|g| g.node) {
            let mine = || links.iter().filter(|l| l.0 == gpu && is_gpu_class(&l.4));
            let total: u32 = mine().map(|l| l.3).sum();
            let most = mine().map(|l| l.3).max().unwrap_or(0);
            let sm = mine().map(|l| l.1).next().unwrap_or(0);
            if total > max_nvlinks(sm) {
                links.retain(|l| !(l.0 == gpu && is_gpu_class(&l.4)));
                links.push((gpu, sm, String::new(), most, NVSWITCH_CLASS.to_string()));
            }
        }
        for (g, sm, target, count, tclass) in links {
            if count == 0 {
                continue;
            }
            let bw = nvlink_bw(sm) * count as f64;
            if tclass == NVSWITCH_CLASS {
                let s = *nvs.get_or_insert_with(|| self.add(NodeKind::Nvs, "0"));
                self.link2(g, s, LinkKind::Nvl, bw);
            } else if is_gpu_class(&tclass) {
                // Each GPU lists its own links, so one direction per element.
                if let Some(peer) = self.gpus.iter().find(|x| x.busid == target) {
                    let p = peer.node;
                    if p != g {
                        self.link(g, p, LinkKind::Nvl, bw);
                    }
                }
            } else if let Some(cpu) = first_cpu {
                // NVLink to a CPU (POWER9 / Grace).
                self.link2(g, cpu, LinkKind::Nvl, bw);
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_like_nccl() {
        assert_eq!(PathType::parse_level("X", "nvl").unwrap(), PathType::Nvl);
        assert_eq!(PathType::parse_level("X", "PXB").unwrap(), PathType::Pxb);
        assert_eq!(PathType::parse_level("X", "2").unwrap(), PathType::Pxb);
        assert_eq!(PathType::parse_level("X", "7").unwrap(), PathType::Sys);
        assert!(PathType::parse_level("X", "far").is_err());
        assert!(PathType::parse_level("X", "-1").is_err());
        assert_eq!(normalize_busid("00000000:07:00.0"), "0000:07:00.0");
        assert_eq!(normalize_busid("0000:0A:00.0"), "0000:0a:00.0");
        assert!((pci_bw(Some("16.0 GT/s PCIe"), Some(16)) - 24.0).abs() < 1e-9);
        assert!((pci_bw(Some("8 GT/s"), Some(16)) - 12.0).abs() < 1e-9);
    }
}
