//! Ring collectives on registered buffers, on the simulator: in an AllGather, a Broadcast and
//! the all-gather half of an AllReduce between ranks whose output buffers are registered, each
//! rank writes what it passes on straight into its successor's output, which passes it on from
//! there (no FIFO on either end). Each channel counts the steps its predecessor wrote in place,
//! which tells the path taken; the results are checked whichever path it was, and a connection
//! with an unregistered end copies. (The registered reductions are `register_coll_reduce`'s.)

use crate::common::register::{coll_round, expected_direct, Who};
use crate::common::{self, procs};
use nccl::Comm;
use nccl_device::abi::Coll;

/// Simple steps (the zero-copy path's protocol), the simulator's 2 channels and 64 KiB buffer:
/// 8 KiB slots, 16 KiB steps (two slots). `local_register`: NCCL_LOCAL_REGISTER. Registered
/// calls run on one CTA of the two where every rank registered (NCCL_RS_REGISTERED_CTAS=1, not
/// the default, so that every test here also runs the kernels' agreement; `expected_direct`
/// counts with it). The parameters are read from the environment at init: each test runs
/// alone in a child process started with its own, and `extra` adds to them (or replaces).
pub(crate) fn isolated(local_register: bool, extra: &[(&str, &str)], body: impl FnOnce()) {
    let mut env = vec![
        ("NCCL_PROTO", "Simple"),
        ("NCCL_ALGO", "Ring"),
        (
            "NCCL_LOCAL_REGISTER",
            if local_register { "1" } else { "0" },
        ),
    ];
    env.retain(|(k, _)| !extra.iter().any(|(e, _)| e == k));
    env.extend_from_slice(extra);
    procs::isolated(
        &env,
        &["NCCL_MIN_NCHANNELS", "NCCL_RS_REGISTERED_CTAS"],
        body,
    );
}

pub(crate) const ONE_CTA: &[(&str, &str)] = &[("NCCL_RS_REGISTERED_CTAS", "1")];

/// Counts per collective: two whose channel slices fill a Simple step or more (with the
/// simulator's 2 channels; one odd, so steps and pieces end short) and one under a step (no
/// handshake). AllGather: bytes per rank, 16 KiB steps (33000: a whole step and a short one per
/// channel); AllReduce: int32, 4096 per step; Broadcast: bytes, 8 KiB steps (one slot).
pub(crate) fn counts(coll: Coll) -> [usize; 3] {
    match coll {
        Coll::AllGather => [33_000, 70_001, 5_000],
        Coll::AllReduce => [9_000, 20_001, 1_000],
        _ => [17_000, 40_001, 3_000],
    }
}

