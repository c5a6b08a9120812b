//! Registered double binary trees across nodes, and captured collectives and send/recv that
//! go direct without registration.

use super::*;
use nccl::{Comm, DataType};
use nccl_device::abi::Coll;

/// A shape of [`registered_tree_across_nodes`]'s runs: nodes, ranks per node, whether the two
/// nodes' heads exchange at the top (`NCCL_RS_TREE_EXCHANGE`), and whether the last rank leaves
/// its output unregistered.
pub struct TreeShape {
    pub nodes: usize,
    pub per_node: usize,
    pub exchange: bool,
    pub mixed: bool,
}

/// Two nodes with the heads' exchange (chains of 2 and 3: a middle rank goes direct both ways)
/// and without it (the fan: a head takes its chain child's partial sums from its output beside
/// its child nodes' FIFOs), three nodes (a root with three children); the last two with one rank
/// unregistered.
pub const TREE_ACROSS_NODES: [TreeShape; 6] = [
    TreeShape {
        nodes: 2,
        per_node: 2,
        exchange: true,
        mixed: false,
    },
    TreeShape {
        nodes: 2,
        per_node: 3,
        exchange: true,
        mixed: false,
    },
    TreeShape {
        nodes: 2,
        per_node: 2,
        exchange: false,
        mixed: false,
    },
    TreeShape {
        nodes: 3,
        per_node: 2,
        exchange: false,
        mixed: false,
    },
    TreeShape {
        nodes: 2,
        per_node: 3,
        exchange: true,
        mixed: true,
    },
    TreeShape {
        nodes: 3,
        per_node: 2,
        exchange: false,
        mixed: true,
    },
];

impl TreeShape {
    /// The rank processes' environment (loopback sockets, the forced Simple tree, local
    /// registration on).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("NCCL_SOCKET_IFNAME", "lo".to_string()),
            ("NCCL_PROTO", "Simple".into()),
            ("NCCL_ALGO", "allreduce:tree".into()),
            ("NCCL_LOCAL_REGISTER", "1".into()),
            ("NCCL_RS_TREE_EXCHANGE", (self.exchange as u8).to_string()),
            ("DBT_TEST_PER_NODE", self.per_node.to_string()),
        ];
        if self.mixed {
            env.push(("DBT_TEST_MIXED", "1".into()));
        }
        env
    }
}

