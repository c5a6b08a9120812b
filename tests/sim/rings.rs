//! Rings in the order rank 0 gives (NCCL_RINGS), on the CPU simulator, whose NVSwitch node
//! would otherwise give rank order on every channel. Each configuration runs in a child
//! process of its own started with its environment (every rank in it, or one rank per
//! process with an NCCL_RINGS of its own), so no environment leaks between tests. Every check compares each channel's ring as the kernels read it
//! (`Comm::channel_rings`) with the one asked for, then runs the collectives on it.

use crate::common::{self, check_all_reduce, check_collective, Drive, Ranks};
use nccl::{Algo, Coll, Proto};
use nccl::{Comm, DataType, NcclResult, ReduceOp};

const RINGS4: &str = "0 2 1 3|3 1 2 0";
/// Two rings for three channels: channel 2 repeats ring 0.
const RINGS8: &str = "0 2 4 6 1 3 5 7|7 1 6 0 5 3 4 2";
/// 70000 elements take several slots of either protocol per channel.
const COUNTS: [usize; 3] = [1, 3000, 70_000];

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Channel `c` on ring `c % count` of `text`.
fn expected(text: &str, nchannels: usize) -> Vec<Vec<usize>> {
    let rings: Vec<Vec<usize>> = text
        .split('|')
        .map(|r| r.split_whitespace().map(|x| x.parse().unwrap()).collect())
        .collect();
    (0..nchannels)
        .map(|c| rings[c % rings.len()].clone())
        .collect()
}

/// Checks every communicator's channels hold `want` (NCCL_RINGS's rings when None).
fn check_rings(comms: &[Comm], want: Option<Vec<Vec<usize>>>) {
    for c in comms {
        let nch = c.shape().nchannels as usize;
        let want = want
            .clone()
            .unwrap_or_else(|| expected(&env("NCCL_RINGS").unwrap(), nch));
        let got = c.channel_rings().expect("read the channels back");
        assert_eq!(got, want, "rank {}", c.rank());
    }
}

/// Every rank of `n` in this process, on NCCL_RINGS's rings.
fn sim_comms(n: usize) -> Ranks {
    let ranks = common::sim_ranks(n);
    check_rings(&ranks.comms, None);
    ranks
}

/// NCCL_PROTO, when the parent set it, is what every rank runs at any size.
fn check_protocol(comms: &[Comm]) {
    let Some(proto) = env("NCCL_PROTO") else {
        return;
    };
    let want = if proto == "LL" {
        Proto::Ll
    } else {
        Proto::Simple
    };
    for c in comms {
        for bytes in [8, 1 << 30] {
            let t = c.tuning(Coll::AllGather, bytes).expect("a choice");
            assert_eq!(t.proto, want, "{bytes} bytes");
        }
    }
}

#[test]
fn four_ranks_every_collective() {
    let ll: &[(&str, &str)] = &[("NCCL_RINGS", RINGS4), ("NCCL_PROTO", "LL")];
    let simple: &[(&str, &str)] = &[("NCCL_RINGS", RINGS4), ("NCCL_PROTO", "Simple")];
    common::procs::isolated_cases(&[("LL", ll), ("Simple", simple)], |_| {
        let ranks = sim_comms(4);
        check_protocol(&ranks.comms);
        assert_eq!(ranks.comms[0].shape().nchannels, 2);
        common::collective_matrix(&ranks, &COUNTS, Drive::Group);
        common::type_op_matrix(&ranks, &[5, 4099], Drive::ThreadPerRank);
    });
}

/// Eight ranks on three channels: two rings given, the third channel repeats the first.
#[test]
fn eight_ranks_channels_repeat_the_rings() {
    let env = |proto| {
        [
            ("NCCL_RINGS", RINGS8),
            ("NCCL_PROTO", proto),
            ("NCCL_MIN_NCHANNELS", "3"),
        ]
    };
    let (ll, simple) = (env("LL"), env("Simple"));
    common::procs::isolated_cases(&[("LL", &ll), ("Simple", &simple)], |_| {
        let ranks = sim_comms(8);
        check_protocol(&ranks.comms);
        let rings = ranks.comms[5].channel_rings().unwrap();
        assert_eq!(rings.len(), 3);
        assert_eq!(rings[2], rings[0]);
        common::collective_matrix(&ranks, &COUNTS, Drive::ThreadPerRank);
    });
}

