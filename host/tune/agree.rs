//! Ranks agree on the tuner's inputs. Each rank detects its own topology, and detection can
//! differ between processes (or fail in one of them): a rank that picks another protocol or
//! channel count than its peers waits for them forever. So every rank adopts rank 0's model
//! inputs, and a tuner plugin is used only where every rank loaded the same one (by name).

use super::Tuner;
use crate::error::{Error, Result};
use crate::topo::PathType;

/// Bytes of [`Tuner::facts`].
const FACTS_LEN: usize = 4 * 4 + 8 * 2 + 2 + 8 + 8;
/// Where [`Tuner::facts`] holds the plugin's identity (0: none).
const PLUGIN_AT: usize = 34;
/// Where [`Tuner::facts`] holds the network's hand-off length ([`NO_HANDOFF`]: none).
const HANDOFF_AT: usize = 42;
const NO_HANDOFF: u64 = u64::MAX;
/// More local GPUs or channels than any rank reports (NCCL has at most 64 channels).
const MAX_PEER_COUNT: usize = 4096;

/// A tuner plugin's identity across ranks: a hash of the name it reports (FNV-1a), never 0.
fn plugin_id(name: &str) -> u64 {
    let h = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    });
    h.max(1)
}

/// Whether every rank loaded the same tuner plugin (facts of every rank, well formed).
fn plugin_agreed(all: &[Vec<u8>]) -> bool {
    let id = |f: &Vec<u8>| u64::from_le_bytes(f[PLUGIN_AT..PLUGIN_AT + 8].try_into().unwrap());
    let first = all.first().map(id).unwrap_or(0);
    first != 0 && all.iter().all(|f| id(f) == first)
}

impl Tuner {
    /// The inputs the model chooses from, encoded for [`Tuner::agree`].
    pub fn facts(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(FACTS_LEN);
        for n in [self.nranks, self.nnodes, self.nlocal, self.nchannels] {
            v.extend_from_slice(&(n as u32).to_le_bytes());
        }
        v.extend_from_slice(&self.bw_intra.to_le_bytes());
        v.extend_from_slice(&self.bw_inter.to_le_bytes());
        let path = PathType::ALL.iter().position(|&p| p == self.intra_type);
        v.push(path.unwrap_or(0) as u8);
        v.push(self.ll128_ok as u8);
        let plugin = self.plugin.as_ref().map_or(0, |p| plugin_id(&p.name));
        v.extend_from_slice(&plugin.to_le_bytes());
        let handoff = self.net_handoff_from.map_or(NO_HANDOFF, |b| b as u64);
        v.extend_from_slice(&handoff.to_le_bytes());
        v
    }

