//! Detection from a fake sysfs tree and an injected GPU probe, and NCCL_TOPO_FILE /
//! NCCL_TOPO_DUMP_FILE: the parent makes the tree and the files, and each setting is a child
//! process started with it (the variables are read per process; nothing sets them here).

use crate::common::procs;
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

/// The fake tree's root, in a child (set by the parent).
const TREE: &str = "NCCL_RS_TEST_SYSFS";

fn probe() -> FakeProbe {
    FakeProbe {
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
    }
}

#[test]
fn detection_topo_file_and_dump() {
    let test = procs::current_test();
    if procs::is_child_for(&test) {
        let root = PathBuf::from(std::env::var(TREE).expect("the fake tree"));
        return procs::isolated_cases(&[], |case| detect_case(case, &root));
    }
    let root = fake_sysfs();
    let file = root.join("dgx.xml");
    std::fs::write(&file, synthetic::dgx_h100().to_text()).unwrap();
    let bad = root.join("bad.xml");
    std::fs::write(&bad, "<system><cpu>").unwrap();
    let (tree, dump) = (root.to_str().unwrap(), root.join("dump.xml"));
    let (dump, file) = (dump.to_str().unwrap(), file.to_str().unwrap());
    let missing = root.join("missing.xml");
    let (missing, bad) = (missing.to_str().unwrap(), bad.to_str().unwrap());
    let cases: [(&str, &[(&str, &str)]); 4] = [
        (
            "detect and dump",
            &[(TREE, tree), ("NCCL_TOPO_DUMP_FILE", dump)],
        ),
        ("topology file", &[(TREE, tree), ("NCCL_TOPO_FILE", file)]),
        ("missing file", &[(TREE, tree), ("NCCL_TOPO_FILE", missing)]),
        ("malformed file", &[(TREE, tree), ("NCCL_TOPO_FILE", bad)]),
    ];
    procs::isolated_cases(&cases, |_| unreachable!("the parent runs no case"));
    let _ = std::fs::remove_dir_all(&root);
}

fn detect_case(case: &str, root: &Path) {
    let probe = probe();
    let sysfs = Sysfs {
        root: root.to_path_buf(),
    };
    match case {
        "detect and dump" => detect_and_dump(&probe, &sysfs, root),
        "topology file" => topology_file(&probe, &sysfs),
        "missing file" => {
            // A missing file is an error with its name.
            let e = System::detect_in(&probe, &sysfs).unwrap_err();
            assert!(e.message.contains("NCCL_TOPO_FILE"), "{e}");
        }
        "malformed file" => assert!(System::detect_in(&probe, &sysfs).is_err()),
        other => panic!("no case {other}"),
    }
}

fn detect_and_dump(probe: &FakeProbe, sysfs: &Sysfs, root: &Path) {
    let dump = root.join("dump.xml");
    let s = System::detect_in(probe, sysfs).unwrap();
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
}

/// NCCL_TOPO_FILE replaces detection; local GPUs take their ranks, the others are dropped.
fn topology_file(probe: &FakeProbe, sysfs: &Sysfs) {
    let s = System::detect_in(probe, sysfs).unwrap();
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
    let s = System::detect_in(&probe2, sysfs).unwrap();
    assert_eq!(s.gpus.len(), 2);
    assert_eq!(
        (s.gpus[0].busid.as_str(), s.gpus[0].dev),
        ("0000:32:00.0", 3)
    );
    assert_eq!(s.paths().gpu_gpu[0][1].ty, PathType::Nvl);
}
