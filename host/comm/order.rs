//! One communicator's launches run one after another, whatever streams they are issued on: its
//! kernels share step counters and FIFOs. After every launch an event this type owns is
//! recorded on the launch's stream; the next launch on another stream waits for it first, and
//! finalize/destroy wait for it to know the communicator's work is done — without ever touching
//! a user's stream after the call that used it (the user may have destroyed it since).
//!
//! A launch into a stream that is capturing a CUDA graph waits for and records the same event
//! through the graph's external event nodes (CU_EVENT_WAIT_EXTERNAL / RECORD_EXTERNAL): each
//! replay waits for the communicator's latest launch, direct or replayed, and records the
//! event for the next. An ordinary wait or record inside a capture would not do: CUDA forbids
//! a capture to wait for an event recorded outside it, and an event recorded inside one cannot
//! be waited for outside. Replays run on streams the communicator never sees, so once it has
//! been captured every direct launch waits for the event. The streams of one launch must all
//! be capturing or none (InvalidUsage otherwise).
//!
//! It also knows whether a non-blocking group is still issuing the communicator's work on a
//! background thread (`ncclGroupEnd` returned `ncclInProgress`), and how that ended.
//!
//! The communicator owns one (created at init, waited for by finalize, destroy and abort);
//! the enqueue layer launches through it.

use crate::cuda::{Device, Fence, StreamHandle};
use crate::error::{Error, Result};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};

/// The background issue of a non-blocking group, as one communicator sees it.
#[derive(Clone, Debug)]
enum BgState {
    /// Nothing in flight; the last background group (if any) issued everything.
    Idle,
    /// A background thread is still issuing work.
    Running,
    /// The last background group failed; the communicator keeps reporting it.
    Failed(Error),
}

/// Whether a non-blocking group is issuing a communicator's work on a background thread.
pub struct Background {
    state: Mutex<BgState>,
    /// Whether `state` is Idle, written under its lock: every call asks, and the common answer
    /// then takes no lock.
    idle: AtomicBool,
    done: Condvar,
}

impl Default for Background {
    fn default() -> Self {
        Background {
            state: Mutex::new(BgState::Idle),
            idle: AtomicBool::new(true),
            done: Condvar::new(),
        }
    }
}

impl Background {
    fn lock(&self) -> MutexGuard<'_, BgState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A non-blocking group starts issuing the communicator's work in the background.
    pub(crate) fn begin(&self) {
        let mut b = self.lock();
        *b = BgState::Running;
        self.idle.store(false, Ordering::Release);
    }

    /// The background group finished issuing, with `r`. An error stays the communicator's
    /// state, as NCCL keeps a group's failure as the communicator's async error.
    pub(crate) fn end(&self, r: &Result<()>) {
        let mut b = self.lock();
        *b = match r {
            Ok(()) => BgState::Idle,
            Err(e) => BgState::Failed(e.clone()),
        };
        self.idle.store(r.is_ok(), Ordering::Release);
        drop(b);
        self.done.notify_all();
    }

    /// Ok when no background group runs or failed; `InProgress` while one runs; else the
    /// error it ended with.
    pub fn state(&self) -> Result<()> {
        if self.idle.load(Ordering::Acquire) {
            return Ok(());
        }
        match &*self.lock() {
            BgState::Idle => Ok(()),
            BgState::Running => Err(Error::in_progress(
                "a non-blocking group is still issuing this communicator's operations",
            )),
            BgState::Failed(e) => Err(e.clone()),
        }
    }

    /// Waits until no background group runs; then as [`Background::state`].
    pub fn wait(&self) -> Result<()> {
        let mut b = self.lock();
        while matches!(&*b, BgState::Running) {
            b = self.done.wait(b).unwrap_or_else(|p| p.into_inner());
        }
        drop(b);
        self.state()
    }
}

/// The last launch as the host knows it.
#[derive(Default)]
struct Last {
    /// Its stream, when no graph replay may have come after it.
    stream: Option<StreamHandle>,
    /// The event recorded after every launch (created on first use).
    done: Option<u64>,
    /// A launch was captured: a replay may record `done` on any stream at any time.
    captured: bool,
    /// A stream of our own for [`StreamOrder::fence`] (made on first use).
    fences: Option<StreamHandle>,
}

/// Keeps one communicator's launches in issue order across the streams it is given.
pub struct StreamOrder {
    device: Device,
    last: Mutex<Last>,
    /// A non-blocking group issuing this communicator's work on another thread.
    pub(crate) background: Background,
}

impl StreamOrder {
    /// The order of a communicator on `device`, with nothing issued yet.
    pub fn new(device: Device) -> StreamOrder {
        StreamOrder {
            device,
            last: Mutex::new(Last::default()),
            background: Background::default(),
        }
    }

    /// Whether a launch of this communicator was ever captured into a CUDA graph (its replays
    /// may then run at any time).
    pub fn captured(&self) -> bool {
        self.last.lock().map_or(true, |l| l.captured)
    }

    /// Runs `launch` on `stream` after everything this communicator launched before.
    pub fn launch(&self, stream: StreamHandle, launch: impl FnOnce() -> Result<()>) -> Result<()> {
        self.launch_joined(stream, &[], launch)
    }

