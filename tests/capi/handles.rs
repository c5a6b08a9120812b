//! Issue 23, failure 6: a destroyed, doubly destroyed or garbage `ncclComm_t` is
//! ncclInvalidArgument at every entry point, never a hang or a crash. Calls the C ABI's
//! functions directly, on the simulator; each call runs under a deadline so that a hang
//! fails the test instead of stalling it.

use crate::common::{self, procs};
use nccl::capi::*;
use nccl::NcclResult;
use std::ffi::{c_int, c_void};

/// Runs `f` on its own thread and fails the test if it does not return (a bound that only
/// turns a hang into a failure).
fn deadline<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    procs::within(what, procs::limit(), f)
}

/// The address of a handle, to move it across threads.
#[derive(Clone, Copy)]
struct H(usize);
impl H {
    fn p(self) -> NcclComm {
        self.0 as NcclComm
    }
}

/// Every entry point that takes a communicator, called on `h`: their results.
fn every_call(h: H) -> Vec<(&'static str, NcclResult)> {
    deadline("the calls", move || {
        let c = h.p();
        let mut n: c_int = 0;
        let mut st = NcclResult::Success;
        let mut op: c_int = 0;
        let mut scalar = 1.0f32;
        let mut reg: *mut c_void = std::ptr::null_mut();
        let mut split: NcclComm = std::ptr::null_mut();
        let buf = 0x1000 as *mut c_void; // never reached: the handle is checked first
        let s = std::ptr::null_mut();
        // SAFETY: the calls under test; every pointer argument but the communicator is valid.
        unsafe {
            vec![
                ("ncclCommCount", ncclCommCount(c, &mut n)),
                ("ncclCommCuDevice", ncclCommCuDevice(c, &mut n)),
                ("ncclCommUserRank", ncclCommUserRank(c, &mut n)),
                ("ncclCommGetAsyncError", ncclCommGetAsyncError(c, &mut st)),
                ("ncclAllReduce", ncclAllReduce(buf, buf, 1, 7, 0, c, s)),
                ("ncclBroadcast", ncclBroadcast(buf, buf, 1, 7, 0, c, s)),
                ("ncclReduce", ncclReduce(buf, buf, 1, 7, 0, 0, c, s)),
                ("ncclAllGather", ncclAllGather(buf, buf, 1, 7, c, s)),
                (
                    "ncclReduceScatter",
                    ncclReduceScatter(buf, buf, 1, 7, 0, c, s),
                ),
                ("ncclBcast", ncclBcast(buf, 1, 7, 0, c, s)),
                ("ncclAlltoAll", ncclAlltoAll(buf, buf, 1, 7, c, s)),
                ("ncclGather", ncclGather(buf, buf, 1, 7, 0, c, s)),
                ("ncclScatter", ncclScatter(buf, buf, 1, 7, 0, c, s)),
                ("ncclSend", ncclSend(buf, 1, 7, 0, c, s)),
                ("ncclRecv", ncclRecv(buf, 1, 7, 0, c, s)),
                ("ncclCommRegister", ncclCommRegister(c, buf, 4, &mut reg)),
                ("ncclCommDeregister", ncclCommDeregister(c, buf)),
                (
                    "ncclCommWindowRegister",
                    ncclCommWindowRegister(c, buf, 4, &mut reg, 0),
                ),
                ("ncclCommWindowDeregister", ncclCommWindowDeregister(c, buf)),
                (
                    "ncclPutSignal",
                    ncclPutSignal(buf, 1, 7, 0, buf, 0, 0, 0, 0, c, s),
                ),
                ("ncclSignal", ncclSignal(0, 0, 0, 0, c, s)),
                ("ncclWaitSignal", ncclWaitSignal(0, std::ptr::null(), c, s)),
                (
                    "ncclDevCommCreate",
                    ncclDevCommCreate(c, std::ptr::null(), buf),
                ),
                (
                    "ncclDevCommDestroy",
                    ncclDevCommDestroy(c, std::ptr::null()),
                ),
                ("ncclRedOpDestroy", ncclRedOpDestroy(5, c)),
                (
                    "ncclRedOpCreatePreMulSum",
                    ncclRedOpCreatePreMulSum(
                        &mut op,
                        &mut scalar as *mut f32 as *mut c_void,
                        7,
                        1,
                        c,
                    ),
                ),
                (
                    "ncclCommSplit",
                    ncclCommSplit(c, 0, 0, &mut split, std::ptr::null()),
                ),
                (
                    "ncclCommShrink",
                    ncclCommShrink(c, std::ptr::null(), 0, &mut split, std::ptr::null(), 0),
                ),
                ("ncclCommFinalize", ncclCommFinalize(c)),
                ("ncclCommAbort", ncclCommAbort(c)),
                ("ncclCommDestroy", ncclCommDestroy(c)),
            ]
        }
    })
}

