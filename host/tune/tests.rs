//! The tuner's model, filters and choices.

use super::*;
use crate::graph::{Graphs, Pattern};
use crate::topo::synthetic;

/// A tuner for `nnodes` nodes of `nlocal` NVSwitch GPUs joined by a 10 Gb/s network of
/// `lat_us` latency, 8 channels, the kernels the communicators build.
fn across_nodes(nnodes: usize, nlocal: usize, lat_us: f64) -> Tuner {
    across(nnodes, nlocal, lat_us, 1.25)
}

/// [`across_nodes`] with a network of `gbs` GB/s.
fn across(nnodes: usize, nlocal: usize, lat_us: f64, gbs: f64) -> Tuner {
    let system = System::from_xml_node(synthetic::nvswitch_node(nlocal, 90)).unwrap();
    let nranks = nnodes * nlocal;
    let graphs = Graphs {
        nranks,
        nnodes,
        nchannels: 8,
        patterns: vec![Pattern {
            gpus: (0..nlocal).collect(),
            net_in: Some(0),
            net_out: Some(0),
        }],
        rings: vec![(0..nranks).collect(); 8],
        trees: Vec::new(),
        speed: gbs,
        // A node of one GPU: its search finds no link inside it, and what it reports must
        // not bound the tree (which has no chain there).
        bw_intra: if nlocal == 1 { 5.0 } else { 160.0 },
        bw_inter: gbs,
        lat_inter: lat_us,
        intra_type: PathType::Nvl,
        net_type: PathType::Net,
        all_nvlink: true,
    };
    let mut built = [[false; NUM_PROTOS]; NUM_ALGOS];
    for (a, p) in [
        (Algo::Ring, Proto::Simple),
        (Algo::Ring, Proto::Ll),
        (Algo::Tree, Proto::Simple),
        (Algo::Tree, Proto::Ll),
    ] {
        built[a as usize][p as usize] = true;
    }
    let params = TuneParams {
        built,
        ..TuneParams::default()
    };
    Tuner::new(&system, &graphs, &params)
}

/// Asserts the tuner's AllReduce choice (algorithm, protocol) at each size.
fn assert_allreduce_choices(t: &Tuner, what: &str, expected: &[(usize, Algo, Proto)]) {
    for &(bytes, algo, proto) in expected {
        let c = t.choose(Coll::AllReduce, bytes).unwrap();
        assert_eq!((c.algo, c.proto), (algo, proto), "{what}, {bytes} B");
    }
}

#[test]
fn mid_sized_calls_across_nodes_keep_to_four_channels() {
    let t = across_nodes(2, 1, 25.0);
    // Simple: 64 KiB a channel up to 4, then 256 KiB a channel (measured on one H200).
    for (bytes, expected) in [(128 << 10, 2), (512 << 10, 4), (1 << 20, 4), (2 << 20, 8)] {
        assert_eq!(
            t.launch_channels(Proto::Simple, bytes),
            expected,
            "{bytes} B"
        );
    }
    // The model keeps counting 8 (its ring/tree fits were made so).
    assert_eq!(t.channels_for(Proto::Simple, 512 << 10), 8);
    let rs = t.choose(Coll::ReduceScatter, 512 << 10).unwrap();
    assert_eq!((rs.proto, rs.nchannels), (Proto::Simple, 4));
    // LL keeps its own rule; inside one node nothing changes.
    assert_eq!(t.launch_channels(Proto::Ll, 128 << 10), 8);
    let one_node = across_nodes(1, 8, 25.0);
    assert_eq!(one_node.launch_channels(Proto::Simple, 512 << 10), 8);
}

