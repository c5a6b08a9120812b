//! Ring collectives on registered buffers, on the simulator: in an AllGather, a Broadcast and
//! the all-gather half of an AllReduce between ranks whose output buffers are registered, each
//! rank writes what it passes on straight into its successor's output, which passes it on from
//! there (no FIFO on either end). Each channel counts the steps its predecessor wrote in place,
//! which tells the path taken; the results are checked whichever path it was, and a connection
//! with an unregistered end copies.

mod common;

use common::register::{coll_round, expected_direct, Who};
use nccl::{Backend, Comm};
use nccl_device::abi::Coll;
use std::sync::Mutex;

/// The parameters are read from the environment at init, which is the process's: inits of
/// this file's tests take turns, each with its own values.
static ENV: Mutex<()> = Mutex::new(());

/// Simple steps (the zero-copy path's protocol), the simulator's 2 channels and 64 KiB buffer:
/// 8 KiB slots, 16 KiB steps (two slots). `local_register`: NCCL_LOCAL_REGISTER. Registered
/// calls run on one CTA of the two where every rank registered (NCCL_RS_REGISTERED_CTAS=1, not
/// the default, so that every test here also runs the kernels' agreement; `expected_direct`
/// counts with it).
fn sim_comms(n: usize, local_register: bool) -> Vec<Comm> {
    sim_comms_with(n, local_register, &[("NCCL_RS_REGISTERED_CTAS", "1")])
}

/// [`sim_comms`] with 4 channels, registered calls on `fewer` CTAs.
fn sim_comms_fewer(n: usize, fewer: usize) -> Vec<Comm> {
    let fewer = fewer.to_string();
    let extra = [
        ("NCCL_RS_REGISTERED_CTAS", fewer.as_str()),
        ("NCCL_MIN_NCHANNELS", "4"),
    ];
    sim_comms_with(n, true, &extra)
}

fn sim_comms_with(n: usize, local_register: bool, extra: &[(&str, &str)]) -> Vec<Comm> {
    let _turn = ENV.lock().unwrap_or_else(|p| p.into_inner());
    std::env::set_var("NCCL_PROTO", "Simple");
    std::env::set_var("NCCL_ALGO", "Ring");
    std::env::set_var(
        "NCCL_LOCAL_REGISTER",
        if local_register { "1" } else { "0" },
    );
    std::env::remove_var("NCCL_MIN_NCHANNELS");
    std::env::remove_var("NCCL_RS_REGISTERED_CTAS");
    for (k, v) in extra {
        std::env::set_var(k, v);
    }
    nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
    Comm::init_all(&(0..n as i32).collect::<Vec<_>>()).expect("init_all on the simulator")
}

/// Counts per collective: two whose channel slices fill a Simple step or more (with the
/// simulator's 2 channels; one odd, so steps and pieces end short) and one under a step (no
/// handshake). AllGather: bytes per rank, 16 KiB steps (33000: a whole step and a short one per
/// channel); AllReduce: int32, 4096 per step; Broadcast: bytes, 8 KiB steps (one slot).
fn counts(coll: Coll) -> [usize; 3] {
    match coll {
        Coll::AllGather => [33_000, 70_001, 5_000],
        Coll::AllReduce => [9_000, 20_001, 1_000],
        _ => [17_000, 40_001, 3_000],
    }
}

const COLLS: [Coll; 3] = [Coll::AllGather, Coll::AllReduce, Coll::Broadcast];

fn check_round(
    comms: &[Comm],
    coll: Coll,
    who: Who,
    count: usize,
    in_place: bool,
    seed: u64,
    on: bool,
) {
    let got = coll_round(comms, coll, who, count, in_place, seed);
    for (c, g) in comms.iter().zip(&got) {
        let want = expected_direct(c, coll, |r| who.registers(r), count, in_place, on);
        assert_eq!(
            g,
            &want,
            "{} on {} ranks, {who:?}, count {count}, in place {in_place}: rank {}'s direct steps \
             per channel",
            coll.name(),
            comms.len(),
            c.rank()
        );
    }
}

#[test]
fn registered_ring_collectives_write_in_place_and_mixed_falls_back() {
    for n in [2usize, 3, 4, 8] {
        let comms = sim_comms(n, true);
        let mut seed = 0;
        for coll in COLLS {
            for count in counts(coll) {
                for who in [Who::All, Who::None, Who::Even] {
                    for in_place in [false, true] {
                        seed += 1;
                        check_round(&comms, coll, who, count, in_place, seed, true);
                    }
                }
            }
            // Everyone registered and the data fills the steps of the channels the tuner runs:
            // the path was taken (by every rank but Broadcast's root, which receives nothing).
            let got = coll_round(&comms, coll, Who::All, counts(coll)[0], false, 99);
            for (r, ch) in got.iter().enumerate() {
                let root = coll == Coll::Broadcast && r == 1 % n;
                assert!(
                    root || ch.iter().sum::<u64>() > 0,
                    "{} on {n} ranks: {got:?}",
                    coll.name()
                );
            }
        }
    }
}

