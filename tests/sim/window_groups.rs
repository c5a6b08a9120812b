//! Windows registered inside a group through the C ABI (`ncclCommWindowRegister` between
//! `ncclGroupStart` and `ncclGroupEnd`), as unmodified nccl-tests' `-R 2` registers its send
//! and receive buffers, with rank processes as nccl-tests runs them under MPI: at the group's
//! end each communicator's registrations run in call order, so each exchange meets the
//! peers' same registration (two windows of different sizes: a registration paired with a
//! peer's other one is refused as not symmetric).

use crate::common;
use nccl::capi::*;
use std::ffi::c_void;

#[test]
fn two_windows_in_one_group_between_processes() {
    let Some((rank, nranks, id)) = common::procs::child() else {
        common::sim();
        common::procs::run(3, &[]);
        return;
    };
    common::sim();
    // SAFETY: the C ABI as a C caller uses it: out-pointers to locals, buffers from
    // ncclMemAlloc that outlive their windows.
    unsafe {
        assert_eq!(ncclRsSetDevice(rank as i32), nccl::NcclResult::Success);
        let mut comm = std::ptr::null_mut();
        let r = ncclCommInitRank(&mut comm, nranks as i32, id, rank as i32);
        assert_eq!(r, nccl::NcclResult::Success);
        for round in 0..3 {
            let mut bufs = [std::ptr::null_mut::<c_void>(); 2];
            let mut wins = [std::ptr::null_mut::<c_void>(); 2];
            assert_eq!(ncclGroupStart(), nccl::NcclResult::Success);
            for (k, (b, w)) in bufs.iter_mut().zip(wins.iter_mut()).enumerate() {
                let bytes = (k + 1) << 12;
                assert_eq!(ncclMemAlloc(b, bytes), nccl::NcclResult::Success);
                let r = ncclCommWindowRegister(comm, *b, bytes, w, 1);
                assert_eq!(r, nccl::NcclResult::Success, "rank {rank}, window {k}");
            }
            let r = ncclGroupEnd();
            assert_eq!(
                r,
                nccl::NcclResult::Success,
                "rank {rank}, round {round}: group end"
            );
            assert!(!wins[0].is_null() && !wins[1].is_null() && wins[0] != wins[1]);
            for (b, w) in bufs.iter().zip(wins).rev() {
                assert_eq!(ncclCommWindowDeregister(comm, w), nccl::NcclResult::Success);
                assert_eq!(ncclMemFree(*b), nccl::NcclResult::Success);
            }
        }
        assert_eq!(ncclCommDestroy(comm), nccl::NcclResult::Success);
    }
}
