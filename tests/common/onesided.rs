//! One-sided operations for the tests (`ncclPutSignal`, `ncclWaitSignal`): windows on every
//! rank and an all-to-all made of puts and signals, checked; and the copy-engine collectives'
//! cases (CTAPolicy zero).

use super::windows::{collective_at, register_all, symmetric_windows};
use super::{from_bytes, lend, to_bytes, Ranks};
use nccl::{Coll, DataType, DevBuffer, ReduceOp, SignalWait, StreamHandle};

const POISON: u8 = 0xA5;

/// What rank `rank` puts in round `round`.
fn data(rank: usize, round: usize, count: usize) -> Vec<f32> {
    (0..count)
        .map(|j| (rank * 1000 + round * 100 + j % 97) as f32)
        .collect()
}

/// Each rank's window (`bytes[r]`, not symmetric: the sizes differ), poisoned, then registered
/// on every rank (a collective call: once it returned anywhere, every rank's poison is in, so
/// no peer's put can land before it).
pub fn windows(ranks: &Ranks, bytes: &[usize]) -> (Vec<DevBuffer>, Vec<u64>) {
    let bufs: Vec<DevBuffer> = ranks
        .comms
        .iter()
        .zip(bytes)
        .map(|(c, &b)| {
            let buf = c.device().alloc(b).unwrap();
            buf.write(0, &vec![POISON; b]).unwrap();
            buf
        })
        .collect();
    let ptrs: Vec<u64> = bufs.iter().map(|b| b.ptr()).collect();
    let flags = vec![0; bytes.len()];
    let handles = register_all(&ranks.comms, &ptrs, bytes, &flags)
        .into_iter()
        .map(|h| h.expect("register a window"))
        .collect();
    (bufs, handles)
}

