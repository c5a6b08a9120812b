//! Group modes on the simulator: non-blocking groups (ncclGroupEnd returns ncclInProgress and
//! the communicators report it until their work was issued in the background) and
//! ncclGroupSimulateEnd (nothing launched, the model's time returned).

use crate::common::{self, from_bytes, input, reference, to_bytes};
use nccl::comm::CollCall;
use nccl::{Comm, Config, DataType, Device, NcclResult, ReduceOp, StreamHandle};
use std::time::{Duration, Instant};

/// Every test runs alone in a child process with 16 simulated GPUs, each test on devices of its
/// own (several use the legacy default stream, which two tests must not share).
fn isolated(body: impl FnOnce()) {
    common::procs::isolated(&[("NCCL_RS_SIM_DEVICES", "16")], &[], body);
}

fn dev(i: usize) -> Device {
    common::sim_dev(i)
}

/// `n` communicators on devices `first..first+n`, created side by side with `config`.
fn comms(first: usize, n: usize, config: &Config) -> Vec<Comm> {
    let id = common::loopback_id();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|r| {
                let (id, config) = (&id, config);
                s.spawn(move || {
                    Comm::init_rank_config_on(dev(first + r), n, id, r, config).expect("init")
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("init thread"))
            .collect()
    })
}

fn in_progress(r: nccl::Result<nccl::GroupStatus>) {
    let s = r.expect("a non-blocking group in progress is not an error");
    assert_eq!(s, nccl::GroupStatus::InProgress);
}

/// Polls until the communicator's background work was issued; its final state.
fn poll(c: &Comm) -> NcclResult {
    let t = Instant::now();
    loop {
        let s = c.async_state();
        if s != NcclResult::InProgress {
            return s;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "still in progress");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_float_sum",
        nccl_rs_kernel = "nccl_all_reduce_int32_sum",
        nccl_rs_kernel = "nccl_p2p"
    )),
    ignore = "needs nccl_all_reduce_float_sum, nccl_all_reduce_int32_sum, nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn nonblocking_groups_issue_in_the_background() {
    isolated(|| {
        let cs = comms(0, 2, &Config::blocking(false));
        let streams: Vec<StreamHandle> = cs
            .iter()
            .map(|c| c.device().stream_create().unwrap())
            .collect();
        // Rank 0's group alone, from this thread: its sends and receives need rank 1 to connect,
        // which it has not even been asked to; a blocking group would wait here forever.
        let count = 20_000; // 80 KB: more than a connection's FIFO
        let data: Vec<Vec<i32>> = (0..2)
            .map(|r| input::<i32>(count, ReduceOp::SUM, 11, r, 2))
            .collect();
        let mut send = Vec::new();
        let mut recv = Vec::new();
        for (r, c) in cs.iter().enumerate() {
            let s = c.device().alloc(count * 4).unwrap();
            s.write(0, to_bytes(&data[r])).unwrap();
            let d = c.device().alloc(count * 4).unwrap();
            d.write(0, &vec![0xA5; count * 4]).unwrap();
            send.push(s);
            recv.push(d);
        }
        let issue = |r: usize| {
            nccl::group_start();
            unsafe { cs[r].send_raw(send[r].ptr(), count, DataType::Int32, 1 - r, streams[r]) }
                .unwrap();
            unsafe { cs[r].recv_raw(recv[r].ptr(), count, DataType::Int32, 1 - r, streams[r]) }
                .unwrap();
            nccl::group_end()
        };
        in_progress(issue(0));
        std::thread::sleep(Duration::from_millis(200));
        assert_eq!(cs[0].async_state(), NcclResult::InProgress);
        assert_eq!(
            cs[1].async_state(),
            NcclResult::Success,
            "rank 1 has nothing"
        );
        // Using rank 0 now is refused, as NCCL refuses it, and changes nothing.
        let e = unsafe {
            cs[0].all_reduce_raw(
                send[0].ptr(),
                send[0].ptr(),
                1,
                DataType::Int32,
                ReduceOp::SUM,
                streams[0],
            )
        }
        .unwrap_err();
        assert_eq!(e.code, NcclResult::InvalidArgument, "{e}");
        assert!(e.message.contains("poll"), "{e}");
        nccl::group_start();
        let e = unsafe { cs[0].send_raw(send[0].ptr(), 1, DataType::Int32, 1, streams[0]) }
            .unwrap_err();
        assert_eq!(e.code, NcclResult::InvalidArgument, "{e}");
        assert_eq!(
            nccl::group_end().unwrap_err().code,
            NcclResult::InvalidArgument,
            "the group returns its first error"
        );
        assert_eq!(cs[0].async_state(), NcclResult::InProgress);
        // Rank 1's group lets both complete.
        in_progress(issue(1));
        for c in &cs {
            assert_eq!(poll(c), NcclResult::Success);
        }
        for (r, c) in cs.iter().enumerate() {
            c.device().stream_sync(streams[r]).unwrap();
            let mut out = vec![0u8; count * 4];
            recv[r].read(0, &mut out).unwrap();
            let got = from_bytes::<i32>(&out);
            if let Some(i) = (0..count).find(|&i| got[i] != data[1 - r][i]) {
                panic!(
                    "rank {r}: element {i} of {count} is {:#x}, want {:#x}",
                    got[i],
                    data[1 - r][i]
                );
            }
        }

        // Collectives of both ranks in one non-blocking group, from one thread.
        let n = 5000;
        let x: Vec<Vec<f32>> = (0..2)
            .map(|r| input::<f32>(n, ReduceOp::SUM, 12, r, 2))
            .collect();
        let want = reference(&x, ReduceOp::SUM, DataType::Float32);
        let bufs: Vec<_> = cs
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let b = c.device().alloc(n * 4).unwrap();
                b.write(0, to_bytes(&x[r])).unwrap();
                b
            })
            .collect();
        nccl::group_start();
        for (r, c) in cs.iter().enumerate() {
            unsafe {
                c.all_reduce_raw(
                    bufs[r].ptr(),
                    bufs[r].ptr(),
                    n,
                    DataType::Float32,
                    ReduceOp::SUM,
                    streams[r],
                )
            }
            .unwrap();
        }
        in_progress(nccl::group_end());
        for (r, c) in cs.iter().enumerate() {
            assert_eq!(poll(c), NcclResult::Success);
            c.wait_group().unwrap();
            c.device().stream_sync(streams[r]).unwrap();
            let mut out = vec![0u8; n * 4];
            bufs[r].read(0, &mut out).unwrap();
            common::compare(&from_bytes::<f32>(&out), &want, &format!("rank {r}"))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        // An empty non-blocking group has nothing to issue.
        nccl::group_start();
        nccl::group_end().unwrap();
        for (c, s) in cs.iter().zip(streams) {
            c.device().stream_destroy(s).unwrap();
        }
    });
}

