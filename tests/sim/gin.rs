//! GIN and signals of the device API (`DevComm::{put, signal, wait_signal, read_counter,
//! flush}`) on the simulator. Every rank's kernel puts a random block into block `rank` of
//! every rank's window (its own included) with a signal and a counter, waits for the signals,
//! and checks every block it received from inside the kernel (a signal orders its put's data
//! before it); a second kernel flushes and reads the counter and the signal. On one node (2
//! and 4 ranks of one process) the puts are stores and the signals atomics into peers'
//! memory; across nodes (2×1 and 2×2 rank processes) they go through the GIN queue, its proxy
//! thread and the socket network. Also: an abort ends a signal wait, a put past the window is
//! stopped, and host puts across nodes are refused while GIN lives.

use crate::common::windows::register_all;
use crate::common::{self, from_bytes, lend, to_bytes, Ranks};
use nccl::{DataType, DevBuffer, NcclResult, ReduceOp};
use nccl_device::api::{DevComm, Window};
use nccl_device::arch;

const POISON: u8 = 0xA5;
const SIG: u32 = 3;
const CTR: u32 = 5;

/// What rank `r` puts at element `i` in round `seed`.
fn value(seed: u32, r: u32, i: usize) -> u32 {
    seed.wrapping_mul(2_654_435_761) ^ (r << 24) ^ (i as u32).wrapping_mul(40_503)
}

#[derive(Clone, Copy)]
struct Exchange {
    comm: DevComm,
    win: Window,
    /// This rank's block (`count` u32).
    src: u64,
    count: usize,
    seed: u32,
    /// Signal `SIG`'s total once this round's puts all landed.
    expect: u64,
    /// `[mismatches, counter, signal]`.
    out: u64,
}

/// The puts (CTA `b` to ranks `b`, `b + grid`, ...), the wait, the check of every block.
unsafe fn exchange(a: &Exchange) {
    let c = &a.comm;
    let at = 4 * c.rank as usize * a.count;
    let mut peer = arch::block_idx();
    while peer < c.nranks {
        let src = a.src as *const u8;
        if c.put(a.win.at(peer, at), src, 4 * a.count, Some(SIG), Some(CTR))
            .is_err()
        {
            return;
        }
        peer += arch::grid_dim();
    }
    if c.wait_signal(SIG, a.expect).is_err() {
        return;
    }
    let out = a.out as *mut u64;
    let stride = (arch::grid_dim() * arch::block_dim()) as usize;
    let first = (arch::block_idx() * arch::block_dim() + arch::thread_idx()) as usize;
    for k in (first..c.nranks as usize * a.count).step_by(stride) {
        let got = *(c.local_ptr(&a.win, 4 * k) as *const u32);
        if got != value(a.seed, (k / a.count) as u32, k % a.count) {
            arch::atomic_add_u64(out, 1);
        }
    }
}

/// After [`exchange`] (its stream's next kernel): every source read, then the counter and the
/// signal.
unsafe fn counted(a: &Exchange) {
    let c = &a.comm;
    let out = a.out as *mut u64;
    if c.flush().is_ok() && arch::thread_idx() == 0 {
        *out.add(1) = c.read_counter(CTR);
        *out.add(2) = c.read_signal(SIG);
    }
}