#[test]
fn calls_across_nodes_follow_the_measured_choices() {
    // 2 x 1 over loopback (10 GB/s) with both exchanges, as the communicators set them:
    // the best forced choice of results/h100-nodes2-tuner-exchange.txt at each size (mean
    // of 3 rounds): Ring/LL to 16 KiB (19.7-32.5 us), Tree/Simple at 256 KiB and 1 MiB (105
    // and 200 us against the ring's 167 and 306), Ring/Simple from 4 MiB (557 us against 647).
    // One H200 (results/h200-nodes2-latency-tuner-idle-s15.txt, medians of 6): Tree/Simple
    // at 32 KiB and from 128 KiB to 2 MiB (44, 86, 115, 175, 210, 347 us; the ring 55, 98,
    // 166, 318, 291, 377), Ring/Simple at 4 MiB (563 against 678); and 16 and 64 MiB on the
    // ring (h200-nodes2-tuner-refit.txt: 1.45 and 5.2 ms against the tree's 1.75 and 6.6).
    // At 64 KiB one channel's ring beat the tree by 4-7% (68 against 73 us, then 66 against
    // 70): the tree's one 64 KiB message goes through the socket network's helper threads,
    // the ring's two of 32 KiB inline (the hand-off, `NET_HANDOFF_US`).
    let mut t = across(2, 1, 0.0, 10.0);
    t.set_ring_exchange(true);
    t.set_tree_exchange(true);
    t.set_net_handoff_from(Some(64 << 10));
    let measured = [
        (16, Algo::Ring, Proto::Ll),
        (4096, Algo::Ring, Proto::Ll),
        (16 << 10, Algo::Ring, Proto::Ll),
        (32 << 10, Algo::Tree, Proto::Simple),
        (64 << 10, Algo::Ring, Proto::Simple),
        (128 << 10, Algo::Tree, Proto::Simple),
        (256 << 10, Algo::Tree, Proto::Simple),
        (512 << 10, Algo::Tree, Proto::Simple),
        (1 << 20, Algo::Tree, Proto::Simple),
        (2 << 20, Algo::Tree, Proto::Simple),
        (4 << 20, Algo::Ring, Proto::Simple),
        (16 << 20, Algo::Ring, Proto::Simple),
        (64 << 20, Algo::Ring, Proto::Simple),
    ];
    assert_allreduce_choices(&t, "2x1", &measured);
    // 2 x 2, same runs: the tree's exchange on LL to 4 KiB (32-40 us; Ring/LL 50-60,
    // Tree/Simple 42-45), Tree/Simple at 256 KiB (95-105 us; Tree/LL 162-170).
    let mut t = across(2, 2, 0.0, 10.0);
    t.set_tree_exchange(true);
    t.set_net_handoff_from(Some(64 << 10));
    for (bytes, proto) in [
        (8, Proto::Ll),
        (4096, Proto::Ll),
        (256 << 10, Proto::Simple),
    ] {
        let c = t.choose(Coll::AllReduce, bytes).unwrap();
        assert_eq!((c.algo, c.proto), (Algo::Tree, proto), "2x2, {bytes} B");
    }
    // The network's own latency is paid on each of its steps: three of the ring's in 2 x 2,
    // two of NCCL's tree (up to the root and back down), one of the exchange.
    let (slow, fast) = (across_nodes(2, 2, 50.0), across_nodes(2, 2, 0.0));
    let ring = |t: &Tuner| {
        t.estimate(Coll::AllReduce, Algo::Ring, Proto::Ll, 8)
            .unwrap()
    };
    let tree = |t: &Tuner| {
        t.estimate(Coll::AllReduce, Algo::Tree, Proto::Simple, 8)
            .unwrap()
    };
    assert!((ring(&slow) - ring(&fast) - 150.0).abs() < 1e-6);
    assert!((tree(&slow) - tree(&fast) - 100.0).abs() < 1e-6);
    // 2 x 1 with the two-rank ring exchange: Ring/LL crosses the network once, and no
    // GPU turns between two steps.
    let mut t = across_nodes(2, 1, 0.0);
    let before = t
        .estimate(Coll::AllReduce, Algo::Ring, Proto::Ll, 8)
        .unwrap();
    t.set_ring_exchange(true);
    let after = t
        .estimate(Coll::AllReduce, Algo::Ring, Proto::Ll, 8)
        .unwrap();
    let saved = NET_HOP_US[Proto::Ll as usize] + NET_TURN_US;
    assert!((before - after - saved).abs() < 1e-6);
}