    /// Adopts rank 0's inputs from every rank's [`Tuner::facts`] (by rank) and drops the
    /// plugin unless every rank has the same one: a plugin choosing for some ranks only, or
    /// two plugins choosing differently, would make ranks launch different kernels. Returns
    /// whether anything here changed.
    pub fn agree(&mut self, all: &[Vec<u8>]) -> Result<bool> {
        let first = all
            .first()
            .ok_or_else(|| Error::internal("tuner facts: the allgather returned nothing"))?;
        // Every rank's facts are read below (the plugin's identity): each must be whole.
        if let Some((r, f)) = all.iter().enumerate().find(|(_, f)| f.len() != FACTS_LEN) {
            return Err(Error::remote(format!(
                "rank {r} sent malformed tuner facts ({} bytes, {FACTS_LEN} expected)",
                f.len()
            )));
        }
        let bad = || {
            Error::remote(format!(
                "rank 0's tuner inputs are out of range: path type {}",
                first[32]
            ))
        };
        let u32_at = |i: usize| u32::from_le_bytes(first[i..i + 4].try_into().unwrap()) as usize;
        let f64_at = |i: usize| f64::from_le_bytes(first[i..i + 8].try_into().unwrap());
        let intra_type = *PathType::ALL.get(first[32] as usize).ok_or_else(bad)?;
        let (nranks, nnodes, nlocal, nchannels) = (u32_at(0), u32_at(4), u32_at(8), u32_at(12));
        let (bw_intra, bw_inter) = (f64_at(16), f64_at(24));
        let handoff = u64::from_le_bytes(first[HANDOFF_AT..HANDOFF_AT + 8].try_into().unwrap());
        let handoff_from = match handoff {
            NO_HANDOFF => None,
            b if b <= crate::net::socket::MAX_INLINE_BELOW as u64 => Some(b as usize),
            b => {
                return Err(Error::remote(format!(
                    "rank 0's tuner inputs are out of range: a network hand-off from {b} bytes"
                )))
            }
        };
        // Rank 0's values drive arithmetic (ranks less nodes, shares of channels): a value no
        // rank could have sent is refused rather than used.
        let sane = nranks == self.nranks
            && (1..=nranks).contains(&nnodes)
            && (1..=MAX_PEER_COUNT).contains(&nlocal)
            && (1..=MAX_PEER_COUNT).contains(&nchannels)
            && [bw_intra, bw_inter]
                .iter()
                .all(|b| b.is_finite() && *b >= 0.0);
        if !sane {
            return Err(Error::remote(format!(
                "rank 0's tuner inputs are out of range: {nranks} ranks (this communicator has {}), \
                 {nnodes} nodes, {nlocal} local GPUs, {nchannels} channels, bandwidths {bw_intra} \
                 and {bw_inter} GB/s",
                self.nranks
            )));
        }
        let mine = self.facts();
        self.nranks = nranks;
        self.set_nnodes(nnodes);
        self.nlocal = nlocal;
        self.nchannels = nchannels;
        self.bw_intra = bw_intra;
        self.bw_inter = bw_inter;
        self.intra_type = intra_type;
        self.ll128_ok = first[33] != 0;
        self.net_handoff_from = handoff_from;
        if !plugin_agreed(all) {
            if let Some(p) = self.plugin.take() {
                log::warn!(
                    "tuner plugin {} is not the one every rank loaded; using the internal model",
                    p.name
                );
            }
        }
        Ok(self.facts() != mine)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topo::synthetic;
    use crate::topo::System;
    use crate::tune::TuneParams;

    fn tuner(ngpus: usize, max_channels: usize) -> Tuner {
        let system = System::from_xml_node(synthetic::nvswitch_node(ngpus, 90)).unwrap();
        let ranks = vec![system.gpus.iter().map(|g| g.rank).collect()];
        let params = crate::graph::Params {
            max_channels,
            ..crate::graph::Params::default()
        };
        let graphs = crate::graph::search_ranks(&system, &ranks, &params).unwrap();
        Tuner::new(&system, &graphs, &TuneParams::default())
    }

    #[test]
    fn every_rank_takes_rank_0s_inputs() {
        let mut rank0 = tuner(4, 32);
        // The network's hand-off length too (a rank's NCCL_RS_SOCKET_INLINE_BYTES).
        rank0.set_net_handoff_from(Some(256 << 10));
        // And its node count, with what follows from it (the trees' depth).
        rank0.set_nnodes(4);
        let mut rank1 = tuner(4, 4);
        let all = vec![rank0.facts(), rank1.facts()];
        assert!(rank1.agree(&all).unwrap());
        assert_eq!(rank1.facts(), rank0.facts());
        assert_eq!(rank1.tree_depth, crate::graph::dbt_depth(4));
        for bytes in [8usize, 1 << 20, 1 << 30] {
            let c = super::super::Coll::AllReduce;
            assert_eq!(
                rank1
                    .choose(c, bytes)
                    .map(|x| (x.algo, x.proto, x.nchannels)),
                rank0
                    .choose(c, bytes)
                    .map(|x| (x.algo, x.proto, x.nchannels))
            );
        }
        let again = vec![rank0.facts(), rank1.facts()];
        assert!(!rank1.agree(&again).unwrap());
    }

    #[test]
    fn a_plugin_counts_only_where_every_rank_has_the_same_one() {
        let with = |id: u64| {
            let mut f = tuner(2, 8).facts();
            f[PLUGIN_AT..PLUGIN_AT + 8].copy_from_slice(&id.to_le_bytes());
            f
        };
        let (a, b) = (plugin_id("tunerA"), plugin_id("tunerB"));
        assert_ne!(a, b);
        assert!(plugin_agreed(&[with(a), with(a)]));
        assert!(!plugin_agreed(&[with(a), with(b)]), "different plugins");
        assert!(!plugin_agreed(&[with(a), with(0)]), "one rank without");
        assert!(!plugin_agreed(&[with(0), with(0)]), "none at all");
        assert_eq!(tuner(2, 8).facts().len(), FACTS_LEN);
    }

    #[test]
    fn malformed_facts_are_an_error() {
        let mut t = tuner(2, 8);
        assert!(t.agree(&[vec![1, 2, 3]]).is_err());
        assert!(t.agree(&[]).is_err());
    }

    /// Rank 0's numbers are range-checked before use: more nodes than ranks once made the
    /// latency model subtract past zero (a panic in debug builds), and a rank count that is not
    /// this communicator's, no channel, or a bandwidth that is no number are refused too.
    #[test]
    fn out_of_range_facts_from_rank_0_are_refused() {
        let good = tuner(2, 8).facts();
        let set_u32 = |at: usize, v: u32| {
            let mut f = good.clone();
            f[at..at + 4].copy_from_slice(&v.to_le_bytes());
            f
        };
        let set_f64 = |at: usize, v: f64| {
            let mut f = good.clone();
            f[at..at + 8].copy_from_slice(&v.to_le_bytes());
            f
        };
        let set_u64 = |at: usize, v: u64| {
            let mut f = good.clone();
            f[at..at + 8].copy_from_slice(&v.to_le_bytes());
            f
        };
        for bad in [
            set_u32(0, 3),
            set_u32(4, 0),
            set_u32(4, 3),
            set_u32(8, 0),
            set_u32(12, 0),
            set_u32(12, u32::MAX),
            set_f64(16, f64::NAN),
            set_f64(24, -1.0),
            set_f64(24, f64::INFINITY),
            set_u64(HANDOFF_AT, (1 << 30) + 1),
            set_u64(HANDOFF_AT, u64::MAX - 1),
        ] {
            let mut t = tuner(2, 8);
            let before = t.facts();
            let e = t.agree(&[bad.clone(), good.clone()]).unwrap_err();
            assert_eq!(e.code, crate::error::NcclResult::RemoteError, "{bad:?}");
            assert!(e.message.contains("rank 0's tuner inputs"), "{}", e.message);
            assert_eq!(t.facts(), before, "nothing adopted");
        }
        let mut t = tuner(2, 8);
        assert!(t.agree(&[good.clone(), good.clone()]).is_ok());
    }

    /// Malformed facts from any rank, and a path type no rank could send, are ncclRemoteError
    /// naming the rank (they were InternalError, as if this library had failed).
    #[test]
    fn malformed_facts_are_a_remote_error_naming_the_rank() {
        let good = tuner(2, 8).facts();
        for (all, who) in [
            (
                vec![good.clone(), good[..10].to_vec()],
                "rank 1 sent malformed",
            ),
            (vec![Vec::new(), good.clone()], "rank 0 sent malformed"),
            (
                vec![good.clone(), [good.clone(), vec![0]].concat()],
                "rank 1 sent malformed",
            ),
        ] {
            let mut t = tuner(2, 8);
            let e = t.agree(&all).unwrap_err();
            assert_eq!(e.code, crate::error::NcclResult::RemoteError, "{e}");
            assert!(e.message.contains(who), "{e}");
        }
        let mut path = good.clone();
        path[32] = 200;
        let e = tuner(2, 8).agree(&[path, good.clone()]).unwrap_err();
        assert_eq!(e.code, crate::error::NcclResult::RemoteError, "{e}");
        assert!(e.message.contains("path type 200"), "{e}");
    }
}