/// Rounds of the exchange on every rank of `ranks` (the communicator's every rank: all of
/// them in this process, or this process's one). `team`: the LSA team's size expected.
fn exchange_rounds(ranks: &Ranks, count: usize, rounds: u32, team: u32) {
    let n = ranks.comms[0].count();
    let bytes = 4 * n * count + 64;
    let wins: Vec<DevBuffer> = ranks
        .comms
        .iter()
        .map(|c| c.device().alloc(bytes).unwrap())
        .collect();
    let ptrs: Vec<u64> = wins.iter().map(|b| b.ptr()).collect();
    let local = ranks.comms.len();
    let handles = register_all(&ranks.comms, &ptrs, &vec![bytes; local], &vec![1; local]);
    let aborts: Vec<nccl::AbortHandle> = ranks.comms.iter().map(|c| c.abort_handle()).collect();
    let failed = std::sync::Mutex::new(None::<String>);
    let lent = lend(&ranks.comms);
    std::thread::scope(|s| {
        for (i, c) in lent.iter().enumerate() {
            let (win, h, st) = (
                &wins[i],
                *handles[i].as_ref().expect("a window"),
                ranks.streams[i],
            );
            let (failed, aborts) = (&failed, &aborts);
            s.spawn(move || {
                let me = c.rank();
                let d = c.device();
                let run = || -> Result<(), String> {
                    let dc = c.dev_comm(Default::default()).map_err(|e| e.to_string())?;
                    assert_eq!(dc.get().lsa_size, team, "the LSA team");
                    assert_eq!(
                        dc.get().gin != 0,
                        team < n as u32,
                        "GIN where the team is short"
                    );
                    let dw = c.dev_window(&dc, h).map_err(|e| e.to_string())?;
                    let src = d.alloc(4 * count).unwrap();
                    let out = d.alloc(24).unwrap();
                    let bar = d.alloc(4).unwrap();
                    for round in 1..=rounds {
                        let seed = round * 7919 + 1;
                        let mine: Vec<u32> =
                            (0..count).map(|k| value(seed, me as u32, k)).collect();
                        src.write(0, to_bytes(&mine)).unwrap();
                        win.write(0, &vec![POISON; bytes]).unwrap();
                        out.write(0, &[0u8; 24]).unwrap();
                        barrier(c, bar.ptr(), st)?;
                        let a = Exchange {
                            comm: dc.get(),
                            win: dw.get(),
                            src: src.ptr(),
                            count,
                            seed,
                            expect: n as u64 * round as u64,
                            out: out.ptr(),
                        };
                        // SAFETY (inside): every buffer outlives the kernels (the stream is
                        // drained below); every rank launches the same kernels.
                        d.launch_on_simulator(2, 64, st, move || unsafe { exchange(&a) })
                            .map_err(|e| e.to_string())?;
                        d.launch_on_simulator(1, 32, st, move || unsafe { counted(&a) })
                            .map_err(|e| e.to_string())?;
                        d.stream_sync(st)
                            .map_err(|e| format!("rank {me}, round {round}: {e}"))?;
                        let mut words = [0u8; 24];
                        out.read(0, &mut words).unwrap();
                        let [bad, counter, signal]: [u64; 3] =
                            from_bytes::<u64>(&words).try_into().unwrap();
                        let total = n as u64 * round as u64;
                        if (bad, counter, signal) != (0, total, total) {
                            return Err(format!(
                                "rank {me}, round {round}: {bad} elements wrong in the kernel, \
                                 counter {counter} and signal {signal} (want {total})"
                            ));
                        }
                        check_window(win, me, n, count, seed)?;
                        // Nobody poisons a window a peer still reads.
                        barrier(c, bar.ptr(), st)?;
                    }
                    drop((dw, dc));
                    c.window_deregister_raw(h).map_err(|e| e.to_string())
                };
                if let Err(e) = run() {
                    failed.lock().unwrap().get_or_insert(e);
                    aborts.iter().for_each(|a| a.abort());
                    let _ = d.stream_sync(st);
                }
            });
        }
    });
    if let Some(e) = failed.into_inner().unwrap() {
        panic!("{e}");
    }
}

/// Every rank's block in `win` as it put it, and the guard after them untouched.
fn check_window(
    win: &DevBuffer,
    me: usize,
    n: usize,
    count: usize,
    seed: u32,
) -> Result<(), String> {
    let mut got = vec![0u8; 4 * n * count + 64];
    win.read(0, &mut got).unwrap();
    let words: Vec<u32> = from_bytes(&got[..4 * n * count]);
    if let Some(k) =
        (0..n * count).find(|&k| words[k] != value(seed, (k / count) as u32, k % count))
    {
        return Err(format!(
            "rank {me}: block {} element {} is {:#x}",
            k / count,
            k % count,
            words[k]
        ));
    }
    match got[4 * n * count..].iter().all(|&b| b == POISON) {
        true => Ok(()),
        false => Err(format!("rank {me}: written past the blocks")),
    }
}

