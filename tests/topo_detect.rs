//! Detection from a fake sysfs tree and an injected GPU probe, and NCCL_TOPO_FILE /
//! NCCL_TOPO_DUMP_FILE. One test function: it sets environment variables.

use nccl::topo::{synthetic, GpuInfo, GpuProbe, NvLinkInfo, PathType, Sysfs, System};
use std::path::{Path, PathBuf};

struct FakeProbe {
    gpus: Vec<GpuInfo>,
}

impl GpuProbe for FakeProbe {
    fn gpus(&self) -> nccl::Result<Vec<GpuInfo>> {
        Ok(self.gpus.clone())
    }
    fn nvlinks(&self, busid: &str) -> Vec<NvLinkInfo> {
        // GPU 0 and 1 joined by 4 NVLinks; the remote class is left for detection to find.
        let other = self.gpus.iter().find(|g| g.busid != busid);
        other
            .map(|o| {
                vec![NvLinkInfo {
                    target: o.busid.to_uppercase(),
                    tclass: None,
                    count: 4,
                }]
            })
            .unwrap_or_default()
    }
}

fn write(p: &Path, text: &str) {
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

/// root/sys/devices/pci0000:00/<root port>/<switch up>/<switch down>/<device>, with the
/// /sys/bus/pci/devices link.
fn pci_dev(root: &Path, chain: &[&str], class: &str, numa: i32) -> PathBuf {
    let mut dir = root.join("sys/devices/pci0000:00");
    for (i, b) in chain.iter().enumerate() {
        dir = dir.join(b);
        let last = i + 1 == chain.len();
        write(&dir.join("class"), if last { class } else { "0x060400" });
        write(&dir.join("max_link_speed"), "32.0 GT/s PCIe");
        write(&dir.join("max_link_width"), "16");
        write(&dir.join("numa_node"), &numa.to_string());
    }
    let bus = root.join("sys/bus/pci/devices");
    std::fs::create_dir_all(&bus).unwrap();
    let _ = std::os::unix::fs::symlink(&dir, bus.join(chain[chain.len() - 1]));
    dir
}

fn fake_sysfs() -> PathBuf {
    let root = std::env::temp_dir().join(format!("nccl-rs-sysfs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    let up = ["0000:00:01.0", "0000:01:00.0"];
    pci_dev(
        &root,
        &[up[0], up[1], "0000:02:00.0", "0000:03:00.0"],
        "0x030200",
        0,
    );
    pci_dev(
        &root,
        &[up[0], up[1], "0000:02:01.0", "0000:04:00.0"],
        "0x030200",
        0,
    );
    let nic = pci_dev(
        &root,
        &[up[0], up[1], "0000:02:02.0", "0000:05:00.0"],
        "0x020700",
        0,
    );
    let ib = root.join("sys/class/infiniband/mlx5_0");
    std::fs::create_dir_all(&ib).unwrap();
    std::os::unix::fs::symlink(&nic, ib.join("device")).unwrap();
    write(&ib.join("ports/1/state"), "4: ACTIVE");
    write(&ib.join("ports/1/rate"), "400 Gb/sec (4X NDR)");
    write(&ib.join("ports/2/state"), "1: DOWN");
    write(
        &root.join("sys/devices/system/node/node0/cpumap"),
        "ffffffff",
    );
    write(
        &root.join("proc/cpuinfo"),
        "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n",
    );
    root
}

#[test]
fn detection_topo_file_and_dump() {
    std::env::remove_var("NCCL_TOPO_FILE");
    std::env::remove_var("NCCL_TOPO_DUMP_FILE");
    let root = fake_sysfs();
    let probe = FakeProbe {
        gpus: vec![
            GpuInfo {
                dev: 0,
                rank: 0,
                busid: "0000:03:00.0".into(),
                sm: 90,
            },
            GpuInfo {
                dev: 1,
                rank: 1,
                busid: "0000:04:00.0".into(),
                sm: 90,
            },
        ],
    };
    let sysfs = Sysfs { root: root.clone() };
    let dump = root.join("dump.xml");
    std::env::set_var("NCCL_TOPO_DUMP_FILE", &dump);
    let s = System::detect_in(&probe, &sysfs).unwrap();
    println!("{}", s.to_xml());
    assert_eq!(s.gpus.len(), 2);
    assert_eq!(s.nets.len(), 1, "the down port is skipped");
    assert_eq!(s.nets[0].name, "mlx5_0");
    assert_eq!(s.nets[0].speed, 400_000);
    assert!(!s.nets[0].gdr, "no peer memory module in the fake tree");
    let p = s.paths();
    assert_eq!(p.gpu_gpu[0][1].ty, PathType::Nvl);
    assert!((p.gpu_gpu[0][1].bw - 4.0 * 20.6).abs() < 1e-6);
    assert_eq!(
        p.gpu_net[0][0].ty,
        PathType::Pix,
        "one switch between GPU and NIC"
    );
    assert!(s.xml.children[0].attr("vendor") == Some("GenuineIntel"));
    let dumped = std::fs::read_to_string(&dump).unwrap();
    assert_eq!(dumped, s.to_xml());
    assert_eq!(System::from_xml(&dumped).unwrap().xml, s.xml);

    // NCCL_TOPO_FILE replaces detection; local GPUs take their ranks, the others are dropped.
    let file = root.join("dgx.xml");
    std::fs::write(&file, synthetic::dgx_h100().to_text()).unwrap();
    std::env::remove_var("NCCL_TOPO_DUMP_FILE");
    std::env::set_var("NCCL_TOPO_FILE", &file);
    let s = System::detect_in(&probe, &sysfs).unwrap();
    assert_eq!(s.nets.len(), 8);
    assert_eq!(
        s.gpus.len(),
        8,
        "no local GPU in the file: the file is taken as it is"
    );
    let probe2 = FakeProbe {
        gpus: vec![
            GpuInfo {
                dev: 3,
                rank: 0,
                busid: "0000:32:00.0".into(),
                sm: 90,
            },
            GpuInfo {
                dev: 2,
                rank: 1,
                busid: "0000:11:00.0".into(),
                sm: 90,
            },
        ],
    };
    let s = System::detect_in(&probe2, &sysfs).unwrap();
    assert_eq!(s.gpus.len(), 2);
    assert_eq!(
        (s.gpus[0].busid.as_str(), s.gpus[0].dev),
        ("0000:32:00.0", 3)
    );
    assert_eq!(s.paths().gpu_gpu[0][1].ty, PathType::Nvl);
    // A missing or malformed file is an error with its name.
    std::env::set_var("NCCL_TOPO_FILE", root.join("missing.xml"));
    let e = System::detect_in(&probe, &sysfs).unwrap_err();
    assert!(e.message.contains("NCCL_TOPO_FILE"));
    std::fs::write(&file, "<system><cpu>").unwrap();
    std::env::set_var("NCCL_TOPO_FILE", &file);
    assert!(System::detect_in(&probe, &sysfs).is_err());
    std::env::remove_var("NCCL_TOPO_FILE");
    let _ = std::fs::remove_dir_all(&root);
}
