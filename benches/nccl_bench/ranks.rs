//! The ranks of a run (one GPU's communicator, stream, buffers and events each), launching a
//! call on one or all of them with either library, and their teardown.

use crate::args::Mode;
use crate::baseline::{Nccl, NcclComm};
use crate::collective::{Call, Collective};
use nccl::cuda::{DevBuffer, StreamHandle};
use nccl::Comm;
use std::time::{Duration, Instant};

/// One GPU's communicator, stream, buffers and timing events.
pub struct Rank {
    pub comm: Comm,
    pub stream: StreamHandle,
    pub send: DevBuffer,
    pub recv: DevBuffer,
    /// One per iteration boundary: iters + 1.
    pub events: Vec<u64>,
}

/// Which library runs a measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lib {
    Ours,
    Nccl,
}

/// Everything a run measures with: the ranks, NVIDIA NCCL's communicators beside them, how the
/// GPUs are driven, and the host staging buffer of the checks.
pub struct Bench {
    pub ranks: Vec<Rank>,
    pub mode: Mode,
    pub nccl: Option<(Nccl, Vec<NcclComm>)>,
    /// Host staging for checks, as large as the largest buffer.
    pub host: Vec<u8>,
}

impl Bench {
    pub fn nranks(&self) -> usize {
        self.ranks.len()
    }

    /// Launches `call` on rank `r` only.
    pub fn launch_one(&self, lib: Lib, r: usize, call: &Call) -> Result<(), String> {
        let rank = &self.ranks[r];
        match (lib, &self.nccl) {
            (Lib::Ours, _) => call.coll.launch_ours(rank, call),
            (Lib::Nccl, Some((n, comms))) => call.coll.launch_nccl(n, comms[r], rank, call),
            (Lib::Nccl, None) => Err("no baseline library loaded".into()),
        }
    }

    /// Launches `call` on every rank from this thread (NVIDIA NCCL inside one group).
    pub fn launch_all(&self, lib: Lib, call: &Call) -> Result<(), String> {
        if lib == Lib::Nccl {
            let (n, _) = self.nccl.as_ref().ok_or("no baseline library loaded")?;
            n.group_start()?;
            let launched = (0..self.nranks()).try_for_each(|r| self.launch_one(lib, r, call));
            let ended = n.group_end();
            return launched.and(ended);
        }
        if call.coll == Collective::SendRecv {
            // One thread drives every rank: their connections are made together at the end.
            nccl::group_start();
            let launched = (0..self.nranks()).try_for_each(|r| self.launch_one(lib, r, call));
            let ended = nccl::group_end().map_err(|e| format!("nccl-rs group: {e}"));
            return launched.and(ended);
        }
        (0..self.nranks()).try_for_each(|r| self.launch_one(lib, r, call))
    }

    /// Whether every stream drained within a few seconds (so buffers may be freed safely).
    pub fn quiesce(&self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        self.ranks.iter().all(|r| loop {
            match r.comm.device().stream_query(r.stream) {
                Ok(true) => break true,
                Ok(false) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                _ => break false,
            }
        })
    }

    pub fn teardown(mut self) -> Result<(), String> {
        let mut first: Option<String> = None;
        if let Some((lib, comms)) = self.nccl.take() {
            for c in comms {
                if let Err(e) = lib.comm_destroy(c) {
                    first.get_or_insert(e);
                }
            }
        }
        for r in &self.ranks {
            let d = r.comm.device();
            for &ev in &r.events {
                if let Err(e) = d.event_destroy(ev) {
                    first.get_or_insert(format!("event destroy: {e}"));
                }
            }
            if let Err(e) = d.stream_destroy(r.stream) {
                first.get_or_insert(format!("stream destroy: {e}"));
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
