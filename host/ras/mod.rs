//! RAS (reliability, availability, serviceability), after NCCL 2.24's: a thread per process
//! keeps the health of its communicators and answers clients with the state of the job.
//!
//! Every communicator registers a `Health` record at init: its id (the first unique id's
//! nonce, alike on every rank), rank, size, the operations issued on it (count, the last few by
//! sequence number, when the last came) and two views it asks when a report is made: whether
//! all its work finished (the launch order's event) and its async error.
//!
//! A client (the `ncclras` binary, or `nc`: the protocol is text) connects to this process's
//! RAS listener (`NCCL_RAS_ADDR`, `localhost:28028` by default; `NCCL_RAS_ENABLE=0` turns RAS
//! off) and sends `STATUS` or `VERBOSE STATUS`. For every communicator with a rank here, the
//! RAS thread asks each of its ranks for its record over the communicator's bootstrap (a rank
//! answers from its bootstrap reader thread, so a rank whose application is stuck still
//! answers) and writes one report: per communicator, the ranks that are dead (their
//! connection ended), that do not answer within the timeout (5 s ×
//! `NCCL_RAS_TIMEOUT_FACTOR`), that are behind (fewer operations issued than the others, and
//! the operation they have not issued), and whether it is stuck. See [`report`].
//!
//! Only one process per address can listen: on a host with several processes of one job the
//! first takes the port (the others log it at INFO), and its report covers every communicator
//! it has a rank in, which reaches every rank of those communicators.

mod record;
mod report;
mod server;

pub(crate) use record::Health;
pub use report::report;
pub use server::{listening_on, query};

use std::sync::{Arc, Mutex, Weak};

use crate::bootstrap::Bootstrap;

/// A registered communicator: its record and the bootstrap to reach its ranks.
pub(crate) struct Entry {
    pub health: Arc<Health>,
    pub bootstrap: Weak<Bootstrap>,
}

fn registry() -> &'static Mutex<Vec<Weak<Entry>>> {
    static R: Mutex<Vec<Weak<Entry>>> = Mutex::new(Vec::new());
    &R
}

/// Registers a communicator (kept while the returned entry lives) and starts the RAS thread
/// on first use; its bootstrap answers other ranks' queries with `health`'s record.
pub(crate) fn register(health: Arc<Health>, bootstrap: &Arc<Bootstrap>) -> Arc<Entry> {
    let answer = health.clone();
    bootstrap.serve_ras(move || answer.record().encode());
    let entry = Arc::new(Entry {
        health,
        bootstrap: Arc::downgrade(bootstrap),
    });
    let mut all = registry().lock().unwrap_or_else(|p| p.into_inner());
    all.retain(|w| w.strong_count() > 0);
    all.push(Arc::downgrade(&entry));
    drop(all);
    server::start_once();
    entry
}

/// The communicators of this process that are alive.
pub(crate) fn entries() -> Vec<Arc<Entry>> {
    registry()
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .filter_map(Weak::upgrade)
        .collect()
}
