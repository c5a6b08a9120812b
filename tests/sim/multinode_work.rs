//! A fixed mix of work across nodes on the CPU simulator (collectives and sends/receives of
//! one rank of a communicator spanning nodes, every output checked), run directly, captured in
//! graphs and replayed, on split and shrunk communicators, and on non-blocking ones.

use super::multinode::child_comm;
use crate::common::{self, Drive, Ranks, LOOPBACK};
use nccl::{Comm, DataType, ReduceOp};

/// A fixed mix of work for one rank of a communicator across nodes: an AllReduce (f32 sum), an
/// AllGather (i32), a ReduceScatter (f32 sum), a Broadcast (f64, from the last rank) and, in
/// one group, sends to the next rank and to the rank half the communicator away (on the other
/// node in 2x2) with the matching receives. Sizes differ, so several protocols and step counts
/// take part. Fresh random inputs and poisoned outputs before every run (`fill`); every output
/// checked against the host reference of every rank's inputs (`check`).
struct Work {
    rank: usize,
    n: usize,
    /// (input, output) per operation, in the order of [`Work::ops`].
    bufs: Vec<(nccl::DevBuffer, nccl::DevBuffer)>,
}

/// Element counts: AllReduce, AllGather (per rank), ReduceScatter (per rank), Broadcast,
/// send to the next rank, send to the far rank.
const WORK_COUNTS: [usize; 6] = [5000, 3001, 2000, 40_000, 10_000, 70_000];

/// The values of `v`, each to be matched exactly.
fn exact<T: Copy>(v: &[T]) -> Vec<(T, f64)> {
    v.iter().map(|&x| (x, 0.0)).collect()
}

/// One rank's inputs of one run of [`Work`].
struct WorkInputs {
    ar: Vec<f32>,
    ag: Vec<i32>,
    rs: Vec<f32>,
    bc: Vec<f64>,
    next: Vec<f32>,
    far: Vec<i32>,
}

impl Work {
    fn new(c: &Comm) -> Result<Work, String> {
        let (n, d) = (c.count(), c.device());
        let [ar, ag, rs, bc, next, far] = WORK_COUNTS;
        let sizes = [
            (ar * 4, ar * 4),
            (ag * 4, n * ag * 4),
            (n * rs * 4, rs * 4),
            (bc * 8, bc * 8),
            (next * 4, next * 4),
            (far * 4, far * 4),
        ];
        let bufs = sizes
            .iter()
            .map(|&(i, o)| Ok((d.alloc(i)?, d.alloc(o)?)))
            .collect::<nccl::Result<_>>()
            .map_err(|e| e.to_string())?;
        Ok(Work {
            rank: c.rank(),
            n,
            bufs,
        })
    }

    /// The ranks this one sends to and receives from: (next, prev, far_to, far_from).
    fn peers(&self, r: usize) -> (usize, usize, usize, usize) {
        let (n, h) = (self.n, (self.n / 2).max(1));
        ((r + 1) % n, (r + n - 1) % n, (r + h) % n, (r + n - h) % n)
    }

    /// Rank `r`'s inputs of run `seed` (any process computes any rank's).
    fn inputs(&self, seed: u64, r: usize) -> WorkInputs {
        let [ar, ag, rs, bc, next, far] = WORK_COUNTS;
        let s = |k: u64| seed * 8 + k;
        let op = ReduceOp::SUM;
        WorkInputs {
            ar: common::input(ar, op, s(0), r, self.n),
            ag: common::input(ag, op, s(1), r, self.n),
            rs: common::input(self.n * rs, op, s(2), r, self.n),
            bc: common::input(bc, op, s(3), r, self.n),
            next: common::input(next, op, s(4), r, self.n),
            far: common::input(far, op, s(5), r, self.n),
        }
    }

