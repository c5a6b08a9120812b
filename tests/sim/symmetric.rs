//! Windows and the symmetric path (`comm/window.rs`, `device/src/coll/symmetric.rs`) on the
//! simulator: once the ranks registered a symmetric window, AllReduces, AllGathers and
//! ReduceScatters up to NCCL_RS_SYMMETRIC_MAX_BYTES per rank block (64 KiB unless set) run
//! one-shot: up to 64 KiB as LL lines pushed to every rank, above (where the variable allows)
//! as loads from the peers with inputs read in the window where they lie there and staged
//! otherwise. The tests of the loads run alone in a child process with
//! NCCL_RS_SYMMETRIC_MAX_BYTES at 1 MiB ([`LOADS`]). Random data and poisoned outputs, every
//! type and reduction, odd counts, in and out of place, 2, 4 and 8 ranks; inputs in windows on
//! some ranks only; graphs; NCCL_ALGO / NCCL_PROTO; bad registrations fail on every rank.

use crate::common::windows::{
    collective_at, launches, register_all, staged_matrix, symmetric_windows, window_cases,
    SYMMETRIC_COLLS,
};
use crate::common::{self, check_all_reduce, check_collective, graphs, lend, Drive, ALL_OPS};
use nccl::{Coll, DataType, DevBuffer, ReduceOp};

/// The symmetric path's limit in these tests' own process (the default).
const LIMIT: usize = 64 << 10;
/// The limit where the loads form runs too (the [`LOADS`] children).
const LOADS_LIMIT: usize = 1 << 20;
/// The environment of the tests that also take the loads form (above 64 KiB).
const LOADS: &[(&str, &str)] = &[("NCCL_RS_SYMMETRIC_MAX_BYTES", "1048576")];

/// Plain buffers (staged by the kernel) on 2, 4 and 8 ranks: every type and reduction.
#[test]
fn staged_inputs_every_type_and_reduction() {
    common::sim();
    for n in [2, 4, 8] {
        let ranks = common::sim_ranks(n);
        let _windows = symmetric_windows(&ranks.comms, 4096);
        for (k, dt) in common::matrix_types().into_iter().enumerate() {
            for (j, op) in ALL_OPS.into_iter().enumerate() {
                for (i, count) in [1usize, 7, 1000, 4099, 20_001].into_iter().enumerate() {
                    let before = launches(&ranks);
                    let in_place = (i + j + k) % 2 == 1;
                    let seed = (k * 100 + j * 10 + i) as u64;
                    let drive = [Drive::OneThread, Drive::ThreadPerRank][i % 2];
                    let ran = check_all_reduce(&ranks, count, dt, op, in_place, seed, drive)
                        .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
                    if ran == common::Checked::Ran && count * dt.size() <= LIMIT {
                        assert_eq!(
                            launches(&ranks),
                            before + n as u64,
                            "{n} ranks, {} {op:?} count {count}: not on the symmetric path",
                            dt.name()
                        );
                    }
                }
            }
        }
    }
}

/// AllGather and ReduceScatter from plain buffers (staged by the kernel) on 2, 4 and 8 ranks:
/// every type, the reductions in turn, odd counts, in and out of place.
#[test]
fn staged_inputs_all_gather_and_reduce_scatter() {
    common::sim();
    for n in [2, 4, 8] {
        let ranks = common::sim_ranks(n);
        let _windows = symmetric_windows(&ranks.comms, 4096);
        for coll in [Coll::AllGather, Coll::ReduceScatter] {
            staged_matrix(&ranks, coll, &[1, 7, 1000, 4099, 20_001], LIMIT);
        }
    }
}

/// Inputs read in the windows where they lie (aligned and not), in place in a window (staged),
/// and a job where only even ranks' inputs are in the window: all right, all symmetric; every
/// collective of the path, in the LL form and the loads.
#[test]
fn inputs_in_windows_where_they_lie_and_mixed() {
    common::procs::isolated(LOADS, &[], inputs_in_windows);
}

fn inputs_in_windows() {
    common::sim();
    for n in [2, 4] {
        let ranks = common::sim_ranks(n);
        let bytes = LOADS_LIMIT;
        let windows = symmetric_windows(&ranks.comms, bytes);
        for coll in SYMMETRIC_COLLS {
            let counts = [1, 5, 1000, 3001, 16_385, 40_000];
            window_cases(&ranks, coll, &windows, &counts, bytes);
        }
    }
}

