//! The calling thread's group (`ncclGroupStart` … `ncclGroupEnd`): one state for every layer
//! that defers work to the group's end. Communicator creation (this layer) sees the nesting,
//! whether the group's communicators are blocking, and the creations of blocking communicators
//! deferred to the outermost end, where they run all at once on their own threads (one thread
//! may initialise several ranks that wait on each other). The enqueue layer records the
//! group's operations here (ordered jobs, sends and receives, the first error, the members)
//! and issues them at the end (`enqueue::group`), after the creations.

use super::call::P2pOp;
use super::order::StreamOrder;
use super::Comm;
use crate::error::{Error, NcclResult, Result};
use crate::profiler::{CommProfiler, Event, STATE_GROUP_END_API_START};
use std::cell::RefCell;
use std::sync::Arc;

/// Work deferred to the end of the group.
pub type Job = Box<dyn FnOnce() -> Result<()> + Send>;

/// A communicator with operations in the group.
pub(crate) struct Member {
    pub order: Arc<StreamOrder>,
    /// The model's time of its collectives in the group, µs.
    pub estimate_us: f64,
}

/// The calling thread's group.
#[derive(Default)]
pub(crate) struct Group {
    depth: u32,
    /// Jobs that must run concurrently (communicator creation, window registration).
    pub creations: Vec<Job>,
    /// Per creation, the communicator whose calls it runs in turn ([`parallel_in_turn`]).
    turns: Vec<Option<usize>>,
    /// Whether the group's communicators are blocking (None: none joined yet).
    pub blocking: Option<bool>,
    /// Jobs that run in issue order (collectives, point-to-point).
    pub ordered: Vec<Job>,
    /// Sends and receives, launched together at the end.
    pub p2p: Vec<P2pOp>,
    /// The first error raised inside the group, returned by the outermost end.
    pub error: Option<Error>,
    /// Communicators with operations in the group, in the order they joined.
    pub members: Vec<Member>,
    /// The group's `GroupApi` event in the profiler plugin, started by its first profiled
    /// call, and the context it went to (`crate::profiler`); ended at the group's end.
    pub profiled: Option<(Arc<CommProfiler>, Event)>,
    /// The library opened this group around one call (a profiled call outside any group).
    pub own: bool,
}

std::thread_local! {
    static GROUP: RefCell<Group> = RefCell::new(Group::default());
}

/// Runs `f` on the calling thread's group.
pub(crate) fn with<R>(f: impl FnOnce(&mut Group) -> R) -> R {
    GROUP.with(|g| f(&mut g.borrow_mut()))
}

/// How deep the calling thread is in groups (0: not in a group).
pub fn depth() -> u32 {
    GROUP.with(|g| g.borrow().depth)
}

/// Opens one level of the calling thread's group.
pub(crate) fn open() {
    with(|g| g.depth += 1);
}

/// Closes one level of the calling thread's group: at the outermost level, the whole group
/// (what it deferred, its operations), leaving the thread outside any group; None at an inner
/// one.
pub(crate) fn close() -> Result<Option<Group>> {
    with(|g| {
        if g.depth == 0 {
            return Err(Error::invalid_usage(
                "ncclGroupEnd without a matching ncclGroupStart",
            ));
        }
        g.depth -= 1;
        if g.depth > 0 {
            return Ok(None);
        }
        Ok(Some(std::mem::take(g)))
    })
}

fn set_mode_in(s: &mut Group, blocking: bool) -> Result<()> {
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
    with(|g| set_mode_in(g, blocking))
}

/// The calling thread's group's `GroupApi` event: started now in `prof`'s context (`mask`:
/// the call's snapshot) if this is the group's first profiled call.
pub(crate) fn profiled_group(prof: &Arc<CommProfiler>, mask: u64, graph_captured: bool) -> Event {
    with(|g| {
        if let Some((_, e)) = &g.profiled {
            return *e;
        }
        // NCCL's depth: a call outside any group is one (its own group), inside the user's
        // outermost group two.
        let depth = if g.own { g.depth } else { g.depth + 1 };
        let e = prof.group_api(mask, depth, graph_captured);
        g.profiled = Some((prof.clone(), e));
        e
    })
}

