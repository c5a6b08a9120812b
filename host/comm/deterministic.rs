//! The deterministic mode's resources (NCCL_RS_DETERMINISTIC, [`Config::deterministic`]): the
//! staging memory each piece of a call lands in, and a connection to every other rank, made at
//! creation. Made here, where every rank runs on its own thread: a thread that drives several
//! ranks could not connect them later, one call after the other. The calls themselves are
//! composed in `enqueue/deterministic.rs`.
//!
//! [`Config::deterministic`]: super::Config::deterministic

use crate::bootstrap::Bootstrap;
use crate::cuda::{DevBuffer, Device};
use crate::error::{Error, Result};
use crate::transport::links::Links;
use crate::transport::Dir;

/// A deterministic communicator's staging memory: a piece's blocks from every rank, then
/// its folded block.
pub(crate) struct Deterministic {
    pub scratch: DevBuffer,
}

/// Agrees that every rank asked alike (`scratch`: this rank's staging bytes, None when off),
/// then, when on, connects this rank to every other both ways and allocates the staging.
pub(super) fn setup(
    bootstrap: &Bootstrap,
    device: &Device,
    links: &Links,
    scratch: Option<usize>,
) -> Result<Option<Deterministic>> {
    let mine = scratch.map_or(0u64, |b| b as u64).to_le_bytes();
    let all = bootstrap.allgather(&mine)?;
    if let Some((q, theirs)) = all.iter().enumerate().find(|(_, t)| **t != mine) {
        let theirs = u64::from_le_bytes(theirs.as_slice().try_into().unwrap_or_default());
        let say = |b: u64| match b {
            0 => "off".to_string(),
            b => format!("on with {b} bytes of scratch"),
        };
        return Err(Error::invalid_usage(format!(
            "NCCL_RS_DETERMINISTIC differs between ranks: {} here, {} on rank {q} (set it, \
             and NCCL_RS_DETERMINISTIC_SCRATCH, alike on every rank)",
            say(u64::from_le_bytes(mine)),
            say(theirs)
        )));
    }
    let Some(bytes) = scratch else {
        return Ok(None);
    };
    let me = links.rank();
    let needs: Vec<(usize, Dir)> = (0..all.len())
        .filter(|&q| q != me)
        .flat_map(|q| [(q, Dir::Send), (q, Dir::Recv)])
        .collect();
    let started = links.start(&needs)?;
    links.finish(started)?;
    // At least a 16-byte pack for each rank's staged block and the folded one.
    let bytes = bytes.max((all.len() + 1) * 16);
    Ok(Some(Deterministic {
        scratch: device.alloc(bytes)?,
    }))
}

impl super::Comm {
    /// The INFO line (subsystem TUNING) of a deterministic call of `bytes` per rank.
    pub(crate) fn log_deterministic(
        &self,
        coll: nccl_device::abi::Coll,
        bytes: usize,
        steps: usize,
    ) {
        let gather = match coll {
            nccl_device::abi::Coll::ReduceScatter => "",
            _ => ", gather",
        };
        log::info!(
            target: crate::debug::TUNING,
            "{}: {bytes} bytes per rank -> deterministic: exchange, fold in rank order{gather}, \
             {steps} steps",
            coll.name()
        );
    }

    /// Registers the staging memory with this communicator, as `ncclCommRegister` does (peers
    /// in other processes get its records): the exchange's senders then write straight into
    /// it where they reach it (NCCL_LOCAL_REGISTER), one copy instead of two through the
    /// FIFOs. A receive offers its part only once its kernel runs, after the fold that read
    /// the part before it (stream order), so no sender overwrites staging still being read.
    pub(super) fn register_deterministic_scratch(&self) -> Result<()> {
        if let Some(d) = &self.deterministic {
            self.register_ptr(d.scratch.ptr, d.scratch.bytes())?;
        }
        Ok(())
    }

    /// The deterministic mode's staging memory (address, bytes), where the mode is on.
    pub(crate) fn deterministic_scratch(&self) -> Option<(crate::cuda::DevPtr, usize)> {
        self.deterministic
            .as_ref()
            .map(|d| (d.scratch.ptr, d.scratch.bytes()))
    }
}
