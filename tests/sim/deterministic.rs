//! Deterministic reductions (NCCL_RS_DETERMINISTIC, `Config::deterministic`): AllReduce,
//! ReduceScatter and Reduce of floats give exactly the bits of a fold in rank order (the
//! device crate's own arithmetic, `check::reference`), with inputs whose sums depend on their
//! order, whatever the cut into pieces, the channels, protocol, algorithm or node layout.

use crate::common::check::{reference, typed_op};
use crate::common::{self, procs, OnItsThread, Rng, LOOPBACK};
use nccl::{Comm, Config, DataType, RedOpKind, ReduceOp};
use nccl_device::abi::Coll;
use nccl_device::types::Elem;
use nccl_device::with_elem;

/// Rank `rank`'s input: random mantissas over a wide range of exponents, so that sums lose
/// different bits in different orders (products stay within the narrow types' range).
fn input<T: Elem>(count: usize, seed: u64, rank: usize, op: ReduceOp) -> Vec<T> {
    let mut rng = Rng::new(seed ^ ((rank as u64 + 7) << 40));
    let spread = if op.kind() == RedOpKind::Prod { 2 } else { 8 };
    (0..count)
        .map(|_| {
            let exp = (rng.next() % (2 * spread + 1)) as i32 - spread as i32;
            let sign = if rng.next() & 1 == 0 { 1.0 } else { -1.0 };
            T::from_f64(sign * rng.uniform(1.0, 2.0) * 2f64.powi(exp))
        })
        .collect()
}

/// `n` communicators on simulated GPUs 0..n with `config`, created side by side.
fn comms(n: usize, config: &Config) -> Vec<nccl::Result<Comm>> {
    common::sim();
    let id = common::loopback_id();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (id, config) = (&id, config);
                s.spawn(move || Comm::init_rank_config_on(common::sim_dev(r), n, id, r, config))
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("init")).collect()
    })
}

fn deterministic(scratch: Option<usize>) -> Config {
    let mut c = Config::default();
    c.deterministic = Some(true);
    c.deterministic_scratch = scratch;
    c
}

/// One call: `count` is AllReduce's and Reduce's whole, ReduceScatter's per rank.
#[derive(Clone, Copy, Debug)]
struct Case {
    coll: Coll,
    dt: DataType,
    op: ReduceOp,
    count: usize,
    root: usize,
    in_place: bool,
}

