//! Topology, graph search and tuning on synthetic machines (CPU only, no environment).

use nccl::graph::{self, Graphs, Params, Transport};
use nccl::topo::{synthetic, PathType, System, XmlNode};
use nccl::tune::Algo;
use nccl::tune::{AlgoFilter, Coll, Proto, ProtoFilter, TuneParams, Tuner};
use std::time::Instant;

fn sys(x: XmlNode) -> System {
    System::from_xml_node(x).expect("synthetic machine builds")
}

fn check_rings(g: &Graphs) {
    assert_eq!(g.rings.len(), g.nchannels);
    for (c, r) in g.rings.iter().enumerate() {
        assert_eq!(r.len(), g.nranks, "channel {c}");
        let mut seen = vec![false; g.nranks];
        for &x in r {
            assert!(
                !std::mem::replace(&mut seen[x], true),
                "rank {x} twice on channel {c}"
            );
        }
    }
}

/// Every rank is a node of the tree once, exactly one root, parents and children agree, every
/// rank reaches the root, at most 3 children.
fn check_tree(t: &graph::Tree, nranks: usize) {
    assert_eq!(t.nodes.len(), nranks);
    assert!(t.nodes[t.root].up.is_none());
    assert_eq!(t.nodes.iter().filter(|n| n.up.is_none()).count(), 1);
    for (r, n) in t.nodes.iter().enumerate() {
        assert!(n.down.len() <= 3, "rank {r} has {} children", n.down.len());
        for &d in &n.down {
            assert_eq!(t.nodes[d].up, Some(r));
        }
        if let Some(u) = n.up {
            assert!(t.nodes[u].down.contains(&r));
        }
    }
    // Every rank reaches the root (no cycles).
    let mut depth = vec![usize::MAX; nranks];
    depth[t.root] = 0;
    for r in 0..nranks {
        let mut chain = vec![];
        let mut cur = r;
        while depth[cur] == usize::MAX {
            chain.push(cur);
            cur = t.nodes[cur].up.expect("non-root has a parent");
            assert!(chain.len() <= nranks, "cycle");
        }
        let mut d = depth[cur];
        for &x in chain.iter().rev() {
            d += 1;
            depth[x] = d;
        }
    }
}

#[test]
fn h200x4_is_one_nvlink_ring_with_32_channels() {
    for x in [synthetic::h200x4(), synthetic::h200x4_direct()] {
        let s = sys(x);
        assert_eq!(s.gpus.len(), 4);
        let p = s.paths();
        for a in 0..4 {
            for b in 0..4 {
                let want = if a == b { PathType::Loc } else { PathType::Nvl };
                assert_eq!(p.gpu_gpu[a][b].ty, want);
                if a != b {
                    assert!((p.gpu_gpu[a][b].bw - 18.0 * 20.6).abs() < 1e-6);
                    assert_eq!(
                        graph::transport(&p, a, b, &Params::default()),
                        Transport::P2p
                    );
                }
            }
        }
        let g = graph::search(&s, 1, &Params::default()).unwrap();
        check_rings(&g);
        assert_eq!(g.nchannels, 32);
        assert!(g.all_nvlink);
        assert_eq!(g.intra_type, PathType::Nvl);
        assert!(
            g.bw_intra > 340.0 && g.bw_intra <= 370.8 + 1e-6,
            "{}",
            g.bw_intra
        );
        // One node: the tree is the chain of the ring's order.
        for t in &g.trees {
            check_tree(t, 4);
        }
        assert_eq!(g.ring_peers(0).len(), 32);
    }
}