#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_all_reduce_float_sum"),
    ignore = "needs nccl_all_reduce_float_sum, which NCCL_RS_KERNELS left out"
)]
fn blocking_and_nonblocking_communicators_do_not_mix() {
    isolated(|| {
        let nb = comms(4, 1, &Config::blocking(false)).pop().unwrap();
        let b = comms(5, 1, &Config::blocking(true)).pop().unwrap();
        let (bn, bb) = (
            nb.device().alloc(64).unwrap(),
            b.device().alloc(64).unwrap(),
        );
        let s = StreamHandle::default();
        nccl::group_start();
        unsafe { nb.all_reduce_raw(bn.ptr(), bn.ptr(), 16, DataType::Float32, ReduceOp::SUM, s) }
            .unwrap();
        let e = unsafe {
            b.all_reduce_raw(bb.ptr(), bb.ptr(), 16, DataType::Float32, ReduceOp::SUM, s)
        }
        .unwrap_err();
        assert_eq!(e.code, NcclResult::InvalidArgument, "{e}");
        assert!(e.message.contains("non-blocking"), "{e}");
        assert_eq!(
            nccl::group_end().unwrap_err().code,
            NcclResult::InvalidArgument
        );
        // Nothing was issued, nothing is pending.
        assert_eq!(nb.async_state(), NcclResult::Success);
    });
}

#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_int32_sum",
        nccl_rs_kernel = "nccl_p2p"
    )),
    ignore = "needs nccl_all_reduce_int32_sum, nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn a_failed_background_group_becomes_the_communicators_error() {
    isolated(|| {
        let c = comms(6, 1, &Config::blocking(false)).pop().unwrap();
        let b = c.device().alloc(64).unwrap();
        let s = c.device().stream_create().unwrap();
        // A send to ourselves without its receive: only found when the group is issued.
        nccl::group_start();
        unsafe { c.send_raw(b.ptr(), 4, DataType::Int32, 0, s) }.unwrap();
        in_progress(nccl::group_end());
        assert_eq!(poll(&c), NcclResult::InvalidUsage);
        let e = c.wait_group().unwrap_err();
        assert!(e.message.contains("receives from itself"), "{e}");
        // Every later call reports it (the communicator is to be aborted).
        let e = unsafe { c.all_reduce_raw(b.ptr(), b.ptr(), 4, DataType::Int32, ReduceOp::SUM, s) }
            .unwrap_err();
        assert_eq!(e.code, NcclResult::InvalidUsage, "{e}");
        c.device().stream_destroy(s).unwrap();
    });
}

