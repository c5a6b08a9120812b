//! The device API (`nccl_device::api`; `Comm::dev_comm`, `Comm::dev_window`,
//! `Device::launch_on_simulator`) on the simulator: a user kernel gathers every rank's block
//! into every rank's window with stores through `lsa_ptr`, between team barriers (random data,
//! poisoned windows, 2/4/8 ranks in one process and 3 as processes); a barrier that a peer
//! never reaches ends with `Aborted` once the communicator is aborted; across nodes the team
//! is the rank alone; bad calls get clear errors, and the simulator stops a kernel that reads
//! past its window. The one-shot AllReduce example runs in `tests/capi/examples.rs`.

use crate::common::windows::{on_every_rank, register_all};
use crate::common::{self, lend, Ranks};
use nccl::{DevBuffer, DevCommRequirements, NcclResult};
use nccl_device::api::{DevComm, Window};
use nccl_device::arch;

const POISON: u8 = 0xA5;

/// What rank `r` stores at element `i` in round `seed`.
fn value(seed: u32, r: u32, i: usize) -> u32 {
    seed.wrapping_mul(2_654_435_761) ^ (r << 24) ^ i as u32
}

#[derive(Clone, Copy)]
struct GatherArgs {
    comm: DevComm,
    win: Window,
    count: usize,
    seed: u32,
}

/// Block `lsa_rank` (`count` u32) of every LSA rank's window gets this rank's values, stored
/// there by this rank; the barrier after it orders them before the host's check.
unsafe fn all_gather_by_stores(a: &GatherArgs) {
    let c = &a.comm;
    let barrier = c.lsa_barrier(arch::block_idx());
    let stride = (arch::grid_dim() * arch::block_dim()) as usize;
    let mut i = (arch::block_idx() * arch::block_dim() + arch::thread_idx()) as usize;
    while i < a.count {
        let v = value(a.seed, c.rank, i);
        for p in 0..c.lsa_size {
            let at = 4 * (c.lsa_rank as usize * a.count + i);
            *(c.lsa_ptr(&a.win, at, p) as *mut u32) = v;
        }
        i += stride;
    }
    let _ = barrier.sync();
}

/// Each rank's window of `n * count` u32 and 64 guard bytes, poisoned, registered
/// (symmetric); the kernel run on every rank; every block and the guard checked. `team`: the
/// LSA team's size (`n` on one node, 1 across nodes: then block 0 is the rank's own and the
/// others stay poisoned).
fn gather_case(ranks: &Ranks, count: usize, seed: u32, team: usize) {
    let n = ranks.comms[0].count();
    let bytes = 4 * n * count + 64;
    let bufs: Vec<DevBuffer> = ranks
        .comms
        .iter()
        .map(|c| {
            let b = c.device().alloc(bytes).unwrap();
            b.write(0, &vec![POISON; bytes]).unwrap();
            b
        })
        .collect();
    let ptrs: Vec<u64> = bufs.iter().map(|b| b.ptr()).collect();
    let local = ranks.comms.len();
    let handles = register_all(&ranks.comms, &ptrs, &vec![bytes; local], &vec![1; local]);
    on_every_rank(ranks, &handles, |_, c, h, st| {
        let dc = c.dev_comm(Default::default()).unwrap();
        assert_eq!(dc.get().lsa_size as usize, team, "the LSA team");
        let win = c.dev_window(&dc, h).unwrap();
        let args = GatherArgs {
            comm: dc.get(),
            win: win.get(),
            count,
            seed,
        };
        // SAFETY (inside): the window and communicator outlive the kernel (drained below);
        // every rank launches the same grid.
        c.device()
            .launch_on_simulator(3, 32, st, move || unsafe { all_gather_by_stores(&args) })
            .unwrap();
        c.device().stream_sync(st).unwrap();
        c.window_deregister_raw(h).unwrap();
    });
    for (c, b) in ranks.comms.iter().zip(&bufs) {
        let mut got = vec![0u8; bytes];
        b.read(0, &mut got).unwrap();
        let words: Vec<u32> = common::from_bytes(&got[..4 * team * count]);
        for (k, &w) in words.iter().enumerate() {
            let (r, i) = (k / count, k % count);
            let from = if team == 1 { c.rank() } else { r };
            assert_eq!(
                w,
                value(seed, from as u32, i),
                "rank {}: block {r} element {i} (seed {seed})",
                c.rank()
            );
        }
        assert!(
            got[4 * team * count..].iter().all(|&x| x == POISON),
            "rank {}: written past the team's blocks",
            c.rank()
        );
    }
}

#[test]
fn stores_through_lsa_pointers_between_barriers() {
    common::sim();
    for (n, count) in [(2, 1001), (4, 333), (8, 77)] {
        let ranks = common::sim_ranks(n);
        for seed in 1..3 {
            gather_case(&ranks, count, seed, n);
        }
    }
}

/// Ranks as processes: the windows and barrier areas are mapped through the simulator's IPC.
#[test]
fn stores_through_lsa_pointers_between_processes() {
    let Some((rank, nranks, id)) = common::procs::child() else {
        common::sim();
        common::procs::run(3, &[]);
        return;
    };
    let comm = nccl::Comm::init_rank_on(common::sim_dev(rank), nranks, &id, rank).unwrap();
    gather_case(&Ranks::new(vec![comm]), 501, 9, nranks);
}