#[test]
fn dgx_h100_paths_transports_and_gdr() {
    let s = sys(synthetic::dgx_h100());
    assert_eq!(s.gpus.len(), 8);
    assert_eq!(s.nets.len(), 8);
    let p = s.paths();
    // GPU 0 and NIC 0 share a PCIe switch; GPU 0 to NIC 2 crosses the CPU; to NIC 4 the CPUs.
    assert_eq!(p.gpu_net[0][0].ty, PathType::Pix);
    assert_eq!(p.gpu_net[0][2].ty, PathType::Phb);
    assert_eq!(p.gpu_net[0][4].ty, PathType::Sys);
    assert_eq!(p.gpu_gpu[0][7].ty, PathType::Nvl);
    let d = Params::default();
    assert!(graph::gdr(&s, &p, 0, 0, &d));
    assert!(!graph::gdr(&s, &p, 0, 2, &d));
    let phb = Params {
        net_gdr_level: Some(PathType::Phb),
        ..Default::default()
    };
    assert!(graph::gdr(&s, &p, 0, 2, &phb));
    assert!(!graph::gdr(&s, &p, 0, 4, &phb));
    let loc = Params {
        net_gdr_level: Some(PathType::Loc),
        ..Default::default()
    };
    assert!(!graph::gdr(&s, &p, 0, 0, &loc));
    // Transports follow the parameters.
    assert_eq!(graph::transport(&p, 0, 5, &d), Transport::P2p);
    let nop2p = Params {
        p2p_disable: true,
        ..Default::default()
    };
    assert_eq!(graph::transport(&p, 0, 5, &nop2p), Transport::Shm);
    let none = Params {
        p2p_disable: true,
        shm_disable: true,
        ..Default::default()
    };
    assert_eq!(graph::transport(&p, 0, 5, &none), Transport::Net);
    let lvl = Params {
        p2p_level: Some(PathType::Loc),
        ..Default::default()
    };
    assert_eq!(graph::transport(&p, 0, 5, &lvl), Transport::Shm);
}

#[test]
fn pcie_only_boxes() {
    let s = sys(synthetic::pcie2(true));
    let p = s.paths();
    assert_eq!(p.gpu_gpu[0][1].ty, PathType::Pix);
    assert!((p.gpu_gpu[0][1].bw - 24.0).abs() < 1e-6);
    let d = Params::default();
    assert_eq!(graph::transport(&p, 0, 1, &d), Transport::P2p);
    let nvl = Params {
        p2p_level: Some(PathType::Nvl),
        ..Default::default()
    };
    assert_eq!(graph::transport(&p, 0, 1, &nvl), Transport::Shm);
    assert!(!graph::gdr(&s, &p, 0, 0, &d), "the NIC is not GDR capable");
    let g = graph::search(&s, 1, &d).unwrap();
    check_rings(&g);
    assert!(!g.all_nvlink);
    assert!(g.nchannels >= 2 && g.nchannels <= 4, "{}", g.nchannels);
    let t = Tuner::new(&s, &g, &TuneParams::default());
    assert!(
        !t.enabled(Coll::AllReduce, Algo::Ring, Proto::Ll128),
        "LL128 needs NVLink"
    );

    let s = sys(synthetic::pcie2(false));
    let p = s.paths();
    assert_eq!(p.gpu_gpu[0][1].ty, PathType::Sys);
    assert_eq!(graph::transport(&p, 0, 1, &d), Transport::Shm);
    let sys_lvl = Params {
        p2p_level: Some(PathType::Sys),
        ..Default::default()
    };
    assert_eq!(graph::transport(&p, 0, 1, &sys_lvl), Transport::P2p);
    check_rings(&graph::search(&s, 1, &d).unwrap());
}

#[test]
fn multi_node_rings_and_double_binary_trees() {
    let s = sys(synthetic::dgx_h100());
    for nnodes in [2, 3, 4, 5, 8, 16, 33, 64] {
        let g = graph::search(&s, nnodes, &Params::default()).unwrap();
        check_rings(&g);
        assert_eq!(g.nranks, nnodes * 8);
        assert!(g.bw_inter > 0.0);
        for p in &g.patterns {
            assert_eq!(
                p.net_in, p.net_out,
                "default keeps rails when it costs nothing"
            );
        }
        let mut both = [false, false];
        for t in &g.trees {
            check_tree(t, g.nranks);
            both[t.which as usize] = true;
        }
        assert!(both[0] && both[1], "both trees are used");
        // Interior nodes (nodes with children in other nodes) of the two trees differ.
        let interior = |which: u8| -> Vec<usize> {
            let t = g.trees.iter().find(|t| t.which == which).unwrap();
            (0..nnodes)
                .filter(|&n| {
                    t.nodes
                        .iter()
                        .enumerate()
                        .any(|(r, x)| r / 8 != n && x.up.is_some_and(|u| u / 8 == n))
                })
                .collect()
        };
        let (a, b) = (interior(0), interior(1));
        let common = a.iter().filter(|x| b.contains(x)).count();
        assert!(common <= 1, "nnodes {nnodes}: interiors {a:?} and {b:?}");
    }
}

