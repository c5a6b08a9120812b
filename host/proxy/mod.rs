//! Proxy threads: one per process and GPU, progressing the connections the GPU cannot drive
//! alone (the network). Each connection is a FIFO of NCCL_STEPS slots in pinned host memory
//! mapped into the device, with counters the kernel and the proxy share:
//!
//! - send: the kernel fills slot `s`, writes its byte count to `sizes[s % 8]` and publishes
//!   `tail = s + 1`; the proxy posts the network send of that slot and, once it completed,
//!   returns the slot by publishing `head`;
//! - receive: the proxy keeps a receive posted into every slot the kernel has consumed (`head`,
//!   published by the kernel) and publishes `tail` once a step's bytes landed whole (a Simple
//!   step in GPU memory flushed first). Connections that share a network comm post only the
//!   steps their kernels await, grouped across connections (`shared`).
//!
//! The thread sleeps when nothing moves: launches kick it ([`Proxy::kick`]), the network wakes it
//! when a transfer completes, and without either it polls at a falling rate, so an idle proxy
//! costs next to no CPU. A launch captured into a CUDA graph kicks it once, at capture, and
//! never at its replays: once one was captured, an idle proxy naps at most [`REPLAY_NAP`]. A
//! connection that fails reports once through its error callback (the communicator's async
//! error and kernel abort flag) and is then left alone.

mod conn;
pub(crate) mod establish;
pub(crate) mod ops;
pub(crate) mod shared;
pub(crate) mod timeline;

use conn::Poll;
pub(crate) use conn::{ConnLayout, ConnMem, FifoPlace};
pub(crate) use establish::ProxyConn;

use crate::error::Error;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Called once when a connection fails, with the peer rank at its other end: the communicator
/// raises its async error and abort flag, and tells the other ranks.
pub(crate) type OnError = Arc<dyn Fn(usize, Error) + Send + Sync>;

/// A group of connections that belong together (one communicator's): removed together.
pub(crate) type GroupId = u64;

type Conns = Vec<(GroupId, ProxyConn, OnError)>;

/// What the thread and its users share. The connections' lock is held while the thread
/// progresses them, and progress can call the network's waker (a socket that fails wakes its
/// owner), so waking must never take that lock: it has its own bell.
struct Shared {
    conns: Mutex<Conns>,
    /// Kicks and network wake-ups since the thread last looked.
    woken: AtomicBool,
    /// A launch that needs the thread was captured into a graph (`Proxy::serve_replays`).
    replays: AtomicBool,
    stop: AtomicBool,
    /// Guards the sleep on `cv` against a wake-up lost between the check and the wait.
    bell: Mutex<()>,
    cv: Condvar,
}

impl Shared {
    fn ring(&self) {
        self.woken.store(true, Ordering::Release);
        let _bell = lock(&self.bell);
        self.cv.notify_one();
    }
}

/// The proxy thread of one GPU in this process.
pub(crate) struct Proxy {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    next_group: AtomicU64,
}

/// Keeps progressing for this long after the last progress or kick, then sleeps.
const HOT: Duration = Duration::from_millis(50);
/// Longest sleep of an idle proxy between polls of its connections.
const MAX_NAP: Duration = Duration::from_millis(64);
/// Longest sleep while a connection's handshake is under way (`establish`): its peer waits.
const HANDSHAKE_NAP: Duration = Duration::from_micros(200);
/// Longest sleep once a launch was captured into a CUDA graph: a replay does not kick the
/// thread, so its first step waits for the next poll. On the simulator (2 cores) a replay
/// after 300 ms idle took 46-48 ms with the long naps (2 x 1, an 8-byte AllReduce; direct calls
/// 0.4-2.7 ms), and `graphs_replay_across_nodes`' replays after 150 ms idle 95-176 ms (direct
/// runs 44-58); with this cap 29-52 (direct 23-46). Each poll costs the idle thread a few
/// microseconds of CPU.
pub(crate) const REPLAY_NAP: Duration = Duration::from_millis(1);

