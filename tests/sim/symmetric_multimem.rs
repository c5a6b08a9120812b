//! The symmetric path's multimem AllReduce, AllGather and ReduceScatter (NVLS on windows,
//! `comm/window.rs` `multimem_launch`, `coll/symmetric.rs` `switch_*`) on the simulator's switch
//! (NCCL_RS_SIM_NVLS=1, in a child of its own): with both buffers in windows of `ncclMemAlloc`
//! memory, each rank reduces its block through the input's multicast address and stores it
//! through the output's. Checked with exact sums and poisoned guards around the outputs; the
//! simulator counts multimem stores, so a call that did not take the form fails. Buffers at
//! different offsets on different ranks, or a count that does not split into whole packs per
//! rank, take the loads form and stay correct.

use crate::common::windows::{collective_at, register_all};
use crate::common::{self, Ranks};
use nccl::{Coll, DevBuffer};

/// Floats of each window (a multiple of the simulator's multicast granularity).
const WINDOW: usize = 16 << 10;

fn stores() -> u64 {
    nccl_device::arch::multimem_stores()
}

fn loads() -> u64 {
    nccl_device::arch::multimem_loads()
}

fn case(ranks: &Ranks) {
    let n = ranks.comms.len();
    let alloc = |c: &nccl::Comm| c.device().alloc_vmm(4 * WINDOW).unwrap();
    let ins: Vec<DevBuffer> = ranks.comms.iter().map(alloc).collect();
    let outs: Vec<DevBuffer> = ranks.comms.iter().map(alloc).collect();
    let mut handles = Vec::new();
    for bufs in [&ins, &outs] {
        let ptrs: Vec<u64> = bufs.iter().map(|b| b.ptr()).collect();
        for h in register_all(&ranks.comms, &ptrs, &vec![4 * WINDOW; n], &vec![1; n]) {
            handles.push(h.expect("a symmetric window"));
        }
    }
    let at = |bufs: &[DevBuffer], off: &dyn Fn(usize) -> u64| -> Vec<u64> {
        bufs.iter()
            .enumerate()
            .map(|(r, b)| b.ptr() + off(r))
            .collect()
    };
    let (send, recv) = (at(&ins, &|_| 256), at(&outs, &|_| 1024));
    for (count, seed) in [(4096, 1), (1024 * n, 2)] {
        let before = stores();
        collective_at(ranks, Coll::AllReduce, &send, &recv, count, seed);
        assert_eq!(
            stores() - before,
            (4 * count / 16) as u64,
            "{n} ranks, {count} floats: every pack stored once through the switch"
        );
    }
    // Inputs at different offsets on rank 1: every rank falls back to loads, together; at
    // an offset that is no multiple of 16, rank 1 alone has no multicast addresses (on 4
    // ranks the others would then run one-shot and it two-shot, and hang, if the host let
    // the form decide the two-shot).
    let skewed = at(&ins, &|r| if r == 1 { 512 } else { 256 });
    let unaligned = at(&ins, &|r| if r == 1 { 264 } else { 256 });
    // Whole packs per rank missing (4 ranks: 4 × 3 floats is not a pack per rank).
    let before = stores();
    collective_at(ranks, Coll::AllReduce, &skewed, &recv, 4096, 3);
    collective_at(ranks, Coll::AllReduce, &unaligned, &recv, 4096, 5);
    collective_at(ranks, Coll::AllReduce, &send, &recv, 4 * n + 2, 4);
    assert_eq!(
        stores(),
        before,
        "{n} ranks: a multimem store where buffers differ"
    );
    // AllGather: each rank's block stored once through the output's multicast address;
    // ReduceScatter: each rank's block reduced once through the input's. A block that is no
    // whole number of packs, or inputs at different offsets, take the loads form.
    for (count, seed) in [(1024, 6), (28, 7)] {
        let packs = (n * count * 4 / 16) as u64;
        let before = stores();
        collective_at(ranks, Coll::AllGather, &send, &recv, count, seed);
        assert_eq!(
            stores() - before,
            packs,
            "{n} ranks: AllGather of {count} floats"
        );
        let before = loads();
        collective_at(ranks, Coll::ReduceScatter, &send, &recv, count, seed + 10);
        assert_eq!(
            loads() - before,
            packs,
            "{n} ranks: ReduceScatter of {count} floats"
        );
    }
    // An input window 8 bytes into its allocation (so without a multicast object), the
    // input at its start: an AllGather's packs of it would be misaligned.
    let odd_bufs: Vec<DevBuffer> = ranks.comms.iter().map(alloc).collect();
    let odd = at(&odd_bufs, &|_| 8);
    for h in register_all(&ranks.comms, &odd, &vec![4 * WINDOW - 8; n], &vec![1; n]) {
        handles.push(h.expect("a symmetric window 8 bytes in"));
    }
    let (before_st, before_ld) = (stores(), loads());
    for (coll, seed) in [(Coll::AllGather, 20), (Coll::ReduceScatter, 21)] {
        collective_at(ranks, coll, &send, &recv, 1023, seed);
        collective_at(ranks, coll, &skewed, &recv, 1024, seed + 2);
        collective_at(ranks, coll, &odd, &recv, 1024, seed + 4);
    }
    assert_eq!(
        (stores(), loads()),
        (before_st, before_ld),
        "{n} ranks: the switch used where blocks or offsets differ"
    );
    let lent = common::lend(&ranks.comms);
    for (i, h) in handles.into_iter().enumerate() {
        lent[i % n].window_deregister_raw(h).unwrap();
    }
}

#[test]
fn collectives_through_the_windows_multicast_objects() {
    let env = [
        ("NCCL_RS_SIM_NVLS", "1"),
        ("NCCL_RS_SYMMETRIC_MAX_BYTES", "1048576"),
        ("NCCL_PROTO", "Simple"),
    ];
    common::procs::isolated(&env, &["NCCL_NVLS_ENABLE"], || {
        common::sim();
        for n in [2, 4] {
            case(&common::sim_ranks(n));
        }
    });
}