#[test]
fn cross_nic_and_channel_limits() {
    let s = sys(synthetic::dgx_h100());
    let rails = Params {
        cross_nic: 0,
        ..Default::default()
    };
    let g = graph::search(&s, 2, &rails).unwrap();
    for p in &g.patterns {
        assert_eq!(p.net_in, p.net_out);
    }
    let cross = Params {
        cross_nic: 1,
        ..Default::default()
    };
    let g = graph::search(&s, 2, &cross).unwrap();
    check_rings(&g);
    assert!(g.patterns.iter().any(|p| p.net_in != p.net_out));
    let few = Params {
        max_channels: 4,
        ..Default::default()
    };
    assert_eq!(graph::search(&s, 2, &few).unwrap().nchannels, 4);
    let many = Params {
        min_channels: 32,
        ..Default::default()
    };
    let g = graph::search(&sys(synthetic::pcie2(true)), 1, &many).unwrap();
    assert_eq!(g.nchannels, 32);
    check_rings(&g);
    // Explicit rank maps are honoured and checked.
    let map = vec![
        vec![7, 6, 5, 4, 3, 2, 1, 0],
        vec![8, 9, 10, 11, 12, 13, 14, 15],
    ];
    let g = graph::search_ranks(&s, &map, &Params::default()).unwrap();
    check_rings(&g);
    let bad = vec![vec![0, 0, 1, 2, 3, 4, 5, 6]];
    let e = graph::search_ranks(&s, &bad, &Params::default()).unwrap_err();
    assert_eq!(e.code, nccl::NcclResult::InvalidArgument);
    let e = graph::search(&sys(synthetic::h200x4()), 2, &Params::default()).unwrap_err();
    assert_eq!(
        e.code,
        nccl::NcclResult::InvalidUsage,
        "no NIC for two nodes"
    );
}

#[test]
fn search_1024_nodes_of_8() {
    let s = sys(synthetic::dgx_h100());
    let t0 = Instant::now();
    let g = graph::search(&s, 1024, &Params::default()).unwrap();
    let dt = t0.elapsed();
    println!(
        "search 1024 x 8 GPUs: {:.1} ms, {} channels",
        dt.as_secs_f64() * 1e3,
        g.nchannels
    );
    // (No time is asserted: the benchmark measures; a search that never ends is a hang.)
    check_rings(&g);
    for t in g.trees.iter().take(2) {
        check_tree(t, 8192);
    }
}

#[test]
fn xml_dump_load_round_trips() {
    for x in [
        synthetic::h200x4(),
        synthetic::h200x4_direct(),
        synthetic::dgx_h100(),
        synthetic::pcie2(true),
        synthetic::pcie2(false),
    ] {
        let s = sys(x);
        let text = s.to_xml();
        assert!(text.starts_with("<system version=\"1\">"));
        let back = System::from_xml(&text).unwrap();
        assert_eq!(back.xml, s.xml);
        assert_eq!(back.to_xml(), text);
        assert_eq!(back.gpus, s.gpus);
        assert_eq!(back.nets, s.nets);
        assert_eq!(back.nodes, s.nodes);
    }
    // NCCL's own layout, hand-written, with attributes we do not use.
    let text = r#"<?xml version="1.0"?>
<system version="1">
  <cpu host_hash="0x1" numaid="0" affinity="ffffffff" arch="x86_64" vendor="GenuineIntel" familyid="6" modelid="143">
    <pci busid="0000:18:00.0" class="0x060400" vendor="0x1000" device="0xc030" link_speed="32.0 GT/s PCIe" link_width="16">
      <pci busid="0000:19:00.0" class="0x030200" vendor="0x10de" device="0x2330" link_speed="32.0 GT/s PCIe" link_width="16">
        <gpu dev="0" sm="90" rank="0" gdr="1">
          <nvlink target="0000:1a:00.0" count="18" tclass="0x030200"/>
        </gpu>
      </pci>
      <pci busid="0000:1a:00.0" class="0x030200" link_speed="32.0 GT/s PCIe" link_width="16">
        <gpu dev="1" sm="90" rank="1" gdr="1">
          <nvlink target="0000:19:00.0" count="18" tclass="0x030200"/>
        </gpu>
      </pci>
      <pci busid="0000:1b:00.0" class="0x020000" link_speed="32.0 GT/s PCIe" link_width="16">
        <nic>
          <net name="mlx5_0" dev="0" speed="400000" port="1" latency="0.000000" guid="0x1" maxconn="131072" gdr="1"/>
        </nic>
      </pci>
    </pci>
  </cpu>
</system>
"#;
    let s = System::from_xml(text).unwrap();
    assert_eq!(s.gpus.len(), 2);
    assert_eq!(s.nets[0].name, "mlx5_0");
    assert_eq!(s.nets[0].speed, 400_000);
    let p = s.paths();
    assert_eq!(p.gpu_gpu[0][1].ty, PathType::Nvl);
    assert_eq!(p.gpu_net[1][0].ty, PathType::Pix);
    assert_eq!(System::from_xml(&s.to_xml()).unwrap().xml, s.xml);
    // Bad files are errors, not panics.
    for bad in [
        "<system><cpu><pci busid=\"0000:01:00.0\"><gpu sm=\"90\"/></pci></cpu></system>",
        "<topology/>",
        "<system><cpu>",
        "<system><cpu><pci><gpu dev=\"0\" sm=\"90\" rank=\"0\"/></pci><pci><gpu dev=\"1\" sm=\"90\" rank=\"0\"/></pci></cpu></system>",
    ] {
        assert!(System::from_xml(bad).is_err(), "{bad}");
    }
}

