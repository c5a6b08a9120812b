//! Copy-engine collectives (NCCL 2.28's `NCCL_CTA_POLICY_ZERO`): with the config's CTAPolicy
//! at zero, AllGather and AlltoAll whose receive buffers lie in a symmetric window run as copies
//! into the peers' windows on the copy engines: no collective kernel, only the one-CTA wait
//! kernel of the hand-overs (`onesided.rs` says why not a stream memory operation). The ranks hand over through the signal pads of `onesided.rs` (their collective
//! channel, apart from the user's signals):
//! 1. ready: each rank signals every peer once its stream reached the call (from then on the
//!    peers may write into its receive buffer), and waits for every peer's ready;
//! 2. each rank copies its block into every peer's receive buffer, at its own block, and
//!    signals that peer after the copy (fenced: the data lands first);
//! 3. its own block is a local copy; then it waits for every peer's data signal.
//!
//! All of it takes the call's place in the communicator's launch order. Every rank must take
//! this path or none: the choice rests on the communicator's CTAPolicy, the collective, and
//! the receive buffer lying in a symmetric window, which NCCL's contract for symmetric windows
//! makes alike on every rank (every rank passes the same offset of the same window). Calls
//! captured in a CUDA graph keep the kernels (the handshake's counts are taken when issued).

use super::config::CTA_POLICY_ZERO;
use super::group_scope::Job;
use super::onesided::Channel;
use super::Comm;
use crate::cuda::{DevPtr, StreamHandle};
use crate::error::Result;
use std::sync::atomic::Ordering;

/// The collectives the copy engines run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CopyColl {
    /// Every rank's `send` block to block `me` of every rank's `recv`.
    AllGather,
    /// Block `p` of `send` to block `me` of rank `p`'s `recv`.
    AllToAll,
}

impl Comm {
    /// The copy-engine form of `coll` from `send` into `recv` (blocks of `block` bytes on
    /// `stream`): a job for the group to issue, or None where the call keeps its kernels.
    pub(crate) fn copy_engine_job(
        &self,
        coll: CopyColl,
        send: DevPtr,
        recv: DevPtr,
        block: usize,
        stream: StreamHandle,
    ) -> Result<Option<Job>> {
        let n = self.nranks;
        if self.config().cta_policy != CTA_POLICY_ZERO || n < 2 || block == 0 {
            return Ok(None);
        }
        let Some(peers) = self.symmetric_peers_at(recv, n * block) else {
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
        let others = move || (0..n).filter(move |&p| p != me);
        let source = move |p: usize| match coll {
            CopyColl::AllGather => send,
            CopyColl::AllToAll => send + (p * block) as u64,
        };
        let at = (me * block) as u64;
        Ok(Some(Box::new(move || {
            order.launch(stream, || {
                let ch = Channel::Collective;
                let all: Vec<(usize, u64)> = others().map(|p| (p, 1)).collect();
                for p in others() {
                    signals.send(stream, p, ch)?;
                }
                signals.wait(stream, ch, &all)?;
                for p in others() {
                    device.copy_dtod_async(peers[p] + at, source(p), block, stream)?;
                    signals.send(stream, p, ch)?;
                }
                if source(me) != recv + at {
                    device.copy_dtod_async(recv + at, source(me), block, stream)?;
                }
                signals.wait(stream, ch, &all)
            })
        })))
    }
}
