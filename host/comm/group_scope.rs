//! The calling thread's group (`ncclGroupStart` … `ncclGroupEnd`) as communicator creation
//! sees it: how deeply the thread is nested, whether the group's communicators are blocking,
//! and the creations of blocking communicators deferred to the outermost end, where they run
//! all at once on their own threads (one thread may initialise several ranks that wait on
//! each other).
//!
//! The group's operations live one layer up, in the enqueue layer's group, which opens and
//! closes this nesting and runs these creations first when the outermost group ends.

use crate::error::{Error, Result};
use std::cell::RefCell;

/// Work deferred to the end of the group.
pub type Job = Box<dyn FnOnce() -> Result<()> + Send>;

#[derive(Default)]
struct Scope {
    depth: u32,
    /// Jobs that must run concurrently (communicator creation).
    creations: Vec<Job>,
    /// Whether the group's communicators are blocking (None: none joined yet).
    blocking: Option<bool>,
}

std::thread_local! {
    static SCOPE: RefCell<Scope> = RefCell::new(Scope::default());
}

/// What the outermost end of a group takes over.
pub(crate) struct Closed {
    /// The deferred creations, for [`run_concurrently`].
    pub creations: Vec<Job>,
    /// Whether the group's communicators were blocking (None: none joined).
    pub blocking: Option<bool>,
}

/// How deep the calling thread is in groups (0: not in a group).
pub fn depth() -> u32 {
    SCOPE.with(|s| s.borrow().depth)
}

/// Opens one level of the calling thread's group.
pub(crate) fn open() {
    SCOPE.with(|s| s.borrow_mut().depth += 1);
}

/// Closes one level of the calling thread's group: what it deferred at the outermost level,
/// None at an inner one.
pub(crate) fn close() -> Result<Option<Closed>> {
    SCOPE.with(|s| {
        let mut s = s.borrow_mut();
        if s.depth == 0 {
            return Err(Error::invalid_usage(
                "ncclGroupEnd without a matching ncclGroupStart",
            ));
        }
        s.depth -= 1;
        if s.depth > 0 {
            return Ok(None);
        }
        let Scope {
            creations,
            blocking,
            ..
        } = std::mem::take(&mut *s);
        Ok(Some(Closed {
            creations,
            blocking,
        }))
    })
}

fn set_mode_in(s: &mut Scope, blocking: bool) -> Result<()> {
    match s.blocking {
        Some(b) if b != blocking => Err(Error::invalid_argument(
            "blocking and non-blocking communicators cannot be used in the same group",
        )),
        _ => {
            s.blocking = Some(blocking);
            Ok(())
        }
    }
}

/// A communicator that is `blocking` (or not) joins the calling thread's group: blocking and
/// non-blocking communicators do not mix in one group.
pub(crate) fn set_mode(blocking: bool) -> Result<()> {
    SCOPE.with(|s| set_mode_in(&mut s.borrow_mut(), blocking))
}

/// Runs `job` now, or concurrently with the group's other such jobs at its end. (Only the
/// creation of blocking communicators comes here: it makes the group a blocking one.)
pub fn parallel(job: Job) -> Result<()> {
    if depth() == 0 {
        return job();
    }
    SCOPE.with(|s| {
        let mut s = s.borrow_mut();
        set_mode_in(&mut s, true)?;
        s.creations.push(job);
        Ok(())
    })
}

/// Runs the creations concurrently; the first error.
pub(crate) fn run_concurrently(jobs: Vec<Job>) -> Option<Error> {
    let results: Vec<Result<()>> = std::thread::scope(|s| {
        let hs: Vec<_> = jobs.into_iter().map(|job| s.spawn(job)).collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(Error::internal("a group job panicked")))
            })
            .collect()
    });
    results.into_iter().find_map(|r| r.err())
}
