//! The communicator's launch shape: channels, threads, FIFO slots and kernel switches, decided
//! from rank 0's parameters (`host/env.rs`) so that every rank agrees.

use super::*;

/// Launch shape and buffer sizes, decided by rank 0's parameters so every rank agrees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Channels (CTAs) per collective.
    pub nchannels: u32,
    /// Threads per CTA.
    pub nthreads: u32,
    /// Bytes of one FIFO slot (a step) of the Simple protocol.
    pub slot_bytes: u32,
    /// NCCL_ALGO as an [`crate::tune::AlgoFilter`] mask.
    pub algo_mask: u64,
    /// NCCL_PROTO as a [`crate::tune::ProtoFilter`] mask.
    pub proto_mask: u64,
    /// Connections per peer of send/recv and of the tree's up links (CTAs per message); 0:
    /// from the communicator's size.
    pub p2p_conns: u32,
    /// Bytes of one FIFO slot of those connections (a step of a send/recv).
    pub p2p_slot_bytes: u32,
    /// FIFO slots one Simple ring step fills (NCCL's slice steps); 0: NCCL's choice per
    /// collective ([`Shape::slice_steps_for`]).
    pub slice_steps: u32,
    /// The kernels' `FLAG_*` bits ([`nccl_device::abi::CollArgs::flags`]).
    pub kernel_flags: u32,
    /// Channels when the ranks span several nodes: every channel's ring crosses the network
    /// once per node, on connections of its own (`NET_CHANNELS`; NCCL's search over one NIC
    /// per node gives two). NCCL_MIN_NCHANNELS raises it and NCCL_MAX_NCHANNELS caps it.
    pub net_nchannels: u32,
    /// CTAs a ring AllReduce, AllGather or Broadcast runs on when every rank's output is
    /// registered (zero-copy over p2p): [`nccl_device::abi::CollArgs::reg_ctas`]; 0 (the
    /// default): as many as unregistered (NCCL_RS_REGISTERED_CTAS).
    pub reg_ctas: u32,
}

/// Channels across nodes on GPUs unless NCCL_MIN/MAX_NCHANNELS say otherwise (see
/// [`Shape::net_nchannels`]). Each is a ring of its own socket connections: on one H100 as 2
/// nodes over loopback, 256 MiB AllReduce moved 4.5 GB/s busbw with 2, 8.2 with 8, 8.9 with 16
/// and 8.5 with 32, and 8 was best at 1 and 16 MiB (NCCL's sockets: 2.3-2.7 in the same runs;
/// results/h100-nodes2-channels.txt). The simulator keeps 2 (threads are its cores).
const NET_CHANNELS: i64 = 8;
const SIM_NET_CHANNELS: i64 = 2;