/// A direct receive passes on the finished value as it arrived: an AllReduce whose reduction
/// scales each input (PreMulSum by 3) or divides the result (Avg) gives the FIFO path's result.
#[test]
fn registered_all_reduce_applies_pre_and_post_once() {
    let comms = sim_comms(3, true);
    let n = comms.len();
    let count = 20_001;
    let streams: Vec<_> = comms
        .iter()
        .map(|c| c.device().stream_create().unwrap())
        .collect();
    let three = 3i32.to_le_bytes();
    for (k, op) in [
        nccl::ReduceOp::PreMulSum {
            scalar_bits: u32::from_le_bytes(three) as u64,
        },
        nccl::ReduceOp::Avg,
    ]
    .into_iter()
    .enumerate()
    {
        let inputs: Vec<Vec<i32>> = (0..n)
            .map(|r| {
                let mut rng = common::Rng::new(500 + 10 * k as u64 + r as u64);
                (0..count).map(|_| (rng.next() % 1000) as i32).collect()
            })
            .collect();
        let want: Vec<i32> = (0..count)
            .map(|i| {
                let sum: i32 = inputs.iter().map(|v| v[i]).sum();
                match op {
                    nccl::ReduceOp::Avg => sum / n as i32,
                    _ => 3 * sum,
                }
            })
            .collect();
        let bufs: Vec<_> = comms
            .iter()
            .zip(&inputs)
            .map(|(c, v)| {
                let b = c.device().alloc(4 * count).unwrap();
                let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
                b.write(0, &bytes).unwrap();
                // SAFETY: the buffer outlives its registration (deregistered below, before it
                // drops).
                let h = unsafe { c.register_raw(b.ptr(), 4 * count).unwrap() };
                (b, h)
            })
            .collect();
        let before: Vec<_> = comms
            .iter()
            .map(|c| c.ring_direct_steps().unwrap())
            .collect();
        let lent = common::lend(&comms);
        nccl::group_start();
        for (r, c) in lent.iter().enumerate() {
            let p = bufs[r].0.ptr();
            // SAFETY: in place on a buffer of `count` int32 that lives until the sync.
            unsafe {
                c.all_reduce_raw(p, p, count, nccl::DataType::Int32, op, streams[r])
                    .unwrap();
            }
        }
        nccl::group_end().unwrap();
        for (r, c) in comms.iter().enumerate() {
            c.device().stream_sync(streams[r]).unwrap();
            let mut raw = vec![0u8; 4 * count];
            bufs[r].0.read(0, &mut raw).unwrap();
            let got: Vec<i32> = raw
                .chunks(4)
                .map(|w| i32::from_le_bytes([w[0], w[1], w[2], w[3]]))
                .collect();
            assert!(got == want, "{op:?}: rank {r}'s result");
            let now = c.ring_direct_steps().unwrap();
            let direct: u64 = now.iter().zip(&before[r]).map(|(a, b)| a - b).sum();
            assert!(direct > 0, "{op:?}: rank {r} took no direct step");
        }
        for (c, (_, h)) in comms.iter().zip(bufs) {
            c.deregister(h).unwrap();
        }
    }
    for (c, s) in comms.iter().zip(streams) {
        c.device().stream_destroy(s).unwrap();
    }
}

#[test]
fn switch_off_keeps_the_fifo() {
    for n in [2usize, 3] {
        let comms = sim_comms(n, false);
        for coll in COLLS {
            let count = counts(coll)[1];
            for (k, who) in [Who::All, Who::Even].into_iter().enumerate() {
                for in_place in [false, true] {
                    check_round(&comms, coll, who, count, in_place, 50 + k as u64, false);
                }
            }
            let got = coll_round(&comms, coll, Who::All, count, false, 60);
            assert!(got.iter().flatten().all(|&s| s == 0), "{n} ranks: {got:?}");
        }
        // The reductions' direct hops too (out of place, everyone registered).
        use common::register::{reduce_root_round, reduce_round, reduce_scatter_round};
        let (dt, op) = (nccl::DataType::Int32, nccl::ReduceOp::Sum);
        for got in [
            reduce_round::<i32>(&comms, dt, op, Who::All, 20_001, false, 61),
            reduce_scatter_round::<i32>(&comms, dt, op, Who::All, 20_001, false, 62),
            reduce_root_round::<i32>(&comms, dt, op, Who::All, 10_001, false, 63),
        ] {
            assert!(got.iter().flatten().all(|&s| s == 0), "{n} ranks: {got:?}");
        }
    }
}

