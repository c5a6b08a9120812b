//! A lab tool for latency across nodes: with `NCCL_RS_PROXY_TIMELINE=PREFIX`, the process
//! records when its launches were issued and when each network step moved, in nanoseconds of
//! the system-wide monotonic clock (so the files of processes on one machine line up), and
//! writes them to `PREFIX.<pid>` when its last proxy stops. One line per event:
//! `ns mark peer step`. Off (the default), a mark costs one load of a flag.

use std::io::Write;
use std::sync::{Mutex, OnceLock};

use crate::clock::clock_ns;

/// What happened.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Mark {
    /// A kernel that needs the network was handed to the driver (before the launch call).
    Launch,
    /// The launch call returned.
    Launched,
    /// A receive side saw its kernel wait for a step it had not published (the kernel runs).
    Awaited,
    /// A send side saw the kernel's step and posted its send.
    SendPosted,
    /// The network completed a send.
    SendDone,
    /// A receive side published a landed step to its kernel.
    RecvLanded,
}

struct Event {
    ns: u64,
    mark: Mark,
    peer: u32,
    step: u64,
}

fn log() -> Option<&'static Mutex<Vec<Event>>> {
    static LOG: OnceLock<Option<Mutex<Vec<Event>>>> = OnceLock::new();
    LOG.get_or_init(|| {
        crate::env::RS_PROXY_TIMELINE
            .raw()
            .filter(|p| !p.is_empty())
            .map(|_| Mutex::new(Vec::with_capacity(1 << 16)))
    })
    .as_ref()
}

/// Records `mark` for the connection with `peer` at `step` (0 where neither applies).
pub(crate) fn mark(mark: Mark, peer: usize, step: u64) {
    let Some(log) = log() else { return };
    let ns = clock_ns(libc::CLOCK_MONOTONIC);
    if let Ok(mut v) = log.lock() {
        // A bounded record: the first million events (a lab run is short).
        if v.len() < 1 << 20 {
            v.push(Event {
                ns,
                mark,
                peer: peer as u32,
                step,
            });
        }
    }
}

/// Writes what was recorded to `PREFIX.<pid>` (appending) and forgets it.
pub(crate) fn flush() {
    let (Some(log), Some(prefix)) = (log(), crate::env::RS_PROXY_TIMELINE.raw()) else {
        return;
    };
    let events = match log.lock() {
        Ok(mut v) => std::mem::take(&mut *v),
        Err(_) => return,
    };
    let path = format!("{prefix}.{}", std::process::id());
    let written = crate::debug::open_private(&path, true).and_then(|f| {
        let mut w = std::io::BufWriter::new(f);
        for e in &events {
            writeln!(w, "{} {:?} {} {}", e.ns, e.mark, e.peer, e.step)?;
        }
        w.flush()
    });
    if let Err(e) = written {
        log::warn!("NCCL_RS_PROXY_TIMELINE: writing {path}: {e}");
    }
}
