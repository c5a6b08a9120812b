//! The ring order of every channel, alike on every rank.
//!
//! Rank 0 proposes the rings: NCCL_RINGS when its process sets it, else the graph search's
//! rings. Every rank all-gathers rank 0's proposal and adopts it, so all ranks meet on the same
//! rings (a rank sending to a neighbour that does not receive from it hangs the collective).
//! Channel `c` uses proposed ring `c % count`: channels beyond the proposal repeat its rings.
//!
//! NCCL_RINGS (as in NCCL 2.x): rings separated by `|`, each the ranks in ring order separated
//! by spaces (or commas), e.g. `0 2 1 3|3 1 2 0`. Only rank 0's value counts. A value that does
//! not parse, or whose rings are not each a permutation of `0..n` for one `n`, fails creation
//! with InvalidArgument on every rank; well-formed rings for another communicator size (a split
//! child, say) are skipped with a warning.

use crate::bootstrap::Bootstrap;
use crate::error::{Error, Result};
use crate::graph::Graphs;

/// Every channel's ring, as indices into the distinct rings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rings {
    nranks: usize,
    /// The distinct rings, each a permutation of `0..nranks`.
    distinct: Vec<Vec<usize>>,
    /// Per channel, which distinct ring it uses.
    of_channel: Vec<usize>,
}

impl Rings {
    /// Channel `c` on `proposed[c % len]`; `proposed` must be valid for `nranks` and not empty.
    pub fn new(nranks: usize, nchannels: usize, proposed: &[Vec<usize>]) -> Rings {
        let mut distinct: Vec<Vec<usize>> = Vec::new();
        let mut of_channel = Vec::with_capacity(nchannels);
        for c in 0..nchannels {
            let ring = &proposed[c % proposed.len()];
            let i = match distinct.iter().position(|d| d == ring) {
                Some(i) => i,
                None => {
                    distinct.push(ring.clone());
                    distinct.len() - 1
                }
            };
            of_channel.push(i);
        }
        Rings {
            nranks,
            distinct,
            of_channel,
        }
    }

    /// Rank order on every channel.
    pub fn rank_order(nranks: usize, nchannels: usize) -> Rings {
        Rings::new(nranks, nchannels, &[(0..nranks).collect()])
    }

    /// Ranks on each ring.
    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// Channels the rings serve.
    pub fn nchannels(&self) -> usize {
        self.of_channel.len()
    }

    /// The distinct rings; channel `c` uses `distinct()[index_of(c)]`.
    pub fn distinct(&self) -> &[Vec<usize>] {
        &self.distinct
    }

    /// The ring channel `c` runs on.
    pub fn index_of(&self, c: usize) -> usize {
        self.of_channel[c]
    }

    /// Channel `c`'s ring: ranks in ring order.
    pub fn ring(&self, c: usize) -> &[usize] {
        &self.distinct[self.of_channel[c]]
    }

    /// `rank`'s position in channel `c`'s ring.
    pub fn position(&self, c: usize, rank: usize) -> usize {
        self.ring(c).iter().position(|&r| r == rank).unwrap_or(0)
    }

    /// `rank`'s (prev, next) on channel `c`'s ring.
    pub fn peers(&self, c: usize, rank: usize) -> (usize, usize) {
        let (ring, n) = (self.ring(c), self.nranks);
        let i = self.position(c, rank);
        (ring[(i + n - 1) % n], ring[(i + 1) % n])
    }

    /// Every channel's ring, one vector per channel.
    pub fn per_channel(&self) -> Vec<Vec<usize>> {
        (0..self.nchannels())
            .map(|c| self.ring(c).to_vec())
            .collect()
    }
}

/// Whether `ring` holds every rank of `0..nranks` exactly once.
pub fn is_permutation(ring: &[usize], nranks: usize) -> bool {
    let mut seen = vec![false; nranks];
    ring.len() == nranks
        && ring
            .iter()
            .all(|&r| r < nranks && !std::mem::replace(&mut seen[r], true))
}

