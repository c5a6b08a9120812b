//! Machines we do not have, as topology XML: for tests, for the simulator, and for asking "what
//! would the search do there". Each returns NCCL's XML; [`System::from_xml_node`] builds it.

use super::xml::XmlNode;
use super::System;
use crate::error::Result;

fn cpu(numa: u32, vendor: &str) -> XmlNode {
    XmlNode::new("cpu")
        .with("numaid", numa)
        .with("affinity", if numa == 0 { "0000ffff" } else { "ffff0000" })
        .with("arch", "x86_64")
        .with("vendor", vendor)
        .with("familyid", 25)
        .with("modelid", 17)
}

fn pci(busid: &str, class: &str, speed: &str, width: u32) -> XmlNode {
    XmlNode::new("pci")
        .with("busid", busid)
        .with("class", class)
        .with("link_speed", speed)
        .with("link_width", width)
}

/// A GPU's `<pci>` with its `<gpu>`; `nvlinks` are (target bus id, count, target class).
pub fn gpu(
    busid: &str,
    dev: usize,
    sm: u32,
    speed: &str,
    nvlinks: &[(String, u32, &str)],
) -> XmlNode {
    let mut g = XmlNode::new("gpu")
        .with("dev", dev)
        .with("sm", sm)
        .with("rank", dev)
        .with("gdr", 1);
    for (t, c, cl) in nvlinks {
        g.children.push(
            XmlNode::new("nvlink")
                .with("target", t)
                .with("count", c)
                .with("tclass", cl),
        );
    }
    pci(busid, "0x030200", speed, 16)
        .with("vendor", "0x10de")
        .child(g)
}

/// A NIC's `<pci>` with one port.
pub fn nic(busid: &str, name: &str, dev: usize, speed_mbps: u64, gdr: bool) -> XmlNode {
    pci(busid, "0x020700", "32.0 GT/s PCIe", 16).child(
        XmlNode::new("nic").child(
            XmlNode::new("net")
                .with("name", name)
                .with("dev", dev)
                .with("speed", speed_mbps)
                .with("port", 1)
                .with("gdr", gdr as u8),
        ),
    )
}

/// The 4×H200 host: every GPU with 18 NVLinks to the NVSwitch fabric (`nvidia-smi topo -m`
/// NV18 between all pairs), PCIe Gen5 under one CPU, no NIC.
pub fn h200x4() -> XmlNode {
    nvswitch_node(4, 90)
}

/// `ngpus` GPUs of compute capability `sm`, each with 18 NVLinks to one NVSwitch fabric, under
/// one CPU: the 4×H200 host for 4, and the machine the simulator presents for any count.
pub fn nvswitch_node(ngpus: usize, sm: u32) -> XmlNode {
    let mut c = cpu(0, "AuthenticAMD");
    for d in 0..ngpus {
        let nvs = vec![("0000:ff:00.0".to_string(), 18, "0x068000")];
        c.children.push(gpu(
            &format!("{:04x}:{:02x}:00.0", d / 200, 6 + d % 200),
            d,
            sm,
            "32.0 GT/s PCIe",
            &nvs,
        ));
    }
    XmlNode::new("system").with("version", 1).child(c)
}

/// 4 H200 where each pair has its own 18 NVLinks (the same NV18 seen as direct links).
pub fn h200x4_direct() -> XmlNode {
    let mut c = cpu(0, "AuthenticAMD");
    let bus = |d: usize| format!("0000:{:02x}:00.0", 6 + d);
    for d in 0..4 {
        let links: Vec<(String, u32, &str)> = (0..4)
            .filter(|&p| p != d)
            .map(|p| (bus(p), 18, "0x030200"))
            .collect();
        c.children
            .push(gpu(&bus(d), d, 90, "32.0 GT/s PCIe", &links));
    }
    XmlNode::new("system").with("version", 1).child(c)
}

/// A DGX-H100-like box: 2 CPUs, 4 PCIe Gen5 switches (2 per CPU), each with 2 GPUs and 2
/// 400 Gb/s NICs (GPUDirect capable), every GPU with 18 NVLinks to the NVSwitches.
pub fn dgx_h100() -> XmlNode {
    let mut sys = XmlNode::new("system").with("version", 1);
    let mut dev = 0;
    for numa in 0..2u32 {
        let mut c = cpu(numa, "GenuineIntel");
        for s in 0..2u32 {
            let sw_bus = 0x10 + 0x40 * numa + 0x20 * s;
            let mut sw = pci(
                &format!("0000:{sw_bus:02x}:00.0"),
                "0x060400",
                "32.0 GT/s PCIe",
                16,
            );
            for k in 0..2u32 {
                let nvs = vec![("0000:fe:00.0".to_string(), 18, "0x068000")];
                sw.children.push(gpu(
                    &format!("0000:{:02x}:00.0", sw_bus + 1 + k),
                    dev,
                    90,
                    "32.0 GT/s PCIe",
                    &nvs,
                ));
                sw.children.push(nic(
                    &format!("0000:{:02x}:00.0", sw_bus + 8 + k),
                    &format!("mlx5_{dev}"),
                    dev,
                    400_000,
                    true,
                ));
                dev += 1;
            }
            c.children.push(sw);
        }
        sys.children.push(c);
    }
    sys
}

/// Two PCIe Gen4 GPUs without NVLink: under one PCIe switch (`same_switch`), or each under its
/// own CPU (the path crosses the CPUs' interconnect). One 100 Gb/s NIC, no GPUDirect.
pub fn pcie2(same_switch: bool) -> XmlNode {
    let g = |b: &str, d| gpu(b, d, 80, "16.0 GT/s PCIe", &[]);
    let n = nic("0000:30:00.0", "eth0", 0, 100_000, false);
    if same_switch {
        let sw = pci("0000:10:00.0", "0x060400", "16.0 GT/s PCIe", 16)
            .child(g("0000:11:00.0", 0))
            .child(g("0000:12:00.0", 1));
        XmlNode::new("system")
            .with("version", 1)
            .child(cpu(0, "GenuineIntel").child(sw).child(n))
    } else {
        XmlNode::new("system")
            .with("version", 1)
            .child(cpu(0, "GenuineIntel").child(g("0000:11:00.0", 0)).child(n))
            .child(cpu(1, "GenuineIntel").child(g("0000:91:00.0", 1)))
    }
}

impl System {
    /// [`h200x4`] built.
    pub fn synthetic_h200x4() -> Result<System> {
        System::from_xml_node(h200x4())
    }
    /// [`dgx_h100`] built.
    pub fn synthetic_dgx_h100() -> Result<System> {
        System::from_xml_node(dgx_h100())
    }
}