#[test]
fn calls_across_four_nodes_follow_the_measured_choices() {
    // 4 x 1 on 4 H200s over loopback (its 20 GB/s shared by the 4 nodes), as the
    // communicator sets it (no exchange past two nodes): the best forced choice of
    // results/h200x4-nodes-tuner-s17.txt at each size (medians of 4): Tree/LL to 8 KiB
    // (69.5 us at 8 B against Ring/LL's 91.5; 101.5 at 8 KiB against 104), Ring/Simple at
    // 32 and 128 KiB (137 and 224 us; Tree/Simple 151 and 396, Tree/LL 154 and 478),
    // Tree/Simple from 512 KiB (747 us against the ring's 835; 1178 against 1616 at 2 MiB;
    // 9251 against 10821 at 32 MiB); in the next call also Ring/Simple at 64 and 256 KiB
    // (169 and 424 us; Tree/Simple 408 and 460) and Tree/Simple at 1 MiB (748 against
    // 1163). Without the turns, the levels' hand-offs and LL fill, and the shared loopback
    // the model took the tree at every size.
    let mut t = across(4, 1, 0.0, 5.0);
    t.set_net_handoff_from(Some(64 << 10));
    let measured = [
        (8, Algo::Tree, Proto::Ll),
        (2048, Algo::Tree, Proto::Ll),
        (8 << 10, Algo::Tree, Proto::Ll),
        (32 << 10, Algo::Ring, Proto::Simple),
        (64 << 10, Algo::Ring, Proto::Simple),
        (128 << 10, Algo::Ring, Proto::Simple),
        (256 << 10, Algo::Ring, Proto::Simple),
        (512 << 10, Algo::Tree, Proto::Simple),
        (1 << 20, Algo::Tree, Proto::Simple),
        (2 << 20, Algo::Tree, Proto::Simple),
        (32 << 20, Algo::Tree, Proto::Simple),
    ];
    assert_allreduce_choices(&t, "4x1", &measured);
    // Each network step past the first waits for a GPU's turn: six in a row for Ring/LL,
    // four levels for the tree; Ring/Simple's step cost holds it already.
    let lat = |a, p| t.latency(Coll::AllReduce, a, p);
    let hop = |p: Proto| NET_HOP_US[p as usize];
    let close = |a: f64, b: f64| (a - b).abs() < 1e-6;
    let ring_ll = NET_BASE_US + 6.0 * hop(Proto::Ll) + 5.0 * NET_TURN_US;
    assert!(close(lat(Algo::Ring, Proto::Ll), ring_ll));
    let tree_ll = NET_BASE_US + 4.0 * hop(Proto::Ll) + TREE_NET_LL_EXTRA_US + 3.0 * NET_TURN_US;
    assert!(close(lat(Algo::Tree, Proto::Ll), tree_ll));
    let ring_simple = NET_BASE_US + 6.0 * hop(Proto::Simple);
    assert!(close(lat(Algo::Ring, Proto::Simple), ring_simple));
    // LL's fill: the first step crosses each level in turn (three more levels than one);
    // Simple pays its levels in hand-offs instead.
    let fill = t.tree_fill(Algo::Tree, Proto::Ll, 8 << 10, 1);
    assert!((fill - 3.0 * (8 << 10) as f64 / (LL_NET_BW * 1e3)).abs() < 1e-6);
    assert_eq!(t.tree_fill(Algo::Tree, Proto::Simple, 64 << 10, 1), 0.0);
    let mut ex = across(2, 2, 0.0, 10.0);
    ex.set_tree_exchange(true);
    assert_eq!(
        ex.tree_fill(Algo::Tree, Proto::Ll, 8 << 10, 1),
        0.0,
        "one level"
    );
}