/// The tree AllReduce is a chain in each CTA's ring order. With two connections per peer it
/// runs two CTAs: on different rings their up links are the tree's own connections; on one
/// ring (not rank order) they are the send/recv links. Send/recv keeps working beside them.
#[test]
fn tree_all_reduce_follows_the_rings() {
    let tree = ("NCCL_ALGO", "allreduce:tree");
    let conns = ("NCCL_RS_SIM_P2P_CONNS", "2");
    let cases: [(&str, &[(&str, &str)]); 4] = [
        ("one connection", &[tree, ("NCCL_RINGS", RINGS4)]),
        ("two rings", &[tree, conns, ("NCCL_RINGS", RINGS4)]),
        ("one ring", &[tree, conns, ("NCCL_RINGS", "2 0 3 1")]),
        (
            "reversed",
            &[tree, conns, ("NCCL_RINGS", "3 2 1 0|1 0 3 2")],
        ),
    ];
    common::procs::isolated_cases(&cases, |_| {
        let ranks = sim_comms(4);
        for c in &ranks.comms {
            let t = c.tuning(Coll::AllReduce, 1 << 30).expect("a choice");
            assert_eq!((t.algo, t.proto), (Algo::Tree, Proto::Simple));
            if env("NCCL_RS_SIM_P2P_CONNS").is_some() {
                assert!(t.nchannels >= 2, "two tree CTAs: {t:?}");
            }
        }
        common::collective_matrix(&ranks, &COUNTS, Drive::Group);
        common::type_op_matrix(&ranks, &[5, 70_000], Drive::ThreadPerRank);
        common::check_all_to_all(&ranks, 1000, Drive::OneThread).unwrap_or_else(|e| panic!("{e}"));
        for count in [1, 3000, 70_000] {
            check_all_reduce(
                &ranks,
                count,
                DataType::Float32,
                ReduceOp::SUM,
                false,
                9,
                Drive::ThreadPerRank,
            )
            .unwrap_or_else(|e| panic!("{e}"));
        }
    });
}

/// One rank per process, each process with its own NCCL_RINGS (one malformed, one missing):
/// rank 0's rings rule on every rank.
#[test]
fn rank_zeros_rings_rule() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        let comm = Comm::init_rank_on(common::sim_dev(rank), nranks, &id, rank).expect("init_rank");
        check_rings(std::slice::from_ref(&comm), Some(expected(RINGS4, 2)));
        let ranks = Ranks::new(vec![comm]);
        for (k, coll) in nccl_device::abi::Coll::ALL.into_iter().enumerate() {
            for count in [7usize, 70_000] {
                check_collective(
                    &ranks,
                    coll,
                    count,
                    DataType::Int32,
                    ReduceOp::SUM,
                    k % nranks,
                    count % 2 == 0,
                    k as u64,
                    Drive::OneThread,
                )
                .unwrap_or_else(|e| panic!("{coll:?}: {e}"));
            }
        }
        return;
    }
    // Rank 1 has none (the parent's is removed from every child), rank 2 a malformed one.
    common::procs::run_each(4, &[("NCCL_RINGS", "")], |r| {
        let rings = ["", "not a ring", "0 1 2 3"];
        match r {
            0 => vec![("NCCL_RINGS".into(), RINGS4.into())],
            r => vec![("NCCL_RINGS".into(), rings[(r - 1).min(2)].into())],
        }
    });
}

/// A malformed NCCL_RINGS on rank 0 fails creation on every rank with InvalidArgument.
#[test]
fn malformed_rings_fail_init_everywhere() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        let e = Comm::init_rank_on(common::sim_dev(rank), nranks, &id, rank).unwrap_err();
        assert_eq!(e.code, NcclResult::InvalidArgument, "rank {rank}: {e}");
        assert!(e.message.contains("NCCL_RINGS"), "rank {rank}: {e}");
        return;
    }
    for bad in ["0 1 x", "0 1 1", "0 2 1|", "0 1 2|0 1", "0 1 3", " | "] {
        // Rank 0's NCCL_RINGS is `bad`; the others have none.
        common::procs::run_each(3, &[("NCCL_RINGS", "")], |r| {
            let rings = if r == 0 { bad } else { "" };
            vec![("NCCL_RINGS".into(), rings.into())]
        });
    }
}

/// Rings for another size (a split child's) are skipped: the child runs on the search's
/// rings (rank order on the simulator's NVSwitch node).
#[test]
fn split_children_use_the_searched_rings() {
    // The split's roots are made by the library: on loopback only.
    let env = [("NCCL_RINGS", RINGS4), common::LOOPBACK];
    common::procs::isolated(&env, &[], || {
        let mut parents = sim_comms(4);
        let children: Vec<Comm> = std::thread::scope(|s| {
            let handles: Vec<_> = parents
                .comms
                .iter_mut()
                .map(|c| s.spawn(move || c.split((c.rank() % 2) as i32, 0, None)))
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().unwrap().expect("split").expect("a child"))
                .collect()
        });
        check_rings(&children, Some(vec![vec![0, 1]; 2]));
        let (evens, odds): (Vec<Comm>, Vec<Comm>) =
            children.into_iter().partition(|c| c.cu_device() % 2 == 0);
        for pair in [evens, odds] {
            check_all_reduce(
                &Ranks::new(pair),
                3000,
                DataType::Float32,
                ReduceOp::SUM,
                true,
                4,
                Drive::ThreadPerRank,
            )
            .unwrap_or_else(|e| panic!("{e}"));
        }
    });
}