fn h200_tuner(params: &TuneParams) -> Tuner {
    let s = sys(synthetic::h200x4());
    let g = graph::search(&s, 1, &Params::default()).unwrap();
    Tuner::new(&s, &g, params)
}

fn busbw(bytes: usize, us: f64) -> f64 {
    bytes as f64 * 1.5 / us / 1e3
}

#[test]
fn tuner_on_h200x4() {
    let _ = env_logger::builder()
        .is_test(true)
        .filter_level(log::LevelFilter::Info)
        .try_init();
    let s = sys(synthetic::h200x4());
    s.log();
    graph::search(&s, 1, &Params::default())
        .unwrap()
        .log(0, true);
    let t = h200_tuner(&TuneParams::default());
    let tiny = t.choose(Coll::AllReduce, 8).unwrap();
    assert_eq!(tiny.proto, Proto::Ll, "{tiny:?}");
    assert_eq!(tiny.algo, Algo::Ring);
    assert!(tiny.nchannels <= 2 && tiny.nthreads <= 128, "{tiny:?}");
    assert!((7.0..12.0).contains(&tiny.est_time_us), "{tiny:?}");
    let big = t.choose(Coll::AllReduce, 1 << 30).unwrap();
    assert_eq!(big.algo, Algo::Ring);
    assert!(matches!(big.proto, Proto::Ll128 | Proto::Simple), "{big:?}");
    assert_eq!(big.nchannels, 32);
    assert_eq!(big.nthreads, 512);
    // The model against NVIDIA NCCL with one protocol forced (busbw GB/s, 4 GPUs).
    let forced = [
        (
            Proto::Ll,
            [
                (2usize << 20, 103.5),
                (16 << 20, 136.4),
                (128 << 20, 148.7),
                (1 << 30, 151.0),
            ],
        ),
        (
            Proto::Ll128,
            [
                (2 << 20, 106.3),
                (16 << 20, 243.5),
                (128 << 20, 302.7),
                (1 << 30, 333.0),
            ],
        ),
        (
            Proto::Simple,
            [
                (2 << 20, 71.5),
                (16 << 20, 251.4),
                (128 << 20, 328.9),
                (1 << 30, 354.3),
            ],
        ),
    ];
    for (proto, points) in forced {
        for (bytes, nccl) in points {
            let us = t
                .estimate(Coll::AllReduce, Algo::Ring, proto, bytes)
                .unwrap();
            let ours = busbw(bytes, us);
            println!(
                "{proto:>6} {:>5} MiB: model {ours:6.1} GB/s, NCCL {nccl:6.1}",
                bytes >> 20
            );
            assert!(
                (ours / nccl - 1.0).abs() < 0.3,
                "{proto} at {bytes}: {ours} vs {nccl}"
            );
        }
    }
    // At each size the pick is within 5% of the best forced NCCL number there.
    for (i, bytes) in [2usize << 20, 16 << 20, 128 << 20, 1 << 30]
        .into_iter()
        .enumerate()
    {
        let c = t.choose(Coll::AllReduce, bytes).unwrap();
        let nccl_of = |p: Proto| forced.iter().find(|f| f.0 == p).unwrap().1[i].1;
        let best = [Proto::Ll, Proto::Ll128, Proto::Simple]
            .into_iter()
            .map(nccl_of)
            .fold(0.0, f64::max);
        let got = nccl_of(c.proto);
        println!(
            "{:>5} MiB: pick {}/{} (NCCL forced {got}, best {best})",
            bytes >> 20,
            c.algo,
            c.proto
        );
        assert!(got >= 0.95 * best, "{bytes}: {c:?}");
    }
    // Tree exists only for AllReduce; other collectives pick rings.
    for coll in [
        Coll::AllGather,
        Coll::ReduceScatter,
        Coll::Broadcast,
        Coll::Reduce,
    ] {
        assert_eq!(t.choose(coll, 1 << 20).unwrap().algo, Algo::Ring);
    }
}

