//! The ranks of a run (one GPU's communicator, stream, buffers and events each), launching a
//! call on one or all of them with either library, and their teardown.

use crate::args::Mode;
use crate::baseline::{Nccl, NcclComm};
use crate::collective::{Call, Collective};
use nccl::cuda::DevBuffer;
use nccl::{Comm, Event, Stream};
use std::time::{Duration, Instant};

/// One GPU's communicator, stream, buffers and timing events.
pub struct Rank {
    /// The rank in the communicator (ranks of other processes are not in `Bench::ranks`).
    pub global: usize,
    pub comm: RankComm,
    pub stream: Stream,
    pub send: DevBuffer,
    pub recv: DevBuffer,
    /// One per iteration boundary: iters + 1.
    pub events: Vec<Event>,
}

/// A rank's communicator, which the timing loop lends to that rank's thread (`Comm` is `Send`
/// but not `Sync`).
pub struct RankComm(pub Comm);

// SAFETY: every field of a `Comm` is thread-safe; `Comm` withholds `Sync` only so that two
// threads never issue on one at once. In thread-per-rank timing each rank's communicator is
// used by its own thread only, and by the main thread only before and after those threads.
unsafe impl Sync for RankComm {}

impl std::ops::Deref for RankComm {
    type Target = Comm;
    fn deref(&self) -> &Comm {
        &self.0
    }
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
    /// This process's ranks: all of them, or one when each rank has its own process.
    pub ranks: Vec<Rank>,
    /// Ranks in the communicator.
    pub world: usize,
    pub mode: Mode,
    pub nccl: Option<(Nccl, Vec<NcclComm>)>,
    /// Host staging for checks, as large as the largest buffer.
    pub host: Vec<u8>,
}

impl Bench {
    /// Ranks in the communicator (in every process).
    pub fn nranks(&self) -> usize {
        self.world
    }

    /// Whether other processes hold ranks too (one rank per process).
    pub fn spread(&self) -> bool {
        self.world > self.ranks.len()
    }

    /// Makes `v` the element-wise `op` (max or sum) of every process's `v`, through an
    /// AllReduce of nccl-rs (a no-op when every rank is in this process).
    pub fn agree(&self, v: &mut [f64], op: nccl::ReduceOp) -> Result<(), String> {
        if !self.spread() || v.is_empty() {
            return Ok(());
        }
        let r = &self.ranks[0];
        let d = r.comm.device();
        let e = |what: &str, x: nccl::Error| format!("agreeing on results ({what}): {x}");
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        let buf = d.alloc(bytes.len()).map_err(|x| e("alloc", x))?;
        buf.write(0, &bytes).map_err(|x| e("copy in", x))?;
        unsafe {
            r.comm.all_reduce_raw(
                buf.ptr(),
                buf.ptr(),
                v.len(),
                nccl::DataType::Float64,
                op,
                r.stream.handle(),
            )
        }
        .map_err(|x| e("AllReduce", x))?;
        r.stream.synchronize().map_err(|x| e("sync", x))?;
        let mut out = vec![0u8; bytes.len()];
        buf.read(0, &mut out).map_err(|x| e("copy out", x))?;
        for (x, c) in v.iter_mut().zip(out.chunks_exact(8)) {
            *x = f64::from_le_bytes(c.try_into().expect("8 bytes"));
        }
        Ok(())
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
            let launched = (0..self.ranks.len()).try_for_each(|r| self.launch_one(lib, r, call));
            let ended = n.group_end();
            return launched.and(ended);
        }
        if call.coll == Collective::SendRecv {
            // One thread drives every rank: their connections are made together at the end.
            nccl::group_start();
            let launched = (0..self.ranks.len()).try_for_each(|r| self.launch_one(lib, r, call));
            let ended = nccl::group_end()
                .map(|_| ())
                .map_err(|e| format!("nccl-rs group: {e}"));
            return launched.and(ended);
        }
        (0..self.ranks.len()).try_for_each(|r| self.launch_one(lib, r, call))
    }

    /// Whether every stream drained within a few seconds (so buffers may be freed safely).
    pub fn quiesce(&self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        self.ranks.iter().all(|r| loop {
            match r.stream.is_idle() {
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
        // The ranks' events and streams are destroyed as they drop.
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}
