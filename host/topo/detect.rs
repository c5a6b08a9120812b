//! Detection of the local machine: GPUs through a [`GpuProbe`] (so tests can inject synthetic
//! machines), NVLink through NVML loaded at run time (absent NVML is no error: no NVLink facts),
//! and the PCI tree, NUMA nodes and NICs from sysfs (`/sys/bus/pci/devices`, `/sys/class/net`,
//! `/sys/class/infiniband`, `/sys/devices/system/node`), under a root tests can move.
//!
//! The result is NCCL's topology XML ([`XmlNode`]), from which [`System`] is built, so a detected
//! machine, a dumped one and a hand-written one go through the same code.

use super::xml::XmlNode;
use super::{normalize_busid, System, NVSWITCH_CLASS};
use crate::error::{Error, Result};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One GPU as the runtime sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GpuInfo {
    /// CUDA device ordinal.
    pub dev: i32,
    /// The communicator rank it serves.
    pub rank: usize,
    /// PCI bus id, `0000:07:00.0`.
    pub busid: String,
    /// Compute capability, major*10+minor.
    pub sm: u32,
}

/// NVLinks from one GPU to one remote device.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NvLinkInfo {
    /// The remote device's PCI bus id (a GPU, an NVSwitch or a CPU).
    pub target: String,
    /// Its PCI class (`0x030200` GPU, `0x068000` NVSwitch), when known.
    pub tclass: Option<String>,
    /// Active links to it.
    pub count: u32,
}

/// Where GPU facts come from.
pub trait GpuProbe {
    /// The GPUs to put in the topology.
    fn gpus(&self) -> Result<Vec<GpuInfo>>;
    /// Active NVLinks of the GPU at `busid`, grouped by remote device.
    fn nvlinks(&self, busid: &str) -> Vec<NvLinkInfo>;
}

/// GPUs given by the caller (the runtime knows them from CUDA), NVLinks from NVML when it loads.
pub struct StaticGpus {
    pub gpus: Vec<GpuInfo>,
    pub nvml: Option<&'static Nvml>,
}

impl StaticGpus {
    /// `gpus` with NVML opened if present.
    pub fn new(gpus: Vec<GpuInfo>) -> StaticGpus {
        StaticGpus {
            gpus,
            nvml: Nvml::shared(),
        }
    }
}

impl GpuProbe for StaticGpus {
    fn gpus(&self) -> Result<Vec<GpuInfo>> {
        Ok(self.gpus.clone())
    }
    fn nvlinks(&self, busid: &str) -> Vec<NvLinkInfo> {
        self.nvml.map(|n| n.nvlinks(busid)).unwrap_or_default()
    }
}

/// The sysfs tree to read (the real one at `/`; a fake one in tests).
#[derive(Clone, Debug)]
pub struct Sysfs {
    pub root: PathBuf,
}

impl Default for Sysfs {
    fn default() -> Sysfs {
        Sysfs { root: "/".into() }
    }
}

impl Sysfs {
    fn path(&self, p: &str) -> PathBuf {
        self.root.join(p.trim_start_matches('/'))
    }

    fn read(&self, p: &Path) -> Option<String> {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    }

    /// The PCI device directory of `busid`, resolved (its ancestors are the bridges above it).
    fn pci_dir(&self, busid: &str) -> Option<PathBuf> {
        std::fs::canonicalize(self.path("sys/bus/pci/devices").join(busid)).ok()
    }

    /// Attributes of a PCI device as NCCL's `<pci>` element carries them.
    fn pci_node(&self, dir: &Path, busid: &str) -> XmlNode {
        let mut x = XmlNode::new("pci").with("busid", busid);
        for (attr, file) in [
            ("class", "class"),
            ("vendor", "vendor"),
            ("device", "device"),
            ("subsystem_vendor", "subsystem_vendor"),
            ("subsystem_device", "subsystem_device"),
            ("link_speed", "max_link_speed"),
            ("link_width", "max_link_width"),
        ] {
            if let Some(v) = self.read(&dir.join(file)) {
                x.set(attr, v);
            }
        }
        x
    }