#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_float_sum",
        nccl_rs_kernel = "nccl_p2p"
    )),
    ignore = "needs nccl_all_reduce_float_sum, nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn simulate_end_launches_nothing_and_estimates() {
    isolated(|| {
        let cs = comms(8, 2, &Config::blocking(true));
        let count = 1 << 16;
        let x: Vec<Vec<f32>> = (0..2)
            .map(|r| input::<f32>(count, ReduceOp::SUM, 21, r, 2))
            .collect();
        let bufs: Vec<_> = cs
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let b = c.device().alloc(count * 4).unwrap();
                b.write(0, to_bytes(&x[r])).unwrap();
                b
            })
            .collect();
        let streams: Vec<StreamHandle> = cs
            .iter()
            .map(|c| c.device().stream_create().unwrap())
            .collect();
        let call = |r: usize, n: usize| CollCall {
            coll: nccl_device::abi::Coll::AllReduce,
            send: bufs[r].ptr(),
            recv: bufs[r].ptr(),
            count: n,
            dt: DataType::Float32,
            op: ReduceOp::SUM,
            root: 0,
            stream: streams[r],
        };
        let one = nccl::enqueue::estimate_us(&cs[0], &call(0, count));
        let small = nccl::enqueue::estimate_us(&cs[0], &call(0, 100));
        assert!(one > 0.0 && small > 0.0, "{one} {small}");
        // Rank 0: two all-reduces; rank 1: one. The ranks run side by side: the longest counts.
        nccl::group_start();
        for (r, c) in cs.iter().enumerate() {
            unsafe {
                c.all_reduce_raw(
                    bufs[r].ptr(),
                    bufs[r].ptr(),
                    count,
                    DataType::Float32,
                    ReduceOp::SUM,
                    streams[r],
                )
            }
            .unwrap();
        }
        unsafe {
            cs[0].all_reduce_raw(
                bufs[0].ptr(),
                bufs[0].ptr(),
                100,
                DataType::Float32,
                ReduceOp::SUM,
                streams[0],
            )
        }
        .unwrap();
        unsafe { cs[0].send_raw(bufs[0].ptr(), 10, DataType::Float32, 1, streams[0]) }.unwrap();
        let t = nccl::group_simulate_end().unwrap().expect("outermost");
        assert!(
            (t - (one + small)).abs() < 1e-9 * t.max(1.0),
            "{t} vs {one} + {small}"
        );
        // Nothing ran: the inputs are untouched, and the connections for the dropped send were
        // never made (the next real operations work).
        for (r, c) in cs.iter().enumerate() {
            c.device().stream_sync(streams[r]).unwrap();
            let mut out = vec![0u8; count * 4];
            bufs[r].read(0, &mut out).unwrap();
            assert!(
                from_bytes::<f32>(&out) == x[r],
                "rank {r}: the simulated group ran"
            );
        }
        assert_eq!(nccl::enqueue::group::depth(), 0);
        let want = reference(&x, ReduceOp::SUM, DataType::Float32);
        nccl::group_start();
        for (r, c) in cs.iter().enumerate() {
            unsafe {
                c.all_reduce_raw(
                    bufs[r].ptr(),
                    bufs[r].ptr(),
                    count,
                    DataType::Float32,
                    ReduceOp::SUM,
                    streams[r],
                )
            }
            .unwrap();
        }
        nccl::group_end().unwrap();
        for (r, c) in cs.iter().enumerate() {
            c.device().stream_sync(streams[r]).unwrap();
            let mut out = vec![0u8; count * 4];
            bufs[r].read(0, &mut out).unwrap();
            common::compare(&from_bytes::<f32>(&out), &want, &format!("rank {r}"))
                .unwrap_or_else(|e| panic!("{e}"));
        }

        // Nested: an inner simulate ends only its level; an empty group estimates 0.
        nccl::group_start();
        nccl::group_start();
        assert_eq!(nccl::group_simulate_end().unwrap(), None);
        assert_eq!(nccl::group_simulate_end().unwrap(), Some(0.0));
        // A bad call in the group comes back from the simulated end.
        nccl::group_start();
        let e =
            unsafe { cs[0].all_reduce_raw(0, 0, 4, DataType::Float32, ReduceOp::SUM, streams[0]) }
                .unwrap_err();
        assert_eq!(e.code, NcclResult::InvalidArgument);
        assert_eq!(
            nccl::group_simulate_end().unwrap_err().code,
            NcclResult::InvalidArgument
        );
        // Outside a group, it is invalid usage like group_end.
        assert_eq!(
            nccl::group_simulate_end().unwrap_err().code,
            NcclResult::InvalidUsage
        );
        for (c, s) in cs.iter().zip(streams) {
            c.device().stream_destroy(s).unwrap();
        }
    });
}

