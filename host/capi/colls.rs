//! The collectives and point-to-point calls of the C ABI: each checks its arguments, finds the
//! communicator and calls the Rust API's raw form.

use super::*;

export! {
    /// `ncclAllReduce`.
    fn ncclAllReduce / pncclAllReduce(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        op: c_int,
        comm: NcclComm,
        stream: CudaStream,
    ) {
        let dt = dtype(datatype)?;
        let h = handle(comm)?;
        let op = h.reduce_op(op, dt)?;
        let (c, s) = (h.ready()?, stream_of(stream));
        // SAFETY: the C caller's buffers, under NCCL's contract (valid until the work ran).
        c.all_reduce_raw(dev(sendbuff), dev(recvbuff), count, dt, op, s)?;
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclBroadcast`.
    fn ncclBroadcast / pncclBroadcast(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        root: c_int,
        comm: NcclComm,
        stream: CudaStream,
    ) {
        let dt = dtype(datatype)?;
        let root = count_of("root", root)?;
        let (c, s) = coll_comm(comm, stream)?;
        // SAFETY: the C caller's buffers, under NCCL's contract (valid until the work ran).
        c.broadcast_raw(dev(sendbuff), dev(recvbuff), count, dt, root, s)?;
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclBcast`: the legacy in-place Broadcast (`buff` is the root's input and every rank's
    /// output).
    fn ncclBcast / pncclBcast(
        buff: *mut c_void,
        count: usize,
        datatype: c_int,
        root: c_int,
        comm: NcclComm,
        stream: CudaStream,
    ) {
        Ok(ncclBroadcast(buff, buff, count, datatype, root, comm, stream))
    }
}

export! {
    /// `ncclSend`.
    fn ncclSend / pncclSend(
        sendbuff: *const c_void,
        count: usize,
        datatype: c_int,
        peer: c_int,
        comm: NcclComm,
        stream: CudaStream,
    ) {
        let dt = dtype(datatype)?;
        let peer = count_of("peer", peer)?;
        let (c, s) = coll_comm(comm, stream)?;
        // SAFETY: the C caller's buffers, under NCCL's contract (valid until the work ran).
        c.send_raw(dev(sendbuff), count, dt, peer, s)?;
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclRecv`.
    fn ncclRecv / pncclRecv(
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        peer: c_int,
        comm: NcclComm,
        stream: CudaStream,
    ) {
        let dt = dtype(datatype)?;
        let peer = count_of("peer", peer)?;
        let (c, s) = coll_comm(comm, stream)?;
        // SAFETY: the C caller's buffers, under NCCL's contract (valid until the work ran).
        c.recv_raw(dev(recvbuff), count, dt, peer, s)?;
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclReduce`.
    fn ncclReduce / pncclReduce(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        op: c_int,
        root: c_int,
        comm: NcclComm,
        stream: CudaStream,
    ) {
        let dt = dtype(datatype)?;
        let h = handle(comm)?;
        let op = h.reduce_op(op, dt)?;
        let root = count_of("root", root)?;
        let (c, s) = (h.ready()?, stream_of(stream));
        // SAFETY: the C caller's buffers, under NCCL's contract (valid until the work ran).
        c.reduce_raw(dev(sendbuff), dev(recvbuff), count, dt, op, root, s)?;
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclAllGather`.
    fn ncclAllGather / pncclAllGather(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        sendcount: usize,
        datatype: c_int,
        comm: NcclComm,
        stream: CudaStream,
    ) {
        let dt = dtype(datatype)?;
        let (c, s) = coll_comm(comm, stream)?;
        // SAFETY: the C caller's buffers, under NCCL's contract (valid until the work ran).
        c.all_gather_raw(dev(sendbuff), dev(recvbuff), sendcount, dt, s)?;
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclAlltoAll` (NCCL 2.28): block `j` of `sendbuff` to rank `j`, rank `i`'s block to
    /// block `i` of `recvbuff`; `count` elements per block. Not in place.
    fn ncclAlltoAll / pncclAlltoAll(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        comm: NcclComm,
        stream: CudaStream,
    ) {
        let dt = dtype(datatype)?;
        let (c, s) = coll_comm(comm, stream)?;
        // SAFETY: the C caller's buffers, under NCCL's contract (valid until the work ran).
        c.all_to_all_raw(dev(sendbuff), dev(recvbuff), count, dt, s)?;
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclGather` (NCCL 2.28): every rank's `count` elements to block `i` of `recvbuff` on
    /// `root`.
    fn ncclGather / pncclGather(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        root: c_int,
        comm: NcclComm,
        stream: CudaStream,
    ) {
        let dt = dtype(datatype)?;
        let root = count_of("root", root)?;
        let (c, s) = coll_comm(comm, stream)?;
        // SAFETY: the C caller's buffers, under NCCL's contract (valid until the work ran).
        c.gather_raw(dev(sendbuff), dev(recvbuff), count, dt, root, s)?;
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclScatter` (NCCL 2.28): block `i` of `sendbuff` on `root` to rank `i`'s `recvbuff`.
    fn ncclScatter / pncclScatter(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        count: usize,
        datatype: c_int,
        root: c_int,
        comm: NcclComm,
        stream: CudaStream,
    ) {
        let dt = dtype(datatype)?;
        let root = count_of("root", root)?;
        let (c, s) = coll_comm(comm, stream)?;
        // SAFETY: the C caller's buffers, under NCCL's contract (valid until the work ran).
        c.scatter_raw(dev(sendbuff), dev(recvbuff), count, dt, root, s)?;
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclReduceScatter`.
    fn ncclReduceScatter / pncclReduceScatter(
        sendbuff: *const c_void,
        recvbuff: *mut c_void,
        recvcount: usize,
        datatype: c_int,
        op: c_int,
        comm: NcclComm,
        stream: CudaStream,
    ) {
        let dt = dtype(datatype)?;
        let h = handle(comm)?;
        let op = h.reduce_op(op, dt)?;
        let (c, s) = (h.ready()?, stream_of(stream));
        // SAFETY: the C caller's buffers, under NCCL's contract (valid until the work ran).
        c.reduce_scatter_raw(dev(sendbuff), dev(recvbuff), recvcount, dt, op, s)?;
        Ok(NcclResult::Success)
    }
}