    /// Writes this rank's inputs of run `seed` and poisons every output.
    fn fill(&self, seed: u64) -> Result<(), String> {
        let x = self.inputs(seed, self.rank);
        let ins: [&[u8]; 6] = [
            common::to_bytes(&x.ar),
            common::to_bytes(&x.ag),
            common::to_bytes(&x.rs),
            common::to_bytes(&x.bc),
            common::to_bytes(&x.next),
            common::to_bytes(&x.far),
        ];
        for ((i, o), data) in self.bufs.iter().zip(ins) {
            i.write(0, data).map_err(|e| e.to_string())?;
            o.write(0, &vec![0xA5u8; o.bytes()])
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Issues the whole mix on `s` (into a capture, if `s` captures).
    fn issue(&self, c: &Comm, s: nccl::StreamHandle) -> nccl::Result<()> {
        let [ar, ag, rs, bc, next, far] = WORK_COUNTS;
        let b = |k: usize| (self.bufs[k].0.ptr(), self.bufs[k].1.ptr());
        let (f32_, i32_, f64_) = (DataType::Float32, DataType::Int32, DataType::Float64);
        let (to_next, from_prev, far_to, far_from) = self.peers(self.rank);
        // SAFETY: every buffer holds the counts named (see `new`) and lives in `self`, which the
        // callers keep until the stream (or the graph's replays) drained.
        unsafe {
            c.all_reduce_raw(b(0).0, b(0).1, ar, f32_, ReduceOp::SUM, s)?;
            c.all_gather_raw(b(1).0, b(1).1, ag, i32_, s)?;
            c.reduce_scatter_raw(b(2).0, b(2).1, rs, f32_, ReduceOp::SUM, s)?;
            c.broadcast_raw(b(3).0, b(3).1, bc, f64_, self.n - 1, s)?;
            nccl::group_start();
            let queued = c
                .send_raw(b(4).0, next, f32_, to_next, s)
                .and_then(|_| c.recv_raw(b(4).1, next, f32_, from_prev, s))
                .and_then(|_| c.send_raw(b(5).0, far, i32_, far_to, s))
                .and_then(|_| c.recv_raw(b(5).1, far, i32_, far_from, s));
            let ended = nccl::group_end();
            queued?;
            if ended? == nccl::GroupStatus::InProgress {
                // A non-blocking communicator issues the group in the background: wait for it
                // before the stream may be synchronized.
                poll_progress("a non-blocking send/recv group", || c.async_state());
                c.get_async_error()?;
            }
        }
        Ok(())
    }

    /// Checks every output of run `seed`.
    fn check(&self, seed: u64, what: &str) -> Result<(), String> {
        let [_, ag, rs, _, _, _] = WORK_COUNTS;
        let all: Vec<WorkInputs> = (0..self.n).map(|r| self.inputs(seed, r)).collect();
        let (r, f32_) = (self.rank, DataType::Float32);
        let (_, from_prev, _, far_from) = self.peers(r);
        let read = |k: usize| -> Result<Vec<u8>, String> {
            let o = &self.bufs[k].1;
            let mut out = vec![0u8; o.bytes()];
            o.read(0, &mut out).map_err(|e| e.to_string())?;
            Ok(out)
        };
        let ctx = |op: &str| format!("{what} (seed {seed}): rank {r} {op}");
        let ar_in: Vec<Vec<f32>> = all.iter().map(|x| x.ar.clone()).collect();
        let want = common::reference(&ar_in, ReduceOp::SUM, f32_);
        common::compare(
            &common::from_bytes::<f32>(&read(0)?),
            &want,
            &ctx("AllReduce"),
        )?;
        let gathered: Vec<i32> = all.iter().flat_map(|x| x.ag.clone()).collect();
        let got = common::from_bytes::<i32>(&read(1)?);
        common::compare(&got, &exact(&gathered), &ctx("AllGather"))?;
        debug_assert_eq!(gathered.len(), self.n * ag);
        let rs_in: Vec<Vec<f32>> = all.iter().map(|x| x.rs.clone()).collect();
        let want = common::reference(&rs_in, ReduceOp::SUM, f32_);
        let got = common::from_bytes::<f32>(&read(2)?);
        common::compare(&got, &want[r * rs..(r + 1) * rs], &ctx("ReduceScatter"))?;
        let got = common::from_bytes::<f64>(&read(3)?);
        common::compare(&got, &exact(&all[self.n - 1].bc), &ctx("Broadcast"))?;
        let got = common::from_bytes::<f32>(&read(4)?);
        let what_next = ctx(&format!("recv from rank {from_prev}"));
        common::compare(&got, &exact(&all[from_prev].next), &what_next)?;
        let got = common::from_bytes::<i32>(&read(5)?);
        let what_far = ctx(&format!("recv from rank {far_from}"));
        common::compare(&got, &exact(&all[far_from].far), &what_far)?;
        Ok(())
    }
}

/// CUDA graphs across nodes (2x2): each rank captures [`Work`] (four collectives and a group
/// of sends and receives, to a rank on its node and to one on the other) on its stream and
/// replays the graph several times, every replay with fresh random inputs and poisoned
/// outputs, checked; a direct run of the same work on another stream comes in between. With
/// `GRAPH_TEST_FIRST_USE=inside` the capture is the communicator's first use (the send/recv
/// connections across nodes are made while it is open); otherwise a direct run comes first.
/// Every other replay follows a pause longer than the proxy's hot window; each replay's time
/// is printed beside the direct runs' (`NCCL_RS_TEST_SHOW_RANKS=1` shows them).
#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_float_sum",
        nccl_rs_kernel = "nccl_all_gather",
        nccl_rs_kernel = "nccl_reduce_scatter_float_sum",
        nccl_rs_kernel = "nccl_broadcast",
        nccl_rs_kernel = "nccl_p2p"
    )),
    ignore = "needs nccl_all_reduce_float_sum, nccl_all_gather, nccl_reduce_scatter_float_sum, nccl_broadcast, nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn graphs_replay_across_nodes() {
    const REPLAYS: u64 = 6;
    if let Some(ranks) = child_comm() {
        let (c, s) = (&ranks.comms[0], ranks.streams[0]);
        let d = c.device();
        let other = d.stream_create().expect("a second stream");
        let work = Work::new(c).unwrap_or_else(|e| panic!("{e}"));
        let inside = std::env::var("GRAPH_TEST_FIRST_USE").is_ok_and(|v| v == "inside");
        let direct = |seed: u64| -> std::time::Duration {
            work.fill(seed).unwrap_or_else(|e| panic!("{e}"));
            let t = std::time::Instant::now();
            work.issue(c, other).expect("issue directly");
            d.stream_sync(other).expect("sync the direct run");
            let took = t.elapsed();
            work.check(seed, "direct run")
                .unwrap_or_else(|e| panic!("{e}"));
            took
        };
        let mut direct_times = Vec::new();
        if !inside {
            direct_times.push(direct(1000));
        }
        // Direct calls leave the proxy its long naps; a captured launch shortens them, since
        // the graph's replays will not wake it.
        let nap = || c.proxy_max_nap().expect("a proxy across nodes");
        let long_nap = nap();
        d.capture_begin(s).expect("begin the capture");
        let issued = work.issue(c, s);
        let graph = d.capture_end(s);
        issued.expect("issue into the capture");
        let graph = graph.expect("end the capture");
        assert!(
            nap() < long_nap,
            "the proxy's longest nap after a capture: {:?} (before: {long_nap:?})",
            nap()
        );
        let mut replay_times = Vec::new();
        for it in 0..REPLAYS {
            if it % 2 == 1 {
                // Past the proxy's hot window (50 ms): it naps when the replay starts.
                std::thread::sleep(std::time::Duration::from_millis(150));
            }
            work.fill(it).unwrap_or_else(|e| panic!("{e}"));
            let t = std::time::Instant::now();
            graph.launch(s).expect("launch the graph");
            d.stream_sync(s).expect("sync the replay");
            replay_times.push(t.elapsed());
            work.check(it, &format!("replay {it}"))
                .unwrap_or_else(|e| panic!("{e}"));
            if it == 2 {
                std::thread::sleep(std::time::Duration::from_millis(150));
                direct_times.push(direct(500 + it));
            }
        }
        eprintln!(
            "rank {}: replays {replay_times:?} (odd ones after 150 ms idle); direct runs \
             {direct_times:?} (the last after 150 ms idle)",
            c.rank()
        );
        drop(graph);
        d.stream_destroy(other).expect("destroy the second stream");
        return;
    }
    for first in ["before", "inside"] {
        let env = [LOOPBACK, ("GRAPH_TEST_FIRST_USE", first)];
        common::procs::run_nodes(2, 2, &env);
    }
    // Three nodes: rings and trees whose every node is entered and left across the network.
    let env = [LOOPBACK, ("GRAPH_TEST_FIRST_USE", "before")];
    common::procs::run_nodes(3, 2, &env);
}