/// NCCL_RINGS's value for a communicator of `nranks`: `Ok(None)` when its rings are for
/// another size, InvalidArgument when it is malformed.
pub fn parse(text: &str, nranks: usize) -> Result<Option<Vec<Vec<usize>>>> {
    let bad = |why: String| Error::invalid_argument(format!("NCCL_RINGS=\"{text}\": {why}"));
    let mut rings = Vec::new();
    for (i, part) in text.split('|').enumerate() {
        let ring = part
            .split(|ch: char| ch.is_whitespace() || ch == ',')
            .filter(|t| !t.is_empty())
            .map(|t| {
                t.parse::<usize>()
                    .map_err(|_| bad(format!("\"{t}\" is not a rank")))
            })
            .collect::<Result<Vec<usize>>>()?;
        if ring.is_empty() {
            return Err(bad(format!("ring {i} is empty")));
        }
        rings.push(ring);
    }
    let len = rings[0].len();
    for (i, ring) in rings.iter().enumerate() {
        if !is_permutation(ring, len) {
            return Err(bad(format!(
                "ring {i} is not every rank of 0..{len} once (rings are separated by '|')"
            )));
        }
    }
    if len != nranks {
        log::warn!("NCCL_RINGS=\"{text}\" has rings of {len} ranks; this communicator has {nranks}: using the searched rings");
        return Ok(None);
    }
    Ok(Some(rings))
}

/// Rank 0's proposal: NCCL_RINGS, else the graph's rings (rank order where those are not
/// rings over every rank).
fn propose(nranks: usize, graphs: &Graphs, nodes: &[Vec<usize>]) -> Result<Vec<Vec<usize>>> {
    if let Some(text) = crate::env::RINGS.raw() {
        if let Some(rings) = parse(&text, nranks)? {
            log::info!("NCCL_RINGS: {} ring(s) from the environment", rings.len());
            return Ok(rings);
        }
    }
    if nodes.len() > 1 {
        return Ok(across_nodes(nodes));
    }
    let ok = !graphs.rings.is_empty() && graphs.rings.iter().all(|r| is_permutation(r, nranks));
    if ok {
        return Ok(graphs.rings.clone());
    }
    log::warn!(
        "the graph search's rings ({} of them) are not each every rank of 0..{nranks} once: using rank order",
        graphs.rings.len()
    );
    Ok(vec![(0..nranks).collect()])
}

/// Rings over several nodes (`nodes[n]`: node n's ranks in the order the node's own search
/// would take them): each ring visits the nodes in order and leaves and enters each once, so
/// that only one network connection per direction and node carries a channel. Ring `k` starts
/// each node at its `k`-th rank, so successive channels enter and leave a node through
/// different GPUs (and their NICs); there are as many rings as the largest node has ranks.
pub fn across_nodes(nodes: &[Vec<usize>]) -> Vec<Vec<usize>> {
    let most = nodes.iter().map(Vec::len).max().unwrap_or(1).max(1);
    (0..most)
        .map(|k| {
            nodes
                .iter()
                .flat_map(|node| {
                    let n = node.len().max(1);
                    (0..node.len()).map(move |i| node[(i + k) % n])
                })
                .collect()
        })
        .collect()
}

const PROPOSAL: u8 = 1;
const FAILED: u8 = 2;

/// `[PROPOSAL, count u32, then count rings of nranks u32]` or `[FAILED, message]`.
fn encode(proposal: &Result<Vec<Vec<usize>>>) -> Vec<u8> {
    match proposal {
        Ok(rings) => {
            let mut v = vec![PROPOSAL];
            v.extend_from_slice(&(rings.len() as u32).to_le_bytes());
            for r in rings.iter().flatten() {
                v.extend_from_slice(&(*r as u32).to_le_bytes());
            }
            v
        }
        Err(e) => {
            let mut v = vec![FAILED];
            v.extend_from_slice(e.message.as_bytes());
            v
        }
    }
}

/// Rank 0's record: its rings, or the InvalidArgument it failed with.
fn decode(b: &[u8], nranks: usize) -> Result<Vec<Vec<usize>>> {
    match b.first() {
        Some(&FAILED) => Err(Error::invalid_argument(format!(
            "rank 0: {}",
            String::from_utf8_lossy(&b[1..])
        ))),
        Some(&PROPOSAL) if b.len() >= 5 => {
            let count = u32::from_le_bytes([b[1], b[2], b[3], b[4]]) as usize;
            let words: Vec<usize> = b[5..]
                .chunks_exact(4)
                .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]) as usize)
                .collect();
            let rings: Vec<Vec<usize>> = words.chunks(nranks.max(1)).map(|r| r.to_vec()).collect();
            if count == 0
                || b.len() != 5 + count * nranks * 4
                || rings.len() != count
                || !rings.iter().all(|r| is_permutation(r, nranks))
            {
                return Err(Error::remote("rank 0 sent malformed rings"));
            }
            Ok(rings)
        }
        _ => Err(Error::remote("rank 0 sent malformed rings")),
    }
}

