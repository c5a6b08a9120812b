//! NCCL 2.28's all-to-all, gather and scatter (`ncclAlltoAll`, `ncclGather`, `ncclScatter`),
//! each one group of sends and receives, as NCCL's point-to-point documentation builds them.
//! Programs built against 2.28 link them (PyTorch does), so the drop-in library has them.

use super::group;
use crate::comm::copy_engine::CopyColl;
use crate::comm::Comm;
use crate::cuda::{DevPtr, StreamHandle};
use crate::error::{Error, Result};
use nccl_device::types::DataType;

/// Bytes of `count` elements, and the offset of block `nranks - 1`: checked, so every block's
/// address fits.
fn block_bytes(what: &str, count: usize, dt: DataType, nranks: usize) -> Result<usize> {
    count
        .checked_mul(dt.size())
        .filter(|b| {
            b.checked_mul(nranks)
                .is_some_and(|t| t <= isize::MAX as usize)
        })
        .ok_or_else(|| {
            Error::invalid_argument(format!(
                "{what}: count {count} of {} times {nranks} ranks overflows the byte size",
                dt.name()
            ))
        })
}

/// [`Comm::send`] or [`Comm::recv`]: (buffer, count, type, peer, stream).
type MoveFn = unsafe fn(&Comm, DevPtr, usize, DataType, usize, StreamHandle) -> Result<()>;

fn check_root(what: &str, root: usize, nranks: usize) -> Result<()> {
    if root >= nranks {
        return Err(Error::invalid_argument(format!(
            "{what}: root {root} is out of range (nranks {nranks})"
        )));
    }
    Ok(())
}

/// Runs `issue` inside a group of its own (nested in the caller's, if any): its sends and
/// receives go out together, now when the caller has no group (also for non-blocking
/// communicators, as any collective outside a group). The first error wins; the group is
/// ended either way.
fn in_group(issue: impl FnOnce() -> Result<()>) -> Result<()> {
    group::start();
    let issued = issue();
    let ended = group::end_inline();
    issued.and(ended)
}

impl Comm {
    /// Issues `coll` on the copy engines where it may run there (`comm/copy_engine.rs`):
    /// whether it did. An error is the group's, in `what`'s name. Where a profiler listens, a
    /// call the copy engines take is a `CollApi` event (`api`: its count, type and root) with
    /// its `CeColl`, in a group of its own outside any.
    #[allow(clippy::too_many_arguments)]
    fn copy_engine(
        &self,
        what: &str,
        coll: CopyColl,
        send: DevPtr,
        recv: DevPtr,
        block: u64,
        stream: StreamHandle,
        (count, dt, root): (usize, DataType, usize),
    ) -> Result<bool> {
        let mut took = false;
        let issue = || -> Result<()> {
            let mut task = None;
            let profile = || {
                task = self.profile_call(false, || {
                    self.api_call(coll.name(), count, dt, root, stream)
                });
                task.clone()
            };
            let Some(job) =
                self.copy_engine_job(coll, send, recv, block as usize, stream, profile)?
            else {
                return Ok(());
            };
            let queued = self
                .enter_call(what.trim_start_matches("nccl"))
                .and_then(|()| group::ordered(job));
            // The API event ends whatever became of the call.
            if let Some(t) = &task {
                t.queued();
            }
            took = queued.is_ok();
            queued
        };
        group::own_if_profiled(self, issue).map_err(|e| group::record_error(e.context(what)))?;
        Ok(took)
    }