/// Rounds of an all-to-all by puts: rank `me` puts `count` floats into every peer's window
/// at block `me` and signals; each rank's stream waits for a signal from every peer, then
/// copies the window out. The waits and copies are queued before any rank puts (an AllReduce
/// of every rank between, a barrier across processes too), so a wait that did not hold its
/// stream would let the copy see poison.
pub fn all_to_all_by_puts(ranks: &Ranks, count: usize, rounds: usize) {
    let n = ranks.comms[0].count();
    let block = count * 4;
    let sizes: Vec<usize> = ranks
        .comms
        .iter()
        .map(|c| n * block + 64 + 16 * c.rank())
        .collect();
    let (wins, handles) = windows(ranks, &sizes);
    let outs: Vec<DevBuffer> = ranks
        .comms
        .iter()
        .zip(&sizes)
        .map(|(c, &b)| c.device().alloc(b).unwrap())
        .collect();
    let srcs: Vec<DevBuffer> = ranks
        .comms
        .iter()
        .map(|c| c.device().alloc(block).unwrap())
        .collect();
    let put_streams: Vec<StreamHandle> = ranks
        .comms
        .iter()
        .map(|c| c.device().stream_create().unwrap())
        .collect();
    let barrier_streams: Vec<StreamHandle> = ranks
        .comms
        .iter()
        .map(|c| c.device().stream_create().unwrap())
        .collect();
    let barrier_bufs: Vec<DevBuffer> = ranks
        .comms
        .iter()
        .map(|c| c.device().alloc(4).unwrap())
        .collect();
    let aborts: Vec<nccl::AbortHandle> = ranks.comms.iter().map(|c| c.abort_handle()).collect();
    let lent = lend(&ranks.comms);
    for round in 0..rounds {
        for (i, c) in ranks.comms.iter().enumerate() {
            wins[i].write(0, &vec![POISON; sizes[i]]).unwrap();
            outs[i].write(0, &vec![0; sizes[i]]).unwrap();
            srcs[i]
                .write(0, to_bytes(&data(c.rank(), round, count)))
                .unwrap();
        }
        // A rank's failure aborts every rank of this process: the others' waits (for its
        // signals) then end, and the test fails naming the step instead of hanging.
        let failed = std::sync::Mutex::new(None::<String>);
        std::thread::scope(|s| {
            for (i, c) in lent.iter().enumerate() {
                let (win, out, src) = (&wins[i], &outs[i], &srcs[i]);
                let (st, put_st, h) = (ranks.streams[i], put_streams[i], handles[i]);
                let (bar_st, bar) = (barrier_streams[i], barrier_bufs[i].ptr());
                let (bytes, failed, aborts) = (sizes[i], &failed, &aborts);
                s.spawn(move || {
                    let me = c.rank();
                    let d = c.device();
                    // Each step is traced (shown with --nocapture or on a failure): a hang
                    // on a GPU then shows where every rank stopped.
                    let step = |what: &str, r: nccl::Result<()>| {
                        eprintln!("rank {me}, round {round}: {what}: {r:?}");
                        r.map_err(|e| format!("rank {me}, round {round}: {what}: {e}"))
                    };
                    let run = || -> Result<(), String> {
                        let waits: Vec<SignalWait> = (0..n)
                            .filter(|&p| p != me)
                            .map(|peer| SignalWait { peer, ops: 1 })
                            .collect();
                        step("wait", c.wait_signal_raw(&waits, st))?;
                        step("copy", d.copy_dtod_async(out.ptr(), win.ptr(), bytes, st))?;
                        let f32 = DataType::Float32;
                        // SAFETY: the test's buffer, alive until the synchronization.
                        let r =
                            unsafe { c.all_reduce_raw(bar, bar, 1, f32, ReduceOp::SUM, bar_st) };
                        step("barrier", r.and_then(|_| d.stream_sync(bar_st)))?;
                        for p in (0..n).filter(|&p| p != me) {
                            // SAFETY: the test's buffer, alive until the synchronization below.
                            let r = unsafe {
                                c.put_signal_raw(src.ptr(), count, f32, p, h, me * block, put_st)
                            };
                            step("put", r)?;
                        }
                        step("puts done", d.stream_sync(put_st))?;
                        step("waits done", d.stream_sync(st))
                    };
                    if let Err(e) = run() {
                        failed.lock().unwrap().get_or_insert(e);
                        aborts.iter().for_each(|a| a.abort());
                        let _ = (d.stream_sync(st), d.stream_sync(put_st));
                    }
                });
            }
        });
        if let Some(e) = failed.into_inner().unwrap() {
            panic!("{e}");
        }
        for (i, c) in ranks.comms.iter().enumerate() {
            let mut got = vec![0u8; sizes[i]];
            outs[i].read(0, &mut got).unwrap();
            let me = c.rank();
            for p in 0..n {
                let b = &got[p * block..(p + 1) * block];
                if p == me {
                    assert!(
                        b.iter().all(|&x| x == POISON),
                        "rank {me}: its own block written"
                    );
                } else {
                    let (got, want) = (from_bytes::<f32>(b), data(p, round, count));
                    let bad = got.iter().zip(&want).position(|(g, w)| g != w);
                    assert!(
                        bad.is_none(),
                        "rank {me}, from {p}, round {round}: element {bad:?} is {} not {}",
                        got[bad.unwrap_or(0)],
                        want[bad.unwrap_or(0)]
                    );
                }
            }
            let tail = &got[n * block..];
            assert!(
                tail.iter().all(|&x| x == POISON),
                "rank {me}: written past the blocks"
            );
        }
    }
}

fn copy_engine_launches(ranks: &Ranks) -> u64 {
    ranks.comms.iter().map(|c| c.copy_engine_launches()).sum()
}

/// One AlltoAll of `count` f32 per block from `send[i]` into `recv[i]`, checked on every rank.
fn all_to_all_at(ranks: &Ranks, send: &[u64], recv: &[u64], count: usize, seed: usize) {
    let n = ranks.comms[0].count();
    let value =
        |from: usize, to: usize, j: usize| (seed * 7 + from * 1000 + to * 100 + j % 89) as f32;
    for (i, c) in ranks.comms.iter().enumerate() {
        let me = c.rank();
        let input: Vec<f32> = (0..n * count)
            .map(|k| value(me, k / count, k % count))
            .collect();
        let d = c.device();
        // SAFETY: the test's buffers, idle.
        unsafe {
            d.copy_htod_raw(send[i], to_bytes(&input)).unwrap();
            d.copy_htod_raw(recv[i], &vec![0xA5; n * count * 4])
                .unwrap();
        }
    }
    let lent = lend(&ranks.comms);
    std::thread::scope(|s| {
        for (i, c) in lent.iter().enumerate() {
            let (sp, rp, st) = (send[i], recv[i], ranks.streams[i]);
            s.spawn(move || {
                // SAFETY: the test's buffers, alive until the synchronization below.
                unsafe { c.all_to_all_raw(sp, rp, count, DataType::Float32, st) }.unwrap();
                c.device().stream_sync(st).unwrap();
            });
        }
    });
    for (i, c) in ranks.comms.iter().enumerate() {
        let me = c.rank();
        let mut out = vec![0u8; n * count * 4];
        // SAFETY: as above.
        unsafe { c.device().copy_dtoh_raw(&mut out, recv[i]).unwrap() };
        let got: Vec<f32> = from_bytes(&out);
        let want: Vec<f32> = (0..n * count)
            .map(|k| value(k / count, me, k % count))
            .collect();
        let bad = got.iter().zip(&want).position(|(g, w)| g != w);
        assert!(
            bad.is_none(),
            "AlltoAll rank {me}: element {bad:?} wrong (seed {seed})"
        );
    }
}