/// Runs `case` on every rank and returns each rank's output bytes (a Reduce's other ranks:
/// empty). Outputs are poisoned first.
fn run(comms: &[OnItsThread], case: Case, inputs: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let Case {
        coll,
        dt,
        op,
        count,
        root,
        in_place,
    } = case;
    let size = dt.size();
    let out_bytes = count * size;
    std::thread::scope(|s| {
        let hs: Vec<_> = comms
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let input = &inputs[r];
                s.spawn(move || {
                    let dev = c.device();
                    let stream = dev.stream_create().unwrap();
                    let send = dev.alloc(input.len()).unwrap();
                    send.write(0, input).unwrap();
                    let recv = dev.alloc(input.len().max(out_bytes)).unwrap();
                    recv.write(0, &vec![0xA5; recv.bytes()]).unwrap();
                    // In place: ReduceScatter's output is block r of its input.
                    let (s_ptr, r_ptr) = match (in_place, coll) {
                        (false, _) => (send.ptr(), recv.ptr()),
                        (true, Coll::ReduceScatter) => {
                            recv.write(0, input).unwrap();
                            (recv.ptr(), recv.ptr() + (r * out_bytes) as u64)
                        }
                        (true, _) => {
                            recv.write(0, input).unwrap();
                            (recv.ptr(), recv.ptr())
                        }
                    };
                    // SAFETY: the buffers hold the call's extents and live past the sync.
                    unsafe {
                        match coll {
                            Coll::AllReduce => {
                                c.all_reduce_raw(s_ptr, r_ptr, count, dt, op, stream)
                            }
                            Coll::ReduceScatter => {
                                c.reduce_scatter_raw(s_ptr, r_ptr, count, dt, op, stream)
                            }
                            _ => c.reduce_raw(s_ptr, r_ptr, count, dt, op, root, stream),
                        }
                    }
                    .unwrap();
                    dev.stream_sync(stream).unwrap();
                    let mut out = vec![0u8; recv.bytes()];
                    recv.read(0, &mut out).unwrap();
                    dev.stream_destroy(stream).unwrap();
                    match (coll, in_place) {
                        (Coll::Reduce, _) if r != root => Vec::new(),
                        (Coll::ReduceScatter, true) => out[r * out_bytes..][..out_bytes].to_vec(),
                        _ => out[..out_bytes].to_vec(),
                    }
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().expect("rank")).collect()
    })
}

/// The rank-order fold of `inputs` (each rank's whole input as `T`), as bytes: AllReduce's
/// and Reduce's output, or ReduceScatter's block `r`.
fn want<T: Elem>(inputs: &[Vec<T>], op: ReduceOp, dt: DataType) -> Vec<u8> {
    let folded: Vec<T> = reference(inputs, op, dt)
        .into_iter()
        .map(|(v, _)| v)
        .collect();
    common::to_bytes(&folded).to_vec()
}

/// Every rank's output equals the rank-order fold bit for bit; the first difference as text.
fn check(comms: &[OnItsThread], case: Case, seed: u64) -> Result<(), String> {
    let Case {
        coll,
        dt,
        op,
        count,
        root,
        ..
    } = case;
    let n = comms.len();
    let whole = if coll == Coll::ReduceScatter {
        count * n
    } else {
        count
    };
    let (bytes, folded) = with_elem!(dt, T => {
        let typed: Vec<Vec<T>> = (0..n).map(|r| input::<T>(whole, seed, r, op)).collect();
        let bytes: Vec<Vec<u8>> = typed.iter().map(|v| common::to_bytes(v).to_vec()).collect();
        (bytes, want(&typed, op, dt))
    });
    let got = run(comms, case, &bytes);
    let size = dt.size();
    for (r, g) in got.iter().enumerate() {
        let w = match coll {
            Coll::ReduceScatter => &folded[r * count * size..][..count * size],
            Coll::Reduce if r != root => continue,
            _ => &folded[..],
        };
        if let Some(i) = (0..g.len())
            .step_by(size)
            .find(|&i| g[i..i + size] != w[i..i + size])
        {
            return Err(format!(
                "{case:?}, rank {r}: element {} is {:02x?}, the rank-order fold {:02x?}",
                i / size,
                &g[i..i + size],
                &w[i..i + size]
            ));
        }
    }
    Ok(())
}

fn ops(dt: DataType) -> Vec<ReduceOp> {
    [
        ReduceOp::SUM,
        ReduceOp::PROD,
        ReduceOp::AVG,
        ReduceOp::pre_mul_sum(0),
    ]
    .into_iter()
    .map(|op| typed_op(op, dt))
    .collect()
}

#[test]
fn every_reduction_gives_the_bits_of_a_rank_order_fold() {
    let types = [
        DataType::Float32,
        DataType::Float16,
        DataType::Bfloat16,
        DataType::Float64,
        DataType::Float8e4m3,
    ];
    // 3 ranks cut into 4 KiB pieces (several per call), 4 ranks with the default staging,
    // 2 ranks on floats.
    for (n, scratch, types) in [
        (3, Some(4096), &types[..]),
        (4, None, &types[..]),
        (2, None, &types[..1]),
    ] {
        let made = comms(n, &deterministic(scratch));
        let comms: Vec<Comm> = made.into_iter().map(|c| c.expect("init")).collect();
        let lent = common::lend(&comms);
        for &dt in types {
            for op in ops(dt) {
                // Blocks and a tail short of one, fewer elements than ranks.
                for count in [1001, 1] {
                    for (coll, root) in [
                        (Coll::AllReduce, 0),
                        (Coll::ReduceScatter, 0),
                        (Coll::Reduce, n - 1),
                    ] {
                        for in_place in [false, true] {
                            let seed = count as u64 * 31 + dt as u64;
                            let case = Case {
                                coll,
                                dt,
                                op,
                                count,
                                root,
                                in_place,
                            };
                            check(&lent, case, seed).unwrap_or_else(|e| panic!("{n} ranks: {e}"));
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn the_ordinary_path_does_not_fold_in_rank_order() {
    // What the mode buys: the same inputs through the ring differ from the fold somewhere
    // (so the checks above can fail).
    let comms = common::sim_comms(4);
    let lent = common::lend(&comms);
    let case = Case {
        coll: Coll::AllReduce,
        dt: DataType::Float32,
        op: ReduceOp::SUM,
        count: 4096,
        root: 0,
        in_place: false,
    };
    let e = check(&lent, case, 5);
    assert!(
        e.is_err(),
        "the ordinary AllReduce folded every element in rank order"
    );
}

#[test]
fn ranks_that_disagree_on_the_mode_are_refused() {
    common::sim();
    let id = common::loopback_id();
    let errs: Vec<nccl::Error> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..2)
            .map(|r| {
                let id = &id;
                s.spawn(move || {
                    let config = if r == 0 {
                        deterministic(None)
                    } else {
                        Config::default()
                    };
                    Comm::init_rank_config_on(common::sim_dev(r), 2, id, r, &config).unwrap_err()
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for e in errs {
        assert_eq!(e.code, nccl::NcclResult::InvalidUsage, "{e}");
        assert!(e.message.contains("NCCL_RS_DETERMINISTIC differs"), "{e}");
    }
    let mut small = deterministic(Some(100));
    small.deterministic_scratch = Some(100);
    let e = Comm::init_rank_config_on(common::sim_dev(0), 1, &common::loopback_id(), 0, &small)
        .unwrap_err();
    assert_eq!(e.code, nccl::NcclResult::InvalidArgument, "{e}");
}

/// A child's communicator with the mode on (NCCL_RS_DETERMINISTIC in its environment).
fn child_check() -> bool {
    let Some((rank, nranks, id)) = procs::child() else {
        return false;
    };
    let comm = Comm::init_rank_on(common::sim_dev(rank), nranks, &id, rank).expect("init");
    // Every rank runs every call; each checks its own output against the fold.
    let whole = 6000 + 3;
    let (dt, op) = (DataType::Float32, ReduceOp::SUM);
    let typed: Vec<Vec<f32>> = (0..nranks)
        .map(|r| input::<f32>(whole, 11, r, op))
        .collect();
    let folded = want(&typed, op, dt);
    let dev = comm.device();
    let stream = dev.stream_create().unwrap();
    let send = dev.alloc(whole * 4).unwrap();
    send.write(0, common::to_bytes(&typed[rank])).unwrap();
    let recv = dev.alloc(whole * 4).unwrap();
    recv.write(0, &vec![0xA5; whole * 4]).unwrap();
    // Cut in two calls at an odd place: the same bits as one call.
    let cut = 2501;
    // SAFETY: the buffers hold the extents and live past the sync.
    unsafe {
        comm.all_reduce_raw(send.ptr(), recv.ptr(), cut, dt, op, stream)
            .unwrap();
        let (s, r) = (send.ptr() + cut as u64 * 4, recv.ptr() + cut as u64 * 4);
        comm.all_reduce_raw(s, r, whole - cut, dt, op, stream)
            .unwrap();
    }
    dev.stream_sync(stream).unwrap();
    let mut got = vec![0u8; whole * 4];
    recv.read(0, &mut got).unwrap();
    assert!(
        got == folded,
        "rank {rank}: AllReduce differs from the rank-order fold"
    );
    // ReduceScatter of the same inputs: block `rank` of the fold.
    let block = whole / nranks;
    recv.write(0, &vec![0xA5; whole * 4]).unwrap();
    // SAFETY: as above.
    unsafe {
        comm.reduce_scatter_raw(send.ptr(), recv.ptr(), block, dt, op, stream)
            .unwrap();
    }
    dev.stream_sync(stream).unwrap();
    let mut got = vec![0u8; block * 4];
    recv.read(0, &mut got).unwrap();
    assert!(
        got[..] == folded[rank * block * 4..][..block * 4],
        "rank {rank}: ReduceScatter differs from the rank-order fold"
    );
    dev.stream_destroy(stream).unwrap();
    true
}

#[test]
fn the_same_bits_whatever_the_layout_protocol_algorithm_and_channels() {
    if child_check() {
        return;
    }
    let on = ("NCCL_RS_DETERMINISTIC", "1");
    let small = ("NCCL_RS_DETERMINISTIC_SCRATCH", "4096");
    // One node of 4, 2 nodes of 2, 4 nodes of 1; protocols, algorithms, channels, pieces.
    procs::run_nodes(1, 4, &[LOOPBACK, on]);
    procs::run_nodes(2, 2, &[LOOPBACK, on, ("NCCL_PROTO", "LL")]);
    procs::run_nodes(2, 2, &[LOOPBACK, on, ("NCCL_ALGO", "tree"), small]);
    procs::run_nodes(4, 1, &[LOOPBACK, on, ("NCCL_MIN_NCHANNELS", "3"), small]);
    procs::run_nodes(
        1,
        3,
        &[
            LOOPBACK,
            on,
            ("NCCL_PROTO", "Simple"),
            ("NCCL_MAX_NCHANNELS", "1"),
        ],
    );
}

#[test]
fn deterministic_calls_in_a_group_and_in_cuda_graphs() {
    use crate::common::graphs::{capture_and_replay, FirstUse};
    // One thread drives every rank in a group holding the AllReduce, an AllGather and sends;
    // captured once the connections exist, and with the first use inside the capture.
    for first in [FirstUse::BeforeCapture, FirstUse::InsideCapture] {
        let made = comms(3, &deterministic(Some(4096)));
        let ranks = common::Ranks::new(made.into_iter().map(|c| c.expect("init")).collect());
        capture_and_replay(&ranks, 12, first).unwrap_or_else(|e| panic!("{first:?}: {e}"));
    }
}

#[test]
fn blocks_past_a_fifo_fold_exactly_in_one_or_two_pieces() {
    // Blocks of 200 KB, so each exchange part fills its connection's FIFO (64 KiB on the
    // simulator) and takes the zero-copy handshake into the registered staging: whole blocks
    // with 32 MiB of staging, two pieces of them with 512 KiB. Checked on the results only:
    // nothing here counts which way the bytes went.
    for scratch in [None, Some(512 << 10)] {
        let made = comms(3, &deterministic(scratch));
        let comms: Vec<Comm> = made.into_iter().map(|c| c.expect("init")).collect();
        let lent = common::lend(&comms);
        for (coll, count) in [
            (Coll::AllReduce, 3 * 50_000 + 2),
            (Coll::ReduceScatter, 50_000),
            (Coll::Reduce, 3 * 50_000),
        ] {
            let case = Case {
                coll,
                dt: DataType::Float32,
                op: ReduceOp::SUM,
                count,
                root: 1,
                in_place: false,
            };
            check(&lent, case, 9).unwrap_or_else(|e| panic!("{e}"));
        }
    }
}

/// The chain's shape from NCCL_RS_DETERMINISTIC_CHAIN_CTAS / _SLOT: an odd CTA count on the
/// smallest slots (many steps per CTA) gives the fold's bits; a value out of range is an
/// invalid argument naming the variable; ranks that set it differently are refused alike.
#[test]
fn the_chain_takes_its_shape_from_the_environment() {
    const CTAS: &str = "NCCL_RS_DETERMINISTIC_CHAIN_CTAS";
    const SLOT: &str = "NCCL_RS_DETERMINISTIC_CHAIN_SLOT";
    if let Some((rank, nranks, id)) = procs::child() {
        if std::env::var("SHAPES_DIFFER").is_ok() {
            let e = Comm::init_rank_on(common::sim_dev(rank), nranks, &id, rank).unwrap_err();
            assert_eq!(e.code, nccl::NcclResult::InvalidUsage, "{e}");
            assert!(e.message.contains("a chain of"), "{e}");
            return;
        }
        assert!(child_check());
        return;
    }
    let on = ("NCCL_RS_DETERMINISTIC", "1");
    procs::run_nodes(1, 3, &[LOOPBACK, on, (CTAS, "3"), (SLOT, "4096")]);
    procs::run_each(2, &[LOOPBACK, on, ("SHAPES_DIFFER", "1")], |r| {
        vec![(CTAS.to_string(), (r + 1).to_string())]
    });
}

/// A chain shape out of range (NCCL_RS_DETERMINISTIC_CHAIN_CTAS / _SLOT) is an invalid
/// argument naming the variable.
#[test]
fn a_chain_shape_out_of_range_is_refused() {
    let cases: [(&str, &[(&str, &str)]); 3] = [
        ("33 CTAs", &[("NCCL_RS_DETERMINISTIC_CHAIN_CTAS", "33")]),
        (
            "slot not of 128",
            &[("NCCL_RS_DETERMINISTIC_CHAIN_SLOT", "4000")],
        ),
        (
            "slot below 4 KiB",
            &[("NCCL_RS_DETERMINISTIC_CHAIN_SLOT", "2048")],
        ),
    ];
    procs::isolated_cases(&cases, |case| {
        common::sim();
        let e = Comm::init_rank_config_on(
            common::sim_dev(0),
            1,
            &common::loopback_id(),
            0,
            &deterministic(None),
        )
        .unwrap_err();
        assert_eq!(e.code, nccl::NcclResult::InvalidArgument, "{case}: {e}");
        assert!(
            e.message.contains("NCCL_RS_DETERMINISTIC_CHAIN_"),
            "{case}: {e}"
        );
    });
}
