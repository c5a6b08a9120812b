//! ncclSend / ncclRecv on the simulator: all-to-all with a different size per pair (self
//! included), as threads and processes, and bad peers.

use crate::common::{self, check_all_to_all, Drive, Ranks};
use nccl::{Comm, DataType, NcclResult};

#[test]
fn all_to_all_on_2_3_4_and_8_ranks() {
    for (n, drive) in [
        (2, Drive::OneThread),
        (3, Drive::ThreadPerRank),
        (4, Drive::OneThread),
        (8, Drive::ThreadPerRank),
    ] {
        let ranks = common::sim_ranks(n);
        for scale in [0usize, 1, 5000] {
            check_all_to_all(&ranks, scale, drive).unwrap_or_else(|e| panic!("{e}"));
        }
        // Again on the same connections: the step counters carry over.
        check_all_to_all(&ranks, 40_000, drive).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn all_to_all_as_processes() {
    if let Some((rank, nranks, id)) = common::procs::child() {
        let comm = Comm::init_rank_on(common::sim_dev(rank), nranks, &id, rank)
            .expect("init_rank in a child process");
        let ranks = Ranks::new(vec![comm]);
        for scale in [3usize, 9000] {
            check_all_to_all(&ranks, scale, Drive::OneThread).unwrap_or_else(|e| panic!("{e}"));
        }
        return;
    }
    for n in [2usize, 4] {
        common::procs::run(n, &[]);
    }
}

#[test]
#[cfg_attr(
    not(nccl_rs_kernel = "nccl_p2p"),
    ignore = "needs nccl_p2p, which NCCL_RS_KERNELS left out"
)]
fn bad_peers_and_unmatched_self_sends() {
    let ranks = common::sim_ranks(2);
    let c = &ranks.comms[0];
    let b = c.device().alloc(64).unwrap();
    let s = ranks.streams[0];
    assert_eq!(
        unsafe { c.send_raw(b.ptr(), 4, DataType::Float32, 2, s) }
            .unwrap_err()
            .code,
        NcclResult::InvalidArgument
    );
    assert_eq!(
        unsafe { c.recv_raw(0, 4, DataType::Float32, 1, s) }
            .unwrap_err()
            .code,
        NcclResult::InvalidArgument
    );
    nccl::group_start();
    unsafe { c.send_raw(b.ptr(), 4, DataType::Float32, 0, s) }.unwrap();
    let e = nccl::group_end().unwrap_err();
    assert_eq!(e.code, NcclResult::InvalidUsage, "{e}");
}