/// Where a Gather or Scatter moves blocks: every rank's own block (`mine`) and the root's `n`
/// blocks (`blocks`; the others' are passed too and must stay untouched).
struct Rooted<'a> {
    gather: bool,
    root: usize,
    mine: &'a [u64],
    blocks: &'a [u64],
}

/// One Gather or Scatter of `count` f32 per block, checked on every rank: the blocks moved, and
/// nothing written past them (64 bytes of guard) nor into the other ranks' `blocks`.
fn rooted_at(ranks: &Ranks, call: &Rooted, count: usize, seed: usize) {
    let n = ranks.comms[0].count();
    let block = count * 4;
    let value = |from: usize, j: usize| (seed * 7 + from * 1000 + j % 89) as f32;
    let (root, gather) = (call.root, call.gather);
    // What rank `i` checks: its output (the root's blocks for Gather, its own block for
    // Scatter) and how many blocks; None: a Gather's other ranks, whose `blocks` stay untouched.
    let target = |i: usize, me: usize| match (gather, me == root) {
        (true, true) => Some((call.blocks[i], n)),
        (false, _) => Some((call.mine[i], 1)),
        (true, false) => None,
    };
    let read = |c: &nccl::Comm, p: u64, bytes: usize| {
        let mut out = vec![0u8; bytes];
        // SAFETY: the test's buffers, idle.
        unsafe { c.device().copy_dtoh_raw(&mut out, p).unwrap() };
        out
    };
    for (i, c) in ranks.comms.iter().enumerate() {
        let me = c.rank();
        let d = c.device();
        // SAFETY: the test's buffers, idle; the poison first, the inputs over it.
        unsafe {
            d.copy_htod_raw(call.blocks[i], &vec![POISON; n * block + 64])
                .unwrap();
            if gather {
                let input: Vec<f32> = (0..count).map(|j| value(me, j)).collect();
                d.copy_htod_raw(call.mine[i], to_bytes(&input)).unwrap();
            } else {
                d.copy_htod_raw(call.mine[i], &vec![POISON; block + 64])
                    .unwrap();
                if me == root {
                    let input: Vec<f32> = (0..n * count).map(|k| value(k / count, k)).collect();
                    d.copy_htod_raw(call.blocks[i], to_bytes(&input)).unwrap();
                }
            }
        }
    }
    // The 64 bytes past each output as they are now (poison, or the root's next input block
    // where a Scatter runs in place), to be found unchanged.
    let guards: Vec<Vec<u8>> = (ranks.comms.iter().enumerate())
        .map(|(i, c)| match target(i, c.rank()) {
            Some((at, blocks)) => read(c, at + (blocks * block) as u64, 64),
            None => Vec::new(),
        })
        .collect();
    let lent = lend(&ranks.comms);
    std::thread::scope(|s| {
        for (i, c) in lent.iter().enumerate() {
            let (mine, blocks, st) = (call.mine[i], call.blocks[i], ranks.streams[i]);
            s.spawn(move || {
                let f32 = DataType::Float32;
                // SAFETY: the test's buffers, alive until the synchronization below.
                unsafe {
                    match gather {
                        true => c.gather_raw(mine, blocks, count, f32, root, st),
                        false => c.scatter_raw(blocks, mine, count, f32, root, st),
                    }
                }
                .unwrap();
                c.device().stream_sync(st).unwrap();
            });
        }
    });
    let what = if gather { "Gather" } else { "Scatter" };
    for (i, c) in ranks.comms.iter().enumerate() {
        let me = c.rank();
        let Some((at, blocks)) = target(i, me) else {
            let untouched = read(c, call.blocks[i], n * block + 64);
            let overlaps = call.mine[i] >= call.blocks[i]
                && call.mine[i] < call.blocks[i] + (n * block) as u64;
            assert!(
                overlaps || untouched.iter().all(|&x| x == POISON),
                "{what}: rank {me}'s receive buffer written (not the root)"
            );
            continue;
        };
        let out = read(c, at, blocks * block + 64);
        let got: Vec<f32> = from_bytes(&out[..blocks * block]);
        let want: Vec<f32> = match gather {
            true => (0..n * count)
                .map(|k| value(k / count, k % count))
                .collect(),
            false => (0..count).map(|j| value(me, me * count + j)).collect(),
        };
        let bad = got.iter().zip(&want).position(|(g, w)| g != w);
        assert!(
            bad.is_none(),
            "{what} root {root}, rank {me}: element {bad:?} wrong (seed {seed})"
        );
        assert_eq!(
            out[blocks * block..],
            guards[i],
            "{what}: rank {me}: written past"
        );
    }
}

