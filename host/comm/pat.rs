//! PAT's connections (`coll::pat` in the device crate runs the collectives): on each of its
//! channels a rank connects to the ranks `2^k` away on either side, both ways, for every
//! dimension `k < ceil(log2 n)`, on links of its own (one set per channel, as the trees
//! across nodes), and gets a scratch for ReduceScatter's partial sums. NCCL connects PAT where
//! every node holds one rank; so does this, at init, in the same order on every rank.

use crate::cuda::{DevBuffer, Device};
use crate::error::{Error, Result};
use crate::transport::links::Links;
use crate::transport::Dir;
use crate::tune::{Algo, AlgoFilter, Coll};
use nccl_device::abi::{pat_dims, PatDev, PAT_MAX_DIMS};

/// Channels PAT connects at most. It serves small calls, which one or two channels carry,
/// and each channel connects up to 2·ceil(log2 n) peers each way.
pub(crate) const PAT_MAX_CTAS: usize = 2;

/// ReduceScatter's scratch per CTA, in Simple FIFO slots: it holds one piece of every partial
/// sum a rank builds at once ((n − 1) / 2 of them), so its pieces fill a slot up to 9 ranks
/// and shrink past that.
const SCRATCH_SLOTS: usize = 4;

/// PAT as this rank's CTAs run it.
pub(crate) struct Pat {
    /// A [`PatDev`] per CTA, in device memory (`CollArgs::pat`).
    pub array: DevBuffer,
    /// CTAs (channels) connected.
    pub ctas: usize,
    /// Bytes of each CTA's scratch (`PatDev::scratch_bytes`).
    pub scratch_each: usize,
    _scratch: DevBuffer,
    /// Per CTA, its connections; per dimension, the ranks `2^k` above and below.
    links: Vec<Links>,
    peers: Vec<(usize, usize)>,
}

impl Pat {
    /// CTA `c`'s network connections of dimension `k` that have op queues (the profiler's
    /// proxy events, `proxy/ops.rs`), for collective `coll`: (peer, queue) of its send and
    /// of its receive. AllGather sends down and receives from above; ReduceScatter the
    /// other way.
    pub(crate) fn op_queues(&self, c: usize, k: usize, coll: Coll) -> [Option<PeerQueue>; 2] {
        let (Some(l), Some(&(up, down))) = (self.links.get(c), self.peers.get(k)) else {
            return [None, None];
        };
        let (to, from) = match coll {
            Coll::AllGather => (down, up),
            _ => (up, down),
        };
        [
            l.op_queue(to, Dir::Send, 0).map(|q| (to, q)),
            l.op_queue(from, Dir::Recv, 0).map(|q| (from, q)),
        ]
    }
}

impl Pat {
    /// Every connection with an op queue: (CTA, peer, send, the step counter the host
    /// predicted, the kernels' counter).
    pub(crate) fn steps_predicted(&self) -> Result<Vec<crate::proxy::ops::StepCount>> {
        let mut out: Vec<crate::proxy::ops::StepCount> = Vec::new();
        for (c, l) in self.links.iter().enumerate() {
            for &(up, down) in &self.peers {
                for (peer, dir) in [
                    (up, Dir::Send),
                    (down, Dir::Recv),
                    (down, Dir::Send),
                    (up, Dir::Recv),
                ] {
                    let send = dir == Dir::Send;
                    if out
                        .iter()
                        .any(|o| o.channel == c && o.peer == peer && o.send == send)
                    {
                        continue;
                    }
                    let Some(predicted) = l.op_queue(peer, dir, 0).and_then(|q| q.end()) else {
                        continue;
                    };
                    let taken = l
                        .steps(peer, dir)?
                        .and_then(|v| v.first().copied())
                        .unwrap_or(0);
                    out.push(crate::proxy::ops::StepCount {
                        channel: c,
                        peer,
                        send,
                        predicted,
                        taken,
                    });
                }
            }
        }
        Ok(out)
    }
}

/// A connection's peer and op queue.
pub(crate) type PeerQueue = (usize, std::sync::Arc<crate::proxy::ops::OpQueue>);

