//! GIN's proxy (the device API's puts and signals to ranks outside a kernel's LSA team): a
//! thread per device communicator reads the ops kernels post into its queue
//! (`nccl_device::abi::gin`, pinned host memory the GPU maps) in ticket order and hands each
//! to the communicator's network side (`onesided_net.rs`), which stages the source on this
//! thread's stream and sends it, the op's signal with its last chunk. An op is complete once
//! its last chunk was sent: its source was read, its counter is raised and `completed`
//! advances (in ticket order).
//!
//! A signal's value on the wire is the count of signals of that id this rank raised at the
//! peer (the thread counts them); the peer's network thread writes it into this rank's slot
//! of the id, after the put's data. An op a kernel wrote wrongly (a peer past the
//! communicator, an unknown kind) is the communicator's async error, as a peer's fault is.

use super::onesided::Signals;
use crate::cuda::{DevPtr, Device, HostFlag, HostMem, StreamHandle};
use crate::error::{Error, Result};
use crate::proxy::OnError;
use nccl_device::abi::gin::{GinOp, GinQueue, GIN_NONE, GIN_PUT, GIN_SIGNAL, GIN_SLOTS};
use nccl_device::abi::gin::{MAX_COUNTERS, MAX_SIGNALS};
use std::collections::VecDeque;
use std::mem::offset_of;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The channel code of GIN signal `id` on the wire (below it: the host API's channels).
pub(crate) const fn channel_of(id: u32) -> u64 {
    GIN_CHANNEL_BASE + id as u64
}
/// The first GIN channel code.
pub(crate) const GIN_CHANNEL_BASE: u64 = 16;

/// Ops in flight at once (posted to the network side, not yet complete).
const IN_FLIGHT: usize = 64;

/// A device communicator's GIN queue and the thread that carries it.
pub(crate) struct GinProxy {
    queue: Arc<HostMem>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl GinProxy {
    /// Starts the thread for a queue of its own; `signals` carries the ops (its network
    /// side), `abort` ends the thread.
    pub(crate) fn start(
        device: &Device,
        (rank, nranks): (usize, usize),
        signals: Arc<Signals>,
        abort: Arc<HostFlag>,
        on_error: OnError,
    ) -> Result<GinProxy> {
        if signals.remote().is_none() {
            return Err(Error::internal("GIN without a network side"));
        }
        let queue = Arc::new(device.alloc_host_mem(std::mem::size_of::<GinQueue>())?);
        let stream = device.stream_create()?;
        let stop = Arc::new(AtomicBool::new(false));
        let worker = Worker {
            device: device.clone(),
            queue: queue.clone(),
            stream,
            signals,
            abort,
            stop: stop.clone(),
            nranks,
            totals: vec![0; nranks * MAX_SIGNALS as usize],
            tail: 0,
            pending: VecDeque::new(),
        };
        let thread = std::thread::Builder::new()
            .name(format!("nccl-gin-{rank}"))
            .spawn(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker.run()));
                let e = match r {
                    Ok(Ok(())) => return,
                    Ok(Err(e)) => e,
                    Err(_) => Error::internal("the GIN proxy thread panicked"),
                };
                on_error(rank, e.context("the device API's GIN proxy"));
            })
            .map_err(|e| Error::system(format!("starting the GIN proxy thread: {e}")))?;
        Ok(GinProxy {
            queue,
            stop,
            thread: Some(thread),
        })
    }

    /// The queue's device address (`DevComm::gin`).
    pub(crate) fn queue_ptr(&self) -> DevPtr {
        self.queue.ptr
    }
}

impl Drop for GinProxy {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread's state.
struct Worker {
    device: Device,
    queue: Arc<HostMem>,
    /// Where sources are staged (the network side's copies).
    stream: StreamHandle,
    signals: Arc<Signals>,
    abort: Arc<HostFlag>,
    stop: Arc<AtomicBool>,
    nranks: usize,
    /// Per (peer, signal id): the signals raised there so far.
    totals: Vec<u64>,
    /// The next ticket to read.
    tail: u64,
    /// Ops handed to the network side, oldest first: (its `sent` target, counter id).
    pending: VecDeque<(u64, u32)>,
}

impl Worker {
    /// Until the device communicator goes (then the ops kernels posted before are carried
    /// first: its owner drained the kernels' streams before dropping it) or the communicator
    /// is aborted (then nothing more; the abort's cause is reported where it arose).
    fn run(mut self) -> Result<()> {
        crate::clock::fine_timer_slack();
        let mut nap = Duration::from_micros(1);
        let result = loop {
            if self.abort.is_raised() {
                break Ok(());
            }
            let stopping = self.stop.load(Ordering::Acquire);
            match self.progress() {
                Ok(true) => nap = Duration::from_micros(1),
                Ok(false) if stopping && self.drained()? => break Ok(()),
                // Kernels post without a doorbell: poll, backing off while idle.
                Ok(false) => {
                    std::thread::sleep(nap);
                    nap = (nap * 2).min(Duration::from_micros(20));
                }
                Err(_) if self.abort.is_raised() => break Ok(()),
                Err(e) => break Err(e),
            }
        };
        let _ = self.device.stream_sync(self.stream);
        let _ = self.device.stream_destroy(self.stream);
        result
    }