pub(crate) const COLLS: [Coll; 3] = [Coll::AllGather, Coll::AllReduce, Coll::Broadcast];

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
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_gather",
        nccl_rs_kernel = "nccl_all_reduce_int32_sum",
        nccl_rs_kernel = "nccl_broadcast"
    )),
    ignore = "needs nccl_all_gather, nccl_all_reduce_int32_sum, nccl_broadcast, which NCCL_RS_KERNELS left out"
)]
fn registered_ring_collectives_write_in_place_and_mixed_falls_back() {
    isolated(true, ONE_CTA, || {
        for n in [2usize, 3, 4, 8] {
            let comms = common::sim_comms(n);
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
    });
}

/// A direct receive passes on the finished value as it arrived: an AllReduce whose reduction
/// scales each input (PreMulSum by 3) or divides the result (Avg) gives the FIFO path's result.
#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_int32_premulsum",
        nccl_rs_kernel = "nccl_all_reduce_int32_avg"
    )),
    ignore = "needs nccl_all_reduce_int32_premulsum, nccl_all_reduce_int32_avg, which NCCL_RS_KERNELS left out"
)]
fn registered_all_reduce_applies_pre_and_post_once() {
    isolated(true, ONE_CTA, || {
        let comms = common::sim_comms(3);
        let n = comms.len();
        let count = 20_001;
        let streams: Vec<_> = comms
            .iter()
            .map(|c| c.device().stream_create().unwrap())
            .collect();
        let three = 3i32.to_le_bytes();
        for (k, op) in [
            nccl::ReduceOp::pre_mul_sum(u32::from_le_bytes(three) as u64),
            nccl::ReduceOp::AVG,
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
                    match op.kind() {
                        nccl::RedOpKind::Avg => sum / n as i32,
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
    });
}

#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_gather",
        nccl_rs_kernel = "nccl_all_reduce_int32_sum",
        nccl_rs_kernel = "nccl_broadcast",
        nccl_rs_kernel = "nccl_reduce_scatter_int32_sum",
        nccl_rs_kernel = "nccl_reduce_int32_sum"
    )),
    ignore = "needs nccl_all_gather, nccl_all_reduce_int32_sum, nccl_broadcast, nccl_reduce_scatter_int32_sum, nccl_reduce_int32_sum, which NCCL_RS_KERNELS left out"
)]
fn switch_off_keeps_the_fifo() {
    isolated(false, ONE_CTA, || {
        for n in [2usize, 3] {
            let comms = common::sim_comms(n);
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
            let (dt, op) = (nccl::DataType::Int32, nccl::ReduceOp::SUM);
            for got in [
                reduce_round::<i32>(&comms, dt, op, Who::All, 20_001, false, 61),
                reduce_scatter_round::<i32>(&comms, dt, op, Who::All, 20_001, false, 62),
                reduce_root_round::<i32>(&comms, dt, op, Who::All, 10_001, false, 63),
            ] {
                assert!(got.iter().flatten().all(|&s| s == 0), "{n} ranks: {got:?}");
            }
        }
    });
}

/// Graph registration: an AllGather captured in a CUDA graph counts as registered
/// (NCCL_GRAPH_REGISTER, on by default), so between ranks of one process every replay goes
/// direct on buffers nobody registered, and new blocks written before each replay arrive whole.
#[test]
fn captured_all_gather_goes_direct_without_registration() {
    isolated(true, ONE_CTA, || {
        let comms = common::sim_comms(3);
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
    });
}

/// Registered calls on fewer CTAs (issue 24, NCCL_RS_REGISTERED_CTAS): where every rank
/// registered its output, the kernels agree on it around each channel's ring and only the first
/// channels run the collective (the others take no step at either end); where one rank did not
/// (or an AllReduce is in place, whose reduce-scatter half copies), every channel runs. The
/// results are checked either way (random data, poisoned outputs: `coll_round`).
#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_gather",
        nccl_rs_kernel = "nccl_all_reduce_int32_sum",
        nccl_rs_kernel = "nccl_broadcast"
    )),
    ignore = "needs nccl_all_gather, nccl_all_reduce_int32_sum, nccl_broadcast, which NCCL_RS_KERNELS left out"
)]
fn registered_calls_run_on_fewer_ctas_only_when_every_rank_registered() {
    isolated(
        true,
        &[
            ("NCCL_RS_REGISTERED_CTAS", "2"),
            ("NCCL_MIN_NCHANNELS", "4"),
        ],
        || {
            for n in [2usize, 3, 4, 8] {
                let comms = common::sim_comms(n);
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
                                let want =
                                    expected_direct(c, coll, registered, count, in_place, true);
                                assert_eq!(d, &want, "{what}: rank {}", c.rank());
                            }
                            if who == Who::None {
                                assert_eq!(went_direct, 0, "{what}");
                            }
                        }
                    }
                }
            }
        },
    );
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
    isolated(true, &[("NCCL_RS_REGISTERED_CTAS", "0")], || {
        use nccl::DataType;
        let comms = common::sim_comms(3);
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
        // The root's call 1 has all the time it needs to answer before `last` joins (no
        // synchronisation: the bytes must be right whatever the pause; it makes the race likely).
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
    });
}