impl Shape {
    /// From this process's parameters for `device`, the channels bounded by the config's
    /// minCTAs / maxCTAs.
    pub(super) fn from_env(device: &Device, config: &ResolvedConfig) -> Result<Shape> {
        use crate::env::{self as e, Param};
        let env = |p: Param| p.int();
        let sim = device.is_sim();
        let buff = match crate::env::BUFFSIZE.raw() {
            Some(_) => env(e::BUFFSIZE),
            None if sim => env(e::RS_SIM_BUFFSIZE),
            None => env(e::BUFFSIZE),
        };
        if !(8 * 1024..=(1 << 30)).contains(&buff) {
            return Err(Error::invalid_argument(format!(
                "NCCL_BUFFSIZE={buff}: use 8 KiB to 1 GiB"
            )));
        }
        let slot = (buff as u32 / nccl_device::abi::NCCL_STEPS) & !127;
        let nthreads = if sim {
            env(e::RS_SIM_NTHREADS)
        } else {
            env(e::NTHREADS)
        };
        let most = crate::cuda::MAX_THREADS as i64;
        if !(1..=most).contains(&nthreads) || (!sim && nthreads % 32 != 0) {
            return Err(Error::invalid_argument(format!(
                "NCCL_NTHREADS={nthreads}: use a multiple of 32 up to {most}"
            )));
        }
        // 32 channels: measured 333 GB/s at 2 GiB on 4xH200 against 286 with 16 (NCCL: 362).
        let auto = if sim { 2 } else { 32 };
        let (min, max) = (env(e::MIN_NCHANNELS), env(e::MAX_NCHANNELS));
        let mut n = auto;
        if max > 0 {
            n = n.min(max);
        }
        if min > 0 {
            n = n.max(min);
        }
        // Across nodes NCCL_MIN_NCHANNELS raises the default and NCCL_MAX_NCHANNELS caps it,
        // as inside a node (a minimum of 4 is 4 rings, not the 32 of NVLink).
        let mut net_n = if sim { SIM_NET_CHANNELS } else { NET_CHANNELS }.max(min);
        if max > 0 {
            net_n = net_n.min(max);
        }
        let n = config.bound_channels(n.clamp(1, MAX_CHANNELS as i64) as u32);
        let net_nchannels = config.bound_channels(net_n.clamp(1, MAX_CHANNELS as i64) as u32);
        let (algo_mask, proto_mask) = tuning::filter_masks()?;
        let (conns_var, conns_max) = match sim {
            true => (e::RS_SIM_P2P_CONNS, 8),
            false => (e::RS_P2P_CONNS, MAX_P2P_ITEMS as i64 / 4),
        };
        let p2p_conns = env(conns_var);
        if !(0..=conns_max).contains(&p2p_conns) {
            return Err(Error::invalid_argument(format!(
                "{}={p2p_conns}: use 1 to {conns_max} (0: 64 / nranks, up to 16)",
                conns_var.name
            )));
        }
        // NCCL_P2P_NVL_CHUNKSIZE as in NCCL, 512 KiB on GPUs by default: 2xH200 sendrecv at
        // 512 MiB moved 261 GB/s with 128 KiB slots, 312 with 256 KiB, 323 with 512 KiB
        // (NCCL: 353; results/h200x2-sendrecv-*). The simulator's: a quarter of its ring slot.
        let p2p_slot = match crate::env::P2P_NVL_CHUNKSIZE.raw() {
            Some(_) => env(e::P2P_NVL_CHUNKSIZE),
            None if sim => (slot as i64 / 4).max(4096),
            None => 512 * 1024,
        };
        if !(4096..=(1 << 24)).contains(&p2p_slot) || p2p_slot % 128 != 0 {
            return Err(Error::invalid_argument(format!(
                "NCCL_P2P_NVL_CHUNKSIZE={p2p_slot}: use a multiple of 128 from 4 KiB to 16 MiB"
            )));
        }
        // A slice must divide the FIFO's NCCL_STEPS = 8 slots and leave room for a second.
        let slice_steps = env(e::RS_SLICE_STEPS);
        if ![0, 1, 2, 4].contains(&slice_steps) {
            return Err(Error::invalid_argument(format!(
                "NCCL_RS_SLICE_STEPS={slice_steps}: use 1, 2 or 4 (0: by collective)"
            )));
        }
        let switch = |p: Param, flag: u32| match env(p) {
            0 => Ok(0),
            1 => Ok(flag),
            v => Err(Error::invalid_argument(format!(
                "{}={v}: use 0 or 1",
                p.name
            ))),
        };
        // They travel with rank 0's shape, so every rank agrees on them.
        let kernel_flags = switch(
            e::RS_SIMPLE_PUBLISHER,
            nccl_device::abi::FLAG_SIMPLE_PUBLISHER,
        )? | switch(e::RS_RING_EXCHANGE, nccl_device::abi::FLAG_RING_EXCHANGE)?
            | switch(e::RS_TREE_EXCHANGE, nccl_device::abi::FLAG_TREE_EXCHANGE)?;
        // Off by default: on 4 H100s a registered call's busbw fell with its CTAs (64 MiB
        // AllReduce 301 GB/s on 32, 267 on 16; 256 MiB AllGather 328 on 32, 209 on 8, 30 on 1;
        // results/h100x4-registered-fewer-ctas.txt): a CTA's loads and stores over NVLink move
        // about what its FIFO copies did.
        let reg_ctas = env(e::RS_REGISTERED_CTAS);
        if !(0..=MAX_CHANNELS as i64).contains(&reg_ctas) {
            return Err(Error::invalid_argument(format!(
                "NCCL_RS_REGISTERED_CTAS={reg_ctas}: use 0 (as many as unregistered calls) to {MAX_CHANNELS}"
            )));
        }
        let reg_ctas = reg_ctas as u32;
        Ok(Shape {
            nchannels: n,
            nthreads: nthreads as u32,
            slot_bytes: slot,
            algo_mask,
            proto_mask,
            p2p_conns: p2p_conns as u32,
            p2p_slot_bytes: p2p_slot as u32,
            slice_steps: slice_steps as u32,
            kernel_flags,
            net_nchannels,
            reg_ctas,
        })
    }

