//! The one-node tree AllReduce's up connections ([`TreeUp`]): each tree CTA runs the chain of
//! its channel's ring and sends up to its predecessor there. Made at creation (stage 6 of
//! `create.rs`).

use super::{Rings, Shape, TreeUp};
use crate::error::Result;
use crate::transport::links::Links;
use crate::transport::Dir;

/// Connects the tree's up direction (the reverse of each tree CTA's ring, as send/recv links)
/// when the filters allow the tree: every rank does it at init, so no collective waits on a
/// handshake. There is a tree CTA per channel: CTA `c` runs the chain of channel `c`'s ring,
/// rooted at its position 0; it sends up to its predecessor there and receives from its
/// successor.
///
/// When every channel has the same ring and the send/recv links have a connection per channel
/// and `slot_bytes`-byte slots, the up links are those to the two neighbours, shared with
/// ncclSend/ncclRecv. Otherwise they are links of the tree's own (`own(n)` makes links of `n`
/// connections per peer; with one link per CTA, 4xH200 ran the tree on 4 CTAs at 0.16 of
/// NCCL's busbw); where the channels' rings differ, CTA `c` takes connection `c` of its own
/// peer, gathered into one array per direction. Every rank decides alike (the rings are rank
/// 0's), so both ends of every link take the same path.
pub(super) fn connect(
    rank: usize,
    links: &Links,
    shape: &Shape,
    rings: &Rings,
    slot_bytes: usize,
    own: impl FnOnce(usize) -> Links,
) -> Result<Option<TreeUp>> {
    use crate::tune::{Algo, AlgoFilter, Coll};
    let nranks = rings.nranks();
    let allowed =
        AlgoFilter::from_mask(shape.algo_mask).allows(Coll::AllReduce, Algo::Tree as usize);
    if nranks == 1 || !allowed {
        return Ok(None);
    }
    let ctas = (shape.nchannels as usize).max(1);
    // Per CTA: (predecessor to send up to, successor to receive from).
    let ups: Vec<(Option<usize>, Option<usize>)> = (0..ctas)
        .map(|c| {
            let pos = rings.position(c, rank);
            let (prev, next) = rings.peers(c, rank);
            (
                (pos > 0).then_some(prev),
                (pos + 1 < nranks).then_some(next),
            )
        })
        .collect();
    let picks = |ups: &[(Option<usize>, Option<usize>)]| {
        let send: Vec<_> = ups.iter().map(|u| u.0.map(|p| (p, Dir::Send))).collect();
        let recv: Vec<_> = ups.iter().map(|u| u.1.map(|p| (p, Dir::Recv))).collect();
        (send, recv)
    };
    let connect = |links: &Links, needs: Vec<(usize, Dir)>| -> Result<()> {
        let started = links.start(&needs)?;
        links
            .finish(started)
            .map_err(|e| e.context("tree connections"))
    };
    // Connection 0 of the neighbours' links: an array of a connection per CTA.
    let first_conns = |links: &Links| -> Result<(u64, u64)> {
        let (send, recv) = picks(&ups[..1]);
        connect(links, send.iter().chain(&recv).flatten().copied().collect())?;
        let conn = |pick: Option<(usize, Dir)>| match pick {
            Some((peer, dir)) => links.conn(peer, dir, 0),
            None => Ok(0),
        };
        Ok((conn(send[0])?, conn(recv[0])?))
    };
    let one_ring = (0..ctas).all(|c| rings.index_of(c) == rings.index_of(0));
    if one_ring && links.nconns >= ctas && links.slot_bytes == slot_bytes {
        return Ok(Some(TreeUp {
            arrays: first_conns(links)?,
            ctas,
            slot_bytes: links.slot_bytes,
            _own: None,
        }));
    }
    let tree_links = own(ctas);
    let slot_bytes = tree_links.slot_bytes;
    if one_ring {
        let arrays = first_conns(&tree_links)?;
        return Ok(Some(TreeUp {
            arrays,
            ctas,
            slot_bytes,
            _own: Some((tree_links, None)),
        }));
    }
    let (send, recv) = picks(&ups);
    connect(
        &tree_links,
        send.iter().chain(&recv).flatten().copied().collect(),
    )?;
    let send_arr = tree_links.gather(&send)?;
    let recv_arr = tree_links.gather(&recv)?;
    Ok(Some(TreeUp {
        arrays: (send_arr.ptr, recv_arr.ptr),
        ctas,
        slot_bytes,
        _own: Some((tree_links, Some((send_arr, recv_arr)))),
    }))
}