/// Runs [`Work`] once on `c` (every rank of `c` at once) on a stream of its own and checks it.
fn run_work(c: &Comm, seed: u64, what: &str) {
    let d = c.device();
    let s = d.stream_create().expect("a stream");
    let w = Work::new(c).unwrap_or_else(|e| panic!("{what}: {e}"));
    w.fill(seed).unwrap_or_else(|e| panic!("{what}: {e}"));
    w.issue(c, s)
        .unwrap_or_else(|e| panic!("{what}: issuing: {e}"));
    d.stream_sync(s).unwrap_or_else(|e| panic!("{what}: {e}"));
    w.check(seed, what).unwrap_or_else(|e| panic!("{e}"));
    d.stream_destroy(s).expect("destroy the stream");
}

/// The tuned time of a 256 MiB AllReduce, µs: across nodes it counts the network (over
/// 20 ms at the 10 GB/s the tuner gives loopback), on one node the simulated GPU links.
fn big_all_reduce_us(c: &Comm) -> f64 {
    c.tuning(nccl::Coll::AllReduce, 256 << 20)
        .expect("tuning")
        .est_time_us
}

/// ncclCommSplit and ncclCommShrink of a 2x2 communicator (node 0: ranks 0 and 1, node 1:
/// ranks 2 and 3). Even/odd ranks, keys reversed: children {2, 0} and {3, 1}, each across both
/// nodes; by node: {0, 1} and {2, 3}, each on one; a shrink without rank 1: {0, 2, 3}, one rank
/// on node 0 and two on node 1. Each child has the ranks and the nodes it should (its tuner
/// counts the network or not) and runs [`Work`] (four collectives, sends and receives) and a
/// Reduce, checked; the parent runs it last, still usable after the splits and the shrink.
#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_float_sum",
        nccl_rs_kernel = "nccl_all_gather",
        nccl_rs_kernel = "nccl_reduce_scatter_float_sum",
        nccl_rs_kernel = "nccl_broadcast",
        nccl_rs_kernel = "nccl_p2p"
    )),
    ignore = "needs nccl_all_reduce_float_sum, nccl_all_gather, nccl_reduce_scatter_float_sum, nccl_broadcast, nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn split_and_shrink_across_nodes() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        assert_eq!(nranks, 4, "a 2x2 test");
        common::sim();
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
        let parent = Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank across nodes");
        let net_us = big_all_reduce_us(&parent);
        assert!(net_us > 20_000.0, "the parent's tuner: {net_us} µs");

        let across = parent
            .split((rank % 2) as i32, -(rank as i32), None)
            .expect("split even/odd")
            .expect("a color");
        assert_eq!((across.count(), across.rank()), (2, 1 - rank / 2));
        let t = big_all_reduce_us(&across);
        assert!(
            t > 20_000.0,
            "rank {rank}: an even/odd child spans two nodes: {t} µs"
        );
        run_work(&across, 10, "even/odd child");
        let ranks = Ranks::new(vec![across]);
        for coll in nccl_device::abi::Coll::ALL {
            common::check_collective(
                &ranks,
                coll,
                4099,
                DataType::Int64,
                ReduceOp::MAX,
                1,
                true,
                11,
                Drive::OneThread,
            )
            .unwrap_or_else(|e| panic!("even/odd child: {e}"));
        }
        drop(ranks);

        let by_node = parent
            .split((rank / 2) as i32, rank as i32, None)
            .expect("split by node")
            .expect("a color");
        assert_eq!((by_node.count(), by_node.rank()), (2, rank % 2));
        let t = big_all_reduce_us(&by_node);
        assert!(t < net_us / 2.0, "rank {rank}: a child on one node: {t} µs");
        run_work(&by_node, 12, "child of one node");
        drop(by_node);

        if rank != 1 {
            let shrunk = parent
                .shrink(&[1], None, nccl::SHRINK_DEFAULT)
                .expect("shrink without rank 1");
            let want = [0, usize::MAX, 1, 2][rank];
            assert_eq!((shrunk.count(), shrunk.rank()), (3, want));
            let t = big_all_reduce_us(&shrunk);
            assert!(
                t > 20_000.0,
                "rank {rank}: the shrunk comm spans two nodes: {t} µs"
            );
            run_work(&shrunk, 13, "shrunk comm");
            let ranks = Ranks::new(vec![shrunk]);
            common::check_collective(
                &ranks,
                nccl_device::abi::Coll::Reduce,
                70_001,
                DataType::Float32,
                ReduceOp::SUM,
                2,
                false,
                14,
                Drive::OneThread,
            )
            .unwrap_or_else(|e| panic!("shrunk comm: {e}"));
        }

        run_work(&parent, 15, "the parent after the splits and the shrink");
        parent.finalize().expect("finalize the parent");
        parent.destroy().expect("destroy the parent");
        return;
    }
    common::procs::run_nodes(2, 2, &[LOOPBACK]);
}