    /// Checks a shape that came from a peer (rank 0's rules every rank) against the ranges
    /// `from_env` allows, so that a corrupt or hostile record cannot make this rank allocate
    /// without bound or index past its arrays.
    pub(crate) fn check_from_peer(&self, rank: usize) -> Result<()> {
        let max_slot = (1u32 << 30) / nccl_device::abi::NCCL_STEPS;
        let bad = |what: &str, v: u64| {
            Err(Error::remote(format!(
                "rank {rank} sent a peer record with {what} = {v}, out of range"
            )))
        };
        let ch = 1..=MAX_CHANNELS as u32;
        if !ch.contains(&self.nchannels) {
            return bad("nchannels", self.nchannels.into());
        }
        if !ch.contains(&self.net_nchannels) {
            return bad("net_nchannels", self.net_nchannels.into());
        }
        if !(1..=crate::cuda::MAX_THREADS).contains(&self.nthreads) {
            return bad("nthreads", self.nthreads.into());
        }
        if !(128..=max_slot).contains(&self.slot_bytes) || !self.slot_bytes.is_multiple_of(128) {
            return bad("slot_bytes", self.slot_bytes.into());
        }
        if self.p2p_conns > (MAX_P2P_ITEMS / 4) as u32 {
            return bad("p2p_conns", self.p2p_conns.into());
        }
        if !(4096..=(1 << 24)).contains(&self.p2p_slot_bytes)
            || !self.p2p_slot_bytes.is_multiple_of(128)
        {
            return bad("p2p_slot_bytes", self.p2p_slot_bytes.into());
        }
        if ![0, 1, 2, 4].contains(&self.slice_steps) {
            return bad("slice_steps", self.slice_steps.into());
        }
        if self.reg_ctas > MAX_CHANNELS as u32 {
            return bad("reg_ctas", self.reg_ctas.into());
        }
        use nccl_device::abi::{FLAG_RING_EXCHANGE, FLAG_SIMPLE_PUBLISHER, FLAG_TREE_EXCHANGE};
        let known = FLAG_SIMPLE_PUBLISHER | FLAG_RING_EXCHANGE | FLAG_TREE_EXCHANGE;
        if self.kernel_flags & !known != 0 {
            return bad("kernel_flags", self.kernel_flags.into());
        }
        Ok(())
    }

    /// FIFO slots a Simple ring step of `coll` fills at once. As NCCL: two for AllReduce,
    /// AllGather and ReduceScatter (a 1 MiB step with the default 4 MiB buffer), one for the
    /// chains of Broadcast and Reduce, whose first bytes reach the last rank sooner so.
    pub fn slice_steps_for(&self, coll: nccl_device::abi::Coll) -> u32 {
        use nccl_device::abi::Coll;
        match (self.slice_steps, coll) {
            (0, Coll::Broadcast | Coll::Reduce) => 1,
            (0, _) => 2,
            (n, _) => n,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Shape;
    use nccl_device::abi::Coll;

    #[test]
    fn slice_steps_follow_nccl_unless_set() {
        let mut s = Shape {
            nchannels: 2,
            nthreads: 64,
            slot_bytes: 8192,
            algo_mask: 0,
            proto_mask: 0,
            p2p_conns: 0,
            p2p_slot_bytes: 4096,
            slice_steps: 0,
            kernel_flags: 0,
            net_nchannels: 2,
            reg_ctas: 0,
        };
        let by_coll = |s: &Shape| Coll::ALL.map(|c| s.slice_steps_for(c));
        // Broadcast, Reduce, AllGather, ReduceScatter, AllReduce.
        assert_eq!(by_coll(&s), [1, 1, 2, 2, 2]);
        s.slice_steps = 4;
        assert_eq!(by_coll(&s), [4; 5]);
    }
}