/// Whether a communicator connects PAT, from facts every rank shares: more than one rank,
/// each node one of them (NCCL's condition), no more than `2^PAT_MAX_DIMS`, and rank 0's
/// NCCL_ALGO (which NCCL_PAT_ENABLE=0 already stripped of PAT) allowing it for AllGather or
/// ReduceScatter.
pub(crate) fn wanted(nranks: usize, nnodes: usize, algo_mask: u64) -> bool {
    let filter = AlgoFilter::from_mask(algo_mask);
    let allowed = [Coll::AllGather, Coll::ReduceScatter]
        .into_iter()
        .any(|c| filter.allows(c, Algo::Pat as usize));
    nranks > 1 && nnodes == nranks && pat_dims(nranks) <= PAT_MAX_DIMS && allowed
}

/// The largest call (bytes of one rank's AllGather output or ReduceScatter input) that
/// `coll::pat` moves as one packed piece on one CTA: dimension 0's `n / 2` parts of a rank's
/// block share a slot of `slot_bytes`.
pub(crate) fn packed_bytes(nranks: usize, slot_bytes: usize) -> usize {
    nranks * (slot_bytes / (nranks / 2).max(1))
}

/// Connects `ctas` channels of PAT for `rank` of `nranks`, channel `c` on links from
/// `make_links(c)` whose slots are `slot_bytes`.
pub(crate) fn connect(
    rank: usize,
    nranks: usize,
    device: &Device,
    ctas: usize,
    slot_bytes: usize,
    make_links: impl Fn(usize) -> Links,
) -> Result<Pat> {
    let dims = pat_dims(nranks);
    if dims > PAT_MAX_DIMS || ctas == 0 {
        return Err(Error::internal(format!(
            "PAT on {nranks} ranks and {ctas} channels"
        )));
    }
    // The same size on every rank (the kernels cut their pieces by it), 256-byte aligned.
    let scratch_each = (slot_bytes * SCRATCH_SLOTS)
        .max(16 * nranks)
        .next_multiple_of(256);
    let scratch = device.alloc(scratch_each * ctas)?;
    let mut links = Vec::with_capacity(ctas);
    let mut devs = Vec::with_capacity(ctas);
    let peers: Vec<(usize, usize)> = (0..dims)
        .map(|k| {
            let d = (1usize << k) % nranks;
            ((rank + d) % nranks, (rank + nranks - d) % nranks)
        })
        .collect();
    for c in 0..ctas {
        let l = make_links(c);
        let needs: Vec<(usize, Dir)> = peers
            .iter()
            .flat_map(|&(up, down)| {
                [
                    (up, Dir::Send),
                    (down, Dir::Recv),
                    (down, Dir::Send),
                    (up, Dir::Recv),
                ]
            })
            .collect();
        let started = l.start(&needs)?;
        l.finish(started)
            .map_err(|e| e.context(format!("PAT connections of channel {c}")))?;
        let mut pd = PatDev {
            slot_bytes: l.slot_bytes as u32,
            scratch: scratch.ptr + (c * scratch_each) as u64,
            scratch_bytes: scratch_each as u64,
            ..PatDev::default()
        };
        for (k, &(up, down)) in peers.iter().enumerate() {
            pd.up_send[k] = l.conn(up, Dir::Send, 0)?;
            pd.up_recv[k] = l.conn(down, Dir::Recv, 0)?;
            pd.down_send[k] = l.conn(down, Dir::Send, 0)?;
            pd.down_recv[k] = l.conn(up, Dir::Recv, 0)?;
        }
        links.push(l);
        devs.push(pd);
    }
    let array = device.alloc(std::mem::size_of_val(devs.as_slice()))?;
    array.write(0, super::as_bytes(&devs))?;
    log::info!("Connected PAT: {ctas} channels, {dims} dimensions (ranks 2^k away on either side)");
    Ok(Pat {
        array,
        ctas,
        _scratch: scratch,
        scratch_each,
        links,
        peers,
    })
}