/// AllGather and AlltoAll into symmetric windows, several rounds alternating (the handshake's
/// counts go on), sends from plain buffers and from the window itself (AllGather in place);
/// into plain buffers they keep their kernels.
pub fn copy_engine_cases(ranks: &Ranks) {
    let n = ranks.comms[0].count();
    let local = ranks.comms.len() as u64;
    let count = 3001;
    let bytes = 2 * n * count * 4 + 512;
    let windows = symmetric_windows(&ranks.comms, bytes);
    let plain: Vec<DevBuffer> = ranks
        .comms
        .iter()
        .map(|c| c.device().alloc(bytes).unwrap())
        .collect();
    let at = |b: &[DevBuffer], off: usize| -> Vec<u64> {
        b.iter().map(|b| b.ptr() + off as u64).collect()
    };
    for round in 0..3 {
        let before = copy_engine_launches(ranks);
        collective_at(
            ranks,
            Coll::AllGather,
            &at(&plain, 0),
            &at(&windows, 256),
            count,
            round,
        );
        let in_place: Vec<u64> = ranks
            .comms
            .iter()
            .zip(&windows)
            .map(|(c, w)| w.ptr() + 256 + (c.rank() * count * 4) as u64)
            .collect();
        collective_at(
            ranks,
            Coll::AllGather,
            &in_place,
            &at(&windows, 256),
            count,
            round + 10,
        );
        all_to_all_at(
            ranks,
            &at(&plain, 0),
            &at(&windows, 256),
            count,
            round as usize,
        );
        assert_eq!(
            copy_engine_launches(ranks),
            before + 3 * local,
            "round {round}"
        );
    }
    let block = (count * 4) as u64;
    for root in [n - 1, 0] {
        let before = copy_engine_launches(ranks);
        let (send, recv) = (at(&windows, 256), at(&plain, 0));
        let gather = |mine, blocks| Rooted {
            gather: true,
            root,
            mine,
            blocks,
        };
        rooted_at(ranks, &gather(&send, &recv), count, root);
        // In place at the root: its block of the receive buffer is its send block, at the
        // window's offset every rank sends from.
        let recv_in: Vec<u64> = at(&windows, 256);
        let send_in: Vec<u64> = at(&windows, 256 + root * count * 4);
        rooted_at(ranks, &gather(&send_in, &recv_in), count, root + 20);
        let scatter = |mine, blocks| Rooted {
            gather: false,
            root,
            mine,
            blocks,
        };
        rooted_at(ranks, &scatter(&send, &recv), count, root + 40);
        let recv_in: Vec<u64> = recv_in.iter().map(|p| p + root as u64 * block).collect();
        rooted_at(
            ranks,
            &scatter(&recv_in, &at(&windows, 256)),
            count,
            root + 60,
        );
        assert_eq!(
            copy_engine_launches(ranks),
            before + 4 * local,
            "Gather and Scatter, root {root}"
        );
    }
    let before = copy_engine_launches(ranks);
    let half = n * count * 4 + 256; // room for the guards around the output
    let gather = Rooted {
        gather: true,
        root: 0,
        mine: &at(&plain, half),
        blocks: &at(&windows, 256),
    };
    rooted_at(ranks, &gather, count, 97);
    collective_at(
        ranks,
        Coll::AllGather,
        &at(&windows, 256),
        &at(&plain, half),
        count,
        99,
    );
    all_to_all_at(ranks, &at(&windows, 256), &at(&plain, half), count, 98);
    assert_eq!(
        copy_engine_launches(ranks),
        before,
        "plain buffers took the copy engines"
    );
}