/// Graph registration: an AllGather captured in a CUDA graph counts as registered
/// (NCCL_GRAPH_REGISTER, on by default), so between ranks of one process every replay goes
/// direct on buffers nobody registered, and new blocks written before each replay arrive whole.
#[test]
fn captured_all_gather_goes_direct_without_registration() {
    let comms = sim_comms(3, true);
    let (n, count) = (comms.len(), counts(Coll::AllGather)[0]);
    let streams: Vec<_> = comms
        .iter()
        .map(|c| c.device().stream_create().unwrap())
        .collect();
    let ins: Vec<_> = comms
        .iter()
        .map(|c| c.device().alloc(count).unwrap())
        .collect();
    let outs: Vec<_> = comms
        .iter()
        .map(|c| c.device().alloc(n * count).unwrap())
        .collect();
    for (c, s) in comms.iter().zip(&streams) {
        c.device().capture_begin(*s).unwrap();
    }
    let lent = common::lend(&comms);
    nccl::group_start();
    for (r, c) in lent.iter().enumerate() {
        // SAFETY: the buffers hold these counts and outlive the graphs' replays.
        unsafe {
            c.all_gather_raw(
                ins[r].ptr(),
                outs[r].ptr(),
                count,
                nccl::DataType::Uint8,
                streams[r],
            )
            .unwrap();
        }
    }
    nccl::group_end().unwrap();
    let graphs: Vec<_> = comms
        .iter()
        .zip(&streams)
        .map(|(c, s)| c.device().capture_end(*s).unwrap())
        .collect();
    for replay in 0..2u64 {
        let blocks: Vec<Vec<u8>> = (0..n)
            .map(|r| common::register::ag_block(r, count, 300 + replay))
            .collect();
        for r in 0..n {
            ins[r].write(0, &blocks[r]).unwrap();
            outs[r].write(0, &vec![0xA5; n * count]).unwrap();
        }
        let before: Vec<_> = comms
            .iter()
            .map(|c| c.ring_direct_steps().unwrap())
            .collect();
        for (g, s) in graphs.iter().zip(&streams) {
            g.launch(*s).unwrap();
        }
        for (r, c) in comms.iter().enumerate() {
            c.device().stream_sync(streams[r]).unwrap();
            let mut got = vec![0u8; n * count];
            outs[r].read(0, &mut got).unwrap();
            assert!(got == blocks.concat(), "replay {replay}: rank {r}'s output");
            let steps: Vec<u64> = c
                .ring_direct_steps()
                .unwrap()
                .iter()
                .zip(&before[r])
                .map(|(a, b)| a - b)
                .collect();
            let want = expected_direct(c, Coll::AllGather, |_| true, count, false, true);
            assert_eq!(steps, want, "replay {replay}: rank {r}'s direct steps");
        }
    }
    drop(graphs);
    for (c, s) in comms.iter().zip(streams) {
        c.device().stream_destroy(s).unwrap();
    }
}

/// Ranks as processes: a registered output reaches the predecessor as a record (an IPC handle
/// of its allocation), which it maps before a launch; an offer not yet mapped is declined and
/// the data takes the FIFO, so the first rounds after registering may copy. Every round's
/// result is checked; rounds where nobody registered never go direct, and with the output
/// registered once, the last round of AllGather, AllReduce and Broadcast goes direct.
#[test]
fn registered_ring_collectives_across_processes() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
        let comm = Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank in a child");
        let comms = vec![comm];
        for (k, coll) in COLLS.into_iter().enumerate() {
            let count = counts(coll)[1];
            let got = coll_round(&comms, coll, Who::None, count, k == 1, 70 + k as u64);
            assert!(got[0].iter().all(|&s| s == 0), "rank {rank}: {got:?}");
        }
        // The same output registered once for every round: its record reaches the
        // predecessor's process before that process's launches after the first rounds, and the
        // last round of each collective goes direct on every channel that fills a step.
        // The last two rounds: out of place, then in place (AllReduce's reduce-scatter half
        // goes direct only out of place).
        for coll in COLLS {
            let count = counts(coll)[1];
            let rounds: Vec<_> = (0..6u64)
                .map(|k| registered_once(&comms[0], coll, count, k % 2 == 1, 80 + k))
                .collect();
            for (k, got) in rounds.iter().enumerate().skip(4) {
                let in_place = k % 2 == 1;
                let want = expected_direct(&comms[0], coll, |_| true, count, in_place, true);
                assert_eq!(
                    got,
                    &want,
                    "rank {rank}: registered {} (in place {in_place}) did not go direct",
                    coll.name()
                );
            }
        }
        // ReduceScatter and Reduce on outputs registered afresh each round: the records may
        // or may not reach the predecessor's process before its launch (an offer it cannot
        // map yet is declined), so each channel went direct on its whole slice or not at all;
        // the results are checked either way.
        use common::register::{reduce_root_round, reduce_scatter_round};
        let (dt, op) = (nccl::DataType::Int32, nccl::ReduceOp::Sum);
        for k in 0..4u64 {
            let in_place = k % 2 == 1;
            for (coll, got, count) in [
                (
                    Coll::ReduceScatter,
                    reduce_scatter_round::<i32>(&comms, dt, op, Who::All, 20_001, in_place, 90 + k),
                    20_001,
                ),
                (
                    Coll::Reduce,
                    reduce_root_round::<i32>(&comms, dt, op, Who::All, 10_001, in_place, 95 + k),
                    10_001,
                ),
            ] {
                let want = expected_direct(&comms[0], coll, |_| true, count, in_place, true);
                for (g, w) in got[0].iter().zip(&want) {
                    assert!(
                        *g == 0 || g == w,
                        "rank {rank}: {} (in place {in_place}) took {:?} direct steps, at most \
                         {want:?}",
                        coll.name(),
                        got[0]
                    );
                }
            }
        }
        return;
    }
    for n in [2usize, 3] {
        common::procs::run(
            "registered_ring_collectives_across_processes",
            n,
            // Explicit: the children inherit this process's environment, which another test
            // may have just set otherwise.
            &[
                ("NCCL_PROTO", "Simple"),
                ("NCCL_ALGO", "Ring"),
                ("NCCL_LOCAL_REGISTER", "1"),
                // Registered calls on fewer CTAs: the agreement across processes too.
                ("NCCL_RS_REGISTERED_CTAS", "1"),
            ],
        );
    }
}