#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_p2p"),
    ignore = "needs nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn abort_stops_a_group_still_in_progress() {
    isolated(|| {
        let cs = comms(10, 2, &Config::blocking(false));
        let b = cs[0].device().alloc(4096).unwrap();
        let s = cs[0].device().stream_create().unwrap();
        // Rank 1 never takes part: rank 0's group waits for it in the background.
        nccl::group_start();
        unsafe { cs[0].send_raw(b.ptr(), 1024, DataType::Int32, 1, s) }.unwrap();
        in_progress(nccl::group_end());
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(cs[0].async_state(), NcclResult::InProgress);
        // (The child's supervisor turns a wait that never ends into a failure.)
        cs[0].abort();
        let e = cs[0].wait_group().unwrap_err();
        assert_ne!(cs[0].async_state(), NcclResult::Success, "{e}");
        cs[0].device().stream_destroy(s).unwrap();
    });
}

/// NCCL 2.28's all-to-all on non-blocking communicators, outside any group and one thread per
/// rank: it is issued at the call, like any collective outside a group, and returns success,
/// not ncclInProgress (PyTorch checks ncclAlltoAll strictly). Inside a group it is deferred,
/// and the group's end is what reports ncclInProgress.
#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_p2p"),
    ignore = "needs nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn nccl_2_28_all_to_all_on_nonblocking_comms_returns_at_the_call() {
    isolated(|| {
        let n = 3;
        let mut cs = comms(12, n, &Config::blocking(false));
        for c in &cs {
            assert_eq!(poll(c), NcclResult::Success);
        }
        let count = 5000;
        let data =
            |r: usize| -> Vec<i32> { (0..n * count).map(|i| (r * 1_000_000 + i) as i32).collect() };
        let bufs: Vec<_> = (0..n)
            .map(|r| {
                let d = cs[r].device();
                let (s, o) = (
                    d.alloc(n * count * 4).unwrap(),
                    d.alloc(n * count * 4 + common::TAIL).unwrap(),
                );
                s.write(0, to_bytes(&data(r))).unwrap();
                (s, o)
            })
            .collect();
        for grouped in [false, true] {
            // Every round's outputs poisoned first (a round that wrote nothing must not pass on
            // the round before's data), with a tail that must stay.
            for b in &bufs {
                b.1.write(0, &vec![common::POISON; n * count * 4 + common::TAIL])
                    .unwrap();
            }
            std::thread::scope(|s| {
                for (c, b) in cs.iter_mut().zip(&bufs) {
                    s.spawn(move || {
                        let st = StreamHandle::default();
                        if grouped {
                            nccl::group_start();
                        }
                        let r1 = unsafe {
                            c.all_to_all_raw(b.0.ptr(), b.1.ptr(), count, DataType::Int32, st)
                        };
                        if grouped {
                            r1.expect("all_to_all inside a group");
                            in_progress(nccl::group_end());
                            assert_eq!(poll(c), NcclResult::Success);
                        } else {
                            r1.expect("all_to_all outside a group returns success");
                        }
                        c.device().stream_sync(st).unwrap();
                    });
                }
            });
            for (r, b) in bufs.iter().enumerate() {
                let mut out = vec![0u8; n * count * 4 + common::TAIL];
                b.1.read(0, &mut out).unwrap();
                let what = format!("rank {r}, grouped {grouped}");
                common::check_tail(&out[n * count * 4..], &what).unwrap_or_else(|e| panic!("{e}"));
                let got: Vec<i32> = from_bytes(&out[..n * count * 4]);
                let want: Vec<i32> = (0..n)
                    .flat_map(|i| data(i)[r * count..(r + 1) * count].to_vec())
                    .collect();
                assert!(got == want, "rank {r}, grouped {grouped}: wrong data");
            }
        }
    });
}