    /// `ncclAlltoAll`: block `j` (`count` elements) of `send` goes to rank `j`, and rank `i`'s
    /// block lands at block `i` of `recv`. Not in place (`send` == `recv`), as in NCCL.
    ///
    /// # Safety
    ///
    /// As [`Comm::send_raw`] and [`Comm::recv_raw`], for every block the call moves.
    pub unsafe fn all_to_all_raw(
        &self,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        dtype: DataType,
        stream: StreamHandle,
    ) -> Result<()> {
        let what = "ncclAlltoAll";
        let n = self.count();
        let block = block_bytes(what, count, dtype, n).map_err(group::record_error)? as u64;
        if send == recv && block > 0 {
            return Err(group::record_error(Error::invalid_argument(format!(
                "{what}: sendbuff and recvbuff are the same buffer; in-place all-to-all is not \
                 supported"
            ))));
        }
        // With CTAPolicy zero into a symmetric window: the copy engines (`comm/copy_engine.rs`).
        let api = (count, dtype, 0);
        if self.copy_engine(what, CopyColl::AllToAll, send, recv, block, stream, api)? {
            return Ok(());
        }
        in_group(|| {
            for peer in 0..n {
                let at = peer as u64 * block;
                // SAFETY: the caller's contract covers every block of both buffers.
                unsafe {
                    self.send_raw(send + at, count, dtype, peer, stream)?;
                    self.recv_raw(recv + at, count, dtype, peer, stream)?;
                }
            }
            Ok(())
        })
    }

    /// `ncclGather`: every rank's `count` elements of `send` land at block `i` (rank `i`'s)
    /// of `recv` on `root`; `recv` is not used elsewhere. In place at the root when `send` is
    /// its own block of `recv`.
    ///
    /// # Safety
    ///
    /// As [`Comm::send_raw`] and [`Comm::recv_raw`], for every block the call moves.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gather_raw(
        &self,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.rooted("ncclGather", true, recv, send, count, dtype, root, stream) }
    }

    /// `ncclScatter`: block `i` (`count` elements) of `send` on `root` lands in rank `i`'s
    /// `recv`; `send` is not used elsewhere. In place at the root when `recv` is its own block
    /// of `send`.
    ///
    /// # Safety
    ///
    /// As [`Comm::send_raw`] and [`Comm::recv_raw`], for every block the call moves.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn scatter_raw(
        &self,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        // SAFETY: the caller's contract.
        unsafe { self.rooted("ncclScatter", false, send, recv, count, dtype, root, stream) }
    }

    /// Gather (`to_root`) or scatter: the root moves block `i` of `blocks` from or to rank
    /// `i`, and every rank its `mine`; nothing moves at the root when `mine` is its own block.
    ///
    /// # Safety
    ///
    /// As [`Comm::gather_raw`] and [`Comm::scatter_raw`].
    #[allow(clippy::too_many_arguments)]
    unsafe fn rooted(
        &self,
        what: &str,
        to_root: bool,
        blocks: DevPtr,
        mine: DevPtr,
        count: usize,
        dtype: DataType,
        root: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        let (n, me) = (self.count(), self.rank());
        check_root(what, root, n).map_err(group::record_error)?;
        let block = block_bytes(what, count, dtype, n).map_err(group::record_error)? as u64;
        let at = |r: usize| blocks + r as u64 * block;
        // With CTAPolicy zero, every rank's own block in a symmetric window: the copy engines.
        let coll = match to_root {
            true => CopyColl::Gather { root },
            false => CopyColl::Scatter { root },
        };
        let (send, recv) = if to_root {
            (mine, blocks)
        } else {
            (blocks, mine)
        };
        if self.copy_engine(what, coll, send, recv, block, stream, (count, dtype, root))? {
            return Ok(());
        }
        let (root_side, rank_side) = match to_root {
            true => (Comm::recv_raw as MoveFn, Comm::send_raw as MoveFn),
            false => (Comm::send_raw as MoveFn, Comm::recv_raw as MoveFn),
        };
        in_group(|| {
            if me == root {
                for peer in (0..n).filter(|&p| !(p == me && at(p) == mine)) {
                    // SAFETY: block `peer` of the caller's buffer (the caller's contract).
                    unsafe { root_side(self, at(peer), count, dtype, peer, stream)? };
                }
            }
            if !(me == root && at(me) == mine) {
                // SAFETY: the caller's own block (the caller's contract).
                unsafe { rank_side(self, mine, count, dtype, root, stream)? };
            }
            Ok(())
        })
    }
}