/// The one-node tree AllReduce with ranks as processes: a child's way up translates its
/// parent's (the ring predecessor's) offer through that rank's registration records
/// ([`nccl_device::abi::ChannelDev::prev_reach`]), the way down its child's as the ring does.
/// With the output registered once, the last two rounds (out of place: both ways; in place: the
/// way down) go direct on every channel that fills a step; every round's result is checked.
#[test]
fn registered_tree_all_reduce_across_processes() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
        let comm = Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank in a child");
        let count = counts(Coll::AllReduce)[1];
        let choice = comm.tuning(nccl::Coll::AllReduce, 4 * count).unwrap();
        assert_eq!(
            choice.algo,
            nccl::Algo::Tree,
            "rank {rank}: the forced tree"
        );
        let rounds: Vec<_> = (0..6u64)
            .map(|k| registered_once(&comm, Coll::AllReduce, count, k % 2 == 1, 180 + k))
            .collect();
        let mut modelled = 0;
        for (k, got) in rounds.iter().enumerate().skip(4) {
            let in_place = k % 2 == 1;
            let want = expected_direct(&comm, Coll::AllReduce, |_| true, count, in_place, true);
            modelled += want.iter().sum::<u64>();
            assert_eq!(
                got, &want,
                "rank {rank}: the registered tree (in place {in_place}) did not go direct"
            );
        }
        // (In place the root has none: it receives nothing on the way down.)
        assert!(modelled > 0, "rank {rank}: the model says no direct step");
        return;
    }
    for n in [2usize, 3] {
        common::procs::run(
            "registered_tree_all_reduce_across_processes",
            n,
            &[
                ("NCCL_PROTO", "Simple"),
                ("NCCL_ALGO", "Tree"),
                ("NCCL_LOCAL_REGISTER", "1"),
                ("NCCL_RS_REGISTERED_CTAS", "0"),
            ],
        );
    }
}

/// A collective (as [`coll_round`] runs it) into an output registered once for the whole process
/// (so the peers' records are in after the first rounds): checks the result and returns the
/// direct steps per channel.
fn registered_once(c: &Comm, coll: Coll, count: usize, in_place: bool, seed: u64) -> Vec<u64> {
    use common::register::{coll_data, elem_bytes, root_of};
    use std::sync::OnceLock;
    /// Room for every round's input and output (3 ranks at most).
    const ROOM: usize = 1 << 20;
    static BUFS: OnceLock<(nccl::DevBuffer, nccl::DevBuffer)> = OnceLock::new();
    let (n, r) = (c.count(), c.rank());
    let (inp, out) = BUFS.get_or_init(|| {
        let inp = c.device().alloc(ROOM).unwrap();
        let out = c.device().alloc(ROOM).unwrap();
        // SAFETY: the buffer lives (in the static) as long as the process.
        unsafe { c.register_raw(out.ptr(), ROOM).unwrap() };
        (inp, out)
    });
    let bytes = count * elem_bytes(coll);
    let (mine, want) = coll_data(coll, n, r, count, seed);
    assert!(want.len() <= ROOM);
    out.write(0, &vec![0xA5; want.len()]).unwrap();
    let at = if coll == Coll::AllGather {
        r * bytes
    } else {
        0
    };
    let send = if in_place {
        if coll != Coll::Broadcast || r == root_of(n) {
            out.write(at, &mine).unwrap();
        }
        out.ptr() + at as u64
    } else {
        inp.write(0, &mine).unwrap();
        inp.ptr()
    };
    let stream = c.device().stream_create().unwrap();
    let before = c.ring_direct_steps().unwrap();
    let recv = out.ptr();
    // SAFETY: both buffers hold what the call needs and live in the static.
    unsafe {
        match coll {
            Coll::AllGather => c.all_gather_raw(send, recv, count, nccl::DataType::Uint8, stream),
            Coll::Broadcast => {
                c.broadcast_raw(send, recv, count, nccl::DataType::Uint8, root_of(n), stream)
            }
            _ => c.all_reduce_raw(
                send,
                recv,
                count,
                nccl::DataType::Int32,
                nccl::ReduceOp::Sum,
                stream,
            ),
        }
        .unwrap();
    }
    c.device().stream_sync(stream).unwrap();
    c.device().stream_destroy(stream).unwrap();
    let mut got = vec![0u8; want.len()];
    out.read(0, &mut got).unwrap();
    assert!(
        got == want,
        "rank {r}: wrong {} result (in place {in_place})",
        coll.name()
    );
    let now = c.ring_direct_steps().unwrap();
    now.iter().zip(before).map(|(a, b)| a - b).collect()
}

