//! `ncclCommSuspend` / `ncclCommResume` checks shared by the simulator and GPU suites: what a
//! suspended communicator is (its memory given back, its operations refused), and the
//! collective suspend and resume of every rank of a process.

use super::{lend, Ranks};
use nccl::{Comm, DataType, NcclResult, ReduceOp, SUSPEND_MEM};

/// Runs `f` on every communicator at once, a thread each (suspend and resume are collective).
pub fn on_all(comms: &[Comm], f: impl Fn(&Comm) -> nccl::Result<()> + Sync) -> Result<(), String> {
    std::thread::scope(|s| {
        let hs: Vec<_> = lend(comms)
            .into_iter()
            .map(|c| {
                let f = &f;
                s.spawn(move || f(&c).map_err(|e| format!("rank {}: {e}", c.rank())))
            })
            .collect();
        hs.into_iter()
            .try_for_each(|h| h.join().map_err(|_| "a rank panicked".to_string())?)
    })
}

/// Free device memory of the communicator's device.
pub fn free_of(c: &Comm) -> usize {
    c.device().mem_info().expect("mem_info").0
}

/// Suspends every rank and checks what a suspended communicator is: its memory given back,
/// its operations refused; then resumes.
pub fn suspend_and_resume(ranks: &Ranks) -> Result<(), String> {
    let comms = &ranks.comms;
    let suspendable: Vec<usize> = comms.iter().map(|c| c.suspendable_memory()).collect();
    if suspendable.contains(&0) {
        return Err(format!("nothing to suspend: {suspendable:?}"));
    }
    let free_before: Vec<usize> = comms.iter().map(free_of).collect();
    on_all(comms, |c| c.suspend(SUSPEND_MEM))?;
    for (i, c) in comms.iter().enumerate() {
        if !c.is_suspended() {
            return Err(format!("rank {i} not suspended"));
        }
        // Ranks of one process share a device here: the frees add up per device.
        let freed = free_of(c).saturating_sub(free_before[i]);
        if freed < suspendable[i] {
            return Err(format!(
                "rank {i}: {freed} bytes given back, {} suspendable",
                suspendable[i]
            ));
        }
        let e = c.suspend(SUSPEND_MEM).expect_err("a second suspend");
        assert_eq!(e.code, NcclResult::InvalidUsage, "{e}");
        let buf = c.device().alloc(64).map_err(|e| e.to_string())?;
        let e = unsafe {
            c.all_reduce_raw(
                buf.ptr(),
                buf.ptr(),
                16,
                DataType::Float32,
                ReduceOp::SUM,
                ranks.streams[i],
            )
        }
        .expect_err("an AllReduce while suspended");
        assert_eq!(e.code, NcclResult::InvalidUsage, "{e}");
        assert!(e.message.contains("suspended"), "{e}");
    }
    on_all(comms, |c| c.resume())?;
    for (i, c) in comms.iter().enumerate() {
        if c.is_suspended() {
            return Err(format!("rank {i} still suspended"));
        }
        let e = c
            .resume()
            .expect_err("a resume of a communicator not suspended");
        assert_eq!(e.code, NcclResult::InvalidUsage, "{e}");
    }
    Ok(())
}

/// A graph replay's `between` ([`super::graphs::capture_and_replay_with`]): every rank
/// suspended and resumed after the even replays.
pub fn after_even_replays(ranks: &Ranks, it: usize) -> Result<(), String> {
    if it.is_multiple_of(2) {
        suspend_and_resume(ranks)?;
    }
    Ok(())
}