/// One rank's part of a [`TreeShape`] run (ranks grouped into nodes in order,
/// `DBT_TEST_PER_NODE` each; with `DBT_TEST_MIXED` the last rank does not register): six int32
/// AllReduces on the tree, out of place and in place by turns, random data, the output
/// poisoned past its end; every result must be the sum, and in the last two rounds (the
/// peers' registration records are in by then) each channel's direct steps must match the
/// model: a step per chunk from the parent where it is in our node and both ends registered,
/// and out of place one from the child in our node likewise.
pub fn registered_tree_across_nodes(comm: &Comm) {
    let (rank, nranks) = (comm.rank(), comm.count());
    let per: usize = std::env::var("DBT_TEST_PER_NODE").unwrap().parse().unwrap();
    let mixed = std::env::var_os("DBT_TEST_MIXED").is_some();
    let registers = |r: usize| !mixed || r != nranks - 1;
    let (ctas, slot) = comm.dbt_geometry().expect("a tree across nodes");
    let places = comm.tree_places().unwrap().expect("a tree across nodes");
    let shape = comm.shape();
    // The kernel's chunk: within a slot of the tree's links, whole 16-byte packs of int32.
    let chunk = (slot.min(shape.slot_bytes as usize) / 4).min(slot / 4) / 4 * 4;
    // Two and a half chunks per CTA (a short one at the end), odd.
    let count = ctas * chunk * 5 / 2 + 1;
    let choice = comm.tuning(nccl::Coll::AllReduce, 4 * count).unwrap();
    assert_eq!(
        (choice.algo, choice.proto),
        (nccl::Algo::Tree, nccl::Proto::Simple),
        "rank {rank}: the forced tree"
    );
    let nch = ((choice.nchannels as u32).clamp(1, shape.nchannels) as usize).min(ctas);
    let node = |x: usize| x / per;
    let model = |in_place: bool| -> Vec<u64> {
        (0..shape.nchannels as usize)
            .map(|ch| {
                let (s, e) = nccl_device::coll::channel_range::<i32>(count, ch, nch);
                if ch >= nch || e - s < chunk || !registers(rank) {
                    return 0;
                }
                let (up, down) = &places[ch];
                let near = |p: usize| node(p) == node(rank) && registers(p);
                let from_parent = up.is_some_and(near);
                let from_child = !in_place && down.iter().any(|&d| near(d));
                (e - s).div_ceil(chunk) as u64 * (from_parent as u64 + from_child as u64)
            })
            .collect()
    };
    // The output and 4 KiB past it (poisoned).
    let room = 4 * count + 4096;
    let inp = comm.device().alloc(room).unwrap();
    let out = comm.device().alloc(room).unwrap();
    // SAFETY: the buffer outlives its registration (withdrawn at the end).
    let reg = registers(rank).then(|| unsafe { comm.register_raw(out.ptr(), room) }.unwrap());
    let mut modelled = 0;
    for k in 0..6u64 {
        let in_place = k % 2 == 1;
        let (mine, want) = coll_data(Coll::AllReduce, nranks, rank, count, 300 + k);
        out.write(0, &vec![0xA5; room]).unwrap();
        let send = match in_place {
            true => {
                out.write(0, &mine).unwrap();
                out.ptr()
            }
            false => {
                inp.write(0, &mine).unwrap();
                inp.ptr()
            }
        };
        let before = comm.ring_direct_steps().unwrap();
        let stream = comm.device().stream_create().unwrap();
        // SAFETY: both buffers hold the call's bytes and live past the sync below.
        unsafe {
            comm.all_reduce_raw(
                send,
                out.ptr(),
                count,
                nccl::DataType::Int32,
                nccl::ReduceOp::SUM,
                stream,
            )
        }
        .unwrap();
        comm.device().stream_sync(stream).unwrap();
        comm.device().stream_destroy(stream).unwrap();
        let mut got = vec![0u8; room];
        out.read(0, &mut got).unwrap();
        assert!(
            got[..want.len()] == want,
            "rank {rank}: round {k}: wrong sum"
        );
        assert!(
            got[want.len()..].iter().all(|&b| b == 0xA5),
            "rank {rank}: round {k}: bytes past the output written"
        );
        let now = comm.ring_direct_steps().unwrap();
        let direct: Vec<u64> = now.iter().zip(before).map(|(a, b)| a - b).collect();
        // The peers' registration records are in after the first rounds.
        if k >= 4 {
            let want = model(in_place);
            modelled += want.iter().sum::<u64>();
            assert_eq!(
                direct, want,
                "rank {rank}: round {k} (in place {in_place}): direct steps per channel \
             (places {places:?})"
            );
        }
    }
    if !mixed {
        assert!(modelled > 0, "rank {rank}: the model says no direct step");
    }
    // Our last call is done: no peer writes into our output any more.
    if let Some(h) = reg {
        comm.deregister(h).unwrap();
    }
}

/// Issues `coll` as [`coll_round`] runs it (AllGather and Broadcast of bytes, AllReduce sum of
/// int32) from `send` into `recv` on `stream`; the buffers must hold what the call needs until
/// it (and any graph capturing it) is done.
pub(super) fn issue(
    c: &Comm,
    coll: Coll,
    send: u64,
    recv: u64,
    count: usize,
    stream: nccl::StreamHandle,
) {
    // SAFETY: the callers' buffers hold what the call needs and outlive its replays.
    unsafe {
        match coll {
            Coll::AllGather => c.all_gather_raw(send, recv, count, DataType::Uint8, stream),
            Coll::Broadcast => c.broadcast_raw(
                send,
                recv,
                count,
                DataType::Uint8,
                root_of(c.count()),
                stream,
            ),
            _ => c.all_reduce_raw(
                send,
                recv,
                count,
                DataType::Int32,
                nccl::ReduceOp::SUM,
                stream,
            ),
        }
        .unwrap();
    }
}