/// The ring's steps across nodes queue at the proxy: one channel pays nothing for it, each
/// further one its network steps (2 (n - 1) for an AllReduce, one for the two-rank LL
/// exchange, n - 1 for the others); a tree and a single node never.
#[test]
fn a_ring_across_nodes_pays_for_each_channel_past_the_first() {
    let mut t = across(2, 1, 0.0, 10.0);
    t.set_ring_exchange(true);
    assert_eq!(
        t.ring_queue(Coll::AllReduce, Algo::Ring, Proto::Simple, 1),
        0.0
    );
    assert_eq!(
        t.ring_queue(Coll::AllReduce, Algo::Ring, Proto::Simple, 8),
        7.0 * 2.0 * RING_NET_STEP_US
    );
    assert_eq!(
        t.ring_queue(Coll::AllReduce, Algo::Ring, Proto::Ll, 8),
        7.0 * RING_NET_STEP_US
    );
    assert_eq!(
        t.ring_queue(Coll::AllReduce, Algo::Tree, Proto::Simple, 8),
        0.0
    );
    let t = across(2, 2, 0.0, 10.0);
    assert_eq!(
        t.ring_queue(Coll::AllReduce, Algo::Ring, Proto::Simple, 3),
        2.0 * 6.0 * RING_NET_STEP_US
    );
    assert_eq!(
        t.ring_queue(Coll::AllGather, Algo::Ring, Proto::Simple, 3),
        2.0 * 3.0 * RING_NET_STEP_US
    );
    let one = across_nodes(1, 4, 0.0);
    assert_eq!(
        one.ring_queue(Coll::AllReduce, Algo::Ring, Proto::Simple, 8),
        0.0
    );
    // It is part of the estimate: 8 channels' worth on 2 x 1 at 1 MiB, 4 at 256 KiB.
    let t = across(2, 1, 0.0, 10.0);
    for (bytes, nch) in [(1usize << 20, 8usize), (256 << 10, 4)] {
        let est = t
            .estimate(Coll::AllReduce, Algo::Ring, Proto::Simple, bytes)
            .unwrap();
        let rest = t.latency(Coll::AllReduce, Algo::Ring, Proto::Simple)
            + bytes as f64 / (2.0 * nch as f64).min(9.9) / 1e3;
        let queue = 2.0 * (nch - 1) as f64 * RING_NET_STEP_US;
        assert!(
            (est - rest - queue).abs() < 1e-6,
            "{bytes} B: {est} {rest} {queue}"
        );
    }
}

/// A network step whose message reaches the network's hand-off length pays
/// `NET_HANDOFF_US` for each step a channel takes in turn; below it, on LL, or on a network
/// without hand-offs (plugins), nothing.
#[test]
fn network_steps_past_the_inline_limit_pay_the_handoff() {
    let mut t = across(2, 1, 0.0, 10.0);
    t.set_tree_exchange(true);
    let h = |t: &Tuner, a, p, bytes, nch| t.net_handoff(Coll::AllReduce, a, p, bytes, nch);
    assert_eq!(
        h(&t, Algo::Tree, Proto::Simple, 64 << 10, 1),
        0.0,
        "no hand-off known"
    );
    t.set_net_handoff_from(Some(64 << 10));
    // The tree's exchange: one message of the channel's bytes.
    assert_eq!(h(&t, Algo::Tree, Proto::Simple, 32 << 10, 1), 0.0);
    assert_eq!(
        h(&t, Algo::Tree, Proto::Simple, 64 << 10, 1),
        NET_HANDOFF_US
    );
    assert_eq!(
        h(&t, Algo::Tree, Proto::Simple, 256 << 10, 8),
        0.0,
        "32 KiB a channel"
    );
    // The two-rank ring: two steps in turn of half the channel's bytes.
    assert_eq!(h(&t, Algo::Ring, Proto::Simple, 64 << 10, 1), 0.0);
    assert_eq!(
        h(&t, Algo::Ring, Proto::Simple, 128 << 10, 1),
        2.0 * NET_HANDOFF_US
    );
    assert_eq!(
        h(&t, Algo::Ring, Proto::Ll, 1 << 20, 1),
        0.0,
        "LL steps are small"
    );
    // A larger limit (NCCL_RS_SOCKET_INLINE_BYTES) moves it.
    t.set_net_handoff_from(Some(256 << 10));
    assert_eq!(h(&t, Algo::Tree, Proto::Simple, 128 << 10, 1), 0.0);
    // A tree across four nodes: two levels up and two down, a step each.
    let mut four = across_nodes(4, 1, 0.0);
    four.set_net_handoff_from(Some(64 << 10));
    assert_eq!(
        h(&four, Algo::Tree, Proto::Simple, 1 << 20, 1),
        4.0 * TREE_LEVEL_HANDOFF_US
    );
    assert_eq!(h(&four, Algo::Tree, Proto::Simple, 256 << 10, 8), 0.0);
    assert!(h(&four, Algo::Ring, Proto::Simple, 1 << 20, 1) > 0.0);
    // One node: no network.
    let mut one = across_nodes(1, 4, 0.0);
    one.set_net_handoff_from(Some(64 << 10));
    assert_eq!(h(&one, Algo::Ring, Proto::Simple, 64 << 20, 1), 0.0);
}

