//! The deterministic mode's resources (NCCL_RS_DETERMINISTIC, [`Config::deterministic`]): the
//! staging memory each piece of a ReduceScatter or Reduce lands in, a connection to every
//! other rank, made at creation, and the AllReduce's chain in rank order over them. Made here, where every rank runs on its own thread: a thread that drives several
//! ranks could not connect them later, one call after the other. The calls themselves are
//! composed in `enqueue/deterministic.rs`.
//!
//! [`Config::deterministic`]: super::Config::deterministic

use crate::bootstrap::Bootstrap;
use crate::cuda::{DevBuffer, Device};
use crate::error::{Error, Result};
use crate::transport::links::Links;
use crate::transport::Dir;
use nccl_device::abi::{TreeDev, MAX_CHANNELS};

/// A deterministic communicator's staging memory (a piece's blocks from every rank, then its
/// folded block) and its AllReduce chain.
pub(crate) struct Deterministic {
    pub scratch: DevBuffer,
    /// The chain in rank order as the tree kernel takes it: a [`TreeDev`] per CTA, each on
    /// its own connection of the links to the neighbours (`CollArgs::tree`).
    pub chain: DevBuffer,
    pub chain_ctas: usize,
    /// Bytes of one FIFO slot of those connections.
    pub chain_slot_bytes: usize,
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
    let (chain, chain_ctas) = chain(links, device, all.len())?;
    Ok(Some(Deterministic {
        scratch: device.alloc(bytes)?,
        chain,
        chain_ctas,
        chain_slot_bytes: links.slot_bytes,
    }))
}

/// The AllReduce's chain in rank order, one CTA per connection of the links to each
/// neighbour: rank `r`'s parent is `r + 1` (rank `n - 1` the root), its child `r - 1`. Up the
/// chain rank 0 sends its input and every rank adds its own to what arrives, so each element
/// is `post(((pre(x0) + pre(x1)) + pre(x2)) + …)`, the fold's order, in one fused pass; the
/// result comes back down. The tree kernel runs it (one child, one parent per place).
fn chain(links: &Links, device: &Device, n: usize) -> Result<(DevBuffer, usize)> {
    let me = links.rank();
    let ctas = links.nconns.clamp(1, MAX_CHANNELS);
    let mut places = vec![TreeDev::default(); ctas];
    for (c, t) in places.iter_mut().enumerate() {
        if me + 1 < n {
            t.up_send = links.conn(me + 1, Dir::Send, c)?;
            t.down_recv = links.conn(me + 1, Dir::Recv, c)?;
        }
        if me > 0 {
            t.nchildren = 1;
            t.up_recv[0] = links.conn(me - 1, Dir::Recv, c)?;
            t.down_send[0] = links.conn(me - 1, Dir::Send, c)?;
        }
    }
    let array = device.alloc(std::mem::size_of_val(places.as_slice()))?;
    array.write(0, super::as_bytes(&places))?;
    Ok((array, ctas))
}

impl super::Comm {
    /// The INFO line (subsystem TUNING) of a deterministic call of `bytes` per rank.
    pub(crate) fn log_deterministic(
        &self,
        coll: nccl_device::abi::Coll,
        bytes: usize,
        steps: usize,
    ) {
        let how = match coll {
            nccl_device::abi::Coll::AllReduce => "chain in rank order",
            nccl_device::abi::Coll::ReduceScatter => "exchange, fold in rank order",
            _ => "exchange, fold in rank order, gather",
        };
        log::info!(
            target: crate::debug::TUNING,
            "{}: {bytes} bytes per rank -> deterministic: {how}, {steps} steps",
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

    /// The deterministic AllReduce's chain (its [`TreeDev`] array, CTAs, slot bytes), where
    /// the mode is on.
    pub(crate) fn deterministic_chain(&self) -> Option<(crate::cuda::DevPtr, usize, usize)> {
        self.deterministic
            .as_ref()
            .map(|d| (d.chain.ptr, d.chain_ctas, d.chain_slot_bytes))
    }

    /// The deterministic mode's staging memory (address, bytes), where the mode is on.
    pub(crate) fn deterministic_scratch(&self) -> Option<(crate::cuda::DevPtr, usize)> {
        self.deterministic
            .as_ref()
            .map(|d| (d.scratch.ptr, d.scratch.bytes()))
    }
}
