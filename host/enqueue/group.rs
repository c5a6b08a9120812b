//! ncclGroupStart / ncclGroupEnd: per-thread nesting. Inside a group, operations are recorded
//! and run when the outermost group ends: communicator inits all at once on their own threads
//! (one thread may initialise several ranks that wait on each other), then the operations in
//! the order they were issued. The group's state is one, the communicator layer's
//! (`comm::group_scope`, which creation uses without reaching up here); this module records
//! the operations in it and issues them.
//!
//! A group whose communicators are non-blocking (config `blocking = 0`) issues its operations
//! on a background thread: `ncclGroupEnd` returns `ncclInProgress` at once, and each of those
//! communicators reports `ncclInProgress` (`ncclCommGetAsyncError`) until everything was issued,
//! then `ncclSuccess` or the error. Using such a communicator before that is an invalid argument,
//! as in NCCL. Blocking and non-blocking communicators do not mix in one group.
//!
//! `ncclGroupSimulateEnd` ends a group without launching anything: the operations are dropped
//! and the model's time of its collectives is returned.

use crate::comm::group_scope::{self, Group};
use crate::comm::order::StreamOrder;
use crate::error::{Error, Result};
use std::sync::Arc;

// For the tests, through the `internals` feature.
#[cfg_attr(not(feature = "internals"), allow(unused_imports))]
pub use crate::comm::group_scope::{depth, ordered, parallel, parallel_in_turn, record_error, Job};

/// `ncclGroupStart`.
pub fn start() {
    group_scope::open();
}

/// Runs `call` (an API call of `comm`) in a group of its own where it is outside any group and
/// a profiler plugin listens, as NCCL wraps every call, so that its events come as NCCL's
/// (a `GroupApi` around it); else as it is.
pub(crate) fn own_if_profiled(
    comm: &crate::comm::Comm,
    call: impl FnOnce() -> Result<()>,
) -> Result<()> {
    if depth() > 0 || !comm.profiling() {
        return call();
    }
    group_scope::open();
    group_scope::with(|g| g.own = true);
    let r = call();
    r.and(end_inline())
}

/// Runs a send or receive now (a group of one), or with the group's others at its end.
pub fn p2p(op: crate::comm::call::P2pOp) -> Result<()> {
    if depth() == 0 {
        return super::p2p::flush(vec![op]);
    }
    group_scope::with(|g| g.p2p.push(op));
    Ok(())
}

/// Issues the operations: the ordered jobs, then the sends and receives.
fn run_ops(ordered: Vec<Job>, p2p: Vec<crate::comm::call::P2pOp>) -> Result<()> {
    for job in ordered {
        job()?;
    }
    if !p2p.is_empty() {
        super::p2p::flush(p2p)?;
    }
    Ok(())
}

/// `ncclGroupEnd`: at the outermost level, runs what the group recorded and returns the first
/// error. For non-blocking communicators the operations are issued on a background thread
/// and this returns an error of code `InProgress` (not a failure: poll each communicator's
/// [`crate::comm::Comm::async_state`] until it is `Success`).
pub fn end() -> Result<()> {
    end_with(false)
}

/// Ends a group this library opened around one API call of its own (NCCL 2.28's all-to-all,
/// gather and scatter, made of sends and receives): at the outermost level its operations are
/// issued on this thread even for non-blocking communicators, as a collective outside a group
/// is, so the call returns their outcome rather than `ncclInProgress` (PyTorch checks
/// `ncclAlltoAll` strictly). Inside the caller's group it only closes the nesting.
pub fn end_inline() -> Result<()> {
    end_with(true)
}

fn end_with(inline: bool) -> Result<()> {
    let Some(mut group) = group_scope::close()? else {
        return Ok(());
    };
    // The group's GroupApi event spans its end; for a non-blocking group it stops once the
    // background issue started (as NCCL's), not when it ends.
    let profiled = group.profiled.take();
    group_scope::profiled_end(&profiled);
    let r = end_group(group, inline);
    if let Some((p, e)) = profiled {
        p.stop(e);
    }
    r
}