#[test]
fn a_two_node_tree_that_exchanges_crosses_the_network_once() {
    let mut t = across_nodes(2, 2, 0.0);
    // The latencies (without the exchange the first chunk's trip through the levels adds
    // its bytes' time too: `tree_fill`).
    let tree = |t: &Tuner, p: Proto| t.latency(Coll::AllReduce, Algo::Tree, p);
    // Without the exchange the tree runs LL too (one peer per step on its fans).
    let before = [tree(&t, Proto::Ll), tree(&t, Proto::Simple)];
    t.set_tree_exchange(true);
    // Up to the root and back down crossed 2 x depth network hops, with a GPU's turn
    // between each two; the heads' trade, one.
    let depth = crate::graph::dbt_depth(2) as f64;
    for (b, p) in before.into_iter().zip([Proto::Ll, Proto::Simple]) {
        let saved = (2.0 * depth - 1.0) * (NET_HOP_US[p as usize] + NET_TURN_US);
        assert!((b - tree(&t, p) - saved).abs() < 1e-6, "{p:?}");
    }
    // Inside one node the chain's way up has Simple FIFOs only: no LL tree there.
    let one = across_nodes(1, 4, 0.0);
    assert!(one
        .estimate(Coll::AllReduce, Algo::Tree, Proto::Ll, 8)
        .is_none());
    // LL is offered and wins small calls (Ring/LL crosses the network three times in 2x2).
    let c = t.choose(Coll::AllReduce, 8).unwrap();
    assert_eq!((c.algo, c.proto), (Algo::Tree, Proto::Ll));
    let c = t.choose(Coll::AllReduce, 64 << 20).unwrap();
    assert_ne!(c.proto, Proto::Ll, "{c:?}");
}

#[test]
fn filters_parse() {
    let f = AlgoFilter::parse("NCCL_ALGO", "ring").unwrap();
    assert!(f.allows(Coll::AllReduce, Algo::Ring as usize));
    assert!(!f.allows(Coll::AllReduce, Algo::Tree as usize));
    let f = AlgoFilter::parse("NCCL_ALGO", "^Tree").unwrap();
    assert!(f.allows(Coll::AllReduce, Algo::Ring as usize));
    assert!(!f.allows(Coll::Broadcast, Algo::Tree as usize));
    let f = AlgoFilter::parse("NCCL_ALGO", "allreduce:tree,ring;broadcast:ring").unwrap();
    assert!(f.allows(Coll::AllReduce, Algo::Tree as usize));
    assert!(!f.allows(Coll::Broadcast, Algo::Tree as usize));
    assert!(f.allows(Coll::AllGather, Algo::Tree as usize));
    // The symmetric path's column: excluded by a list that does not name it, kept by ^.
    let sym = super::filter::SYMMETRIC;
    assert!(!AlgoFilter::parse("NCCL_ALGO", "ring")
        .unwrap()
        .allows(Coll::AllReduce, sym));
    assert!(AlgoFilter::parse("NCCL_ALGO", "^tree")
        .unwrap()
        .allows(Coll::AllGather, sym));
    let f = AlgoFilter::parse("NCCL_ALGO", "allreduce:^Symmetric").unwrap();
    assert!(!f.allows(Coll::AllReduce, sym));
    assert!(f.allows(Coll::AllReduce, Algo::Ring as usize));
    assert!(f.allows(Coll::ReduceScatter, sym));
    let f = AlgoFilter::parse("NCCL_ALGO", "symmetric").unwrap();
    assert!(f.allows(Coll::AllReduce, sym) && !f.allows(Coll::AllReduce, Algo::Ring as usize));
    assert_eq!(AlgoFilter::from_mask(f.to_mask()), f);
    let f = ProtoFilter::parse("NCCL_PROTO", "^ll128, ll").unwrap();
    assert!(f.allows(Coll::AllReduce, Proto::Simple as usize));
    assert!(!f.allows(Coll::AllReduce, Proto::Ll as usize));
    for bad in [
        "rings",
        "allreduce:",
        "alltoall:ring",
        "^",
        "ring;bcast:tree",
    ] {
        let e = AlgoFilter::parse("NCCL_ALGO", bad).unwrap_err();
        assert_eq!(e.code, crate::error::NcclResult::InvalidArgument, "{bad}");
        assert!(e.message.contains("NCCL_ALGO"));
    }
    assert!(ProtoFilter::parse("NCCL_PROTO", "LL256").is_err());
}
