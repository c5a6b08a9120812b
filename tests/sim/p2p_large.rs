//! Large send/receive groups on the simulator: more work items per communicator than one
//! launch holds (MAX_P2P_ITEMS), several messages per (peer, direction) of different sizes,
//! each rank issuing its operations in its own shuffled order, some messages larger than a
//! connection's FIFO (so a send cannot finish before its receive runs), on one or two streams.
//! The launches must be cut so that no rank waits on a peer that waits on it.

use crate::common::{self, from_bytes, to_bytes, Ranks, Rng};
use nccl::{DataType, StreamHandle};
use nccl_device::abi::MAX_P2P_ITEMS;

/// 16 simulated GPUs (every rank needs a device of its own): the 16-rank test runs in a child
/// process started with NCCL_RS_SIM_DEVICES=16.
const SIXTEEN: &[(&str, &str)] = &[("NCCL_RS_SIM_DEVICES", "16")];

/// One message: from `from` to `to`, the `j`-th between them.
fn elems(seed: u64, from: usize, to: usize, j: usize) -> usize {
    let mut r = Rng::new(seed ^ ((from * 4096 + to * 64 + j) as u64) << 8);
    // Up to 48 KiB: the p2p FIFOs of the simulator hold 8 x 4 KiB.
    match r.next() % 4 {
        0 => 0,
        1 => (r.next() % 64) as usize,
        _ => (r.next() % 12_000) as usize,
    }
}

fn value(seed: u64, from: usize, to: usize, j: usize, i: usize) -> i32 {
    let mut r = Rng::new(seed ^ ((from * 4096 + to * 64 + j) as u64) << 20 ^ i as u64);
    r.next() as i32
}