/// Every rank of the communicator past this point (an AllReduce of one float, drained).
fn barrier(c: &nccl::Comm, buf: u64, st: nccl::StreamHandle) -> Result<(), String> {
    // SAFETY: the caller's 4-byte buffer, alive until the synchronization.
    unsafe { c.all_reduce_raw(buf, buf, 1, DataType::Float32, ReduceOp::SUM, st) }
        .and_then(|_| c.device().stream_sync(st))
        .map_err(|e| format!("rank {}: barrier: {e}", c.rank()))
}

#[test]
fn puts_signals_and_counters_on_one_node() {
    common::sim();
    for (n, count) in [(2, 1001), (4, 77)] {
        exchange_rounds(&common::sim_ranks(n), count, 2, n as u32);
    }
}

/// Across nodes the team is the rank alone: every put but the one to itself goes through the
/// GIN queue, a put of several network chunks too; host puts are refused meanwhile, and a
/// second device communicator with GIN too.
#[test]
fn puts_signals_and_counters_across_nodes() {
    if let Some(ranks) = crate::multinode::child_comm() {
        exchange_rounds(&ranks, 333, 2, 1);
        // Three network chunks per put (512 KiB each).
        exchange_rounds(&ranks, 2 * 512 * 1024 / 4 + 999, 1, 1);
        puts_to_one_peer_land_in_order(&ranks);
        refusals_while_gin_lives(&ranks);
        return;
    }
    common::sim();
    // One lane, and three (an odd count, against chunks of several puts in flight); the
    // default (8 here) runs elsewhere.
    for (nodes, per_node, lanes) in [(2, 1, "1"), (2, 2, "3")] {
        let env = [common::LOOPBACK, ("NCCL_RS_PUT_LANES", lanes)];
        common::procs::run_nodes(nodes, per_node, &env);
    }
}

#[derive(Clone, Copy)]
struct InOrder {
    comm: DevComm,
    win: Window,
    /// `PUTS` blocks of 4 KiB, block `k` holding `k + 1` in every word.
    src: u64,
    out: u64,
}

const PUTS: usize = 8;

/// Rank 0 puts `PUTS` blocks one after another at the same place of rank 1's window, each
/// signalled, and does not flush (its host drops the device communicator as soon as the
/// kernel ended: the proxy must still carry every op posted); rank 1, once all arrived,
/// finds the last one's words there.
unsafe fn in_order(a: &InOrder) {
    let c = &a.comm;
    match c.rank {
        0 => {
            for k in 0..PUTS {
                let src = (a.src as *const u8).add(4096 * k);
                if c.put(a.win.at(1, 0), src, 4096, Some(SIG), None).is_err() {
                    return;
                }
            }
        }
        1 if c.wait_signal(SIG, PUTS as u64).is_ok() && arch::thread_idx() == 0 => {
            let words = c.local_ptr(&a.win, 0) as *const u32;
            let last = (0..1024).filter(|&i| *words.add(i) == PUTS as u32).count();
            *(a.out as *mut u64) = last as u64;
        }
        _ => {}
    }
}

