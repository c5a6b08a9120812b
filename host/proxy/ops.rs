//! The profiler's proxy events (`ProxyOp`, `ProxyStep`) of one network connection.
//!
//! Our proxy follows a connection's counters, not per-call operations, so the host tells it
//! what each launch will move: with a profiler plugin loaded, every launch that uses the
//! connection appends an [`Op`] to its [`OpQueue`] (the steps the kernel will take there, from
//! the launch's arguments: `nccl_device::coll::steps`), in launch order, whether or not the
//! call is profiled (an unprofiled one only keeps the count). The proxy thread then walks its
//! counters through the ops ([`OpTrack::sync`]): a step's event starts, changes state and
//! stops as the step passes three marks (a send: its slot free for the kernel, posted to the
//! network, completed; a receive: posted, landed and handed to the kernel, consumed), and an
//! op's event spans its steps. Where the queue does not yet cover a step (the host appends an
//! op just after its launch call returns) the walk waits for it.
//!
//! A launch captured into a CUDA graph moves steps at every replay, which the host does not
//! see: it marks the queue lost ([`OpQueue::lose`]), and the connection reports no more
//! proxy events. Without a plugin no queue exists and nothing here runs.

use crate::profiler::{CommProfiler, Event, ProxyOpDescr};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// A network connection's step counter as the host predicted it and as the kernels left it
/// (what the tests compare).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StepCount {
    pub channel: usize,
    pub peer: usize,
    pub send: bool,
    pub predicted: u64,
    pub taken: u64,
}

/// One launch's steps on a connection, as the host appends them.
pub(crate) struct Op {
    /// The connection's step counter where the launch's steps begin (Simple slices round it
    /// up), and how many it takes.
    pub first: u64,
    pub steps: u64,
    /// The plugin's context, the activation mask at the call, the parent (`Coll` or `P2p`)
    /// event and what the `ProxyOp` event says; None for an unprofiled launch.
    pub profiled: Option<(Arc<CommProfiler>, u64, Event, ProxyOpDescr)>,
}

/// The ops the host appended to one connection, and the counter after the last of them.
#[derive(Default)]
pub(crate) struct OpQueue {
    inner: Mutex<Queue>,
    lost: AtomicBool,
}

#[derive(Default)]
struct Queue {
    ops: VecDeque<Op>,
    /// The step counter after the last op appended (the kernels' counter, as the host
    /// predicts it).
    end: u64,
}

impl OpQueue {
    /// Appends a launch of `steps` steps, each `slots` FIFO slots (a Simple slice: the kernel
    /// first rounds the counter up to a multiple of it).
    pub(crate) fn append(
        &self,
        steps: u64,
        slots: u64,
        profiled: Option<(Arc<CommProfiler>, u64, Event, ProxyOpDescr)>,
    ) {
        if self.lost.load(Ordering::Relaxed) {
            return;
        }
        let Ok(mut q) = self.inner.lock() else { return };
        let first = q.end.next_multiple_of(slots.max(1));
        let steps = steps * slots.max(1);
        q.end = first + steps;
        if steps > 0 {
            q.ops.push_back(Op {
                first,
                steps,
                profiled,
            });
        }
    }

    /// The counters can no longer be predicted (a launch was captured into a graph, or one
    /// failed after some of its kernels may have been issued, or ran steps nothing counts):
    /// no more events on this connection.
    pub(crate) fn lose(&self) {
        if !self.lost.swap(true, Ordering::Relaxed) {
            log::info!(
                "PROFILER/Plugin: the steps of a network connection can no longer be \
                 predicted (a launch captured into a CUDA graph, a failed launch, or the \
                 one-node tree): its proxy events stop"
            );
        }
    }

    /// The step counter the kernels reach once every launch appended has run (None once
    /// the queue is lost).
    pub(crate) fn end(&self) -> Option<u64> {
        if self.lost.load(Ordering::Relaxed) {
            return None;
        }
        self.inner.lock().ok().map(|q| q.end)
    }

    fn pop(&self) -> Option<Op> {
        self.inner.lock().ok()?.ops.pop_front()
    }
}

/// The queues of this process's network connections, by the device address of each one's
/// tail counter (what the host finds in the connection's kernel structure).
fn registry() -> &'static Mutex<HashMap<u64, Weak<OpQueue>>> {
    static R: OnceLock<Mutex<HashMap<u64, Weak<OpQueue>>>> = OnceLock::new();
    R.get_or_init(Default::default)
}

/// The queue of the network connection whose tail counter is at `tail`, if it has one.
pub(crate) fn queue_of(tail: u64) -> Option<Arc<OpQueue>> {
    registry().lock().ok()?.get(&tail)?.upgrade()
}

/// An op whose events have started.
struct Live {
    op: Op,
    event: Event,
    /// Its steps' events, from its first step on.
    steps: VecDeque<Event>,
}