    /// Runs `launch` on `main` after everything this communicator launched before and after
    /// the work already queued on each of `others`; later work on `others` waits for it. This
    /// is how one group's operations issued on several streams become one launch sequence
    /// (NCCL: "as if the group was posted on every stream").
    pub fn launch_joined(
        &self,
        main: StreamHandle,
        others: &[StreamHandle],
        launch: impl FnOnce() -> Result<()>,
    ) -> Result<()> {
        let mut last = self
            .last
            .lock()
            .map_err(|_| Error::internal("launch order poisoned"))?;
        let capturing = self.device.stream_capturing(main)?;
        for &s in others.iter().filter(|&&s| s != main) {
            if self.device.stream_capturing(s)? != capturing {
                return Err(Error::invalid_usage(
                    "one group mixes streams capturing a CUDA graph with streams that are not",
                ));
            }
        }
        let done = match last.done {
            Some(e) => e,
            None => {
                let e = self.device.event_create_untimed()?;
                last.done = Some(e);
                e
            }
        };
        if capturing {
            self.device.stream_wait_event_external(main, done)?;
            join(&self.device, main, others, launch)?;
            self.device.event_record_external(done, main)?;
            last.captured = true;
            last.stream = None;
            return Ok(());
        }
        if last.captured || last.stream.is_some_and(|p| p != main) {
            self.device.stream_wait_event(main, done)?;
        }
        // A launch that failed part-way (a group of several kernels) may have issued some:
        // the event is recorded after them all the same, so that what waits for it (a later
        // launch, a fence, destroy) waits for them too.
        let launched = join(&self.device, main, others, launch);
        self.device.event_record(done, main)?;
        last.stream = Some(main);
        launched
    }

    /// Whether everything launched so far has finished, without waiting (None: cannot tell,
    /// as after a graph capture, or while a launch holds the order).
    pub(crate) fn finished(&self) -> Option<bool> {
        let last = self.last.try_lock().ok()?;
        if last.captured {
            return None;
        }
        match last.done {
            // Asked from other threads (RAS, the hang watch), perhaps while the user's
            // stream captures in CUDA's global mode, which a query would invalidate.
            Some(e) => {
                let _relaxed = self.device.relaxed_capture();
                self.device.event_query(e).ok()
            }
            None => Some(true),
        }
    }

    /// A fence behind everything launched so far (graph replays as far as they were launched),
    /// or None when nothing was ever launched. It waits on a stream of the order's own for
    /// the latest launch's event, so no user stream is touched after its call.
    pub fn fence(&self) -> Result<Option<Fence>> {
        let mut last = self
            .last
            .lock()
            .map_err(|_| Error::internal("launch order poisoned"))?;
        let Some(done) = last.done else {
            return Ok(None);
        };
        let s = match last.fences {
            Some(s) => s,
            None => *last.fences.insert(self.device.stream_create()?),
        };
        self.device.stream_wait_event(s, done)?;
        let fence = Fence {
            device: self.device.clone(),
            event: self.device.event_create_untimed()?,
        };
        self.device.event_record(fence.event, s)?;
        Ok(Some(fence))
    }

    /// Waits until everything launched so far has finished (a non-blocking group still being
    /// issued in the background included).
    pub fn wait_idle(&self) -> Result<()> {
        let _ = self.background.wait();
        let last = self
            .last
            .lock()
            .map_err(|_| Error::internal("launch order poisoned"))?;
        match last.done {
            Some(e) => self.device.event_sync(e),
            None => Ok(()),
        }
    }
}

impl Drop for StreamOrder {
    fn drop(&mut self) {
        if let Ok(last) = self.last.lock() {
            if let Some(e) = last.done {
                let _ = self.device.event_sync(e);
                let _ = self.device.event_destroy(e);
            }
            // Fences recorded on it may outlive it: an event outlives its stream.
            if let Some(s) = last.fences {
                let _ = self.device.stream_destroy(s);
            }
        }
    }
}

/// Runs `launch` on `main` after the work queued on each of `others`; later work on `others`
/// waits for it (one event per join, recorded on the stream it joins from: inside a capture,
/// the fork/join CUDA expects).
fn join(
    device: &Device,
    main: StreamHandle,
    others: &[StreamHandle],
    launch: impl FnOnce() -> Result<()>,
) -> Result<()> {
    let others: Vec<StreamHandle> = others.iter().copied().filter(|&s| s != main).collect();
    for &s in &others {
        // Destroying an event after the wait is queued is fine (the wait keeps what it
        // needs, in CUDA as in the simulator).
        link(device, s, main)?;
    }
    launch()?;
    for &s in &others {
        link(device, main, s)?;
    }
    Ok(())
}

/// Work queued on `to` from now on waits for the work queued on `from` so far.
fn link(device: &Device, from: StreamHandle, to: StreamHandle) -> Result<()> {
    let e = device.event_create_untimed()?;
    let r = device
        .event_record(e, from)
        .and_then(|()| device.stream_wait_event(to, e));
    let _ = device.event_destroy(e);
    r
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::NcclResult;

    #[test]
    fn background_state_follows_the_group() {
        let b = Background::default();
        assert!(b.state().is_ok());
        b.begin();
        assert_eq!(b.state().unwrap_err().code, NcclResult::InProgress);
        std::thread::scope(|s| {
            s.spawn(|| {
                std::thread::sleep(std::time::Duration::from_millis(20));
                b.end(&Ok(()));
            });
            assert!(b.wait().is_ok(), "wait returns once the group issued");
        });
        b.begin();
        b.end(&Err(Error::remote("peer gone")));
        assert_eq!(b.wait().unwrap_err().code, NcclResult::RemoteError);
        assert_eq!(b.state().unwrap_err().code, NcclResult::RemoteError);
    }
}