/// Issues what a closed outermost group recorded (see [`end`]).
fn end_group(group: Group, inline: bool) -> Result<()> {
    let Group {
        creations,
        blocking,
        ordered,
        p2p,
        error,
        members,
        ..
    } = group;
    let mut first = error;
    if let Some(e) = group_scope::run_concurrently(creations) {
        first.get_or_insert(e);
    }
    if let Some(e) = first {
        return Err(e);
    }
    if inline || blocking != Some(false) || (ordered.is_empty() && p2p.is_empty()) {
        return run_ops(ordered, p2p);
    }
    let orders: Vec<Arc<StreamOrder>> = members.into_iter().map(|m| m.order).collect();
    for o in &orders {
        o.background.begin();
    }
    let bg = orders.clone();
    let spawned = std::thread::Builder::new()
        .name("nccl-group".into())
        .spawn(move || {
            let r =
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| run_ops(ordered, p2p)))
                    .unwrap_or_else(|_| Err(Error::internal("a non-blocking group panicked")));
            for o in &bg {
                o.background.end(&r);
            }
        });
    match spawned {
        Ok(_) => Err(Error::in_progress(
            "ncclGroupEnd: the group's operations are being issued in the background",
        )),
        Err(e) => {
            let e = Error::system(format!(
                "cannot start a thread for a non-blocking group: {e}"
            ));
            for o in &orders {
                o.background.end(&Err(e.clone()));
            }
            Err(e)
        }
    }
}

/// `ncclGroupSimulateEnd`: ends the group like [`end`] but launches nothing (its collectives
/// and sends/receives are dropped; communicator creations still run). At the outermost level,
/// the model's time of the group in µs: per communicator, the sum of its collectives' times;
/// across communicators (ranks running side by side), the longest. None at an inner level.
pub fn simulate_end() -> Result<Option<f64>> {
    let Some(state) = group_scope::close()? else {
        return Ok(None);
    };
    if let Some((p, e)) = &state.profiled {
        group_scope::profiled_end(&state.profiled);
        p.stop(*e);
    }
    let mut first = state.error;
    if let Some(e) = group_scope::run_concurrently(state.creations) {
        first.get_or_insert(e);
    }
    if let Some(e) = first {
        return Err(e);
    }
    Ok(Some(
        state
            .members
            .iter()
            .map(|m| m.estimate_us)
            .fold(0.0, f64::max),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Arc, Barrier};

    #[test]
    fn nested_groups_defer_to_the_outermost_end() {
        let n = Arc::new(AtomicU32::new(0));
        start();
        start();
        let m = n.clone();
        ordered(move || {
            m.fetch_add(1, Ordering::SeqCst);
            Ok(())
        })
        .unwrap();
        end().unwrap();
        assert_eq!(n.load(Ordering::SeqCst), 0, "inner end runs nothing");
        end().unwrap();
        assert_eq!(n.load(Ordering::SeqCst), 1);
        assert_eq!(end().unwrap_err().code, crate::NcclResult::InvalidUsage);
    }

    #[test]
    fn parallel_jobs_run_together() {
        // Three jobs that each wait for the others: only concurrent execution finishes.
        let b = Arc::new(Barrier::new(3));
        start();
        for _ in 0..3 {
            let b = b.clone();
            parallel(Box::new(move || {
                b.wait();
                Ok(())
            }))
            .unwrap();
        }
        end().unwrap();
    }

    #[test]
    fn the_first_error_comes_back_at_the_end() {
        start();
        let _ = record_error(Error::invalid_argument("bad count"));
        ordered(|| Ok(())).unwrap();
        let e = end().unwrap_err();
        assert!(e.message.contains("bad count"));
        assert_eq!(depth(), 0);
    }
}
