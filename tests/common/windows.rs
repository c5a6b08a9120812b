//! Windows for the tests (`ncclCommWindowRegister`): registering on every rank of a process at
//! once (a collective call), and AllReduces between buffers at given addresses.

use super::{from_bytes, lend, to_bytes, Ranks};
use nccl::{Comm, DataType, DevBuffer, ReduceOp, StreamHandle};

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

/// One AllReduce of `count` f32 on every rank from `send[i]` into `recv[i]` (device
/// addresses of this process's i-th communicator), checked against the sum of every rank's
/// input (computed alike in every process from the seed and the rank); the outputs'
/// neighbours are poisoned and must stay so.
pub fn all_reduce_at(ranks: &Ranks, send: &[u64], recv: &[u64], count: usize, seed: u64) {
    let n = ranks.comms[0].count();
    let inputs: Vec<Vec<f32>> = (0..n)
        .map(|r| {
            (0..count)
                .map(|j| ((seed as usize * 31 + r * 17 + j * 7) % 113) as f32)
                .collect()
        })
        .collect();
    let want: Vec<f32> = (0..count)
        .map(|j| inputs.iter().map(|v| v[j]).sum())
        .collect();
    for (r, c) in ranks.comms.iter().enumerate() {
        let d = c.device();
        // SAFETY: the test's own buffers, idle.
        unsafe {
            d.copy_htod_raw(recv[r] - 16, &[0xAB; 16]).unwrap();
            d.copy_htod_raw(recv[r] + count as u64 * 4, &[0xAB; 16])
                .unwrap();
            d.copy_htod_raw(send[r], to_bytes(&inputs[c.rank()]))
                .unwrap();
            if recv[r] != send[r] {
                d.copy_htod_raw(recv[r], &vec![0xCD; count * 4]).unwrap();
            }
        }
    }
    let lent = lend(&ranks.comms);
    let streams: &[StreamHandle] = &ranks.streams;
    std::thread::scope(|s| {
        for (r, c) in lent.iter().enumerate() {
            let (sp, rp, st) = (send[r], recv[r], streams[r]);
            s.spawn(move || {
                // SAFETY: the test's buffers, alive until the synchronization below.
                unsafe { c.all_reduce_raw(sp, rp, count, DataType::Float32, ReduceOp::SUM, st) }
                    .expect("all_reduce");
                c.device().stream_sync(st).expect("sync");
            });
        }
    });
    for (r, c) in ranks.comms.iter().enumerate() {
        let d = c.device();
        let mut out = vec![0u8; count * 4];
        let (mut before, mut after) = ([0u8; 16], [0u8; 16]);
        // SAFETY: as above.
        unsafe {
            d.copy_dtoh_raw(&mut out, recv[r]).unwrap();
            d.copy_dtoh_raw(&mut before, recv[r] - 16).unwrap();
            d.copy_dtoh_raw(&mut after, recv[r] + count as u64 * 4)
                .unwrap();
        }
        let got: Vec<f32> = from_bytes(&out);
        let rank = c.rank();
        assert_eq!(got, want, "rank {rank} of {n}, count {count}, seed {seed}");
        assert_eq!(
            (before, after),
            ([0xAB; 16], [0xAB; 16]),
            "rank {rank}: outside the output"
        );
    }
}

/// AllReduces of each of `counts` f32 on every rank of `ranks`, with inputs in `windows`
/// (every rank's symmetric window, `bytes` each) at offsets 256 and 260 (aligned and not): out
/// of place into a plain buffer, in place in the window, and in the window on even ranks only
/// (odd ranks' inputs in the plain buffer's second half). Every call must take the symmetric
/// path.
pub fn window_cases(ranks: &Ranks, windows: &[DevBuffer], counts: &[usize], bytes: usize) {
    let n = ranks.comms.len() as u64;
    let plain: Vec<DevBuffer> = ranks
        .comms
        .iter()
        .map(|c| c.device().alloc(bytes).expect("alloc"))
        .collect();
    let at = |b: &[DevBuffer], off: u64| -> Vec<u64> { b.iter().map(|b| b.ptr() + off).collect() };
    let mut seed = 0;
    for &count in counts {
        for off in [256u64, 260] {
            let before = launches(ranks);
            seed += 1;
            all_reduce_at(ranks, &at(windows, off), &at(&plain, 256), count, seed);
            seed += 1;
            all_reduce_at(ranks, &at(windows, off), &at(windows, off), count, seed);
            seed += 1;
            let mixed: Vec<u64> = ranks
                .comms
                .iter()
                .enumerate()
                .map(|(i, c)| match c.rank() % 2 {
                    0 => windows[i].ptr() + off,
                    _ => plain[i].ptr() + (bytes / 2) as u64,
                })
                .collect();
            all_reduce_at(ranks, &mixed, &at(&plain, 256), count, seed);
            assert_eq!(launches(ranks), before + 3 * n, "count {count}");
        }
    }
}