fn all_invalid(h: H, case: &str) {
    let t = std::time::Instant::now();
    let results = every_call(h);
    // For docs/faults.md: what a bad handle costs (no bound is asserted but the deadline's).
    eprintln!(
        "{case} handle: {} entry points refused in {:?} (all calls together)",
        results.len(),
        t.elapsed()
    );
    for (name, r) in results {
        assert_eq!(r, NcclResult::InvalidArgument, "{name} on a {case} handle");
    }
}

/// A one-rank communicator of the simulator, through the C ABI.
fn new_comm() -> H {
    // ncclCommInitAll's bootstrap is on loopback.
    common::sim();
    let mut c: NcclComm = std::ptr::null_mut();
    // SAFETY: one slot for one device; devlist NULL means device 0.
    let r = unsafe { ncclCommInitAll(&mut c, 1, std::ptr::null()) };
    assert_eq!(r, NcclResult::Success);
    assert!(!c.is_null());
    H(c as usize)
}

#[test]
fn destroyed_and_garbage_handles_are_invalid_arguments() {
    let live = new_comm();
    let mut n: c_int = 0;
    // SAFETY: a live handle.
    assert_eq!(
        unsafe { ncclCommCount(live.p(), &mut n) },
        NcclResult::Success
    );
    assert_eq!(n, 1);

    // Destroyed, then destroyed again: every entry refuses it.
    let gone = new_comm();
    // SAFETY: a live handle, destroyed once.
    assert_eq!(unsafe { ncclCommDestroy(gone.p()) }, NcclResult::Success);
    all_invalid(gone, "destroyed");
    // SAFETY: as above (refused, not freed twice).
    assert_eq!(
        deadline("a second destroy", move || unsafe {
            ncclCommDestroy(gone.p())
        }),
        NcclResult::InvalidArgument
    );

    // Garbage: memory of ours that holds no handle, and addresses that are no memory at all
    // (dereferencing them would crash the test).
    let junk = Box::new([0x5au8; 256]);
    all_invalid(H(junk.as_ptr() as usize), "garbage (heap bytes)");
    all_invalid(H(0x10), "garbage (address 0x10)");
    all_invalid(H(usize::MAX - 7), "garbage (top address)");

    // Aborted: calls get ncclInvalidUsage until the handle is destroyed; a second abort is a
    // no-op (as NCCL; PyTorch's watchdog relies on it); then destroy frees it, once.
    let aborted = new_comm();
    // SAFETY: a live handle.
    assert_eq!(unsafe { ncclCommAbort(aborted.p()) }, NcclResult::Success);
    // SAFETY: the aborted handle's shell stays until destroyed.
    unsafe {
        assert_eq!(ncclCommCount(aborted.p(), &mut n), NcclResult::InvalidUsage);
        assert_eq!(ncclCommAbort(aborted.p()), NcclResult::Success);
        assert_eq!(ncclCommDestroy(aborted.p()), NcclResult::Success);
    }
    all_invalid(aborted, "aborted and destroyed");

    // The live communicator was not disturbed by any of it.
    // SAFETY: a live handle.
    unsafe {
        assert_eq!(ncclCommCount(live.p(), &mut n), NcclResult::Success);
        assert_eq!(ncclCommDestroy(live.p()), NcclResult::Success);
    }
    // NULL keeps NCCL's meaning: destroy and abort succeed, the others refuse it.
    // SAFETY: null handles.
    unsafe {
        assert_eq!(ncclCommDestroy(std::ptr::null_mut()), NcclResult::Success);
        assert_eq!(ncclCommAbort(std::ptr::null_mut()), NcclResult::Success);
        assert_eq!(
            ncclCommCount(std::ptr::null_mut(), &mut n),
            NcclResult::InvalidArgument
        );
    }
}