/// Puts to one peer through GIN land in the order they were posted.
fn puts_to_one_peer_land_in_order(ranks: &Ranks) {
    let (c, st) = (&ranks.comms[0], ranks.streams[0]);
    let win = c.device().alloc(4096).unwrap();
    // SAFETY: `win` outlives the window (deregistered below).
    let h = unsafe { c.window_register_raw(win.ptr(), 4096, 1) }.unwrap();
    let dc = c.dev_comm(Default::default()).unwrap();
    let blocks: Vec<u32> = (0..PUTS * 1024).map(|i| (i / 1024 + 1) as u32).collect();
    let src = c.device().alloc(4 * blocks.len()).unwrap();
    src.write(0, to_bytes(&blocks)).unwrap();
    let out = c.device().alloc(8).unwrap();
    out.write(0, &[0u8; 8]).unwrap();
    let dw = c.dev_window(&dc, h).unwrap();
    let a = InOrder {
        comm: dc.get(),
        win: dw.get(),
        src: src.ptr(),
        out: out.ptr(),
    };
    // SAFETY (inside): every buffer outlives the kernel (drained below).
    c.device()
        .launch_on_simulator(1, 32, st, move || unsafe { in_order(&a) })
        .unwrap();
    c.device().stream_sync(st).unwrap();
    drop((dw, dc));
    if c.rank() == 1 {
        let mut got = [0u8; 8];
        out.read(0, &mut got).unwrap();
        assert_eq!(
            u64::from_le_bytes(got),
            1024,
            "rank 1: the last put's words"
        );
    }
    barrier(c, out.ptr(), st).unwrap();
    c.window_deregister_raw(h).unwrap();
}

fn refusals_while_gin_lives(ranks: &Ranks) {
    let c = &ranks.comms[0];
    let buf = c.device().alloc(4096).unwrap();
    // SAFETY: `buf` outlives the window (deregistered below).
    let h = unsafe { c.window_register_raw(buf.ptr(), 4096, 1) }.unwrap();
    let dc = c.dev_comm(Default::default()).unwrap();
    let e = c
        .dev_comm(Default::default())
        .err()
        .expect("a second device communicator with GIN");
    assert_eq!(e.code, NcclResult::InvalidUsage, "{e}");
    let peer = (c.rank() + 1) % c.count();
    // SAFETY: the test's buffer, alive until the stream is drained.
    let r = unsafe {
        c.put_signal_raw(
            buf.ptr(),
            4,
            DataType::Float32,
            peer,
            h,
            0,
            ranks.streams[0],
        )
    };
    let e = r.expect_err("a host put across nodes while GIN lives");
    assert!(
        e.code == NcclResult::InvalidUsage && e.message.contains("GIN"),
        "{e}"
    );
    drop(dc);
    c.device().stream_sync(ranks.streams[0]).unwrap();
    c.window_deregister_raw(h).unwrap();
}

/// Rank 0's kernel waits for a signal nobody raises; the abort ends it with `Aborted`.
#[test]
fn an_abort_ends_a_signal_wait() {
    // SAFETY: the communicator outlives the kernel (`an_abort_ends`).
    crate::device_api::an_abort_ends("a signal wait", Default::default(), |comm| unsafe {
        comm.wait_signal(SIG, 1).is_err()
    });
}

/// A put past the window stops the kernel with a clear message.
#[test]
fn a_put_past_the_window_is_stopped() {
    common::sim();
    let ranks = common::sim_ranks(1);
    let (c, st) = (&ranks.comms[0], ranks.streams[0]);
    let buf = c.device().alloc(256).unwrap();
    // SAFETY: `buf` outlives the window (deregistered below).
    let h = unsafe { c.window_register_raw(buf.ptr(), 256, 1) }.unwrap();
    let dc = c.dev_comm(Default::default()).unwrap();
    let dw = c.dev_window(&dc, h).unwrap();
    let (comm, win) = (dc.get(), dw.get());
    let src = buf.ptr();
    c.device()
        .launch_on_simulator(1, 32, st, move || {
            // SAFETY: deliberately past the window: the simulator must stop it.
            let _ = unsafe { comm.put(win.at(0, 200), src as *const u8, 64, None, None) };
        })
        .unwrap();
    let e = c
        .device()
        .stream_sync(st)
        .expect_err("a put past the window");
    assert!(e.message.contains("past the window"), "{e}");
    c.window_deregister_raw(h).unwrap();
}