/// AllReduce's reduce-scatter half on registered outputs: out of place, each rank writes its
/// partial sums straight into its successor's output, which reduces them from there (in place
/// they keep the FIFO: a partial would land on an input not yet added). Every reduction (Avg
/// and PreMulSum apply once) on a float and an integer type, odd counts, random data, outputs
/// poisoned inside and around; the direct steps per channel show which half went direct: both
/// halves out of place, the all-gather half alone in place, none where an end did not register.
#[test]
fn registered_all_reduce_reduce_scatter_half_goes_direct() {
    use common::register::reduction_round_as_modelled;
    use nccl::DataType;
    for n in [2usize, 3, 4, 8] {
        // Every channel runs (the comparison of the halves below needs the same channels).
        let comms = sim_comms_with(n, true, &[("NCCL_RS_REGISTERED_CTAS", "0")]);
        let mut seed = 1000 * n as u64;
        let mut round = |dt: DataType, op: nccl::ReduceOp, who: Who, count: usize, in_place| {
            seed += 1;
            let op = common::typed_op(op, dt);
            reduction_round_as_modelled(&comms, Coll::AllReduce, dt, op, who, count, in_place, seed)
        };
        // Every reduction on both types, everyone registered, in and out of place.
        for dt in [DataType::Float32, DataType::Int32] {
            for op in common::ALL_OPS {
                for in_place in [false, true] {
                    let got = round(dt, op, Who::All, 20_001, in_place);
                    let (all, ag) = (got.iter().flatten().sum::<u64>(), {
                        // What the all-gather half alone takes.
                        comms
                            .iter()
                            .flat_map(|c| {
                                expected_direct(c, Coll::AllReduce, |_| true, 20_001, true, true)
                            })
                            .sum::<u64>()
                    });
                    assert!(ag > 0, "{n} ranks: no direct step at all");
                    if !in_place {
                        assert_eq!(all, 2 * ag, "{n} ranks: the reduce-scatter half copied");
                    }
                }
            }
        }
        // Mixed and no registration, a short count (no handshake) and a count over several
        // pieces, on a few reductions.
        for (dt, op) in [
            (DataType::Int32, nccl::ReduceOp::Sum),
            (DataType::Float32, nccl::ReduceOp::Avg),
            (
                DataType::Int32,
                nccl::ReduceOp::PreMulSum { scalar_bits: 0 },
            ),
        ] {
            for who in [Who::Even, Who::None] {
                for in_place in [false, true] {
                    round(dt, op, who, 20_001, in_place);
                }
            }
            round(dt, op, Who::All, 1_003, false);
            round(dt, op, Who::All, 9 * 4096 * n + 5, false);
        }
        // Odd ranks in place, even ones not, in one call: each connection's reduce-scatter
        // half goes direct exactly where its receiver runs out of place.
        let count = 20_001;
        let odd = |r: usize| r % 2 == 1;
        let got = common::register::reduce_round_each::<f32>(
            &comms,
            DataType::Float32,
            common::typed_op(
                nccl::ReduceOp::PreMulSum { scalar_bits: 0 },
                DataType::Float32,
            ),
            Who::All,
            count,
            &odd,
            9 * n as u64,
        );
        for (c, g) in comms.iter().zip(&got) {
            let want = expected_direct(c, Coll::AllReduce, |_| true, count, odd(c.rank()), true);
            assert_eq!(g, &want, "{n} ranks, odd ranks in place: rank {}", c.rank());
        }
    }
}

/// ReduceScatter on registered outputs: out of place, the last hop of each block (the partial
/// sum a rank sends its successor of the successor's own block) lands in the successor's
/// output, which adds its input there; in place, or where an end did not register, every hop
/// takes the FIFO. Every reduction on a float and an integer type, odd counts, random data,
/// poisoned bytes around and the in-place input's other blocks left alone.
#[test]
fn registered_reduce_scatter_last_hop_goes_direct() {
    use common::register::reduction_round_as_modelled;
    use nccl::DataType;
    for n in [2usize, 3, 4, 8] {
        let comms = sim_comms(n, true);
        let mut seed = 5000 * n as u64;
        let mut round = |dt: DataType, op: nccl::ReduceOp, who: Who, count: usize, in_place| {
            seed += 1;
            let op = common::typed_op(op, dt);
            reduction_round_as_modelled(
                &comms,
                Coll::ReduceScatter,
                dt,
                op,
                who,
                count,
                in_place,
                seed,
            )
        };
        for dt in [DataType::Float32, DataType::Int32] {
            for op in common::ALL_OPS {
                let got = round(dt, op, Who::All, 20_001, false);
                assert!(
                    got.iter().flatten().sum::<u64>() > 0,
                    "{n} ranks: no direct step"
                );
                let got = round(dt, op, Who::All, 20_001, true);
                assert!(got.iter().flatten().all(|&s| s == 0), "{n} ranks, in place");
            }
        }
        for who in [Who::Even, Who::None] {
            round(DataType::Int32, nccl::ReduceOp::Sum, who, 20_001, false);
            round(DataType::Float32, nccl::ReduceOp::Avg, who, 9_003, false);
        }
        round(DataType::Int32, nccl::ReduceOp::Sum, Who::All, 1_003, false);
    }
}