/// The proxy thread's walk of one connection through its queue's ops.
pub(crate) struct OpTrack {
    queue: Arc<OpQueue>,
    tail: u64,
    send: bool,
    live: VecDeque<Live>,
    /// The next step each mark reaches: started, changed state, stopped.
    at: [u64; 3],
}

impl OpTrack {
    /// A track for the connection whose tail counter is at `tail` (registered for the host to
    /// find), where a profiler plugin is loaded; None otherwise.
    pub(crate) fn new(tail: u64, send: bool) -> Option<OpTrack> {
        crate::profiler::loaded().then_some(())?;
        let queue = Arc::new(OpQueue::default());
        registry().lock().ok()?.insert(tail, Arc::downgrade(&queue));
        Some(OpTrack {
            queue,
            tail,
            send,
            live: VecDeque::new(),
            at: [0; 3],
        })
    }

    /// Moves the events up to the connection's counters: steps below `marks[0]` started,
    /// below `marks[1]` in their second state, below `marks[2]` done (`marks` falls).
    pub(crate) fn sync(&mut self, marks: [u64; 3]) {
        if self.queue.lost.load(Ordering::Relaxed) {
            if !self.live.is_empty() {
                self.stop_all();
            }
            return;
        }
        for (phase, &mark) in marks.iter().enumerate() {
            // A step passes a mark only after the ones before it: the counters may have run
            // ahead while the walk waited for the host's op.
            let mark = match phase {
                0 => mark,
                _ => mark.min(self.at[phase - 1]),
            };
            while self.at[phase] < mark {
                let s = self.at[phase];
                if !self.reach(s) {
                    break;
                }
                self.mark(phase, s);
                self.at[phase] += 1;
            }
        }
    }

    /// Makes sure the ops known reach past step `s` (taking more from the queue): false
    /// where the host has not appended the op of `s` yet.
    fn reach(&mut self, s: u64) -> bool {
        loop {
            if self
                .live
                .back()
                .is_some_and(|l| l.op.first + l.op.steps > s)
            {
                return true;
            }
            let Some(op) = self.queue.pop() else {
                return false;
            };
            self.live.push_back(Live {
                op,
                event: Event::NONE,
                steps: VecDeque::new(),
            });
        }
    }

    /// Step `s` reached mark `phase`.
    fn mark(&mut self, phase: usize, s: u64) {
        let send = self.send;
        let Some(i) = self
            .live
            .iter()
            .position(|l| l.op.first <= s && s < l.op.first + l.op.steps)
        else {
            // A step between ops (a slice's rounding), or of an op already gone.
            return;
        };
        let l = &mut self.live[i];
        let index = s - l.op.first;
        if let Some((prof, mask, parent, descr)) = &l.op.profiled {
            match phase {
                0 => {
                    if index == 0 {
                        l.event = prof.proxy_op(*mask, *parent, descr);
                    }
                    let e = prof.proxy_step(*mask, l.event, index);
                    let state = match send {
                        true => crate::profiler::STATE_STEP_SEND_GPU_WAIT,
                        false => crate::profiler::STATE_STEP_RECV_WAIT,
                    };
                    prof.record(e, state, None);
                    l.steps.push_back(e);
                }
                1 => {
                    let state = match send {
                        true => crate::profiler::STATE_STEP_SEND_WAIT,
                        false => crate::profiler::STATE_STEP_RECV_GPU_WAIT,
                    };
                    if let Some(&e) = l.steps.get(index as usize) {
                        prof.record(e, state, None);
                    }
                }
                _ => {
                    if let Some(&e) = l.steps.get(index as usize) {
                        prof.stop(e);
                    }
                    if index + 1 == l.op.steps {
                        prof.stop(l.event);
                    }
                }
            }
        }
        if phase == 2 && index + 1 == l.op.steps {
            self.live.remove(i);
        }
    }

    /// Stops every event still open (the connection goes, or its queue was lost).
    fn stop_all(&mut self) {
        for l in self.live.drain(..) {
            if let Some((prof, ..)) = &l.op.profiled {
                let started = (self.at[0].saturating_sub(l.op.first)).min(l.op.steps);
                let stopped = (self.at[2].saturating_sub(l.op.first)).min(l.op.steps);
                for e in l.steps.iter().skip(stopped as usize) {
                    prof.stop(*e);
                }
                if started > 0 {
                    prof.stop(l.event);
                }
            }
        }
    }
}

impl Drop for OpTrack {
    fn drop(&mut self) {
        self.stop_all();
        // Only our own entry: the address may already serve a connection made since.
        if let Ok(mut r) = registry().lock() {
            if r.get(&self.tail)
                .is_some_and(|w| std::ptr::eq(w.as_ptr(), Arc::as_ptr(&self.queue)))
            {
                r.remove(&self.tail);
            }
        }
    }
}
