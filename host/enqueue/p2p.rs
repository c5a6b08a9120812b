//! ncclSend / ncclRecv. Calls are checked at once and gathered until the group ends (a lone
//! call is a group of one); then the connections they need are made and each communicator's
//! operations on one stream go out as one launch, a CTA per connection used, so that sends and
//! receives between the same ranks progress together.

use super::group;
use crate::cuda::{DevPtr, StreamHandle};
use crate::error::{Error, Result};
use crate::transport::links::{Dir, Links};
use nccl_device::abi::{P2pArgs, P2pItem, P2pKind, MAX_P2P_ITEMS};
use std::sync::Arc;

/// One send or receive waiting for its group to end.
pub struct P2pOp {
    pub links: Arc<Links>,
    pub order: Arc<super::order::StreamOrder>,
    pub peer: usize,
    pub dir: Dir,
    pub buff: DevPtr,
    pub bytes: usize,
    pub stream: StreamHandle,
}

/// `ncclSend` (`dir` Send) and `ncclRecv` (`dir` Recv): checks the call, then records it until
/// the group ends (or runs it now outside a group).
#[allow(clippy::too_many_arguments)]
pub fn submit(
    comm: &crate::comm::Comm,
    dir: Dir,
    buff: DevPtr,
    count: usize,
    dt: nccl_device::types::DataType,
    peer: usize,
    stream: StreamHandle,
) -> Result<()> {
    let what = if dir == Dir::Send {
        "ncclSend"
    } else {
        "ncclRecv"
    };
    let checked = || -> Result<P2pOp> {
        comm.check_usable()?;
        if peer >= comm.nranks {
            return Err(Error::invalid_argument(format!(
                "peer {peer} is out of range (nranks {})",
                comm.nranks
            )));
        }
        let bytes = count
            .checked_mul(dt.size())
            .filter(|&b| b <= isize::MAX as usize)
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "count {count} of {} overflows the byte size",
                    dt.name()
                ))
            })?;
        if bytes > 0 {
            super::check_buffer(
                comm,
                if dir == Dir::Send {
                    "sendbuff"
                } else {
                    "recvbuff"
                },
                buff,
                bytes,
                dt,
            )?;
        }
        Ok(P2pOp {
            links: comm.links.clone(),
            order: comm.order.clone(),
            peer,
            dir,
            buff,
            bytes,
            stream,
        })
    };
    match checked() {
        Ok(op) => group::p2p(op),
        Err(e) => Err(group::record_error(e.context(what))),
    }
}

/// The byte range connection `c` of `n` carries of a `bytes`-long message (16-byte aligned
/// pieces; the last ones may be empty).
pub fn part(bytes: usize, n: usize, c: usize) -> (usize, usize) {
    let per = bytes.div_ceil(n).next_multiple_of(16);
    let s = (c * per).min(bytes);
    (s, (s + per).min(bytes) - s)
}