/// NCCL_ALGO and NCCL_PROTO over the symmetric path: `^symmetric` keeps calls off it; `^LL`
/// leaves the loads form, which then runs small calls too; `symmetric` alone runs what the
/// path can take there, and refuses the rest (ncclInvalidUsage, naming why).
#[test]
fn filters_exclude_or_force_the_symmetric_path() {
    let cases: &[(&str, &[(&str, &str)])] = &[
        ("excluded", &[("NCCL_ALGO", "^symmetric")]),
        ("loads only", &[("NCCL_PROTO", "^LL")]),
        ("forced", &[("NCCL_ALGO", "symmetric")]),
    ];
    common::procs::isolated_cases(cases, |case| {
        common::sim();
        let n = 4;
        let ranks = common::sim_ranks(n);
        let bytes = 256 << 10;
        let windows = symmetric_windows(&ranks.comms, bytes);
        for (i, coll) in SYMMETRIC_COLLS.into_iter().enumerate() {
            let before = launches(&ranks);
            let dt = DataType::Float32;
            check_collective(
                &ranks,
                coll,
                1000,
                dt,
                ReduceOp::SUM,
                0,
                i == 1,
                7,
                Drive::OneThread,
            )
            .unwrap_or_else(|e| panic!("{case}: {e}"));
            let symmetric = launches(&ranks) - before;
            match case {
                "excluded" => assert_eq!(symmetric, 0, "{}: ran symmetric", coll.name()),
                _ => assert_eq!(symmetric, n as u64, "{case}: {}", coll.name()),
            }
            if case == "loads only" {
                window_cases(&ranks, coll, &windows, &[1, 5, 1000], bytes);
            }
        }
        if case == "forced" {
            let plain: Vec<DevBuffer> = ranks
                .comms
                .iter()
                .map(|c| c.device().alloc(LIMIT + 4).unwrap())
                .collect();
            for (c, (b, st)) in ranks.comms.iter().zip(plain.iter().zip(&ranks.streams)) {
                let big = (LIMIT + 4) / 4; // over the limit: the path cannot take it
                                           // SAFETY: the test's buffer; the call fails before it is enqueued.
                let e = unsafe {
                    c.all_reduce_raw(b.ptr(), b.ptr(), big, DataType::Float32, ReduceOp::SUM, *st)
                }
                .expect_err("forced symmetric over the limit");
                assert_eq!(e.code, nccl::NcclResult::InvalidUsage, "{e}");
                assert!(e.message.contains("symmetric"), "{e}");
                // SAFETY: as above.
                let e = unsafe { c.broadcast_raw(b.ptr(), b.ptr(), 10, DataType::Float32, 0, *st) }
                    .expect_err("Broadcast with only the symmetric path");
                assert_eq!(e.code, nccl::NcclResult::InvalidUsage, "{e}");
            }
        }
    });
}

/// Above NCCL_RS_SYMMETRIC_MAX_BYTES, and after the last symmetric window went, the ordinary
/// path runs (and is right).
#[test]
fn large_calls_and_no_window_take_the_ordinary_path() {
    common::sim();
    let ranks = common::sim_ranks(2);
    let windows = symmetric_windows(&ranks.comms, 4096);
    let big = LIMIT / 4 + 1;
    let before = launches(&ranks);
    check_all_reduce(
        &ranks,
        big,
        DataType::Float32,
        ReduceOp::SUM,
        false,
        1,
        Drive::OneThread,
    )
    .unwrap();
    assert_eq!(
        launches(&ranks),
        before,
        "a call over the limit ran symmetric"
    );
    let lent = lend(&ranks.comms);
    std::thread::scope(|s| {
        for c in lent.iter() {
            s.spawn(move || c.window_deregister_raw(1).expect("deregister"));
        }
    });
    drop(windows);
    check_all_reduce(
        &ranks,
        100,
        DataType::Float32,
        ReduceOp::SUM,
        true,
        2,
        Drive::OneThread,
    )
    .unwrap();
    assert_eq!(
        launches(&ranks),
        before,
        "a call without a window ran symmetric"
    );
}

/// Captured on the symmetric path and replayed: the launch numbers count on in the graph.
#[test]
fn graphs_replay_on_the_symmetric_path() {
    common::sim();
    let ranks = common::sim_ranks(4);
    let _windows = symmetric_windows(&ranks.comms, 4096);
    graphs::capture_and_replay(&ranks, 5, graphs::FirstUse::BeforeCapture).unwrap();
    assert!(
        launches(&ranks) > 0,
        "the graphs' AllReduce did not take the symmetric path"
    );
}

