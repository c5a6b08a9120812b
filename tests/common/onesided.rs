//! One-sided operations for the tests (`ncclPutSignal`, `ncclWaitSignal`): windows on every
//! rank and an all-to-all made of puts and signals, checked.

use super::windows::register_all;
use super::{from_bytes, lend, to_bytes, Ranks};
use nccl::{DataType, DevBuffer, ReduceOp, SignalWait, StreamHandle};

const POISON: u8 = 0xA5;

/// What rank `rank` puts in round `round`.
fn data(rank: usize, round: usize, count: usize) -> Vec<f32> {
    (0..count)
        .map(|j| (rank * 1000 + round * 100 + j % 97) as f32)
        .collect()
}

/// Each rank's window (`bytes[r]`, not symmetric: the sizes differ), registered on every rank.
pub fn windows(ranks: &Ranks, bytes: &[usize]) -> (Vec<DevBuffer>, Vec<u64>) {
    let bufs: Vec<DevBuffer> = ranks
        .comms
        .iter()
        .zip(bytes)
        .map(|(c, &b)| c.device().alloc(b).unwrap())
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
    let lent = lend(&ranks.comms);
    for round in 0..rounds {
        for (i, c) in ranks.comms.iter().enumerate() {
            wins[i].write(0, &vec![POISON; sizes[i]]).unwrap();
            outs[i].write(0, &vec![0; sizes[i]]).unwrap();
            srcs[i]
                .write(0, to_bytes(&data(c.rank(), round, count)))
                .unwrap();
        }
        std::thread::scope(|s| {
            for (i, c) in lent.iter().enumerate() {
                let (win, out, src) = (&wins[i], &outs[i], &srcs[i]);
                let (st, put_st, h) = (ranks.streams[i], put_streams[i], handles[i]);
                let (bar_st, bar) = (barrier_streams[i], barrier_bufs[i].ptr());
                let bytes = sizes[i];
                s.spawn(move || {
                    let me = c.rank();
                    let waits: Vec<SignalWait> = (0..n)
                        .filter(|&p| p != me)
                        .map(|peer| SignalWait { peer, ops: 1 })
                        .collect();
                    c.wait_signal_raw(&waits, st).expect("wait");
                    let d = c.device();
                    d.copy_dtod_async(out.ptr(), win.ptr(), bytes, st).unwrap();
                    // SAFETY: the test's buffer, alive until the synchronization.
                    unsafe {
                        c.all_reduce_raw(bar, bar, 1, DataType::Float32, ReduceOp::SUM, bar_st)
                    }
                    .expect("barrier");
                    d.stream_sync(bar_st).unwrap();
                    for p in (0..n).filter(|&p| p != me) {
                        // SAFETY: the test's buffer, alive until the synchronization below.
                        unsafe {
                            c.put_signal_raw(
                                src.ptr(),
                                count,
                                DataType::Float32,
                                p,
                                h,
                                me * block,
                                put_st,
                            )
                        }
                        .expect("put");
                    }
                    d.stream_sync(put_st).unwrap();
                    d.stream_sync(st).unwrap();
                });
            }
        });
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
                    let want = data(p, round, count);
                    assert_eq!(
                        from_bytes::<f32>(b),
                        want,
                        "rank {me}, from {p}, round {round}"
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
