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
    /// its own connection of `chain_links` (`CollArgs::tree`).
    pub chain: DevBuffer,
    pub chain_ctas: usize,
    /// Bytes of one FIFO slot of those connections.
    pub chain_slot_bytes: usize,
    /// The chain's connections to the two neighbours, `chain_ctas` each way (held here).
    _chain_links: Links,
}

/// What every rank must ask alike: staging bytes (0: the mode is off), the chain's CTAs and
/// its slot bytes.
fn agreed(bootstrap: &Bootstrap, mine: [u64; 3]) -> Result<()> {
    let bytes: Vec<u8> = mine.iter().flat_map(|v| v.to_le_bytes()).collect();
    let all = bootstrap.allgather(&bytes)?;
    let Some((q, theirs)) = all.iter().enumerate().find(|(_, t)| **t != bytes) else {
        return Ok(());
    };
    let word = |i: usize| {
        theirs
            .get(8 * i..8 * i + 8)
            .and_then(|b| b.try_into().ok())
            .map_or(0, u64::from_le_bytes)
    };
    let say = |v: [u64; 3]| match v[0] {
        0 => "off".to_string(),
        b => format!(
            "on with {b} bytes of scratch, a chain of {} CTAs and {}-byte slots",
            v[1], v[2]
        ),
    };
    Err(Error::invalid_usage(format!(
        "NCCL_RS_DETERMINISTIC differs between ranks: {} here, {} on rank {q} (set it, \
         NCCL_RS_DETERMINISTIC_SCRATCH and the _CHAIN_ variables alike on every rank)",
        say(mine),
        say([word(0), word(1), word(2)])
    )))
}

/// The chain's CTAs and slot bytes: NCCL_RS_DETERMINISTIC_CHAIN_CTAS and _SLOT, else the
/// ring's channels and slot (on one H100 shared by 4 ranks, 16 CTAs on 512 KiB slots ran the
/// chain at 0.71x the ring's busbw at 256 MiB: each CTA splits its threads between the two
/// directions, so the chain needs the ring's CTA count to move as much).
fn chain_shape(ring_channels: usize, ring_slot: usize) -> Result<(usize, usize)> {
    let ctas = match crate::env::RS_DETERMINISTIC_CHAIN_CTAS.int() {
        0 => ring_channels,
        n if (1..=MAX_CHANNELS as i64).contains(&n) => n as usize,
        n => {
            return Err(Error::invalid_argument(format!(
                "NCCL_RS_DETERMINISTIC_CHAIN_CTAS={n}: use 1 to {MAX_CHANNELS} (0: the ring's \
                 channels)"
            )))
        }
    };
    let slot = match crate::env::RS_DETERMINISTIC_CHAIN_SLOT.int() {
        0 => ring_slot,
        b if (4096..=1 << 24).contains(&b) && b % 128 == 0 => b as usize,
        b => {
            return Err(Error::invalid_argument(format!(
                "NCCL_RS_DETERMINISTIC_CHAIN_SLOT={b}: use a multiple of 128 from 4 KiB to \
                 16 MiB (0: the ring's slot)"
            )))
        }
    };
    Ok((ctas, slot))
}

/// Agrees that every rank asked alike (`scratch`: this rank's staging bytes, None when off),
/// then, when on, connects this rank to every other both ways on `links`, allocates the
/// staging, and wires the chain on links of its own from `make_links(ctas, slot)` (the
/// ring's channels and slot unless the environment says otherwise).
pub(super) fn setup(
    bootstrap: &Bootstrap,
    device: &Device,
    links: &Links,
    scratch: Option<usize>,
    ring: (usize, usize),
    make_links: impl FnOnce(usize, usize) -> Links,
) -> Result<Option<Deterministic>> {
    // A shape out of range still takes part in the agreement (as no shape), so that the
    // other ranks are not left waiting for this one; it then fails here with its own error.
    let shape = match scratch {
        Some(_) => chain_shape(ring.0, ring.1),
        None => Ok((0, 0)),
    };
    let (ctas, slot) = shape
        .as_ref()
        .map_or((u64::MAX, 0), |&(c, s)| (c as u64, s as u64));
    let agreement = agreed(bootstrap, [scratch.map_or(0, |b| b as u64), ctas, slot]);
    let (ctas, slot) = shape?;
    agreement?;
    let Some(bytes) = scratch else {
        return Ok(None);
    };
    let n = bootstrap.nranks();
    let me = links.rank();
    let needs: Vec<(usize, Dir)> = (0..n)
        .filter(|&q| q != me)
        .flat_map(|q| [(q, Dir::Send), (q, Dir::Recv)])
        .collect();
    let started = links.start(&needs)?;
    links.finish(started)?;
    // At least a 16-byte pack for each rank's staged block and the folded one.
    let bytes = bytes.max((n + 1) * 16);
    let chain_links = make_links(ctas, slot);
    let chain = chain(&chain_links, device, n)?;
    Ok(Some(Deterministic {
        scratch: device.alloc(bytes)?,
        chain,
        chain_ctas: chain_links.nconns,
        chain_slot_bytes: chain_links.slot_bytes,
        _chain_links: chain_links,
    }))
}

/// The AllReduce's chain in rank order, one CTA per connection of `links` to each
/// neighbour: rank `r`'s parent is `r + 1` (rank `n - 1` the root), its child `r - 1`. Up the
/// chain rank 0 sends its input and every rank adds its own to what arrives, so each element
/// is `post(((pre(x0) + pre(x1)) + pre(x2)) + …)`, the fold's order, in one fused pass; the
/// result comes back down. The tree kernel runs it (one child, one parent per place).
fn chain(links: &Links, device: &Device, n: usize) -> Result<DevBuffer> {
    let me = links.rank();
    let mut needs = Vec::new();
    if me + 1 < n {
        needs.extend([(me + 1, Dir::Send), (me + 1, Dir::Recv)]);
    }
    if me > 0 {
        needs.extend([(me - 1, Dir::Send), (me - 1, Dir::Recv)]);
    }
    let started = links.start(&needs)?;
    links
        .finish(started)
        .map_err(|e| e.context("the deterministic chain's connections"))?;
    let mut places = vec![TreeDev::default(); links.nconns];
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
    Ok(array)
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