fn registry() -> &'static Mutex<HashMap<i32, Weak<Proxy>>> {
    static R: std::sync::OnceLock<Mutex<HashMap<i32, Weak<Proxy>>>> = std::sync::OnceLock::new();
    R.get_or_init(Default::default)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Proxy {
    /// The proxy of GPU `device` in this process, started on first use and stopped when the
    /// last communicator holding it lets go.
    pub(crate) fn for_device(device: i32) -> Arc<Proxy> {
        let mut reg = lock(registry());
        if let Some(p) = reg.get(&device).and_then(Weak::upgrade) {
            return p;
        }
        let shared = Arc::new(Shared {
            conns: Mutex::new(Vec::new()),
            woken: AtomicBool::new(false),
            replays: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            bell: Mutex::new(()),
            cv: Condvar::new(),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("nccl-proxy-{device}"))
            .spawn(move || {
                crate::debug::set_cuda_dev(device);
                // The thread runs with its GPU current, as NCCL's proxy thread does
                // (cudaSetDevice): network plugins that take CUDA pointers may call the CUDA
                // driver from isend, irecv, test and iflush, and the driver works on the
                // calling thread's current context.
                match crate::cuda::Device::open(device).and_then(|d| d.make_current()) {
                    Ok(()) => {}
                    Err(e) => log::warn!("proxy thread of GPU {device}: its context: {e}"),
                }
                run(&s)
            })
            .ok();
        let p = Arc::new(Proxy {
            shared,
            thread: Mutex::new(thread),
            next_group: AtomicU64::new(1),
        });
        reg.insert(device, Arc::downgrade(&p));
        p
    }

    pub(crate) fn new_group(&self) -> GroupId {
        self.next_group.fetch_add(1, Ordering::Relaxed)
    }

    /// Hands connections to the thread.
    pub(crate) fn add(&self, group: GroupId, conns: Vec<ProxyConn>, on_error: OnError) {
        let waker = self.waker();
        {
            let mut all = lock(&self.shared.conns);
            for mut c in conns {
                c.set_waker(waker.clone());
                all.push((group, c, on_error.clone()));
            }
        }
        self.shared.ring();
    }

    /// Waits until the group's sending connections have sent every step their kernels
    /// published (a communicator destroyed right after its last collective must not cut its
    /// peers' data short), or until `limit`; false on timeout.
    pub(crate) fn drain(&self, group: GroupId, limit: Duration) -> bool {
        let t0 = Instant::now();
        loop {
            let done = lock(&self.shared.conns)
                .iter()
                .filter(|(g, _, _)| *g == group)
                .all(|(_, c, _)| c.drained());
            if done {
                return true;
            }
            if t0.elapsed() > limit {
                return false;
            }
            self.kick();
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Drops a group's connections (their network endpoints close, their memory is freed).
    pub(crate) fn remove(&self, group: GroupId) {
        let gone: Vec<_> = {
            let mut all = lock(&self.shared.conns);
            let (gone, kept) = std::mem::take(&mut *all)
                .into_iter()
                .partition(|(g, _, _)| *g == group);
            *all = kept;
            gone
        };
        drop(gone);
    }

    /// Work is coming (a launch that uses proxied connections): progress at full speed.
    pub(crate) fn kick(&self) {
        self.shared.ring();
    }

    /// A launch that needs the thread went into a CUDA graph, whose replays will not kick it:
    /// from now on it naps at most [`REPLAY_NAP`].
    pub(crate) fn serve_replays(&self) {
        self.shared.replays.store(true, Ordering::Relaxed);
    }

    /// The longest nap the thread takes now.
    pub(crate) fn max_nap(&self) -> Duration {
        max_nap(&self.shared)
    }

    fn waker(&self) -> crate::net::Waker {
        let s = Arc::downgrade(&self.shared);
        Arc::new(move || {
            if let Some(s) = s.upgrade() {
                s.ring();
            }
        })
    }
}

/// A communicator's hold on the proxy of its GPU: its group of connections, removed (closed and
/// freed) when the hold is dropped.
pub(crate) struct ProxyGroup {
    proxy: Arc<Proxy>,
    group: GroupId,
    on_error: OnError,
    /// Set by an abort: the connections close without sending what is left.
    abandoned: AtomicBool,
}

/// How long a communicator's destruction waits for its proxy to send what its kernels left.
const DRAIN_LIMIT: Duration = Duration::from_secs(10);

impl ProxyGroup {
    pub(crate) fn new(device: i32, on_error: OnError) -> ProxyGroup {
        let proxy = Proxy::for_device(device);
        let group = proxy.new_group();
        ProxyGroup {
            proxy,
            group,
            on_error,
            abandoned: AtomicBool::new(false),
        }
    }

    /// Where its connections' errors go.
    pub(crate) fn on_error(&self) -> OnError {
        self.on_error.clone()
    }

    /// The communicator was aborted: do not wait for its sends when it goes.
    pub(crate) fn abandon(&self) {
        self.abandoned.store(true, Ordering::Relaxed);
    }

    pub(crate) fn add(&self, conns: Vec<ProxyConn>) {
        if !conns.is_empty() {
            self.proxy.add(self.group, conns, self.on_error.clone());
        }
    }

    pub(crate) fn kick(&self) {
        self.proxy.kick();
    }

    /// [`Proxy::serve_replays`].
    pub(crate) fn serve_replays(&self) {
        self.proxy.serve_replays();
    }

    /// [`Proxy::max_nap`].
    pub(crate) fn max_nap(&self) -> Duration {
        self.proxy.max_nap()
    }
}

impl Drop for ProxyGroup {
    fn drop(&mut self) {
        if !self.abandoned.load(Ordering::Relaxed) && !self.proxy.drain(self.group, DRAIN_LIMIT) {
            log::warn!(
                "network sends still pending after {} s; closing the connections",
                DRAIN_LIMIT.as_secs()
            );
        }
        self.proxy.remove(self.group);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.ring();
        if let Some(t) = lock(&self.thread).take() {
            let _ = t.join();
        }
        timeline::flush();
    }
}

fn max_nap(shared: &Shared) -> Duration {
    match shared.replays.load(Ordering::Relaxed) {
        true => REPLAY_NAP,
        false => MAX_NAP,
    }
}

fn run(shared: &Shared) {
    let mut last_busy = Instant::now();
    let mut nap = Duration::from_micros(100);
    // The connection whose turn it is to be tested although idle: one per pass, so a pass costs
    // the connections in use plus one, and an idle one is still looked at every few passes.
    let mut turn = 0usize;
    while !shared.stop.load(Ordering::Acquire) {
        if shared.woken.swap(false, Ordering::AcqRel) {
            last_busy = Instant::now();
        }
        let mut moved = false;
        let mut conns = lock(&shared.conns);
        // Receives are posted for every connection first: a network comm that several share
        // then groups their awaited steps (shared.rs) before any completes.
        for (_, c, on_error) in conns.iter_mut() {
            match c.post() {
                Ok(m) => moved |= m,
                Err(e) => on_error(c.peer_rank(), e),
            }
        }
        let now = Instant::now();
        // After a nap every connection is tested: that pass is rare.
        let napped = now.saturating_duration_since(last_busy) >= HOT;
        turn = if turn + 1 < conns.len() { turn + 1 } else { 0 };
        let mut handshaking = false;
        for (k, (_, c, on_error)) in conns.iter_mut().enumerate() {
            let poll = match napped || k == turn {
                true => Poll::Always,
                false => Poll::IfActive(now),
            };
            match c.progress(poll) {
                Ok(m) => moved |= m,
                Err(e) => on_error(c.peer_rank(), e),
            }
            handshaking |= c.is_coming();
        }
        drop(conns);
        if moved {
            last_busy = Instant::now();
            nap = Duration::from_micros(100);
        }
        if last_busy.elapsed() < HOT {
            std::thread::yield_now();
            continue;
        }
        // Idle: sleep until kicked or woken, or for a nap that doubles up to MAX_NAP.
        let bell = lock(&shared.bell);
        let _ = shared
            .cv
            .wait_timeout_while(bell, nap, |_| {
                !shared.woken.load(Ordering::Acquire) && !shared.stop.load(Ordering::Acquire)
            })
            .unwrap_or_else(|p| p.into_inner());
        nap = if shared.woken.load(Ordering::Acquire) {
            Duration::from_micros(100)
        } else if handshaking {
            HANDSHAKE_NAP
        } else {
            (nap * 2).min(max_nap(shared))
        };
    }
}