/// Polls `state` until it is no longer `InProgress` (within a minute), and returns it.
fn poll_progress(what: &str, state: impl Fn() -> nccl::NcclResult) -> nccl::NcclResult {
    let t = std::time::Instant::now();
    loop {
        let s = state();
        if s != nccl::NcclResult::InProgress {
            return s;
        }
        assert!(
            t.elapsed() < std::time::Duration::from_secs(60),
            "{what}: still in progress after a minute"
        );
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// [`Work`] issued in one group on a non-blocking communicator: ncclGroupEnd answers
/// InProgress, the communicator reports InProgress until the group was issued and then
/// Success; the results are checked.
fn nonblocking_group(c: &Comm, seed: u64, what: &str) {
    let d = c.device();
    let s = d.stream_create().expect("a stream");
    let w = Work::new(c).unwrap_or_else(|e| panic!("{what}: {e}"));
    w.fill(seed).unwrap_or_else(|e| panic!("{what}: {e}"));
    nccl::group_start();
    let queued = w.issue(c, s);
    let ended = nccl::group_end();
    queued.unwrap_or_else(|e| panic!("{what}: queueing: {e}"));
    let status = ended.unwrap_or_else(|e| panic!("{what}: group end: {e}"));
    assert_eq!(status, nccl::GroupStatus::InProgress, "{what}");
    let state = poll_progress(what, || c.async_state());
    assert_eq!(
        state,
        nccl::NcclResult::Success,
        "{what}: {:?}",
        c.get_async_error()
    );
    d.stream_sync(s).unwrap_or_else(|e| panic!("{what}: {e}"));
    w.check(seed, what).unwrap_or_else(|e| panic!("{e}"));
    d.stream_destroy(s).expect("destroy the stream");
}

/// Non-blocking communicators across nodes (2x2): init with `blocking = false` returns at once
/// (InProgress) and is polled to Success; a group of collectives and sends/receives across
/// nodes is issued in the background (InProgress, polled) and checked; collectives outside a
/// group run as usual; a non-blocking split (even/odd: each child across both nodes) is
/// polled to completion and its collectives checked too.
#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_float_sum",
        nccl_rs_kernel = "nccl_all_gather",
        nccl_rs_kernel = "nccl_reduce_scatter_float_sum",
        nccl_rs_kernel = "nccl_broadcast",
        nccl_rs_kernel = "nccl_p2p"
    )),
    ignore = "needs nccl_all_reduce_float_sum, nccl_all_gather, nccl_reduce_scatter_float_sum, nccl_broadcast, nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn nonblocking_comms_across_nodes() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        use nccl::NcclResult;
        common::sim();
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
        let cfg = nccl::Config::blocking(false);
        let pending = Comm::start_init_rank_config_on(dev, nranks, &id, rank, &cfg)
            .expect("start a non-blocking init");
        // It needs every rank's bootstrap and network connections: never done at once.
        assert_eq!(pending.state(), NcclResult::InProgress);
        let state = poll_progress("init", || pending.state());
        assert_eq!(state, NcclResult::Success);
        let comm = pending
            .try_take()
            .expect("done")
            .expect("init across nodes");
        assert!(!comm.config().blocking);
        nonblocking_group(&comm, 20, "non-blocking comm");
        run_work(&comm, 21, "non-blocking comm, outside a group");

        // start_split takes an Arc (the split may outlive the call); it stays on this thread.
        #[allow(clippy::arc_with_non_send_sync)]
        let parent = std::sync::Arc::new(comm);
        let pending = Comm::start_split(&parent, (rank % 2) as i32, rank as i32, None)
            .expect("start a non-blocking split")
            .expect("a color");
        let state = poll_progress("split", || pending.state());
        assert_eq!(state, NcclResult::Success);
        let child = pending
            .try_take()
            .expect("done")
            .expect("split across nodes");
        assert!(!child.config().blocking, "the child inherits non-blocking");
        assert_eq!((child.count(), child.rank()), (2, rank / 2));
        nonblocking_group(&child, 22, "non-blocking child");
        let ranks = Ranks::new(vec![child]);
        for (i, coll) in nccl_device::abi::Coll::ALL.into_iter().enumerate() {
            common::check_collective(
                &ranks,
                coll,
                3000,
                DataType::Float32,
                ReduceOp::SUM,
                i % 2,
                false,
                23 + i as u64,
                Drive::OneThread,
            )
            .unwrap_or_else(|e| panic!("non-blocking child: {e}"));
        }
        drop(ranks);
        run_work(&parent, 30, "non-blocking parent after the split");
        return;
    }
    common::procs::run_nodes(2, 2, &[LOOPBACK]);
}

