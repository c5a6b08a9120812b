//! Multimem pointers of the device API (`DevComm::multimem_ptr`, a symmetric window's multicast
//! object, `comm/window_mc.rs`) on the simulator, with its NVLS switch (NCCL_RS_SIM_NVLS=1, in
//! a child of its own; the CUDA backend never reads it): a user kernel all-reduces every
//! rank's window in place through the multicast address (random integer-valued floats, so the
//! sums are exact; a poisoned guard after the reduced part must stay poisoned), on 2 and 4
//! ranks. Without NVLS a window has no multicast address and a kernel asking for one stops
//! with a clear error.

use crate::common::windows::{on_every_rank, register_all};
use crate::common::{self, Ranks};
use nccl::DevBuffer;
use nccl_device::api::{multimem_ld_reduce, multimem_st, DevComm, McOp, Pack16, Window};
use nccl_device::arch;

const POISON: u8 = 0xA5;
/// Floats reduced per rank's window (16 KiB: a multiple of the simulator's multicast
/// granularity), then a guard of the same size.
const COUNT: usize = 4096;
const GUARD: usize = 4 * COUNT;

/// Rank `r`'s element `i` in round `seed`: a small integer, so every sum is exact.
fn value(seed: u32, r: usize, i: usize) -> f32 {
    ((seed as usize * 31 + r * 17 + i * 7) % 101) as f32 - 50.0
}

#[derive(Clone, Copy)]
struct Args {
    comm: DevComm,
    win: Window,
}

/// After a barrier (every rank's input is in), LSA rank k reduces the k-th slice of the
/// window through the multicast address, 16 bytes at a time, and stores the sum to every
/// rank's window; a barrier after it orders the stores before the host's check.
unsafe fn all_reduce_by_multimem(a: &Args) {
    let c = &a.comm;
    let barrier = c.lsa_barrier(arch::block_idx());
    if barrier.sync().is_err() {
        return;
    }
    let packs = 4 * COUNT / 16;
    let per = packs.div_ceil(c.lsa_size as usize);
    let (from, to) = (
        c.lsa_rank as usize * per,
        ((c.lsa_rank as usize + 1) * per).min(packs),
    );
    let stride = (arch::grid_dim() * arch::block_dim()) as usize;
    let mut p = from + (arch::block_idx() * arch::block_dim() + arch::thread_idx()) as usize;
    while p < to {
        let at = c.multimem_ptr(&a.win, 16 * p) as *mut Pack16;
        let sum = multimem_ld_reduce::<f32>(McOp::Add, at);
        multimem_st(at, sum);
        p += stride;
    }
    let _ = barrier.sync();
}

/// Each rank's window (ncclMemAlloc memory: `COUNT` floats and a poisoned guard) reduced in
/// place by the kernel, in `rounds` rounds of fresh data.
fn case(ranks: &Ranks, rounds: u32) {
    let n = ranks.comms.len();
    let bytes = 4 * COUNT + GUARD;
    let bufs: Vec<DevBuffer> = ranks
        .comms
        .iter()
        .map(|c| c.device().alloc_vmm(bytes).unwrap())
        .collect();
    let ptrs: Vec<u64> = bufs.iter().map(|b| b.ptr()).collect();
    let handles = register_all(&ranks.comms, &ptrs, &vec![bytes; n], &vec![1; n]);
    for seed in 1..=rounds {
        for (r, b) in bufs.iter().enumerate() {
            let mine: Vec<f32> = (0..COUNT).map(|i| value(seed, r, i)).collect();
            b.write(0, common::to_bytes(&mine)).unwrap();
            b.write(4 * COUNT, &vec![POISON; GUARD]).unwrap();
        }
        on_every_rank(ranks, &handles, |i, c, h, st| {
            let dc = c.dev_comm(Default::default()).unwrap();
            let win = c.dev_window(&dc, h).unwrap();
            assert_ne!(win.get().multimem, 0, "rank {i}: no multicast address");
            let args = Args {
                comm: dc.get(),
                win: win.get(),
            };
            // SAFETY (inside): the window and communicator outlive the kernel (drained
            // below); every rank launches the same grid.
            c.device()
                .launch_on_simulator(2, 32, st, move || unsafe { all_reduce_by_multimem(&args) })
                .unwrap();
            c.device().stream_sync(st).unwrap();
        });
        for (r, b) in bufs.iter().enumerate() {
            let mut got = vec![0u8; bytes];
            b.read(0, &mut got).unwrap();
            let sums: Vec<f32> = common::from_bytes(&got[..4 * COUNT]);
            for (i, &v) in sums.iter().enumerate() {
                let want: f32 = (0..n).map(|q| value(seed, q, i)).sum();
                assert_eq!(v, want, "rank {r}: element {i} (round {seed}, {n} ranks)");
            }
            assert!(
                got[4 * COUNT..].iter().all(|&x| x == POISON),
                "rank {r}: written past the reduced part"
            );
        }
    }
    for (c, h) in ranks.comms.iter().zip(handles) {
        c.window_deregister_raw(h.unwrap()).unwrap();
    }
}

#[test]
fn a_user_kernel_all_reduces_through_a_windows_multicast_address() {
    common::procs::isolated(&[("NCCL_RS_SIM_NVLS", "1")], &["NCCL_NVLS_ENABLE"], || {
        common::sim();
        for n in [2, 4] {
            case(&common::sim_ranks(n), 2);
        }
    });
}

/// Without NVLS the window has no multicast address, and a kernel asking for one stops with
/// an error that says why.
#[test]
fn without_nvls_a_window_has_no_multicast_address() {
    common::procs::isolated(&[], &["NCCL_RS_SIM_NVLS", "NCCL_NVLS_ENABLE"], || {
        common::sim();
        let ranks = common::sim_ranks(2);
        let bufs: Vec<DevBuffer> = ranks
            .comms
            .iter()
            .map(|c| c.device().alloc_vmm(4 * COUNT).unwrap())
            .collect();
        let ptrs: Vec<u64> = bufs.iter().map(|b| b.ptr()).collect();
        let handles = register_all(&ranks.comms, &ptrs, &[4 * COUNT; 2], &[1; 2]);
        on_every_rank(&ranks, &handles, |i, c, h, st| {
            let dc = c.dev_comm(Default::default()).unwrap();
            let dw = c.dev_window(&dc, h).unwrap();
            let (comm, win) = (dc.get(), dw.get());
            assert_eq!(
                win.multimem, 0,
                "rank {i}: a multicast address without NVLS"
            );
            c.device()
                .launch_on_simulator(1, 1, st, move || {
                    // SAFETY: the window has no multicast object: the call must stop.
                    unsafe { comm.multimem_ptr(&win, 0) };
                })
                .unwrap();
            let e = c.device().stream_sync(st).expect_err("no multicast object");
            assert!(e.message.contains("no multicast object"), "{e}");
            c.window_deregister_raw(h).unwrap();
        });
    });
}