/// Reduce on registered buffers: out of place, the chain's last rank writes each piece's
/// partial sum into the root's output, which adds its input there; in place, or where either
/// end did not register, the hop takes the FIFO. Every reduction on a float and an integer
/// type, odd counts; the other ranks' output buffers stay untouched.
#[test]
fn registered_reduce_last_hop_goes_direct() {
    use common::register::reduction_round_as_modelled;
    use nccl::DataType;
    for n in [2usize, 3, 4, 8] {
        let comms = sim_comms(n, true);
        let mut seed = 7000 * n as u64;
        let mut round = |dt: DataType, op: nccl::ReduceOp, who: Who, count: usize, in_place| {
            seed += 1;
            let op = common::typed_op(op, dt);
            reduction_round_as_modelled(&comms, Coll::Reduce, dt, op, who, count, in_place, seed)
        };
        for dt in [DataType::Float32, DataType::Int32] {
            for op in common::ALL_OPS {
                let got = round(dt, op, Who::All, 10_001, false);
                assert!(
                    got.iter().flatten().sum::<u64>() > 0,
                    "{n} ranks: no direct step"
                );
                let got = round(dt, op, Who::All, 10_001, true);
                assert!(got.iter().flatten().all(|&s| s == 0), "{n} ranks, in place");
            }
        }
        for who in [Who::Even, Who::None] {
            round(DataType::Int32, nccl::ReduceOp::Sum, who, 10_001, false);
        }
        round(
            DataType::Float32,
            nccl::ReduceOp::Avg,
            Who::All,
            1_003,
            false,
        );
    }
}

/// Registered calls on fewer CTAs (issue 24, NCCL_RS_REGISTERED_CTAS): where every rank
/// registered its output, the kernels agree on it around each channel's ring and only the first
/// channels run the collective (the others take no step at either end); where one rank did not
/// (or an AllReduce is in place, whose reduce-scatter half copies), every channel runs. The
/// results are checked either way (random data, poisoned outputs: `coll_round`).
#[test]
fn registered_calls_run_on_fewer_ctas_only_when_every_rank_registered() {
    for n in [2usize, 3, 4, 8] {
        let comms = sim_comms_fewer(n, 2);
        let mut seed = 1000;
        for coll in COLLS {
            // Each channel's slice fills a step or more, on 3 or 4 channels.
            let count = 4 * counts(coll)[1];
            for who in [Who::All, Who::Even, Who::None] {
                for in_place in [false, true] {
                    seed += 1;
                    let sends = |c: &Comm| c.ring_send_steps().unwrap();
                    let before: Vec<Vec<u64>> = comms.iter().map(sends).collect();
                    let direct = coll_round(&comms, coll, who, count, in_place, seed);
                    // Per channel, the steps every rank sent (Broadcast's last rank sends none).
                    let mut steps = [0u64; 4];
                    for (c, b) in comms.iter().zip(&before) {
                        for (ch, (now, was)) in sends(c).iter().zip(b).enumerate() {
                            steps[ch] += now - was;
                        }
                    }
                    let went_direct: u64 = direct.iter().flatten().sum();
                    let fewer = who == Who::All && !(coll == Coll::AllReduce && in_place);
                    let what = format!(
                        "{} on {n} ranks, {who:?}, in place {in_place}: steps per channel {steps:?}, direct {direct:?}",
                        coll.name()
                    );
                    // The tuner's channels for this call: fewer than 3 would not tell.
                    let tcoll = match coll {
                        Coll::AllGather => nccl::Coll::AllGather,
                        Coll::Broadcast => nccl::Coll::Broadcast,
                        _ => nccl::Coll::AllReduce,
                    };
                    let nbytes = match coll {
                        Coll::AllGather => n * count,
                        _ => count * common::register::elem_bytes(coll),
                    };
                    let grid = comms[0].tuning(tcoll, nbytes).unwrap().nchannels;
                    assert!(grid >= 3, "{what}: the tuner runs {grid} channels");
                    assert!(steps[0] > 0 && steps[1] > 0, "{what}");
                    if fewer {
                        assert_eq!(steps[2..].iter().sum::<u64>(), 0, "{what}");
                        assert!(went_direct > 0, "{what}");
                    } else {
                        assert!(steps[2] > 0, "{what}");
                    }
                    for (c, d) in comms.iter().zip(&direct) {
                        let registered = |r| who.registers(r);
                        let want = expected_direct(c, coll, registered, count, in_place, true);
                        assert_eq!(d, &want, "{what}: rank {}", c.rank());
                    }
                    if who == Who::None {
                        assert_eq!(went_direct, 0, "{what}");
                    }
                }
            }
        }
    }
}