/// ncclCommRevoke on a 2x2 communicator whose rank 1 stopped taking part: ranks 0, 2 and 3
/// start an AllReduce that cannot finish without it; every rank revokes; the AllReduce's
/// stream then drains; later operations are refused (invalid usage; finalize and a second
/// revoke: invalid argument); the three shrink the revoked communicator to themselves and
/// run [`Work`] on the result, checked.
#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_float_sum",
        nccl_rs_kernel = "nccl_all_gather",
        nccl_rs_kernel = "nccl_reduce_scatter_float_sum",
        nccl_rs_kernel = "nccl_broadcast",
        nccl_rs_kernel = "nccl_p2p"
    )),
    ignore = "needs nccl_all_reduce_float_sum, nccl_all_gather, nccl_reduce_scatter_float_sum, nccl_broadcast, nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn revoke_mid_collective_then_shrink_across_nodes() {
    use nccl::{DeviceBuffer, NcclResult, Op, Stream};
    if let Some((rank, nranks, id)) = common::procs::child() {
        common::sim();
        let dev = nccl::Device::open(rank as i32).expect("open a simulated device");
        let parent = Comm::init_rank_on(dev, nranks, &id, rank).expect("init_rank across nodes");
        let stream = Stream::new(parent.device()).expect("a stream");
        let mut buf = DeviceBuffer::<f32>::zeroed(parent.device(), 4096).expect("a buffer");
        if rank != 1 {
            parent
                .all_reduce_in_place(&mut buf, Op::SUM, &stream)
                .expect("issue an AllReduce rank 1 never joins");
        }
        parent.revoke().expect("revoke");
        let handle = stream.handle();
        let d = parent.device().clone();
        common::procs::within("the AllReduce after the revoke", common::procs::limit(), {
            move || d.stream_sync(handle)
        })
        .expect("the revoked AllReduce's stream drains");
        let refused = parent
            .all_reduce_in_place(&mut buf, Op::SUM, &stream)
            .expect_err("an AllReduce after the revoke");
        assert_eq!(refused.code, NcclResult::InvalidUsage, "{refused}");
        for (what, e) in [
            ("finalize", parent.finalize().expect_err("finalize")),
            ("revoke", parent.revoke().expect_err("a second revoke")),
        ] {
            assert_eq!(e.code, NcclResult::InvalidArgument, "{what}: {e}");
        }
        if rank != 1 {
            let shrunk = parent
                .shrink(&[1], None, nccl::SHRINK_DEFAULT)
                .expect("shrink the revoked communicator");
            assert_eq!(shrunk.count(), 3);
            run_work(&shrunk, 21, "the shrunk communicator after a revoke");
            shrunk.destroy().expect("destroy the shrunk communicator");
        }
        drop((buf, stream));
        parent.destroy().expect("destroy the revoked communicator");
        return;
    }
    common::procs::run_nodes(2, 2, &[LOOPBACK]);
}