/// The rings every rank uses: rank 0's proposal, all-gathered. Every rank calls this at the
/// same point of creation; a bad NCCL_RINGS on rank 0 fails every rank with InvalidArgument.
pub fn agree(
    bootstrap: &Bootstrap,
    graphs: &Graphs,
    nodes: &[Vec<usize>],
    nchannels: usize,
) -> Result<Rings> {
    let (rank, nranks) = (bootstrap.rank(), bootstrap.nranks());
    let mine = match rank {
        0 => encode(&propose(nranks, graphs, nodes)),
        _ => Vec::new(),
    };
    let all = bootstrap.allgather(&mine)?;
    let first = all
        .first()
        .ok_or_else(|| Error::internal("rings: allgather returned nothing"))?;
    let rings = decode(first, nranks)?;
    let agreed = Rings::new(nranks, nchannels, &rings);
    if rank == 0 && log::log_enabled!(log::Level::Info) {
        for c in 0..agreed.nchannels() {
            let s: Vec<String> = agreed.ring(c).iter().map(|r| r.to_string()).collect();
            log::info!("Ring {c:02}: {}", s.join(" "));
        }
    }
    Ok(agreed)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::NcclResult;

    #[test]
    fn parses_nccl_rings() {
        let r = parse("0 2 1 3|3 1 2 0", 4).unwrap().unwrap();
        assert_eq!(r, vec![vec![0, 2, 1, 3], vec![3, 1, 2, 0]]);
        let r = parse(" 1,0 | 0  1 ", 2).unwrap().unwrap();
        assert_eq!(r, vec![vec![1, 0], vec![0, 1]]);
        assert_eq!(parse("0 1 2", 4).unwrap(), None, "rings for another size");
        for bad in [
            "0 1 2 x",
            "0 1 1 3",
            "0 1 2 3|",
            "0 1 2 3|0 1",
            "0 1 2 4",
            "|",
            "-1 0",
        ] {
            let e = parse(bad, 4).unwrap_err();
            assert_eq!(e.code, NcclResult::InvalidArgument, "{bad}");
        }
    }

    #[test]
    fn rings_across_nodes_cross_each_node_boundary_once() {
        let nodes = vec![vec![0, 1], vec![2, 3], vec![4, 5]];
        let rings = across_nodes(&nodes);
        assert_eq!(rings, vec![vec![0, 1, 2, 3, 4, 5], vec![1, 0, 3, 2, 5, 4]]);
        for ring in &rings {
            assert!(is_permutation(ring, 6));
            let node = |r: usize| r / 2;
            let crossings = (0..6)
                .filter(|&i| node(ring[i]) != node(ring[(i + 1) % 6]))
                .count();
            assert_eq!(crossings, 3, "one exit per node: {ring:?}");
        }
        assert_eq!(across_nodes(&[vec![1], vec![0]]), vec![vec![1, 0]]);
    }

    #[test]
    fn channels_repeat_the_rings() {
        let r = Rings::new(4, 5, &[vec![0, 2, 1, 3], vec![3, 1, 2, 0]]);
        assert_eq!(r.distinct().len(), 2);
        assert_eq!(r.ring(4), &[0, 2, 1, 3]);
        assert_eq!(r.ring(3), &[3, 1, 2, 0]);
        assert_eq!(r.peers(0, 2), (0, 1));
        assert_eq!(r.peers(1, 3), (0, 1));
        assert_eq!(r.position(1, 3), 0);
        let same = Rings::new(4, 3, &[vec![0, 1, 2, 3], vec![0, 1, 2, 3]]);
        assert_eq!(same.distinct().len(), 1);
        assert_eq!(Rings::rank_order(3, 2).ring(1), &[0, 1, 2]);
    }

    #[test]
    fn records_round_trip() {
        let rings = vec![vec![0, 2, 1, 3], vec![3, 1, 2, 0]];
        assert_eq!(decode(&encode(&Ok(rings.clone())), 4).unwrap(), rings);
        let e = decode(&encode(&Err(Error::invalid_argument("NCCL_RINGS bad"))), 4).unwrap_err();
        assert_eq!(e.code, NcclResult::InvalidArgument);
        assert!(e.message.contains("NCCL_RINGS bad"), "{e}");
        let mut b = encode(&Ok(rings));
        b.pop();
        assert_eq!(decode(&b, 4).unwrap_err().code, NcclResult::RemoteError);
        assert_eq!(decode(&[], 4).unwrap_err().code, NcclResult::RemoteError);
    }
}