    /// NUMA node of a PCI device (0 when unknown).
    fn numa(&self, dir: &Path) -> i64 {
        self.read(&dir.join("numa_node"))
            .and_then(|s| s.parse::<i64>().ok())
            .filter(|n| *n >= 0)
            .unwrap_or(0)
    }

    /// The chain of PCI switches above a device: the upstream port of each switch level (the
    /// root port belongs to the CPU; a switch shows as an upstream and a downstream bridge).
    fn switches(&self, dir: &Path) -> Vec<(String, PathBuf)> {
        let mut bridges = Vec::new();
        let mut cur = dir.parent();
        while let Some(p) = cur {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if !is_busid(name) {
                break;
            }
            bridges.push((name.to_string(), p.to_path_buf()));
            cur = p.parent();
        }
        bridges.reverse(); // root port first
        bridges
            .into_iter()
            .skip(1)
            .step_by(2)
            .map(|(b, p)| (normalize_busid(&b), p))
            .collect()
    }

    fn cpu_node(&self, numa: i64) -> XmlNode {
        let mut x = XmlNode::new("cpu").with("numaid", numa);
        if let Some(map) =
            self.read(&self.path(&format!("sys/devices/system/node/node{numa}/cpumap")))
        {
            x.set("affinity", map);
        }
        x.set("arch", std::env::consts::ARCH);
        if let Some(info) = self.read(&self.path("proc/cpuinfo")) {
            let field = |k: &str| {
                info.lines()
                    .find(|l| l.split(':').next().map(str::trim) == Some(k))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            };
            if let Some(v) = field("vendor_id") {
                x.set("vendor", v);
            }
            if let Some(v) = field("cpu family") {
                x.set("familyid", v);
            }
            if let Some(v) = field("model") {
                x.set("modelid", v);
            }
        }
        x
    }