/// The one-node tree (NCCL_ALGO=Tree: each channel's chain in ring order) on registered
/// outputs: the way down writes each finished chunk straight into the child's output, which
/// passes it on from there; out of place the way up writes each partial sum into the parent's
/// output, which adds its input to it there. Every reduction on both types, 2 to 8 ranks,
/// all / every other / no rank registered, in and out of place, slices over and under a step:
/// results checked (random data, poisoned outputs) and each channel's direct steps equal the
/// model (`expected_direct`), so a path taken where it should not be, or not taken where it
/// should, fails.
#[test]
fn registered_tree_all_reduce_goes_direct_both_ways() {
    use common::register::reduction_round_as_modelled;
    use nccl::DataType;
    for n in [2usize, 3, 4, 8] {
        let comms = sim_comms_with(n, true, &[("NCCL_ALGO", "Tree")]);
        let tree = comms[0].tuning(nccl::Coll::AllReduce, 4 * 20_001).unwrap();
        assert_eq!(tree.algo, nccl::Algo::Tree, "{n} ranks: the tuner's choice");
        assert!(comms[0].tree_chain().is_some(), "{n} ranks: no chain");
        let mut seed = 7000 * n as u64;
        let mut round = |dt: DataType, op: nccl::ReduceOp, who: Who, count: usize, in_place| {
            seed += 1;
            let op = common::typed_op(op, dt);
            let got = reduction_round_as_modelled(
                &comms,
                Coll::AllReduce,
                dt,
                op,
                who,
                count,
                in_place,
                seed,
            );
            got.iter().flatten().sum::<u64>()
        };
        for who in [Who::All, Who::Even, Who::None] {
            for count in counts(Coll::AllReduce) {
                for in_place in [false, true] {
                    round(DataType::Int32, nccl::ReduceOp::Sum, who, count, in_place);
                }
            }
        }
        // Both ways direct out of place, the way down alone in place.
        let (both, down) = (
            round(
                DataType::Int32,
                nccl::ReduceOp::Sum,
                Who::All,
                20_001,
                false,
            ),
            round(DataType::Int32, nccl::ReduceOp::Sum, Who::All, 20_001, true),
        );
        assert!(
            down > 0 && both > down,
            "{n} ranks: {both} / {down} direct steps"
        );
        for dt in [DataType::Float32, DataType::Int32] {
            for op in common::ALL_OPS {
                round(dt, op, Who::All, 9_000, false);
            }
        }
    }
}

/// A ring sender that did not register answers "FIFO" only once its successor's offer of the
/// same call is there. Here the Broadcast's root goes direct in call k (every rank registered)
/// and finishes it at once (its steps fill no FIFO), while its successor still waits for its
/// own successor, not launched yet; the root's call k+1, on unregistered buffers, then runs
/// before that successor reads the root's answer of call k. Had the root answered k+1 at once,
/// its "FIFO" would be read for call k, whose data is in the output already: the successor
/// would pass on stale FIFO slots instead (wrong bytes at both other ranks).
#[test]
fn unregistered_sender_answers_after_the_offer() {
    use nccl::DataType;
    let comms = sim_comms_with(3, true, &[("NCCL_RS_REGISTERED_CTAS", "0")]);
    let rings = comms[0].channel_rings().unwrap();
    assert!(rings.iter().all(|r| r == &rings[0]), "one ring: {rings:?}");
    let (root, mid, last) = (rings[0][0], rings[0][1], rings[0][2]);
    // Two 8 KiB slots' worth per channel: two direct steps each, no wait for a free slot.
    let count = 32 * 1024;
    let streams: Vec<_> = comms
        .iter()
        .map(|c| c.device().stream_create().unwrap())
        .collect();
    let data = |call: u8, r: usize| -> Vec<u8> {
        (0..count)
            .map(|i| (i as u8).wrapping_mul(31) ^ call ^ (r as u8) << 4)
            .collect()
    };
    // Per call and rank, a buffer (in place: the root's holds its data, the others' poison).
    let bufs: Vec<Vec<_>> = (0..2u8)
        .map(|call| {
            comms
                .iter()
                .map(|c| {
                    let b = c.device().alloc(count).unwrap();
                    let fill = match c.rank() == root {
                        true => data(call, root),
                        false => vec![0xA5; count],
                    };
                    b.write(0, &fill).unwrap();
                    b
                })
                .collect()
        })
        .collect();
    // Call 0's buffers registered on every rank; call 1's only off the root.
    let mut regs = Vec::new();
    for (r, c) in comms.iter().enumerate() {
        for (call, per_rank) in bufs.iter().enumerate() {
            if call == 0 || r != root {
                // SAFETY: each buffer outlives its registration (deregistered below).
                regs.push((r, unsafe {
                    c.register_raw(per_rank[r].ptr(), count).unwrap()
                }));
            }
        }
    }
    let launch = |call: usize, r: usize| {
        let p = bufs[call][r].ptr();
        nccl::group_start();
        // SAFETY: in place on `count` bytes that live until the syncs below.
        unsafe {
            comms[r]
                .broadcast_raw(p, p, count, DataType::Uint8, root, streams[r])
                .unwrap();
        }
        nccl::group_end().unwrap();
    };
    launch(0, root);
    launch(0, mid);
    launch(1, root);
    // The root's call 1 has all the time it needs to answer before `last` joins.
    std::thread::sleep(std::time::Duration::from_millis(300));
    launch(0, last);
    launch(1, mid);
    launch(1, last);
    for (r, c) in comms.iter().enumerate() {
        c.device().stream_sync(streams[r]).unwrap();
    }
    for (call, per_rank) in bufs.iter().enumerate() {
        for (r, b) in per_rank.iter().enumerate() {
            let mut got = vec![0u8; count];
            b.read(0, &mut got).unwrap();
            assert!(
                got == data(call as u8, root),
                "call {call}: rank {r}'s bytes"
            );
        }
    }
    for (r, h) in regs {
        comms[r].deregister(h).unwrap();
    }
    for (c, s) in comms.iter().zip(streams) {
        c.device().stream_destroy(s).unwrap();
    }
}