#[test]
fn tuner_honours_filters_and_threads() {
    let p = TuneParams {
        algo: AlgoFilter::parse("NCCL_ALGO", "allreduce:tree").unwrap(),
        proto: ProtoFilter::parse("NCCL_PROTO", "^LL").unwrap(),
        nthreads: Some(256),
        ..Default::default()
    };
    let t = h200_tuner(&p);
    let c = t.choose(Coll::AllReduce, 8).unwrap();
    assert_eq!((c.algo, c.nthreads), (Algo::Tree, 256));
    assert_ne!(c.proto, Proto::Ll);
    let p = TuneParams {
        algo: AlgoFilter::parse("NCCL_ALGO", "tree").unwrap(),
        ..Default::default()
    };
    let e = h200_tuner(&p).choose(Coll::AllGather, 1024).unwrap_err();
    assert_eq!(e.code, nccl::NcclResult::InvalidUsage);
    let p = TuneParams {
        proto: ProtoFilter::parse("NCCL_PROTO", "simple").unwrap(),
        ..Default::default()
    };
    assert_eq!(
        h200_tuner(&p).choose(Coll::AllReduce, 8).unwrap().proto,
        Proto::Simple
    );
}

#[test]
fn tuner_across_nodes_prefers_tree_on_one_nic_and_many_nodes() {
    // 8 GPUs with one slow NIC per node: the tree beats the ring at large sizes.
    let mut x = synthetic::dgx_h100();
    // Keep only the first NIC.
    fn strip(x: &mut XmlNode, keep: &mut bool) {
        x.children.retain(|c| {
            let is_nic = c.children.iter().any(|n| n.name == "nic");
            if is_nic {
                let k = *keep;
                *keep = false;
                k
            } else {
                true
            }
        });
        for c in &mut x.children {
            strip(c, keep);
        }
    }
    strip(&mut x, &mut true);
    let s = sys(x);
    assert_eq!(s.nets.len(), 1);
    let g = graph::search(&s, 4, &Params::default()).unwrap();
    check_rings(&g);
    let t = Tuner::new(&s, &g, &TuneParams::default());
    assert_eq!(t.choose(Coll::AllReduce, 1 << 30).unwrap().algo, Algo::Tree);
    // Many nodes: the ring's latency grows with the node count, the tree's with its log.
    let s = sys(synthetic::dgx_h100());
    let g = graph::search(&s, 256, &Params::default()).unwrap();
    let t = Tuner::new(&s, &g, &TuneParams::default());
    assert_eq!(
        t.choose(Coll::AllReduce, 64 << 10).unwrap().algo,
        Algo::Tree
    );
}

#[test]
fn tuner_across_nodes_ends_ll_where_the_network_steps_throttle_it() {
    // Two DGX H100 nodes: LL still serves the smallest AllReduce, but its per-channel rate over
    // the network (each step waits for the proxies) hands mid sizes to LL128 or Simple.
    let s = sys(synthetic::dgx_h100());
    let g = graph::search(&s, 2, &Params::default()).unwrap();
    let t = Tuner::new(&s, &g, &TuneParams::default());
    assert_eq!(t.choose(Coll::AllReduce, 8).unwrap().proto, Proto::Ll);
    let end = (3..=30)
        .map(|k| 1usize << k)
        .find(|&b| t.choose(Coll::AllReduce, b).unwrap().proto != Proto::Ll)
        .expect("LL ends somewhere");
    eprintln!("LL ends at {end} bytes across 2 nodes");
    assert!(end <= 256 << 10, "LL chosen up to {end} bytes across nodes");
}