/// A captured AllReduce of `count` Int32 replayed a few times (new random data and a poisoned
/// output each time, results checked), whatever each rank's graph registration: a peer
/// whose process has it off sends no marks, and is not waited for.
pub fn captured_allreduce_replays(c: &Comm, count: usize) {
    let (rank, nranks) = (c.rank(), c.count());
    let stream = c.device().stream_create().unwrap();
    let coll = Coll::AllReduce;
    let (mine, want) = coll_data(coll, nranks, rank, count, 0);
    let inp = c.device().alloc(mine.len()).unwrap();
    let out = c.device().alloc(want.len()).unwrap();
    c.device().capture_begin(stream).unwrap();
    issue(c, coll, inp.ptr(), out.ptr(), count, stream);
    let graph = c.device().capture_end(stream).unwrap();
    for replay in 1..4u64 {
        let (mine, want) = coll_data(coll, nranks, rank, count, replay);
        inp.write(0, &mine).unwrap();
        out.write(0, &vec![0xA5; want.len()]).unwrap();
        graph.launch(stream).unwrap();
        c.device().stream_sync(stream).unwrap();
        let mut got = vec![0u8; want.len()];
        out.read(0, &mut got).unwrap();
        assert!(got == want, "rank {rank}: replay {replay}");
    }
    drop(graph);
}

/// Graph registration with ranks as processes (this process's one rank; every rank runs the
/// same), for each (collective, count) of `colls` on fresh, unregistered buffers (Simple ring
/// steps): an eager round copies; a capture of two calls into two outputs of one allocation
/// registers that allocation once (one live graph registration) and every replay goes direct
/// as [`expected_direct`] models it, twice; an eager call into the same output while the
/// graph lives copies (a graph's registration is not the user's); after the graph is dropped
/// the next call withdraws it (nothing stays registered). New random data and a poisoned
/// output every round.
pub fn captured_coll_rounds(c: &Comm, colls: &[(Coll, usize)]) {
    let (rank, nranks) = (c.rank(), c.count());
    let stream = c.device().stream_create().unwrap();
    for (k, &(coll, count)) in colls.iter().enumerate() {
        let (mine, want) = coll_data(coll, nranks, rank, count, 0);
        let inp = c.device().alloc(mine.len()).unwrap();
        // Two outputs in one allocation: the graph writes both, eager calls the first.
        let half = want.len().next_multiple_of(256);
        let out = c.device().alloc(2 * half).unwrap();
        // One round: new data, poisoned outputs, the results checked (`outs` of them); the
        // direct steps.
        let round = |launch: &dyn Fn(), outs: usize, seed: u64| -> Vec<u64> {
            let (mine, want) = coll_data(coll, nranks, rank, count, seed);
            inp.write(0, &mine).unwrap();
            out.write(0, &vec![0xA5; 2 * half]).unwrap();
            let before = c.ring_direct_steps().unwrap();
            launch();
            c.device().stream_sync(stream).unwrap();
            for o in 0..2 {
                let mut got = vec![0u8; want.len()];
                out.read(o * half, &mut got).unwrap();
                match o < outs {
                    true => assert!(got == want, "rank {rank}: {} (seed {seed})", coll.name()),
                    false => assert!(got.iter().all(|&b| b == 0xA5), "rank {rank}: output {o}"),
                }
            }
            let now = c.ring_direct_steps().unwrap();
            now.iter().zip(before).map(|(a, b)| a - b).collect()
        };
        let call = |o: usize| {
            issue(
                c,
                coll,
                inp.ptr(),
                out.ptr() + (o * half) as u64,
                count,
                stream,
            )
        };
        let eager = || call(0);
        let direct = expected_direct(c, coll, |_| true, count, false, true);
        let copies = vec![0; direct.len()];
        // (A Broadcast's root receives nothing.)
        let receives = coll != Coll::Broadcast || rank != root_of(nranks);
        assert_eq!(
            direct.iter().sum::<u64>() > 0,
            receives,
            "rank {rank}: the model"
        );
        let seed = 1000 * k as u64;
        assert_eq!(
            round(&eager, 1, seed),
            copies,
            "rank {rank}: nothing registered yet"
        );
        c.device().capture_begin(stream).unwrap();
        call(0);
        call(1);
        let graph = c.device().capture_end(stream).unwrap();
        assert_eq!(
            c.graph_registrations(),
            1,
            "rank {rank}: the outputs' allocation, registered once"
        );
        let twice: Vec<u64> = direct.iter().map(|d| 2 * d).collect();
        for replay in 1..4 {
            let got = round(&|| graph.launch(stream).unwrap(), 2, seed + replay);
            assert_eq!(got, twice, "rank {rank}: {} replay {replay}", coll.name());
        }
        let got = round(&eager, 1, seed + 10);
        assert_eq!(got, copies, "rank {rank}: eager while the graph lives");
        drop(graph);
        let got = round(&eager, 1, seed + 11);
        assert_eq!(got, copies, "rank {rank}: eager after the graph is gone");
        assert_eq!(c.graph_registrations(), 0, "rank {rank}: released");
    }
    c.device().stream_destroy(stream).unwrap();
}