/// Across nodes the team is the rank alone: its barrier passes by itself, `lsa_ptr` reaches
/// its own window only.
#[test]
fn across_nodes_the_team_is_the_rank_alone() {
    if let Some(ranks) = crate::multinode::child_comm() {
        let c = &ranks.comms[0];
        let dc = c.dev_comm(Default::default()).unwrap();
        let v = dc.get();
        assert_eq!((v.lsa_size, v.lsa_rank, v.rank), (1, 0, c.rank() as u32));
        // ncclCommQueryProperties says the same: a team per rank, GIN by proxy.
        let p = c.properties().unwrap();
        assert_eq!((p.rank, p.nranks, p.lsa_teams), (c.rank(), 2, 2));
        assert!(!p.device_api && !p.multimem && p.host_rma, "{p:?}");
        assert_eq!(
            (p.gin, p.railed_gin),
            (nccl::GinType::Proxy, nccl::GinType::None)
        );
        gather_case(&ranks, 257, 5, 1);
        return;
    }
    common::sim();
    common::procs::run_nodes(2, 1, &[common::LOOPBACK]);
}

/// Rank 0's kernel waits at a barrier rank 1 never reaches; the abort ends it with `Aborted`.
#[test]
fn an_abort_ends_a_barrier_a_peer_never_reaches() {
    // SAFETY: the communicator outlives the kernel (`an_abort_ends`).
    an_abort_ends("a barrier", Default::default(), |comm| unsafe {
        comm.lsa_barrier(0).sync().is_err()
    });
}

/// On 2 simulated ranks with device communicators (of `req`), rank 0's kernel runs `wait`
/// (true: it ended with `Aborted`), which cannot pass without rank 1; the abort must end it
/// so.
pub(crate) fn an_abort_ends(what: &str, req: DevCommRequirements, wait: fn(&DevComm) -> bool) {
    common::sim();
    let ranks = common::sim_ranks(2);
    let lent = lend(&ranks.comms);
    let dcs: Vec<nccl::DeviceComm> = std::thread::scope(|s| {
        let hs: Vec<_> = lent
            .iter()
            .map(|c| s.spawn(move || c.dev_comm(req).unwrap()))
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let c = &ranks.comms[0];
    let st = ranks.streams[0];
    let outcome = c.device().alloc(8).unwrap();
    outcome.write(0, &[0u8; 8]).unwrap();
    let (comm, out) = (dcs[0].get(), outcome.ptr());
    c.device()
        .launch_on_simulator(1, 32, st, move || {
            // SAFETY: `out` outlives the kernel (drained below).
            if wait(&comm) && arch::thread_idx() == 0 {
                unsafe { *(out as *mut u64) = 1 };
            }
        })
        .unwrap();
    assert!(
        !c.device().stream_query(st).unwrap(),
        "{what} passed without rank 1"
    );
    c.abort_handle().abort();
    let d = c.device().clone();
    common::procs::within(
        &format!("{what}, after the abort"),
        common::procs::limit(),
        move || d.stream_sync(st).unwrap(),
    );
    let mut got = [0u8; 8];
    outcome.read(0, &mut got).unwrap();
    assert_eq!(u64::from_le_bytes(got), 1, "{what} did not say Aborted");
}

/// Bad calls: clear errors; a kernel reading past its window is stopped by the simulator.
#[test]
fn bad_device_api_calls_are_refused() {
    common::sim();
    let ranks = common::sim_ranks(1);
    let c = &ranks.comms[0];
    let st = ranks.streams[0];
    let dc = c.dev_comm(Default::default()).unwrap();
    let e = c.dev_window(&dc, 77).err().expect("an unknown window");
    assert_eq!(e.code, NcclResult::InvalidArgument, "{e}");
    for (grid, block) in [(0, 32), (1, 0), (1, 2048)] {
        let e = c
            .device()
            .launch_on_simulator(grid, block, st, || {})
            .expect_err("a bad grid");
        assert_eq!(e.code, NcclResult::InvalidArgument, "{e}");
    }
    let buf = c.device().alloc(256).unwrap();
    // SAFETY: `buf` outlives the window (deregistered below).
    let h = unsafe { c.window_register_raw(buf.ptr(), 256, 1) }.unwrap();
    // Kept until the kernel ran: the kernel reads its table of bases.
    let dw = c.dev_window(&dc, h).unwrap();
    let win = dw.get();
    let comm = dc.get();
    // One thread of 32 reads past the window, the others wait at the CTA barrier: the
    // simulator releases them and the stream fails with the first thread's message.
    c.device()
        .launch_on_simulator(1, 32, st, move || {
            if arch::thread_idx() == 5 {
                // SAFETY: deliberately past the window: the simulator must stop it.
                unsafe { comm.lsa_ptr(&win, 256, 0) };
            }
            arch::sync_threads();
        })
        .unwrap();
    let e = c
        .device()
        .stream_sync(st)
        .expect_err("read past the window");
    assert!(e.message.contains("past the window"), "{e}");
    c.window_deregister_raw(h).unwrap();
}