/// All-to-all with `m` messages per ordered pair (self included), in one group per rank
/// (`threads`: a thread per rank; else one thread, one group for every rank); checks every
/// message and that the poison beyond it is untouched.
fn all_to_all_many(ranks: &Ranks, m: usize, seed: u64, threads: bool, two_streams: bool) {
    let n = ranks.comms.len();
    let extra: Vec<StreamHandle> = ranks
        .comms
        .iter()
        .map(|c| c.device().stream_create().expect("stream"))
        .collect();
    // Per rank: its operations in issue order (peer, send?, j), shuffled per rank but with
    // each (peer, direction)'s messages in j order (which is what matches them).
    let plans: Vec<Vec<(usize, bool, usize)>> = (0..n)
        .map(|r| {
            let mut rng = Rng::new(seed * 7919 + r as u64);
            let mut ops: Vec<(usize, bool)> = (0..n)
                .flat_map(|p| (0..m).flat_map(move |_| [(p, true), (p, false)]))
                .collect();
            for i in (1..ops.len()).rev() {
                ops.swap(i, (rng.next() % (i as u64 + 1)) as usize);
            }
            let mut next = vec![[0usize; 2]; n];
            ops.into_iter()
                .map(|(p, send)| {
                    let j = &mut next[p][send as usize];
                    *j += 1;
                    (p, send, *j - 1)
                })
                .collect()
        })
        .collect();
    let items: usize = plans[0].iter().filter(|o| o.0 != 0).count();
    assert!(
        items > MAX_P2P_ITEMS,
        "the test must need more than one launch"
    );
    // Buffers: each message in its own allocation with 64 poisoned bytes after it.
    let mut bufs = Vec::new();
    for (r, c) in ranks.comms.iter().enumerate() {
        let mut mine = Vec::new();
        for &(p, send, j) in &plans[r] {
            let (from, to) = if send { (r, p) } else { (p, r) };
            let len = elems(seed, from, to, j);
            let b = c.device().alloc(len * 4 + 64).expect("alloc");
            if send {
                let data: Vec<i32> = (0..len).map(|i| value(seed, from, to, j, i)).collect();
                b.write(0, to_bytes(&data)).expect("write");
                b.write(len * 4, &[0x5Au8; 64]).expect("write");
            } else {
                b.write(0, &vec![0xA5u8; len * 4 + 64]).expect("poison");
            }
            mine.push(b);
        }
        bufs.push(mine);
    }
    let lent = common::lend(&ranks.comms);
    let (comms, streams) = (&lent[..], &ranks.streams);
    let issue = |r: usize| -> Result<(), String> {
        let c = &comms[r];
        for (k, &(p, send, j)) in plans[r].iter().enumerate() {
            let s = if two_streams && k % 3 == 1 {
                extra[r]
            } else {
                streams[r]
            };
            let (from, to) = if send { (r, p) } else { (p, r) };
            let len = elems(seed, from, to, j);
            let ptr = bufs[r][k].ptr();
            let res = if send {
                unsafe { c.send_raw(ptr, len, DataType::Int32, p, s) }
            } else {
                unsafe { c.recv_raw(ptr, len, DataType::Int32, p, s) }
            };
            res.map_err(|e| format!("rank {r} op {k}: {e}"))?;
        }
        Ok(())
    };
    let run = || -> Result<(), String> {
        if threads {
            let rs: Vec<Result<(), String>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..n)
                    .map(|r| {
                        let (issue, extra) = (&issue, &extra);
                        s.spawn(move || {
                            nccl::group_start();
                            let a = issue(r);
                            let b = nccl::group_end().map_err(|e| e.to_string());
                            a.and(b)?;
                            let c = &comms[r];
                            c.device()
                                .stream_sync(streams[r])
                                .and_then(|()| c.device().stream_sync(extra[r]))
                                .map_err(|e| e.to_string())
                        })
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| h.join().unwrap_or_else(|_| Err("panicked".into())))
                    .collect()
            });
            rs.into_iter().collect::<Result<Vec<_>, _>>()?;
        } else {
            nccl::group_start();
            let a = (0..n).try_for_each(issue);
            let b = nccl::group_end().map_err(|e| e.to_string());
            a.and(b)?;
            for (r, c) in comms.iter().enumerate() {
                c.device()
                    .stream_sync(streams[r])
                    .and_then(|()| c.device().stream_sync(extra[r]))
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    };
    // A wrong cut deadlocks: the child process this runs in is killed after the supervisor's
    // generous bound (a hang), instead of hanging the suite.
    run().unwrap_or_else(|e| panic!("{n} ranks, {m} per pair: {e}"));
    for (r, c) in ranks.comms.iter().enumerate() {
        for (k, &(p, send, j)) in plans[r].iter().enumerate() {
            if send {
                continue;
            }
            let len = elems(seed, p, r, j);
            let mut out = vec![0u8; len * 4 + 64];
            // SAFETY: the test's own buffer (64 bytes of slack included), idle by now.
            unsafe { c.device().copy_dtoh_raw(&mut out, bufs[r][k].ptr()) }.expect("read back");
            let got = from_bytes::<i32>(&out[..len * 4]);
            if let Some(i) = (0..len).find(|&i| got[i] != value(seed, p, r, j, i)) {
                panic!(
                    "{n} ranks: rank {r}, message {j} from {p}: element {i} of {len} is {} want {}",
                    got[i],
                    value(seed, p, r, j, i)
                );
            }
            assert!(
                out[len * 4..].iter().all(|&b| b == 0xA5),
                "rank {r}, message {j} from {p}: written past its {len} elements"
            );
        }
    }
    for (c, s) in ranks.comms.iter().zip(extra) {
        let _ = c.device().stream_destroy(s);
    }
}

#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_p2p"),
    ignore = "needs nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn sixteen_ranks_three_messages_per_pair_thread_per_rank() {
    common::procs::isolated(SIXTEEN, &[], || {
        let ranks = common::sim_ranks(16);
        all_to_all_many(&ranks, 3, 1, true, false);
        // Again on the same connections, on two streams per rank.
        all_to_all_many(&ranks, 3, 2, true, true);
    });
}

#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_p2p"),
    ignore = "needs nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn eight_ranks_five_messages_per_pair_one_thread() {
    common::procs::isolated(&[], &[], || {
        let ranks = common::sim_ranks(8);
        all_to_all_many(&ranks, 5, 3, false, false);
        all_to_all_many(&ranks, 5, 4, false, true);
    });
}