/// Launches everything a group gathered: per (communicator, stream), in issue order, a new
/// launch whenever a connection would be used twice or the items run out.
pub fn flush(ops: Vec<P2pOp>) -> Result<()> {
    let mut batches: Vec<Vec<P2pOp>> = Vec::new();
    for op in ops {
        match batches
            .iter_mut()
            .find(|b| Arc::ptr_eq(&b[0].links, &op.links) && b[0].stream == op.stream)
        {
            Some(b) => b.push(op),
            None => batches.push(vec![op]),
        }
    }
    // Publish every new connection of every communicator first, then wait for the peers.
    let mut started = Vec::new();
    for batch in &batches {
        let links = &batch[0].links;
        let needs: Vec<(usize, Dir)> = batch
            .iter()
            .filter(|o| o.peer != links.rank())
            .map(|o| (o.peer, o.dir))
            .collect();
        started.push(links.start(&needs)?);
    }
    for (batch, s) in batches.iter().zip(started) {
        batch[0].links.finish(s)?;
    }
    for batch in batches {
        let links = batch[0].links.clone();
        let order = batch[0].order.clone();
        let stream = batch[0].stream;
        // Sends to ourselves pair with receives from ourselves, in order.
        let self_sends: Vec<&P2pOp> = batch
            .iter()
            .filter(|o| o.peer == links.rank() && o.dir == Dir::Send)
            .collect();
        let self_recvs: Vec<&P2pOp> = batch
            .iter()
            .filter(|o| o.peer == links.rank() && o.dir == Dir::Recv)
            .collect();
        if self_sends.len() != self_recvs.len() {
            return Err(Error::invalid_usage(format!(
                "rank {}: {} sends to itself but {} receives from itself in one group",
                links.rank(),
                self_sends.len(),
                self_recvs.len()
            )));
        }
        let mut args = P2pArgs::default();
        let mut used: Vec<(usize, Dir)> = Vec::new();
        let launch = |args: &mut P2pArgs| -> Result<()> {
            if args.nitems > 0 {
                let k = links.device().kernel("nccl_p2p", "nccl_p2p")?;
                let threads = crate::cuda::MAX_THREADS.min(links_threads(&links));
                order.launch(stream, || {
                    links
                        .device()
                        .launch(k, args.nitems, threads, stream, &*args)
                })?;
                *args = P2pArgs::default();
            }
            Ok(())
        };
        let mut items: Vec<P2pItem> = Vec::new();
        for (s, r) in self_sends.iter().zip(&self_recvs) {
            if s.bytes != r.bytes {
                return Err(Error::invalid_usage(format!(
                    "send to self of {} bytes matched with a receive of {} bytes",
                    s.bytes, r.bytes
                )));
            }
            items.push(P2pItem {
                conn: 0,
                buff: r.buff,
                src: s.buff,
                bytes: s.bytes as u64,
                kind: P2pKind::Copy as u32,
                slot_bytes: 0,
            });
        }
        for op in batch.iter().filter(|o| o.peer != links.rank()) {
            if used.contains(&(op.peer, op.dir))
                || args.nitems as usize + links.nconns > MAX_P2P_ITEMS
            {
                launch(&mut args)?;
                used.clear();
            }
            used.push((op.peer, op.dir));
            for c in 0..links.nconns {
                let (off, len) = part(op.bytes, links.nconns, c);
                args.items[args.nitems as usize] = P2pItem {
                    conn: links.conn(op.peer, op.dir, c)?,
                    buff: op.buff + off as u64,
                    src: 0,
                    bytes: len as u64,
                    kind: if op.dir == Dir::Send {
                        P2pKind::Send as u32
                    } else {
                        P2pKind::Recv as u32
                    },
                    slot_bytes: links.slot_bytes as u32,
                };
                args.nitems += 1;
            }
        }
        for it in items {
            if args.nitems as usize == MAX_P2P_ITEMS {
                launch(&mut args)?;
            }
            args.items[args.nitems as usize] = it;
            args.nitems += 1;
        }
        launch(&mut args)?;
    }
    Ok(())
}

/// Threads per p2p CTA: the simulator's small CTAs, else a full one.
fn links_threads(links: &Links) -> u32 {
    if links.device().is_sim() {
        crate::env::int("NCCL_RS_SIM_NTHREADS").clamp(1, 64) as u32
    } else {
        crate::env::int("NCCL_NTHREADS").clamp(32, crate::cuda::MAX_THREADS as i64) as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parts_cover_the_message_once() {
        for bytes in [0usize, 1, 15, 16, 17, 1000, 1 << 20] {
            for n in [1usize, 2, 4] {
                let mut next = 0;
                for c in 0..n {
                    let (s, len) = part(bytes, n, c);
                    assert_eq!(s, next.min(bytes));
                    assert!(len == 0 || s % 16 == 0);
                    next = s + len;
                }
                assert_eq!(next, bytes, "bytes {bytes} n {n}");
            }
        }
    }
}