/// The canonical pattern (nccl-tests' all-to-all by puts): each rank puts its block into every
/// peer's window and then waits on the same stream for a signal from every peer, then copies
/// its window out, all on one stream. It cannot show a wait that did not hold (the peers'
/// puts may land first either way); `all_to_all_by_puts` does.
pub fn puts_then_waits(ranks: &Ranks, count: usize) {
    let n = ranks.comms[0].count();
    let block = count * 4;
    let sizes = vec![n * block; ranks.comms.len()];
    let (wins, handles) = windows(ranks, &sizes);
    let srcs: Vec<DevBuffer> = ranks
        .comms
        .iter()
        .map(|c| {
            let b = c.device().alloc(block).unwrap();
            b.write(0, to_bytes(&data(c.rank(), 7, count))).unwrap();
            b
        })
        .collect();
    let aborts: Vec<nccl::AbortHandle> = ranks.comms.iter().map(|c| c.abort_handle()).collect();
    let failed = std::sync::Mutex::new(None::<String>);
    let lent = lend(&ranks.comms);
    std::thread::scope(|s| {
        for (i, c) in lent.iter().enumerate() {
            let (src, st, h) = (srcs[i].ptr(), ranks.streams[i], handles[i]);
            let (failed, aborts) = (&failed, &aborts);
            s.spawn(move || {
                let me = c.rank();
                let step = |what: &str, r: nccl::Result<()>| {
                    eprintln!("rank {me}: {what}: {r:?}");
                    r.map_err(|e| format!("rank {me}: {what}: {e}"))
                };
                let run = || -> Result<(), String> {
                    for p in (0..n).filter(|&p| p != me) {
                        // SAFETY: the test's buffer, alive until the synchronization below.
                        let r = unsafe {
                            c.put_signal_raw(src, count, DataType::Float32, p, h, me * block, st)
                        };
                        step("put", r)?;
                    }
                    let waits: Vec<SignalWait> = (0..n)
                        .filter(|&p| p != me)
                        .map(|peer| SignalWait { peer, ops: 1 })
                        .collect();
                    step("wait", c.wait_signal_raw(&waits, st))?;
                    step("synchronized", c.device().stream_sync(st))
                };
                // A failure aborts every rank, so the others' waits end.
                if let Err(e) = run() {
                    failed.lock().unwrap().get_or_insert(e);
                    aborts.iter().for_each(|a| a.abort());
                    let _ = c.device().stream_sync(st);
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().unwrap() {
        panic!("{e}");
    }
    for (i, c) in ranks.comms.iter().enumerate() {
        let mut got = vec![0u8; n * block];
        wins[i].read(0, &mut got).unwrap();
        let me = c.rank();
        for p in (0..n).filter(|&p| p != me) {
            let b = from_bytes::<f32>(&got[p * block..(p + 1) * block]);
            let want = data(p, 7, count);
            let bad = b.iter().zip(&want).position(|(g, w)| g != w);
            assert!(
                bad.is_none(),
                "rank {me}: the block from {p} is wrong at element {bad:?}: {:?} not {:?}",
                bad.map(|i| b[i]),
                bad.map(|i| want[i])
            );
        }
    }
}

/// Each rank puts `count` floats into its own window and waits for its own signal, on one
/// stream; the window then holds them (a put to itself takes the local path on one node and
/// across nodes alike).
pub fn put_to_self(ranks: &Ranks, count: usize) {
    let bytes = 4 * count;
    let (wins, handles) = windows(ranks, &vec![bytes; ranks.comms.len()]);
    let lent = lend(&ranks.comms);
    std::thread::scope(|s| {
        for (i, c) in lent.iter().enumerate() {
            let (st, h) = (ranks.streams[i], handles[i]);
            s.spawn(move || {
                let me = c.rank();
                let src = c.device().alloc(bytes).unwrap();
                src.write(0, to_bytes(&data(me, 5, count))).unwrap();
                // SAFETY: the test's buffers, alive until the synchronization below.
                unsafe { c.put_signal_raw(src.ptr(), count, DataType::Float32, me, h, 0, st) }
                    .unwrap();
                c.wait_signal_raw(&[SignalWait { peer: me, ops: 1 }], st)
                    .unwrap();
                c.device().stream_sync(st).unwrap();
            });
        }
    });
    for (i, c) in ranks.comms.iter().enumerate() {
        let mut got = vec![0u8; bytes];
        wins[i].read(0, &mut got).unwrap();
        assert!(
            from_bytes::<f32>(&got) == data(c.rank(), 5, count),
            "rank {}: its put to itself did not land",
            c.rank()
        );
    }
}
