//! One-sided operations in the C ABI (NCCL 2.29): `ncclPutSignal`, `ncclSignal`,
//! `ncclWaitSignal` (`comm/onesided.rs`). `sigIdx`, `ctx` and `flags` are reserved by NCCL
//! and must be 0.

use super::*;
use crate::comm::onesided::SignalWait;

/// `ncclWaitSignalDesc_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct WaitSignalDesc {
    /// How many signals from `peer` to wait for.
    pub op_cnt: c_int,
    /// The rank whose signals are awaited.
    pub peer: c_int,
    /// Reserved: 0.
    pub sig_idx: c_int,
    /// Reserved: 0.
    pub ctx: c_int,
}

/// NCCL's reserved arguments must be 0 for now.
fn reserved(what: &str, sig_idx: c_int, ctx: c_int, flags: u32) -> Result<()> {
    if sig_idx != 0 || ctx != 0 || flags != 0 {
        return Err(Error::invalid_argument(format!(
            "{what}: sigIdx {sig_idx}, ctx {ctx} and flags {flags:#x} are reserved and must be 0"
        )));
    }
    Ok(())
}

export! {
    /// `ncclPutSignal` (NCCL 2.29).
    fn ncclPutSignal / pncclPutSignal(
        localbuff: *const c_void,
        count: usize,
        datatype: c_int,
        peer: c_int,
        peer_win: *mut c_void,
        peer_win_offset: usize,
        sig_idx: c_int,
        ctx: c_int,
        flags: u32,
        comm: NcclComm,
        stream: CudaStream,
    ) {
        reserved("ncclPutSignal", sig_idx, ctx, flags)?;
        let dt = dtype(datatype)?;
        let peer = count_of("peer", peer)?;
        let (c, s) = coll_comm(comm, stream)?;
        let win = peer_win as usize as u64;
        // SAFETY: the C caller's buffer, under NCCL's contract (valid until the work ran).
        c.put_signal_raw(dev(localbuff), count, dt, peer, win, peer_win_offset, s)?;
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclSignal` (NCCL 2.29).
    fn ncclSignal / pncclSignal(
        peer: c_int,
        sig_idx: c_int,
        ctx: c_int,
        flags: u32,
        comm: NcclComm,
        stream: CudaStream,
    ) {
        reserved("ncclSignal", sig_idx, ctx, flags)?;
        let peer = count_of("peer", peer)?;
        let (c, s) = coll_comm(comm, stream)?;
        c.signal_raw(peer, s)?;
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclWaitSignal` (NCCL 2.29): `n_desc` descriptors at `descs`.
    fn ncclWaitSignal / pncclWaitSignal(
        n_desc: c_int,
        descs: *const WaitSignalDesc,
        comm: NcclComm,
        stream: CudaStream,
    ) {
        let n = count_of("nDesc", n_desc)?;
        let (c, s) = coll_comm(comm, stream)?;
        if n > 0 && descs.is_null() {
            return Err(null("signalDescs"));
        }
        let mut waits = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: the caller passes `n_desc` descriptors (checked non-null above).
            let d = *descs.add(i);
            reserved("ncclWaitSignal", d.sig_idx, d.ctx, 0)?;
            waits.push(SignalWait {
                peer: count_of("peer", d.peer)?,
                ops: count_of("opCnt", d.op_cnt)? as u64,
            });
        }
        c.wait_signal_raw(&waits, s)?;
        Ok(NcclResult::Success)
    }
}
