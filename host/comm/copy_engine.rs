//! Copy-engine collectives (NCCL 2.28's `NCCL_CTA_POLICY_ZERO`): with the config's CTAPolicy
//! at zero, AllGather, AlltoAll, Gather and Scatter whose windowed buffers lie in a symmetric
//! window run as copies on the copy engines: no collective kernel, only the one-CTA wait
//! kernel of the hand-overs (`onesided.rs` says why not a stream memory operation). The ranks
//! hand over through the signal pads of `onesided.rs` (their collective channel, apart from
//! the user's signals).
//!
//! AllGather and AlltoAll (the receive buffers in the window):
//! 1. ready: each rank signals every peer once its stream reached the call (from then on the
//!    peers may write into its receive buffer), and waits for every peer's ready;
//! 2. each rank copies its block into every peer's receive buffer, at its own block, and
//!    signals that peer after the copy (fenced: the data lands first);
//! 3. its own block is a local copy; then it waits for every peer's data signal.
//!
//! Gather and Scatter (every rank's own block in the window: Gather's send buffer, Scatter's
//! receive buffer; the root's whole buffer may lie anywhere on its device):
//! 1. ready: each rank but the root signals the root once its stream reached the call;
//! 2. the root waits for every ready, then copies every peer's block (Gather: out of the
//!    peer's send buffer; Scatter: into its receive buffer) and signals that peer after it;
//! 3. the root's own block is a local copy; each other rank waits for the root's signal, so
//!    its call ends once its block was read (Gather) or written (Scatter).
//!
//! All of it takes the call's place in the communicator's launch order. Every rank must take
//! this path or none: the choice rests on the communicator's CTAPolicy, the collective, and
//! the windowed buffer lying in a symmetric window, which NCCL's contract for symmetric windows
//! makes alike on every rank (every rank passes the same offset of the same window). Calls
//! captured in a CUDA graph keep the kernels (the handshake's counts are taken when issued).

use super::config::CTA_POLICY_ZERO;
use super::group_scope::Job;
use super::onesided::Channel;
use super::profile::{stream_ptr, Task};
use super::Comm;
use crate::cuda::{DevPtr, StreamHandle};
use crate::error::Result;
use crate::profiler::CeLaunch;
use std::ffi::c_void;
use std::sync::atomic::Ordering;

/// The collectives the copy engines run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CopyColl {
    /// Every rank's `send` block to block `me` of every rank's `recv`.
    AllGather,
    /// Block `p` of `send` to block `me` of rank `p`'s `recv`.
    AllToAll,
    /// Every rank's `send` block to block `me` of the root's `recv`.
    Gather { root: usize },
    /// Block `p` of the root's `send` to rank `p`'s `recv`.
    Scatter { root: usize },
}

impl CopyColl {
    /// Its name in profiler events (NCCL's function names).
    pub(crate) fn name(self) -> &'static std::ffi::CStr {
        match self {
            CopyColl::AllGather => c"AllGather",
            CopyColl::AllToAll => c"AlltoAll",
            CopyColl::Gather { .. } => c"Gather",
            CopyColl::Scatter { .. } => c"Scatter",
        }
    }

    /// The buffer that must lie in a symmetric window for the copy engines to take the call,
    /// and its bytes on every rank.
    fn windowed(self, send: DevPtr, recv: DevPtr, block: usize, n: usize) -> (DevPtr, usize) {
        match self {
            CopyColl::AllGather | CopyColl::AllToAll => (recv, n * block),
            CopyColl::Gather { .. } => (send, block),
            CopyColl::Scatter { .. } => (recv, block),
        }
    }
}

impl Comm {
    /// The copy-engine form of `coll` from `send` into `recv` (blocks of `block` bytes on
    /// `stream`): a job for the group to issue, or None where the call keeps its kernels.
    /// `task` gives the call's profiling, asked only once the copy engines take the call (a
    /// call that keeps its kernels profiles as they do).
    pub(crate) fn copy_engine_job(
        &self,
        coll: CopyColl,
        send: DevPtr,
        recv: DevPtr,
        block: usize,
        stream: StreamHandle,
        task: impl FnOnce() -> Option<Task>,
    ) -> Result<Option<Job>> {
        let n = self.nranks;
        if self.config().cta_policy != CTA_POLICY_ZERO || n < 2 || block == 0 {
            return Ok(None);
        }
        let (windowed, bytes) = coll.windowed(send, recv, block, n);
        let Some(peers) = self.symmetric_peers_at(windowed, bytes) else {
            return Ok(None);
        };
        let Some(signals) = self.windows.signals() else {
            return Ok(None);
        };
        if self.device.stream_capturing(stream)? {
            return Ok(None);
        }
        self.windows.copy_engine.fetch_add(1, Ordering::Relaxed);
        log::info!(
            target: crate::debug::TUNING,
            "{coll:?}: {block} bytes per rank -> copy engines (CTAPolicy zero)"
        );
        let (me, device, order) = (self.rank, self.device.clone(), self.order.clone());
        let ch = Channel::Collective;
        let others = move || (0..n).filter(move |&p| p != me);
        let at = move |r: usize| (r * block) as u64;
        // One copy of `block` bytes on the stream, unless it would copy a block onto itself.
        let copy = move |dst: DevPtr, src: DevPtr| match dst == src {
            true => Ok(()),
            false => device.copy_dtod_async(dst, src, block, stream),
        };
        let job: Job = match coll {
            CopyColl::AllGather | CopyColl::AllToAll => Box::new(move || {
                let source = |p: usize| match coll {
                    CopyColl::AllToAll => send + at(p),
                    _ => send,
                };
                order.launch(stream, || {
                    let all: Vec<(usize, u64)> = others().map(|p| (p, 1)).collect();
                    for p in others() {
                        signals.send(stream, p, ch)?;
                    }
                    signals.wait(stream, ch, &all)?;
                    for p in others() {
                        copy(peers[p] + at(me), source(p))?;
                        signals.send(stream, p, ch)?;
                    }
                    copy(recv + at(me), source(me))?;
                    signals.wait(stream, ch, &all)
                })
            }),
            CopyColl::Gather { root } | CopyColl::Scatter { root } => Box::new(move || {
                let gather = matches!(coll, CopyColl::Gather { .. });
                order.launch(stream, || {
                    if me != root {
                        signals.send(stream, root, ch)?;
                        return signals.wait(stream, ch, &[(root, 1)]);
                    }
                    let all: Vec<(usize, u64)> = others().map(|p| (p, 1)).collect();
                    signals.wait(stream, ch, &all)?;
                    for p in others() {
                        match gather {
                            true => copy(recv + at(p), peers[p])?,
                            false => copy(peers[p], send + at(p))?,
                        }
                        signals.send(stream, p, ch)?;
                    }
                    match gather {
                        true => copy(recv + at(me), send),
                        false => copy(recv, send + at(me)),
                    }
                })
            }),
        };
        let Some(task) = task() else {
            return Ok(Some(job));
        };
        // Profiled: the copies inside a CeColl event (AllGather and AlltoAll copy to every
        // peer; Gather and Scatter only at the root).
        let func = coll.name();
        let ops = match coll {
            CopyColl::Gather { root } | CopyColl::Scatter { root } if root != me => 0,
            _ => n,
        };
        let launch = CeLaunch {
            func,
            send: send as usize as *const c_void,
            recv: recv as usize as *mut c_void,
            bytes: block,
            stream: stream_ptr(stream),
        };
        Ok(Some(Box::new(move || {
            task.copy_engines(&launch, ops, ops * block, job)
        })))
    }
}