/// The double binary tree across nodes (ranks as processes, nodes by `NCCL_HOSTID`, sockets over
/// loopback between them) on registered outputs: on the links inside a node (its chain, through
/// p2p), a child's partial sums land in its parent's output (out of place) and the parent's
/// results in the child's, through the tree links' handshake; the links between nodes copy
/// through the network. [`common::register::TREE_ACROSS_NODES`] names the shapes, and
/// [`common::register::registered_tree_across_nodes`] what each rank checks.
#[test]
fn registered_tree_across_nodes_goes_direct_inside_nodes() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
        let comm = Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank across nodes");
        common::register::registered_tree_across_nodes(&comm);
        return;
    }
    for shape in common::register::TREE_ACROSS_NODES {
        let env = shape.env();
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        common::procs::run_nodes(
            "registered_tree_across_nodes_goes_direct_inside_nodes",
            shape.nodes,
            shape.per_node,
            &env,
        );
    }
}

/// Graph registration with ranks as processes: a capture registers the output's allocation and
/// sends its record, and the predecessor's capture waits for it (the marks of
/// comm/graph_reg.rs), so every replay of the graph goes direct on buffers nobody registered,
/// on rings (AllGather, AllReduce, Broadcast) and on the one-node tree (AllReduce); eager calls
/// into it copy, and once the graph is destroyed the next call withdraws it. Random data and
/// poisoned outputs in every replay and round (`common::register::captured_coll_rounds`).
#[test]
fn captured_collectives_go_direct_across_processes_until_the_graph_is_gone() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
        let c = Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank in a child");
        let colls = COLLS.map(|coll| (coll, counts(coll)[1]));
        match std::env::var("NCCL_ALGO").as_deref() {
            // The one-node tree: AllReduce, its way down and (out of place) up direct.
            Ok("Tree") => {
                let choice = c.tuning(nccl::Coll::AllReduce, 4 * colls[1].1).unwrap();
                assert_eq!(
                    choice.algo,
                    nccl::Algo::Tree,
                    "rank {rank}: the forced tree"
                );
                common::register::captured_coll_rounds(&c, &colls[1..2]);
            }
            _ => common::register::captured_coll_rounds(&c, &colls),
        }
        return;
    }
    for (n, algo, ctas) in [(2usize, "Ring", "1"), (3, "Ring", "1"), (3, "Tree", "0")] {
        common::procs::run(
            "captured_collectives_go_direct_across_processes_until_the_graph_is_gone",
            n,
            &[
                ("NCCL_PROTO", "Simple"),
                ("NCCL_ALGO", algo),
                ("NCCL_LOCAL_REGISTER", "1"),
                ("NCCL_GRAPH_REGISTER", "1"),
                ("NCCL_RS_REGISTERED_CTAS", ctas),
            ],
        );
    }
}

/// Graph registration is a setting of each process: a peer whose process has it off
/// (NCCL_GRAPH_REGISTER=0) sends no marks, so a captured launch does not wait for it (before,
/// one NCCL_RS_GRAPH_REG_WAIT_MS wait per such peer, and a warning). Here the wait is 1 ms,
/// which rank 1 would outlast every time: with rank 1's setting ignored, rank 0 would count
/// it late. Every replay's results are checked on both ranks.
#[test]
fn a_peer_without_graph_registration_is_never_waited_for() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        if rank == 1 {
            std::env::set_var("NCCL_GRAPH_REGISTER", "0");
        }
        nccl::cuda::set_backend(Backend::Sim).expect("choose the simulator");
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
        let c = Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank in a child");
        common::register::captured_allreduce_replays(&c, 3000);
        assert_eq!(
            c.graph_late_peers(),
            0,
            "rank {rank}: a peer was waited for in vain"
        );
        return;
    }
    common::procs::run(
        "a_peer_without_graph_registration_is_never_waited_for",
        2,
        &[
            ("NCCL_PROTO", "Simple"),
            ("NCCL_ALGO", "Ring"),
            ("NCCL_LOCAL_REGISTER", "1"),
            ("NCCL_GRAPH_REGISTER", "1"),
            ("NCCL_RS_GRAPH_REG_WAIT_MS", "1"),
        ],
    );
}