/// Graph registration of send/recv with ranks as processes (this process's one rank; every
/// rank runs the same): each rank sends [`ring_bytes`]`(rank, base)` to its successor and
/// receives from its predecessor, over `conns` connections of `slot`-byte slots, on fresh,
/// unregistered buffers. An eager round copies; a capture registers the receive buffer (one
/// live graph registration, which the sender maps) and every replay goes direct
/// ([`expected_steps`]); after the graph is dropped the next round copies, nothing stays
/// registered and the sender unmaps it. New random bytes, a
/// poisoned receive buffer and its tail checked every round.
pub fn captured_p2p_rounds(c: &Comm, base: usize, conns: usize, slot: usize) {
    let (rank, nranks) = (c.rank(), c.count());
    let (next, prev) = ((rank + 1) % nranks, (rank + nranks - 1) % nranks);
    let (out_len, in_len) = (ring_bytes(rank, base), ring_bytes(prev, base));
    let s = c.device().alloc(out_len).unwrap();
    let rb = c.device().alloc(in_len + 512).unwrap();
    let stream = c.device().stream_create().unwrap();
    let data = |from: usize, len: usize, seed: u64| -> Vec<u8> {
        let mut rng = Rng::new(seed * 1000 + from as u64);
        (0..len).map(|_| rng.next() as u8).collect()
    };
    let issue = || {
        nccl::group_start();
        // SAFETY: both buffers hold their message and outlive the graph's replays.
        unsafe {
            c.send_raw(s.ptr(), out_len, DataType::Uint8, next, stream)
                .unwrap();
            c.recv_raw(rb.ptr(), in_len, DataType::Uint8, prev, stream)
                .unwrap();
        }
        nccl::group_end().unwrap();
    };
    // One round: new bytes, a poisoned buffer, the result checked; this rank's send steps.
    let round = |launch: &dyn Fn(), seed: u64| -> u64 {
        s.write(0, &data(rank, out_len, seed)).unwrap();
        rb.write(0, &vec![0x5A; in_len + 512]).unwrap();
        let before = send_steps(c);
        launch();
        c.device().stream_sync(stream).unwrap();
        let mut got = vec![0u8; in_len + 512];
        rb.read(0, &mut got).unwrap();
        assert!(
            got[..in_len] == data(prev, in_len, seed),
            "rank {rank}, seed {seed}"
        );
        assert!(
            got[in_len..].iter().all(|&b| b == 0x5A),
            "rank {rank}: past the end"
        );
        send_steps(c) - before
    };
    let copies = expected_steps(out_len, conns, slot, false);
    let direct = expected_steps(out_len, conns, slot, true);
    assert_eq!(round(&issue, 1), copies, "rank {rank}: nothing registered");
    c.device().capture_begin(stream).unwrap();
    issue();
    let graph = c.device().capture_end(stream).unwrap();
    assert_eq!(
        c.graph_registrations(),
        1,
        "rank {rank}: the captured receive"
    );
    for replay in 2..5 {
        let got = round(&|| graph.launch(stream).unwrap(), replay);
        assert_eq!(got, direct, "rank {rank}: replay {replay} was not direct");
    }
    assert_eq!(
        c.mapped_registrations(next),
        1,
        "rank {rank}: rank {next}'s buffer"
    );
    drop(graph);
    let gone = "after the graph is gone";
    assert_eq!(round(&issue, 9), copies, "rank {rank}: {gone}");
    assert_eq!(c.graph_registrations(), 0, "rank {rank}: released");
    // The successor withdrew it in the round above (at its first call), which this rank's
    // launch of the next drains.
    assert_eq!(round(&issue, 10), copies, "rank {rank}: {gone}");
    assert_eq!(
        c.mapped_registrations(next),
        0,
        "rank {rank}: {next}'s withdrawal"
    );
    c.device().stream_destroy(stream).unwrap();
}
