//! Windows for the tests (`ncclCommWindowRegister`): registering on every rank of a process at
//! once (a collective call), and the symmetric path's collectives between buffers at given
//! addresses.

use super::{
    check_collective, from_bytes, lend, matrix_types, to_bytes, Checked, Drive, Ranks, ALL_OPS,
};
use nccl::{Coll, Comm, DataType, DevBuffer, ReduceOp, StreamHandle};

/// Runs `body(r, comm, window, stream)` for every rank of `ranks` at once, each on a thread of
/// its own (device communicators and windows are made collectively), with rank r's window of
/// `handles` (from [`register_all`]; each must have registered).
pub fn on_every_rank(
    ranks: &Ranks,
    handles: &[nccl::Result<u64>],
    body: impl Fn(usize, &Comm, u64, StreamHandle) + Sync,
) {
    let lent = lend(&ranks.comms);
    std::thread::scope(|s| {
        for (r, (c, h)) in lent.iter().zip(handles).enumerate() {
            let (h, st) = (*h.as_ref().expect("a registered window"), ranks.streams[r]);
            let body = &body;
            s.spawn(move || body(r, c, h, st));
        }
    });
}

/// Registers on every rank at once (a collective call) `bytes[r]` at `ptrs[r]`.
pub fn register_all(
    comms: &[Comm],
    ptrs: &[u64],
    bytes: &[usize],
    flags: &[u32],
) -> Vec<nccl::Result<u64>> {
    let lent = lend(comms);
    std::thread::scope(|s| {
        let hs: Vec<_> = lent
            .iter()
            .enumerate()
            .map(|(r, c)| {
                let (p, b, f) = (ptrs[r], bytes[r], flags[r]);
                // SAFETY: the test's buffers outlive the communicators' use of them.
                s.spawn(move || unsafe { c.window_register_raw(p, b, f) })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("rank thread"))
            .collect()
    })
}

/// A symmetric window of `bytes` on every rank (its buffers, kept alive by the caller).
pub fn symmetric_windows(comms: &[Comm], bytes: usize) -> Vec<DevBuffer> {
    let bufs: Vec<DevBuffer> = comms
        .iter()
        .map(|c| c.device().alloc(bytes).expect("alloc"))
        .collect();
    let ptrs: Vec<u64> = bufs.iter().map(|b| b.ptr()).collect();
    let n = comms.len();
    for r in register_all(comms, &ptrs, &vec![bytes; n], &vec![1; n]) {
        r.expect("register a symmetric window");
    }
    bufs
}

/// Calls the communicators planned on the symmetric path.
pub fn launches(ranks: &Ranks) -> u64 {
    ranks.comms.iter().map(|c| c.symmetric_launches()).sum()
}

/// The collectives of the symmetric path.
pub const SYMMETRIC_COLLS: [Coll; 3] = [Coll::AllReduce, Coll::AllGather, Coll::ReduceScatter];

/// Elements of (input, output) of one rank in a call of `coll` with `count` (NCCL's count) on
/// `n` ranks.
pub fn lengths(coll: Coll, count: usize, n: usize) -> (usize, usize) {
    match coll {
        Coll::AllGather => (count, n * count),
        Coll::ReduceScatter => (n * count, count),
        _ => (count, count),
    }
}

/// One AllReduce, AllGather or ReduceScatter (`coll`, a sum) of `count` f32 on every rank
/// from `send[i]` into `recv[i]` (device addresses of this process's i-th communicator),
/// checked against the result computed alike in every process from the seed and the ranks;
/// the outputs' neighbours are poisoned and must stay so.
pub fn collective_at(
    ranks: &Ranks,
    coll: Coll,
    send: &[u64],
    recv: &[u64],
    count: usize,
    seed: u64,
) {
    let n = ranks.comms[0].count();
    let (ins, outs) = lengths(coll, count, n);
    let inputs: Vec<Vec<f32>> = (0..n)
        .map(|r| {
            (0..ins)
                .map(|j| ((seed as usize * 31 + r * 17 + j * 7) % 113) as f32)
                .collect()
        })
        .collect();
    let sum = |at: usize| -> f32 { inputs.iter().map(|v| v[at]).sum() };
    let want = |rank: usize| -> Vec<f32> {
        match coll {
            Coll::AllGather => inputs.concat(),
            Coll::ReduceScatter => (0..count).map(|j| sum(rank * count + j)).collect(),
            _ => (0..count).map(sum).collect(),
        }
    };
    // The 16 bytes before and after each output, where they are not input (ReduceScatter in
    // place: the output is a block of the input).
    let guards = |r: usize| {
        let (input, end) = (send[r], send[r] + ins as u64 * 4);
        [recv[r] - 16, recv[r] + outs as u64 * 4]
            .into_iter()
            .filter(move |&g| g + 16 <= input || g >= end)
    };
    for (r, c) in ranks.comms.iter().enumerate() {
        let d = c.device();
        // SAFETY: the test's own buffers, idle. The output is poisoned first: in place, the
        // input lies in it.
        unsafe {
            for g in guards(r) {
                d.copy_htod_raw(g, &[0xAB; 16]).unwrap();
            }
            d.copy_htod_raw(recv[r], &vec![0xCD; outs * 4]).unwrap();
            d.copy_htod_raw(send[r], to_bytes(&inputs[c.rank()]))
                .unwrap();
        }
    }
    let lent = lend(&ranks.comms);
    let streams: &[StreamHandle] = &ranks.streams;
    std::thread::scope(|s| {
        for (r, c) in lent.iter().enumerate() {
            let (sp, rp, st) = (send[r], recv[r], streams[r]);
            s.spawn(move || {
                let f32 = DataType::Float32;
                // SAFETY: the test's buffers, alive until the synchronization below.
                unsafe {
                    match coll {
                        Coll::AllGather => c.all_gather_raw(sp, rp, count, f32, st),
                        Coll::ReduceScatter => {
                            c.reduce_scatter_raw(sp, rp, count, f32, ReduceOp::SUM, st)
                        }
                        _ => c.all_reduce_raw(sp, rp, count, f32, ReduceOp::SUM, st),
                    }
                }
                .expect("collective");
                c.device().stream_sync(st).expect("sync");
            });
        }
    });
    for (r, c) in ranks.comms.iter().enumerate() {
        let d = c.device();
        let mut out = vec![0u8; outs * 4];
        // SAFETY: as above.
        unsafe { d.copy_dtoh_raw(&mut out, recv[r]).unwrap() };
        let got: Vec<f32> = from_bytes(&out);
        let rank = c.rank();
        let what = format!(
            "{} rank {rank} of {n}, count {count}, seed {seed}",
            coll.name()
        );
        assert_eq!(got, want(rank), "{what}");
        for g in guards(r) {
            let mut guard = [0u8; 16];
            // SAFETY: as above.
            unsafe { d.copy_dtoh_raw(&mut guard, g).unwrap() };
            assert_eq!(guard, [0xAB; 16], "{what}: outside the output, at {g:#x}");
        }
    }
}

/// Calls of `coll` with each of `counts` f32 on every rank of `ranks`, with inputs in
/// `windows` (every rank's symmetric window, `bytes` each) at offsets 256 and 260 (aligned and
/// not): out of place into a plain buffer, in place in the window, and in the window on even
/// ranks only (odd ranks' inputs in a plain buffer). Every call must take the symmetric path.
pub fn window_cases(
    ranks: &Ranks,
    coll: Coll,
    windows: &[DevBuffer],
    counts: &[usize],
    bytes: usize,
) {
    let n = ranks.comms.len() as u64;
    let nranks = ranks.comms[0].count();
    let plain: Vec<DevBuffer> = ranks
        .comms
        .iter()
        .map(|c| c.device().alloc(2 * bytes).expect("alloc"))
        .collect();
    let at = |b: &[DevBuffer], off: u64| -> Vec<u64> { b.iter().map(|b| b.ptr() + off).collect() };
    let mut seed = 0;
    for &count in counts {
        let (ins, outs) = lengths(coll, count, nranks);
        assert!(
            256 + 4 * ins.max(outs) + 16 <= bytes,
            "count {count}: the window is too small"
        );
        for off in [256u64, 260] {
            let before = launches(ranks);
            seed += 1;
            collective_at(
                ranks,
                coll,
                &at(windows, off),
                &at(&plain, 256),
                count,
                seed,
            );
            seed += 1;
            // In place: the input is the output (AllGather: this rank's block of it;
            // ReduceScatter: its block is the output).
            let inputs = at(windows, off);
            let outputs: Vec<u64> = ranks
                .comms
                .iter()
                .zip(&inputs)
                .map(|(c, &p)| match coll {
                    Coll::AllGather => p,
                    Coll::ReduceScatter => p + (c.rank() * count * 4) as u64,
                    _ => p,
                })
                .collect();
            let inputs: Vec<u64> = ranks
                .comms
                .iter()
                .zip(&outputs)
                .map(|(c, &p)| match coll {
                    Coll::AllGather => p + (c.rank() * count * 4) as u64,
                    Coll::ReduceScatter => p - (c.rank() * count * 4) as u64,
                    _ => p,
                })
                .collect();
            collective_at(ranks, coll, &inputs, &outputs, count, seed);
            seed += 1;
            let mixed: Vec<u64> = ranks
                .comms
                .iter()
                .enumerate()
                .map(|(i, c)| match c.rank() % 2 {
                    0 => windows[i].ptr() + off,
                    _ => plain[i].ptr() + bytes as u64,
                })
                .collect();
            collective_at(ranks, coll, &mixed, &at(&plain, 256), count, seed);
            assert_eq!(
                launches(ranks),
                before + 3 * n,
                "{} count {count}",
                coll.name()
            );
        }
    }
}

/// `coll` (AllGather or ReduceScatter) from plain buffers, staged by the kernel, on `ranks`
/// (which registered a symmetric window): every type, the reductions in turn, each of
/// `counts`, in and out of place; every call with a block of at most `limit` bytes must take
/// the symmetric path.
pub fn staged_matrix(ranks: &Ranks, coll: Coll, counts: &[usize], limit: usize) {
    let n = ranks.comms[0].count();
    let local = ranks.comms.len() as u64;
    for (k, dt) in matrix_types().into_iter().enumerate() {
        for (i, &count) in counts.iter().enumerate() {
            let op = ALL_OPS[(k + i) % ALL_OPS.len()];
            let before = launches(ranks);
            let (in_place, seed) = ((i + k) % 2 == 1, (k * 100 + i) as u64);
            let d = Drive::OneThread;
            let ran = check_collective(ranks, coll, count, dt, op, 0, in_place, seed, d)
                .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
            if ran == Checked::Ran && count * dt.size() <= limit {
                let what = format!("{n} ranks, {} {} count {count}", coll.name(), dt.name());
                assert_eq!(launches(ranks), before + local, "{what}: not symmetric");
            }
        }
    }
}