    /// Network ports: InfiniBand/RoCE devices with an active port, else physical Ethernet
    /// interfaces that are up. (name, PCI bus id, speed Mbit/s, port, gdr)
    fn nets(&self) -> Vec<(String, Option<String>, u64, i32, bool)> {
        let mut out = Vec::new();
        let peermem = self
            .path("sys/kernel/mm/memory_peers/nv_mem/version")
            .exists()
            || self.path("sys/module/nvidia_peermem").exists();
        let list = |d: &str| -> Vec<String> {
            let mut v: Vec<String> = std::fs::read_dir(self.path(d))
                .map(|rd| {
                    rd.filter_map(|e| e.ok())
                        .filter_map(|e| e.file_name().to_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default();
            v.sort();
            v
        };
        let busid_of = |dev_link: PathBuf| {
            std::fs::canonicalize(dev_link).ok().and_then(|p| {
                p.file_name()
                    .and_then(|n| n.to_str())
                    .filter(|n| is_busid(n))
                    .map(normalize_busid)
            })
        };
        for ib in list("sys/class/infiniband") {
            let base = self.path("sys/class/infiniband").join(&ib);
            for port in list(&format!("sys/class/infiniband/{ib}/ports")) {
                let pdir = base.join("ports").join(&port);
                let active = self
                    .read(&pdir.join("state"))
                    .is_some_and(|s| s.contains("ACTIVE"));
                if !active {
                    continue;
                }
                // "400 Gb/sec (4X NDR)"
                let gbps = self
                    .read(&pdir.join("rate"))
                    .and_then(|r| {
                        r.split_whitespace()
                            .next()
                            .and_then(|x| x.parse::<f64>().ok())
                    })
                    .unwrap_or(100.0);
                out.push((
                    ib.clone(),
                    busid_of(base.join("device")),
                    (gbps * 1000.0) as u64,
                    port.parse().unwrap_or(1),
                    peermem,
                ));
            }
        }
        if out.is_empty() {
            for ifc in list("sys/class/net") {
                let base = self.path("sys/class/net").join(&ifc);
                if !base.join("device").exists() {
                    continue; // virtual: lo, docker, bridges
                }
                if self.read(&base.join("operstate")).as_deref() != Some("up") {
                    continue;
                }
                let speed = self
                    .read(&base.join("speed"))
                    .and_then(|s| s.parse::<i64>().ok())
                    .filter(|s| *s > 0)
                    .unwrap_or(10_000) as u64;
                out.push((ifc, busid_of(base.join("device")), speed, 1, false));
            }
        }
        out
    }
}

fn is_busid(s: &str) -> bool {
    // dddd:bb:dd.f
    let b = s.as_bytes();
    b.len() == 12 && b[4] == b':' && b[7] == b':' && b[10] == b'.'
}

/// Builds NCCL's topology XML of this machine from `probe` and `sysfs`.
pub fn detect_xml(probe: &dyn GpuProbe, sysfs: &Sysfs) -> Result<XmlNode> {
    let gpus = probe.gpus()?;
    let gpu_busids: Vec<String> = gpus.iter().map(|g| normalize_busid(&g.busid)).collect();
    // numa -> cpu element; devices are inserted under their switch chain.
    let mut cpus: BTreeMap<i64, XmlNode> = BTreeMap::new();
    let mut insert = |cpu_numa: i64, chain: Vec<XmlNode>, leaf: XmlNode, sysfs: &Sysfs| {
        let cpu = cpus
            .entry(cpu_numa)
            .or_insert_with(|| sysfs.cpu_node(cpu_numa));
        let mut at = cpu;
        for sw in chain {
            let id = sw.attr("busid").map(str::to_string);
            let pos = at
                .children
                .iter()
                .position(|c| c.name == "pci" && c.attr("busid").map(str::to_string) == id);
            let i = match pos {
                Some(i) => i,
                None => {
                    at.children.push(sw);
                    at.children.len() - 1
                }
            };
            at = &mut at.children[i];
        }
        at.children.push(leaf);
    };
    let place = |busid: &str| -> (i64, Vec<XmlNode>, XmlNode) {
        match sysfs.pci_dir(busid) {
            Some(dir) => {
                let chain = sysfs
                    .switches(&dir)
                    .into_iter()
                    .map(|(b, p)| sysfs.pci_node(&p, &b))
                    .collect();
                (sysfs.numa(&dir), chain, sysfs.pci_node(&dir, busid))
            }
            None => (0, Vec::new(), XmlNode::new("pci").with("busid", busid)),
        }
    };
    for (g, busid) in gpus.iter().zip(&gpu_busids) {
        let (numa, chain, mut pci) = place(busid);
        if pci.attr("class").is_none() {
            pci.set("class", "0x030200");
        }
        let mut gpu = XmlNode::new("gpu")
            .with("dev", g.dev)
            .with("sm", g.sm)
            .with("rank", g.rank)
            .with("gdr", 1);
        for l in probe.nvlinks(busid) {
            let target = normalize_busid(&l.target);
            let tclass = l.tclass.clone().unwrap_or_else(|| {
                if gpu_busids.contains(&target) {
                    "0x030200".to_string()
                } else {
                    sysfs
                        .pci_dir(&target)
                        .and_then(|d| sysfs.read(&d.join("class")))
                        // Not visible (a VM hides NVSwitches): NCCL's reading, an NVSwitch.
                        .unwrap_or_else(|| NVSWITCH_CLASS.to_string())
                }
            });
            gpu.children.push(
                XmlNode::new("nvlink")
                    .with("target", target)
                    .with("count", l.count)
                    .with("tclass", tclass),
            );
        }
        pci.children.push(gpu);
        insert(numa, chain, pci, sysfs);
    }
    // Group ports by NIC.
    let mut nics: Vec<(Option<String>, XmlNode)> = Vec::new();
    for (i, (name, busid, speed, port, gdr)) in sysfs.nets().into_iter().enumerate() {
        let net = XmlNode::new("net")
            .with("name", &name)
            .with("dev", i)
            .with("speed", speed)
            .with("port", port)
            .with("gdr", gdr as u8);
        match nics.iter_mut().find(|(b, _)| b.is_some() && *b == busid) {
            Some((_, nic)) => nic.children.push(net),
            None => nics.push((busid, XmlNode::new("nic").child(net))),
        }
    }
    for (busid, nic) in nics {
        match busid {
            Some(b) => {
                let (numa, chain, pci) = place(&b);
                insert(numa, chain, pci.child(nic), sysfs);
            }
            None => insert(0, Vec::new(), nic, sysfs),
        }
    }
    let mut system = XmlNode::new("system").with("version", 1);
    system.children = cpus.into_values().collect();
    Ok(system)
}

impl System {
    /// The machine this process runs on, for the GPUs `probe` lists: `NCCL_TOPO_FILE` when set
    /// (the ranks of its GPUs are replaced by those of `probe`'s GPUs with the same bus id),
    /// else detection from sysfs and NVML. Writes `NCCL_TOPO_DUMP_FILE` when set and logs the
    /// result at NCCL_DEBUG=INFO.
    pub fn detect(probe: &dyn GpuProbe) -> Result<System> {
        System::detect_in(probe, &Sysfs::default())
    }

    /// [`System::detect`] with sysfs under another root.
    pub fn detect_in(probe: &dyn GpuProbe, sysfs: &Sysfs) -> Result<System> {
        let xml = match crate::env::TOPO_FILE.raw() {
            Some(path) => {
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| Error::invalid_argument(format!("NCCL_TOPO_FILE={path}: {e}")))?;
                let mut x = XmlNode::parse(&text)
                    .map_err(|e| e.context(format!("NCCL_TOPO_FILE={path}")))?;
                let gpus = probe.gpus()?;
                let mut found = Vec::new();
                x.find_all_mut_pci(&mut |pci| {
                    let busid = normalize_busid(pci.attr("busid").unwrap_or(""));
                    if let Some(g) = gpus.iter().find(|g| normalize_busid(&g.busid) == busid) {
                        if let Some(gx) = pci.children.iter_mut().find(|c| c.name == "gpu") {
                            gx.set("dev", g.dev);
                            gx.set("rank", g.rank);
                            found.push(busid);
                        }
                    }
                });
                if !found.is_empty() {
                    // Keep only this communicator's GPUs.
                    x.retain_pci(&|pci| {
                        let busid = normalize_busid(pci.attr("busid").unwrap_or(""));
                        !pci.children.iter().any(|c| c.name == "gpu") || found.contains(&busid)
                    });
                }
                log::info!(
                    "Loaded topology from NCCL_TOPO_FILE={path} ({} of {} local GPUs found in it)",
                    found.len(),
                    gpus.len()
                );
                x
            }
            None => detect_xml(probe, sysfs)?,
        };
        let system = System::from_xml_node(xml)?;
        if let Some(path) = crate::env::TOPO_DUMP_FILE.raw() {
            std::fs::write(&path, system.to_xml())
                .map_err(|e| Error::system(format!("NCCL_TOPO_DUMP_FILE={path}: {e}")))?;
            log::info!("Topology dumped to {path}");
        }
        system.log();
        Ok(system)
    }
}

impl XmlNode {
    fn retain_pci(&mut self, keep: &dyn Fn(&XmlNode) -> bool) {
        self.children.retain(|c| c.name != "pci" || keep(c));
        for c in &mut self.children {
            c.retain_pci(keep);
        }
    }

    fn find_all_mut_pci(&mut self, f: &mut dyn FnMut(&mut XmlNode)) {
        if self.name == "pci" {
            f(self);
        }
        for c in &mut self.children {
            c.find_all_mut_pci(f);
        }
    }
}

/// NVML, opened at run time from `libnvidia-ml.so.1`, once per process.
pub struct Nvml {
    lib: libloading::Library,
    /// Queries one at a time: communicators initialised by several threads at once (one per
    /// GPU) saw NVLinks missing on one thread when each opened and queried NVML on its own.
    queries: std::sync::Mutex<()>,
}

static NVML: std::sync::OnceLock<Option<Nvml>> = std::sync::OnceLock::new();

/// nvmlPciInfo_t (NVML's v3 layout: legacy bus id, domain, bus, device, ids, bus id).
#[repr(C)]
#[allow(dead_code)] // filled by NVML; only the bus id is read
struct NvmlPciInfo {
    bus_id_legacy: [u8; 16],
    domain: u32,
    bus: u32,
    device: u32,
    pci_device_id: u32,
    pci_sub_system_id: u32,
    bus_id: [u8; 32],
}

type NvmlDevice = *mut std::ffi::c_void;
const NVML_MAX_LINKS: u32 = 18;

impl Nvml {
    /// The process's NVML, opened on first use and kept open; `None` (no NVLink facts) where
    /// the library does not load or initialise.
    pub fn shared() -> Option<&'static Nvml> {
        NVML.get_or_init(Nvml::open).as_ref()
    }

    fn open() -> Option<Nvml> {
        // SAFETY: loading NVML runs its constructors, which have no preconditions; the symbol has
        // NVML's documented signature `nvmlReturn_t nvmlInit_v2(void)`.
        unsafe {
            let lib = libloading::Library::new("libnvidia-ml.so.1").ok()?;
            let rc = {
                let init: libloading::Symbol<unsafe extern "C" fn() -> i32> =
                    lib.get(b"nvmlInit_v2\0").ok()?;
                init()
            };
            if rc != 0 {
                log::info!("NVML present but nvmlInit_v2 failed ({rc}): no NVLink information");
                return None;
            }
            Some(Nvml {
                lib,
                queries: std::sync::Mutex::new(()),
            })
        }
    }

    /// Active NVLinks of the GPU at `busid`, grouped by remote bus id.
    pub fn nvlinks(&self, busid: &str) -> Vec<NvLinkInfo> {
        let mut out: Vec<NvLinkInfo> = Vec::new();
        let Ok(cbus) = std::ffi::CString::new(busid) else {
            return out;
        };
        let _one_at_a_time = self.queries.lock().unwrap_or_else(|e| e.into_inner());
        type ByBus = unsafe extern "C" fn(*const std::ffi::c_char, *mut NvmlDevice) -> i32;
        type State = unsafe extern "C" fn(NvmlDevice, u32, *mut i32) -> i32;
        type Remote = unsafe extern "C" fn(NvmlDevice, u32, *mut NvmlPciInfo) -> i32;
        // SAFETY: the symbols have NVML's documented signatures (nvmlDeviceGetHandleByPciBusId_v2,
        // nvmlDeviceGetNvLinkState, nvmlDeviceGetNvLinkRemotePciInfo_v2); every out-pointer is a
        // live local of the declared type; the bus id is NUL-terminated and outlives the calls.
        unsafe {
            let (Ok(by_bus), Ok(state), Ok(remote)) = (
                self.lib.get::<ByBus>(b"nvmlDeviceGetHandleByPciBusId_v2\0"),
                self.lib.get::<State>(b"nvmlDeviceGetNvLinkState\0"),
                self.lib
                    .get::<Remote>(b"nvmlDeviceGetNvLinkRemotePciInfo_v2\0"),
            ) else {
                return out;
            };
            let mut dev: NvmlDevice = std::ptr::null_mut();
            if by_bus(cbus.as_ptr(), &mut dev) != 0 {
                return out;
            }
            for link in 0..NVML_MAX_LINKS {
                let mut active = 0i32;
                if state(dev, link, &mut active) != 0 || active == 0 {
                    continue;
                }
                let mut pci: NvmlPciInfo = std::mem::zeroed();
                if remote(dev, link, &mut pci) != 0 {
                    continue;
                }
                let end = pci.bus_id.iter().position(|&b| b == 0).unwrap_or(32);
                let target = normalize_busid(&String::from_utf8_lossy(&pci.bus_id[..end]));
                match out.iter_mut().find(|l| l.target == target) {
                    Some(l) => l.count += 1,
                    None => out.push(NvLinkInfo {
                        target,
                        tclass: None,
                        count: 1,
                    }),
                }
            }
        }
        out
    }
}