/// The group's end began: its `GroupApi` event (if any) records `GroupEndApiStart`; the
/// event to stop once the end returns.
pub(crate) fn profiled_end(profiled: &Option<(Arc<CommProfiler>, Event)>) {
    if let Some((p, e)) = profiled {
        p.record(*e, STATE_GROUP_END_API_START, None);
    }
}

/// Runs `job` now, or concurrently with the group's other such jobs at its end. (Only the
/// creation of blocking communicators comes here: it makes the group a blocking one.)
pub fn parallel(job: Job) -> Result<()> {
    if depth() == 0 {
        return job();
    }
    with(|g| {
        set_mode_in(g, true)?;
        g.creations.push(job);
        g.turns.push(None);
        Ok(())
    })
}

/// As [`parallel`] for a collective call of communicator `key` (window registration): at the
/// group's end each communicator's such calls run one after another, in the order they were
/// made (they meet their peers' calls in that order), concurrently with other communicators'.
pub fn parallel_in_turn(key: usize, job: Job) -> Result<()> {
    if depth() == 0 {
        return job();
    }
    with(|g| {
        set_mode_in(g, true)?;
        match g.turns.iter().position(|t| *t == Some(key)) {
            Some(i) => {
                let before = std::mem::replace(&mut g.creations[i], Box::new(|| Ok(())));
                g.creations[i] = Box::new(move || {
                    before()?;
                    job()
                });
            }
            None => {
                g.creations.push(job);
                g.turns.push(Some(key));
            }
        }
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

/// Runs `job` now, or at the end of the calling thread's group.
pub fn ordered(job: impl FnOnce() -> Result<()> + Send + 'static) -> Result<()> {
    if depth() == 0 {
        return job(); // boxed only when the group keeps it
    }
    with(|g| g.ordered.push(Box::new(job)));
    Ok(())
}

/// Remembers an error raised inside a group (argument checks run at the call).
pub fn record_error(e: Error) -> Error {
    if depth() == 0 {
        return e;
    }
    with(|g| {
        if g.error.is_none() {
            g.error = Some(e.clone());
        }
    });
    e
}

impl Comm {
    /// The first step of every operation: it enters RAS's history; the communicator must be
    /// usable and ready (not still issuing a non-blocking group's work); inside a group it
    /// joins the group (whose communicators must all be blocking, or all non-blocking); and
    /// registrations of destroyed graphs are withdrawn.
    pub(crate) fn enter_call(&self, what: &str) -> Result<()> {
        self.ras.health.issued(what);
        self.check_ready()?;
        self.check_usable()?;
        if depth() > 0 {
            set_mode(self.config().blocking)?;
            with(|g| {
                if !g.members.iter().any(|m| Arc::ptr_eq(&m.order, &self.order)) {
                    g.members.push(Member {
                        order: self.order.clone(),
                        estimate_us: 0.0,
                    });
                }
            });
        }
        self.release_graph_regs();
        Ok(())
    }

    /// Whether this communicator may take a new call: not while a non-blocking group still
    /// issues its work in the background (NCCL: "attempt to use communicator before the
    /// previous operation returned ncclSuccess", an invalid argument), nor after such a group
    /// failed (its error).
    pub(crate) fn check_ready(&self) -> Result<()> {
        match self.order.background.state() {
            Err(e) if e.code == NcclResult::InProgress => Err(Error::invalid_argument(format!(
                "rank {}: the communicator was used before its previous operation completed \
                 (ncclInProgress): poll ncclCommGetAsyncError until it returns ncclSuccess \
                 first",
                self.rank
            ))),
            r => r,
        }
    }

    /// Waits until a non-blocking group's background issue of this communicator's work ended.
    pub(crate) fn wait_background(&self) {
        let _ = self.order.background.wait();
    }

    /// Adds `estimate_us` (a collective's time by the model) to this communicator's share of
    /// the calling thread's group, for `ncclGroupSimulateEnd`.
    pub(crate) fn note_in_group(&self, estimate_us: f64) {
        if depth() == 0 {
            return;
        }
        with(|g| {
            if let Some(m) = g
                .members
                .iter_mut()
                .find(|m| Arc::ptr_eq(&m.order, &self.order))
            {
                m.estimate_us += estimate_us;
            }
        });
    }
}