/// What a bad registration case passes: its name, each rank's buffer, bytes and flags.
type Case = (&'static str, Vec<u64>, [usize; 3], [u32; 3]);

/// Different sizes, a symmetric flag on some ranks only, a rank's bad buffer: every rank gets
/// the error (none waits for the others), and the communicator keeps working.
#[test]
fn bad_windows_fail_on_every_rank() {
    common::sim();
    let ranks = common::sim_ranks(3);
    let bufs: Vec<DevBuffer> = ranks
        .comms
        .iter()
        .map(|c| c.device().alloc(8192).unwrap())
        .collect();
    let ptrs: Vec<u64> = bufs.iter().map(|b| b.ptr()).collect();
    let cases: [Case; 3] = [
        ("sizes differ", ptrs.clone(), [4096, 4096, 8192], [1, 1, 1]),
        (
            "symmetric on some ranks",
            ptrs.clone(),
            [4096; 3],
            [1, 0, 1],
        ),
        (
            "a null buffer",
            vec![ptrs[0], 0, ptrs[2]],
            [4096; 3],
            [1, 1, 1],
        ),
    ];
    for (what, p, b, f) in cases {
        for (r, res) in register_all(&ranks.comms, &p, &b, &f)
            .into_iter()
            .enumerate()
        {
            let e = res.expect_err(what);
            let code = e.code;
            assert!(
                matches!(
                    code,
                    nccl::NcclResult::InvalidUsage | nccl::NcclResult::InvalidArgument
                ),
                "{what}: rank {r}: {e}"
            );
        }
    }
    assert_eq!(launches(&ranks), 0);
    check_all_reduce(
        &ranks,
        77,
        DataType::Float32,
        ReduceOp::SUM,
        false,
        3,
        Drive::OneThread,
    )
    .unwrap();
}

/// A rank of a child process of [`common::procs::run`].
fn child_ranks() -> Option<common::Ranks> {
    let (rank, nranks, id) = common::procs::child()?;
    let comm = nccl::Comm::init_rank_on(common::sim_dev(rank), nranks, &id, rank)
        .expect("init_rank in a child");
    Some(common::Ranks::new(vec![comm]))
}

/// Ranks as processes (2 and 4): every rank maps the others' windows and scratch through the
/// simulator's IPC, and the symmetric path runs as in one process: staged inputs of a few
/// types and reductions (LL and loads sizes), inputs in windows, in place, mixed.
#[test]
fn ranks_as_processes_map_each_other() {
    let Some(ranks) = child_ranks() else {
        common::sim();
        for n in [2, 4] {
            common::procs::run(n, LOADS);
        }
        return;
    };
    let bytes = 512 << 10;
    let windows = symmetric_windows(&ranks.comms, bytes);
    // Outputs in the first half, the odd ranks' mixed inputs in the second.
    let plain = ranks.comms[0].device().alloc(2 * bytes).unwrap();
    let nranks = ranks.comms[0].count();
    let mut seed = 0;
    for dt in [
        DataType::Float32,
        DataType::Int8,
        DataType::Float16,
        DataType::Float64,
    ] {
        for op in [ReduceOp::SUM, ReduceOp::MAX] {
            for count in [3usize, 5000, 30_001] {
                seed += 1;
                let before = launches(&ranks);
                let ran =
                    check_all_reduce(&ranks, count, dt, op, seed % 2 == 0, seed, Drive::OneThread)
                        .unwrap_or_else(|e| panic!("ranks as processes: {e}"));
                if ran == common::Checked::Ran && count * dt.size() <= LOADS_LIMIT {
                    assert_eq!(launches(&ranks), before + 1, "{} count {count}", dt.name());
                }
            }
        }
    }
    for coll in [Coll::AllGather, Coll::ReduceScatter] {
        for (i, count) in [3usize, 5000, 20_001].into_iter().enumerate() {
            seed += 1;
            let before = launches(&ranks);
            let (dt, op) = (DataType::Float16, ReduceOp::SUM);
            check_collective(
                &ranks,
                coll,
                count,
                dt,
                op,
                0,
                i == 1,
                seed,
                Drive::OneThread,
            )
            .unwrap_or_else(|e| panic!("ranks as processes: {e}"));
            assert_eq!(
                launches(&ranks),
                before + 1,
                "{} count {count}",
                coll.name()
            );
        }
    }
    let rank = ranks.comms[0].rank();
    for coll in SYMMETRIC_COLLS {
        for count in [7usize, 20_000] {
            let before = launches(&ranks);
            let w = windows[0].ptr() + 256;
            let p = plain.ptr() + 256;
            seed += 1;
            collective_at(&ranks, coll, &[w], &[p], count, seed);
            seed += 1;
            let (input, output) = match coll {
                Coll::AllGather => (w + (rank * count * 4) as u64, w),
                Coll::ReduceScatter => (w, w + (rank * count * 4) as u64),
                _ => (w, w),
            };
            collective_at(&ranks, coll, &[input], &[output], count, seed);
            seed += 1;
            let half = plain.ptr() + bytes as u64;
            let mixed = if rank % 2 == 0 { w } else { half };
            assert!(count * 4 * nranks <= bytes - 256);
            collective_at(&ranks, coll, &[mixed], &[p], count, seed);
            assert_eq!(
                launches(&ranks),
                before + 3,
                "{} count {count}",
                coll.name()
            );
        }
    }
}

/// The narrow floats sum in f32 on the symmetric path, rounded once: 2048 + 1 + 1 + 1 in fp16
/// is 2052 (2051 rounded to even), where fp16 steps would keep 2048 (each 2049 rounds back);
/// in bf16 256 + 1 + 1 + 1 is 260, not 256.
#[test]
fn narrow_floats_sum_in_f32() {
    common::sim();
    let ranks = common::sim_ranks(4);
    let _windows = symmetric_windows(&ranks.comms, 4096);
    for (dt, big, one, want) in [
        (DataType::Float16, 0x6800u16, 0x3C00u16, 0x6802u16),
        (DataType::Bfloat16, 0x4380, 0x3F80, 0x4382),
    ] {
        let count = 9;
        let bufs: Vec<DevBuffer> = ranks
            .comms
            .iter()
            .map(|c| {
                let b = c.device().alloc(count * 4).unwrap();
                let v = if c.rank() == 0 { big } else { one };
                b.write(0, common::to_bytes(&vec![v; count])).unwrap();
                b.write(count * 2, &vec![0xEE; count * 2]).unwrap();
                b
            })
            .collect();
        let before = launches(&ranks);
        let lent = lend(&ranks.comms);
        std::thread::scope(|s| {
            for ((c, b), st) in lent.iter().zip(&bufs).zip(&ranks.streams) {
                let (p, st) = (b.ptr(), *st);
                s.spawn(move || {
                    let o = p + (count * 2) as u64;
                    // SAFETY: the test's buffers, alive until the synchronization below.
                    unsafe { c.all_reduce_raw(p, o, count, dt, ReduceOp::SUM, st) }.unwrap();
                    c.device().stream_sync(st).unwrap();
                });
            }
        });
        assert_eq!(launches(&ranks), before + 4, "{}: not symmetric", dt.name());
        for (c, b) in ranks.comms.iter().zip(&bufs) {
            let mut out = vec![0u8; count * 2];
            b.read(count * 2, &mut out).unwrap();
            let got: Vec<u16> = common::from_bytes(&out);
            assert_eq!(got, vec![want; count], "{} rank {}", dt.name(), c.rank());
        }
    }
}

/// The typed API: each rank's thread registers its buffer as a window (`Comm::window`, a
/// collective call) and all-reduces in place through the guard, on the symmetric path.
#[test]
fn typed_windows_all_reduce_in_place() {
    common::sim();
    let comms = common::sim_comms(3);
    let lent = lend(&comms);
    let count = 1001;
    let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
        let hs: Vec<_> = lent
            .iter()
            .map(|c| {
                s.spawn(move || {
                    let stream = nccl::Stream::new(c.device()).unwrap();
                    let data = vec![(c.rank() + 1) as f32; count];
                    let mut buf = nccl::DeviceBuffer::from_slice(c.device(), &data).unwrap();
                    let before = c.symmetric_launches();
                    let mut win = c.window(&mut buf, true).unwrap();
                    c.all_reduce_in_place(&mut *win, nccl::Op::SUM, &stream)
                        .unwrap();
                    stream.synchronize().unwrap();
                    assert_eq!(c.symmetric_launches(), before + 1, "not symmetric");
                    win.deregister().unwrap();
                    buf.to_vec().unwrap()
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    });
    for (r, got) in sums.iter().enumerate() {
        assert_eq!(got, &vec![6.0f32; count], "rank {r}");
    }
}

/// A window that a live CUDA graph reads (a call of the loads form captured with its input
/// in the window) cannot be deregistered: ncclInvalidUsage, and the graph still replays
/// right; once the graphs are destroyed it can.
#[test]
fn a_window_read_by_a_live_graph_stays() {
    common::procs::isolated(LOADS, &[], || {
        common::sim();
        let ranks = common::sim_ranks(2);
        let bytes = 512 << 10;
        let windows = symmetric_windows(&ranks.comms, bytes);
        let outs: Vec<DevBuffer> = ranks
            .comms
            .iter()
            .map(|c| c.device().alloc(bytes).unwrap())
            .collect();
        let count = 20_000; // 80 000 bytes: the loads form
        for (c, w) in ranks.comms.iter().zip(&windows) {
            let v = vec![(c.rank() + 1) as f32; count];
            w.write(0, common::to_bytes(&v)).unwrap();
        }
        let before = launches(&ranks);
        let graphs: Vec<nccl::cuda::Graph> = ranks
            .comms
            .iter()
            .zip(&windows)
            .zip(&outs)
            .zip(&ranks.streams)
            .map(|(((c, w), o), s)| {
                let d = c.device();
                d.capture_begin(*s).unwrap();
                // SAFETY: the test's buffers, alive until the graphs are gone.
                unsafe {
                    c.all_reduce_raw(
                        w.ptr(),
                        o.ptr(),
                        count,
                        DataType::Float32,
                        ReduceOp::SUM,
                        *s,
                    )
                }
                .unwrap();
                d.capture_end(*s).unwrap()
            })
            .collect();
        assert_eq!(
            launches(&ranks),
            before + 2,
            "not captured on the symmetric path"
        );
        for c in &ranks.comms {
            let e = c
                .window_deregister_raw(1)
                .expect_err("deregistered under a live graph");
            assert_eq!(e.code, nccl::NcclResult::InvalidUsage, "{e}");
        }
        for (g, s) in graphs.iter().zip(&ranks.streams) {
            g.launch(*s).unwrap();
        }
        for ((c, o), s) in ranks.comms.iter().zip(&outs).zip(&ranks.streams) {
            c.device().stream_sync(*s).unwrap();
            let mut out = vec![0u8; count * 4];
            o.read(0, &mut out).unwrap();
            let got: Vec<f32> = common::from_bytes(&out);
            assert_eq!(got, vec![3.0f32; count], "rank {}", c.rank());
        }
        drop(graphs);
        for c in &ranks.comms {
            c.window_deregister_raw(1)
                .expect("deregister once the graphs are gone");
        }
    });
}

/// A rank killed while the others' symmetric kernels wait for its LL lines, windows mapped
/// (3 processes of one node): every survivor's async error names it within the bound, the
/// abort ends the kernels (they watch the abort flag), and destroy unmaps; nothing hangs.
#[test]
fn a_dead_peer_while_a_window_is_mapped() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        let comm = nccl::Comm::init_rank_on(common::sim_dev(rank), nranks, &id, rank).unwrap();
        let comms = vec![comm];
        let _windows = symmetric_windows(&comms, 4096);
        let comm = comms.into_iter().next().expect("the comm");
        let (buf, st) = (
            comm.device().alloc(4000).unwrap(),
            comm.device().stream_create().unwrap(),
        );
        // SAFETY: the test's buffer, alive until the synchronization.
        unsafe {
            comm.all_reduce_raw(
                buf.ptr(),
                buf.ptr(),
                1000,
                DataType::Float32,
                ReduceOp::SUM,
                st,
            )
        }
        .unwrap();
        comm.device().stream_sync(st).unwrap();
        assert_eq!(comm.symmetric_launches(), 1, "not on the symmetric path");
        let limit = std::time::Duration::from_secs(30);
        // 4000-byte AllReduces: the symmetric path's LL form, which waits on every rank.
        common::faults::killed_mid_collective(comm, nranks - 1, 1000, 3000, limit);
        return;
    }
    common::sim();
    common::procs::run_nodes_with_victim(1, 3, &[common::LOOPBACK], 2);
}
