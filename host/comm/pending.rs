//! Communicators that are still being created: by a background thread (non-blocking config),
//! or at the end of the calling thread's group (`ncclGroupStart` … `ncclGroupEnd`).

use super::{group_scope, Comm};
use crate::bootstrap::AbortFlag;
use crate::error::{Error, NcclResult, Result};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

enum Slot {
    Running,
    Done(Box<Result<Comm>>),
    Taken,
}

struct Shared {
    slot: Mutex<Slot>,
    done: Condvar,
    abort: AbortFlag,
}

fn lock(m: &Mutex<Slot>) -> MutexGuard<'_, Slot> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn finish(&self, r: Result<Comm>) {
        let mut s = lock(&self.slot);
        // An init that completes after an abort hands back an aborted communicator.
        if let Ok(c) = &r {
            if self.abort.is_aborted() {
                c.abort();
            }
        }
        *s = Slot::Done(Box::new(r));
        self.done.notify_all();
    }
}

/// A communicator on its way. `state()` is `InProgress` until the creation finished; then
/// `take()` hands over the communicator (or the error). Dropping it while the creation runs
/// aborts the creation.
pub struct PendingComm {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for PendingComm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PendingComm({:?})", self.state())
    }
}

/// How the creation job runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launch {
    /// On the calling thread, now (or at the end of its group, concurrently with the group's
    /// other creations).
    Blocking,
    /// On a thread of its own, now.
    Background,
}

impl Launch {
    /// How a communicator whose config says `blocking` is created.
    pub(crate) fn for_blocking(blocking: bool) -> Launch {
        if blocking {
            Launch::Blocking
        } else {
            Launch::Background
        }
    }
}

impl PendingComm {
    /// Starts `job` (which receives the abort flag it must honour).
    pub(crate) fn start(
        launch: Launch,
        job: impl FnOnce(&AbortFlag) -> Result<Comm> + Send + 'static,
    ) -> Result<PendingComm> {
        let shared = Arc::new(Shared {
            slot: Mutex::new(Slot::Running),
            done: Condvar::new(),
            abort: AbortFlag::new(),
        });
        let s = shared.clone();
        let run = move || {
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| job(&s.abort)))
                .unwrap_or_else(|_| Err(Error::internal("communicator creation panicked")));
            let failed = r.as_ref().err().cloned();
            s.finish(r);
            failed
        };
        match launch {
            Launch::Blocking if group_scope::depth() > 0 => {
                group_scope::parallel(Box::new(move || match run() {
                    Some(e) => Err(e),
                    None => Ok(()),
                }))?;
            }
            Launch::Blocking => {
                run();
            }
            Launch::Background => {
                std::thread::Builder::new()
                    .name("nccl-comm-init".into())
                    .spawn(move || {
                        run();
                    })
                    .map_err(|e| {
                        Error::system(format!("cannot start a communicator init thread: {e}"))
                    })?;
            }
        }
        Ok(PendingComm { shared })
    }

    /// `InProgress` while running; then `Success`, or the code of the creation's error (the
    /// state stays once the result was taken).
    pub fn state(&self) -> NcclResult {
        match &*lock(&self.shared.slot) {
            Slot::Running => NcclResult::InProgress,
            Slot::Taken => NcclResult::Success,
            Slot::Done(r) => match &**r {
                Ok(_) => NcclResult::Success,
                Err(e) => e.code,
            },
        }
    }

    /// The result once the creation finished; None while it runs (or after it was taken).
    pub fn try_take(&self) -> Option<Result<Comm>> {
        let mut s = lock(&self.shared.slot);
        match &*s {
            Slot::Running | Slot::Taken => None,
            Slot::Done(_) => match std::mem::replace(&mut *s, Slot::Taken) {
                Slot::Done(r) => Some(*r),
                _ => None,
            },
        }
    }

    /// Waits for the creation to finish and hands over its result.
    pub fn wait(&self) -> Result<Comm> {
        let mut s = lock(&self.shared.slot);
        loop {
            match &*s {
                Slot::Running => {
                    s = self.shared.done.wait(s).unwrap_or_else(|p| p.into_inner());
                }
                Slot::Taken => {
                    return Err(Error::invalid_usage(
                        "the communicator was already taken from its pending handle",
                    ))
                }
                Slot::Done(_) => {
                    return match std::mem::replace(&mut *s, Slot::Taken) {
                        Slot::Done(r) => *r,
                        _ => Err(Error::internal("pending communicator slot changed")),
                    }
                }
            }
        }
    }

    /// Stops the creation promptly: it fails with an error (or, if it already completed, the
    /// communicator is aborted).
    pub fn abort(&self) {
        self.shared.abort.abort();
        if let Slot::Done(r) = &*lock(&self.shared.slot) {
            if let Ok(c) = &**r {
                c.abort();
            }
        }
    }
}

impl Drop for PendingComm {
    fn drop(&mut self) {
        if matches!(&*lock(&self.shared.slot), Slot::Running) {
            self.shared.abort.abort();
        }
    }
}