    /// Whether every op posted so far was carried and sent (no slot ready, none pending).
    fn drained(&self) -> Result<bool> {
        let at = (self.tail as usize % GIN_SLOTS) * std::mem::size_of::<GinOp>();
        Ok(self.pending.is_empty() && self.word(at)?.load(Ordering::Acquire) != self.tail + 1)
    }

    /// A word of the queue block, as the host sees it.
    fn word(&self, offset: usize) -> Result<&AtomicU64> {
        let p = self
            .queue
            .host_ptr(offset)
            .filter(|_| offset.is_multiple_of(8) && offset + 8 <= self.queue.bytes)
            .ok_or_else(|| Error::internal("GIN queue offset"))?;
        // SAFETY: an aligned u64 of the live mapping; the GPU reads and writes it with
        // system-scope loads and stores.
        Ok(unsafe { &*(p as *const AtomicU64) })
    }

    /// Completes what was sent, then takes new ops: whether anything moved.
    fn progress(&mut self) -> Result<bool> {
        let mut moved = false;
        let remote = self
            .signals
            .remote()
            .ok_or_else(|| Error::internal("no network side"))?;
        let sent = remote.sent();
        while let Some(&(target, counter)) = self.pending.front() {
            if sent < target {
                break;
            }
            self.pending.pop_front();
            if counter != GIN_NONE {
                let c = self.word(offset_of!(GinQueue, counters) + 8 * counter as usize)?;
                c.fetch_add(1, Ordering::Release);
            }
            self.word(offset_of!(GinQueue, completed))?
                .fetch_add(1, Ordering::Release);
            moved = true;
        }
        while self.pending.len() < IN_FLIGHT {
            let at = (self.tail as usize % GIN_SLOTS) * std::mem::size_of::<GinOp>();
            if self.word(at)?.load(Ordering::Acquire) != self.tail + 1 {
                break;
            }
            let src = self
                .queue
                .host_ptr(at)
                .ok_or_else(|| Error::internal("GIN slot"))?;
            // SAFETY: the slot's op, complete (its sequence number was released last) and not
            // written again until `consumed` passes it.
            let op = unsafe { std::ptr::read_volatile(src as *const GinOp) };
            self.tail += 1;
            self.word(offset_of!(GinQueue, consumed))?
                .store(self.tail, Ordering::Release);
            let target = self.carry(&op)?;
            self.pending.push_back((target, op.counter));
            moved = true;
        }
        Ok(moved)
    }

    /// Hands `op` to the network side; the `sent` value at which it is complete.
    fn carry(&mut self, op: &GinOp) -> Result<u64> {
        let peer = op.peer as usize;
        let bad = |what: String| Err(Error::invalid_usage(format!("a kernel posted {what}")));
        if peer >= self.nranks {
            return bad(format!("an op to rank {peer} of {}", self.nranks));
        }
        if op.signal != GIN_NONE && op.signal >= MAX_SIGNALS
            || op.counter != GIN_NONE && op.counter >= MAX_COUNTERS
        {
            return bad(format!("signal {} / counter {}", op.signal, op.counter));
        }
        let bytes = match op.kind {
            GIN_PUT => op.bytes as usize,
            GIN_SIGNAL => 0,
            k => return bad(format!("an op of kind {k}")),
        };
        let remote = self
            .signals
            .remote()
            .ok_or_else(|| Error::internal("no network side"))?;
        // Windows are symmetric: the peer's part is as large as this rank's.
        match remote.window_bytes(op.win) {
            Some(size)
                if op
                    .offset
                    .checked_add(bytes as u64)
                    .is_some_and(|end| end <= size) => {}
            Some(size) => {
                return bad(format!(
                    "a put of {bytes} bytes at offset {} of window {:#x} ({size} bytes)",
                    op.offset, op.win
                ))
            }
            None if bytes == 0 => {}
            None => return bad(format!("a put into window {:#x}, not registered", op.win)),
        }
        let (channel, value) = match op.signal {
            GIN_NONE => (channel_of(0), 0),
            id => {
                let t = &mut self.totals[peer * MAX_SIGNALS as usize + id as usize];
                *t += 1;
                (channel_of(id), *t)
            }
        };
        let remote = self
            .signals
            .remote()
            .ok_or_else(|| Error::internal("no network side"))?;
        // A staging slot is reused once the chunk in it was sent: the thread waits for that
        // here (the network side's thread sends meanwhile).
        let wait = |_: StreamHandle, _: DevPtr, v: u64| -> Result<()> {
            let mut spins = 0u32;
            while remote.sent() < v {
                // (A drop lets the thread finish what was posted: only an abort ends this.)
                if self.abort.is_raised() {
                    return Err(Error::invalid_usage("the communicator was aborted"));
                }
                spins += 1;
                match spins < 1000 {
                    true => std::hint::spin_loop(),
                    false => std::thread::yield_now(),
                }
            }
            Ok(())
        };
        remote.stage(
            self.stream,
            (op.src, bytes),
            peer,
            (op.win, op.offset as usize),
            (channel, value),
            &wait,
        )
    }
}
