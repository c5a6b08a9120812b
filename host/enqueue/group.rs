//! ncclGroupStart / ncclGroupEnd: per-thread nesting. Inside a group, operations are recorded
//! and run when the outermost group ends: communicator inits all at once on their own threads
//! (one thread may initialise several ranks that wait on each other), then the operations in
//! the order they were issued.

use crate::error::{Error, Result};
use std::cell::RefCell;

/// Work deferred to the end of the group.
pub type Job = Box<dyn FnOnce() -> Result<()> + Send>;

#[derive(Default)]
struct GroupState {
    depth: u32,
    /// Jobs that must run concurrently (communicator creation).
    parallel: Vec<Job>,
    /// Jobs that run in issue order (collectives, point-to-point).
    ordered: Vec<Job>,
    /// Sends and receives, launched together at the end.
    p2p: Vec<super::p2p::P2pOp>,
    /// The first error raised inside the group, returned by the outermost end.
    error: Option<Error>,
}

std::thread_local! {
    static GROUP: RefCell<GroupState> = RefCell::new(GroupState::default());
}

/// `ncclGroupStart`.
pub fn start() {
    GROUP.with(|g| g.borrow_mut().depth += 1);
}

/// How deep the calling thread is in groups (0: not in a group).
pub fn depth() -> u32 {
    GROUP.with(|g| g.borrow().depth)
}

/// Runs `job` now, or at the end of the calling thread's group.
pub fn ordered(job: Job) -> Result<()> {
    if depth() == 0 {
        return job();
    }
    GROUP.with(|g| g.borrow_mut().ordered.push(job));
    Ok(())
}

/// Runs `job` now, or concurrently with the group's other such jobs at its end.
pub fn parallel(job: Job) -> Result<()> {
    if depth() == 0 {
        return job();
    }
    GROUP.with(|g| g.borrow_mut().parallel.push(job));
    Ok(())
}

/// Runs a send or receive now (a group of one), or with the group's others at its end.
pub fn p2p(op: super::p2p::P2pOp) -> Result<()> {
    if depth() == 0 {
        return super::p2p::flush(vec![op]);
    }
    GROUP.with(|g| g.borrow_mut().p2p.push(op));
    Ok(())
}

/// Remembers an error raised inside a group (argument checks run at the call).
pub fn record_error(e: Error) -> Error {
    GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth > 0 && g.error.is_none() {
            g.error = Some(e.clone());
        }
    });
    e
}

/// `ncclGroupEnd`: at the outermost level, runs what the group recorded and returns the first
/// error.
pub fn end() -> Result<()> {
    let state = GROUP.with(|g| {
        let mut g = g.borrow_mut();
        if g.depth == 0 {
            return Err(Error::invalid_usage(
                "ncclGroupEnd without a matching ncclGroupStart",
            ));
        }
        g.depth -= 1;
        Ok(if g.depth == 0 {
            Some(std::mem::take(&mut *g))
        } else {
            None
        })
    })?;
    let Some(state) = state else { return Ok(()) };
    let mut first = state.error;
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let hs: Vec<_> = state.parallel.into_iter().map(|job| s.spawn(job)).collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::internal("a group job panicked")))
            })
            .collect()
    });
    for r in results {
        if let Err(e) = r {
            first.get_or_insert(e);
        }
    }
    if first.is_none() {
        for job in state.ordered {
            if let Err(e) = job() {
                first = Some(e);
                break;
            }
        }
    }
    if first.is_none() && !state.p2p.is_empty() {
        if let Err(e) = super::p2p::flush(state.p2p) {
            first = Some(e);
        }
    }
    match first {
        Some(e) => Err(e),
        None => Ok(()),
    }
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
        ordered(Box::new(move || {
            m.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }))
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
        ordered(Box::new(|| Ok(()))).unwrap();
        let e = end().unwrap_err();
        assert!(e.message.contains("bad count"));
        assert_eq!(depth(), 0);
    }
}
