//! Which transport joins each pair of ranks, as NCCL chooses: ranks on different nodes use the
//! network; on one node p2p where `NCCL_P2P_DISABLE`, `NCCL_P2P_LEVEL` (against the topology's
//! path between the two GPUs) and peer access allow it, else SHM unless `NCCL_SHM_DISABLE`,
//! else the network too.
//!
//! Each rank judges its own row (its parameters, its view of the topology and peer access);
//! the rows are all-gathered and a pair takes the farther of its two judgements, so both ends
//! of every connection, and every rank's view of the whole matrix, agree.

use super::peer::PeerInfo;
use crate::bootstrap::Bootstrap;
use crate::cuda::Device;
use crate::error::{Error, Result};
use crate::graph::{self, Transport};
use crate::topo::{normalize_busid, PathType, Paths, System};

/// The transport of every pair of ranks, alike on every rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Transports {
    rows: Vec<Vec<Transport>>,
}

fn code(t: Transport) -> u8 {
    match t {
        Transport::P2p => 0,
        Transport::Shm => 1,
        Transport::Net => 2,
    }
}

fn decode(b: u8) -> Option<Transport> {
    match b {
        0 => Some(Transport::P2p),
        1 => Some(Transport::Shm),
        2 => Some(Transport::Net),
        _ => None,
    }
}

/// The path between the GPUs of ranks `a` and `b` in `system` (this node's topology); NVLink
/// where the topology does not hold them as those ranks (the simulator's and the kernel lab's
/// synthetic NVSwitch node, where every pair is NVLink).
fn path_type(system: &System, paths: &Paths, peers: &[PeerInfo], a: usize, b: usize) -> PathType {
    if peers[a].bus_id == peers[b].bus_id {
        return PathType::Loc;
    }
    let at = |r: usize| {
        let bus = normalize_busid(&peers[r].bus_id);
        system
            .gpus
            .iter()
            .position(|g| g.rank == r && normalize_busid(&g.busid) == bus)
    };
    match (at(a), at(b)) {
        (Some(i), Some(j)) => paths.gpu_gpu[i][j].ty,
        _ => PathType::Nvl,
    }
}

/// This rank's judgement of its transport to every rank (itself: p2p).
pub(super) fn own_row(
    rank: usize,
    device: &Device,
    peers: &[PeerInfo],
    system: &System,
) -> Result<Vec<Transport>> {
    let params = graph::Params::from_env()?;
    let me = &peers[rank];
    let paths = system.paths();
    peers
        .iter()
        .enumerate()
        .map(|(r, p)| {
            if r == rank {
                return Ok(Transport::P2p);
            }
            if p.host_hash != me.host_hash {
                return Ok(Transport::Net);
            }
            let mut ty = path_type(system, &paths, peers, rank, r);
            // Peer access is what p2p needs in one process; across processes the topology's
            // path says it (CUDA IPC over a disconnected path is refused there).
            if p.same_process(me) && p.device != me.device {
                let other = Device::open(p.device)?;
                if !device.can_access_peer(&other)? {
                    ty = PathType::Dis;
                }
            }
            Ok(graph::transport_over(ty, &params))
        })
        .collect()
}

impl Transports {
    /// All-gathers every rank's row and settles each pair on the farther of its two.
    pub(super) fn agree(bootstrap: &Bootstrap, row: &[Transport]) -> Result<Transports> {
        let mine: Vec<u8> = row.iter().map(|&t| code(t)).collect();
        let all = bootstrap.allgather(&mine)?;
        let n = row.len();
        let mut rows = Vec::with_capacity(n);
        for (r, b) in all.iter().enumerate() {
            let row = b
                .iter()
                .map(|&c| decode(c))
                .collect::<Option<Vec<_>>>()
                .filter(|v| v.len() == n)
                .ok_or_else(|| Error::remote(format!("rank {r} sent a malformed transport row")))?;
            rows.push(row);
        }
        Ok(Transports::settle(rows))
    }

    /// Each pair on the farther of its two rows' transports.
    fn settle(rows: Vec<Vec<Transport>>) -> Transports {
        let settled = (0..rows.len())
            .map(|a| {
                (0..rows.len())
                    .map(|b| rows[a][b].max(rows[b][a]))
                    .collect()
            })
            .collect();
        Transports { rows: settled }
    }

    /// How ranks `a` and `b` talk.
    pub(crate) fn between(&self, a: usize, b: usize) -> Transport {
        self.rows[a][b]
    }

    /// Whether any pair talks through `t`.
    pub(crate) fn any(&self, t: Transport) -> bool {
        self.rows.iter().flatten().any(|&x| x == t)
    }

    /// The ranks rank `me` reaches through the network.
    pub(crate) fn remote(&self, me: usize) -> Vec<bool> {
        self.rows[me].iter().map(|&t| t == Transport::Net).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Transport::{Net, P2p, Shm};

    #[test]
    fn pairs_take_the_farther_judgement() {
        // Rank 1 has p2p off (SHM towards 0 and 2); rank 2 also has SHM off towards 0.
        let t = Transports::settle(vec![
            vec![P2p, P2p, P2p],
            vec![Shm, P2p, Shm],
            vec![Net, P2p, P2p],
        ]);
        assert_eq!(t.between(0, 1), Shm);
        assert_eq!(t.between(1, 0), Shm);
        assert_eq!(t.between(1, 2), Shm);
        assert_eq!(t.between(0, 2), Net);
        assert_eq!(t.between(2, 0), Net);
        assert_eq!(t.remote(0), vec![false, false, true]);
        assert!(t.any(Shm) && t.any(Net));
        for r in 0..3 {
            assert_eq!(t.between(r, r), P2p);
        }
    }

    #[test]
    fn codes_round_trip() {
        for t in [P2p, Shm, Net] {
            assert_eq!(decode(code(t)), Some(t));
        }
        assert_eq!(decode(7), None);
    }
}
