//! The typed calls' checks: element counts from the views' lengths, each buffer long enough
//! and on the communicator's device, then the raw layer. Every refusal is
//! `ncclInvalidArgument` with a message naming the call, the buffer and both sizes.

use super::buffer::{DeviceSlice, DeviceSliceMut};
use super::element::Element;
use super::op::Op;
use super::stream::Stream;
use crate::comm::Comm;
use crate::error::{Error, Result};

/// The buffers' and the stream's device must be the communicator's.
fn on_device(comm: &Comm, what: &str, bufs: &[(&str, i32)], stream: &Stream) -> Result<()> {
    let mine = comm.device().ordinal;
    if stream.device().ordinal != mine {
        return Err(Error::invalid_argument(format!(
            "{what}: the stream is on device {} but the communicator (rank {}) is on device \
             {mine}",
            stream.device().ordinal,
            comm.rank()
        )));
    }
    for &(name, ordinal) in bufs {
        if ordinal != mine {
            return Err(Error::invalid_argument(format!(
                "{what}: {name} is on device {ordinal} but the communicator (rank {}) is on \
                 device {mine}",
                comm.rank()
            )));
        }
    }
    Ok(())
}

/// `buf` must hold at least `needs` elements (`why` says where the number comes from).
fn holds(what: &str, buf: &str, has: usize, needs: usize, why: &str) -> Result<()> {
    if has < needs {
        return Err(Error::invalid_argument(format!(
            "{what}: {buf} holds {has} elements but the call needs {needs} ({why})"
        )));
    }
    Ok(())
}

/// `nranks × count`, or an error when it overflows.
fn times_ranks(what: &str, comm: &Comm, count: usize) -> Result<usize> {
    count.checked_mul(comm.count()).ok_or_else(|| {
        Error::invalid_argument(format!(
            "{what}: {} ranks × {count} elements overflow",
            comm.count()
        ))
    })
}

/// The address of element `i` of a view at `ptr`.
fn at<T: Element>(ptr: u64, i: usize) -> u64 {
    ptr + (i * std::mem::size_of::<T>()) as u64
}

/// Issues an AllReduce of `send` into `recv`.
pub(crate) fn all_reduce<T: Element>(
    comm: &Comm,
    send: DeviceSlice<'_, T>,
    recv: DeviceSliceMut<'_, T>,
    op: Op<T>,
    stream: &Stream,
) -> Result<()> {
    let what = "ncclAllReduce";
    let bufs = [
        ("sendbuff", send.device_ordinal()),
        ("recvbuff", recv.device_ordinal()),
    ];
    on_device(comm, what, &bufs, stream)?;
    holds(
        what,
        "recvbuff",
        recv.len(),
        send.len(),
        "sendbuff's length",
    )?;
    let (s, r) = (send.as_raw_ptr(), recv.as_raw_ptr());
    // SAFETY: the views borrow live device memory on the communicator's device for as long
    // as the caller (a plain call, a group or a capture) keeps the work's borrows; `recv` is
    // exclusively borrowed and long enough.
    unsafe { comm.all_reduce_raw(s, r, send.len(), T::DATA_TYPE, op.to_raw(), stream.handle()) }
}

/// Issues an in-place AllReduce of `buf`.
pub(crate) fn all_reduce_in_place<T: Element>(
    comm: &Comm,
    buf: DeviceSliceMut<'_, T>,
    op: Op<T>,
    stream: &Stream,
) -> Result<()> {
    on_device(
        comm,
        "ncclAllReduce",
        &[("buff", buf.device_ordinal())],
        stream,
    )?;
    let p = buf.as_raw_ptr();
    // SAFETY: as in `all_reduce`; one exclusively borrowed view serves both sides.
    unsafe { comm.all_reduce_raw(p, p, buf.len(), T::DATA_TYPE, op.to_raw(), stream.handle()) }
}

/// Issues a Broadcast from `root`'s `send` (None elsewhere) into every `recv`.
pub(crate) fn broadcast<T: Element>(
    comm: &Comm,
    send: Option<DeviceSlice<'_, T>>,
    recv: DeviceSliceMut<'_, T>,
    root: usize,
    stream: &Stream,
) -> Result<()> {
    let what = "ncclBroadcast";
    on_device(comm, what, &[("recvbuff", recv.device_ordinal())], stream)?;
    let s = match (&send, comm.rank() == root) {
        (Some(s), true) => {
            on_device(comm, what, &[("sendbuff", s.device_ordinal())], stream)?;
            holds(what, "sendbuff", s.len(), recv.len(), "recvbuff's length")?;
            s.as_raw_ptr()
        }
        (None, true) if !recv.is_empty() => {
            return Err(Error::invalid_argument(format!(
                "{what}: the root (rank {root}) gave no sendbuff"
            )))
        }
        _ => 0,
    };
    // SAFETY: as in `all_reduce`; `send` is only read on the root, where it was checked.
    unsafe {
        comm.broadcast_raw(
            s,
            recv.as_raw_ptr(),
            recv.len(),
            T::DATA_TYPE,
            root,
            stream.handle(),
        )
    }
}

/// Issues an in-place Broadcast of `buf` from `root`.
pub(crate) fn broadcast_in_place<T: Element>(
    comm: &Comm,
    buf: DeviceSliceMut<'_, T>,
    root: usize,
    stream: &Stream,
) -> Result<()> {
    on_device(
        comm,
        "ncclBroadcast",
        &[("buff", buf.device_ordinal())],
        stream,
    )?;
    let p = buf.as_raw_ptr();
    // SAFETY: as in `all_reduce`.
    unsafe { comm.broadcast_raw(p, p, buf.len(), T::DATA_TYPE, root, stream.handle()) }
}

/// Issues a Reduce of every `send` into `root`'s `recv` (None elsewhere).
pub(crate) fn reduce<T: Element>(
    comm: &Comm,
    send: DeviceSlice<'_, T>,
    recv: Option<DeviceSliceMut<'_, T>>,
    op: Op<T>,
    root: usize,
    stream: &Stream,
) -> Result<()> {
    let what = "ncclReduce";
    on_device(comm, what, &[("sendbuff", send.device_ordinal())], stream)?;
    let r = match (&recv, comm.rank() == root) {
        (Some(r), true) => {
            on_device(comm, what, &[("recvbuff", r.device_ordinal())], stream)?;
            holds(what, "recvbuff", r.len(), send.len(), "sendbuff's length")?;
            r.as_raw_ptr()
        }
        (None, true) if !send.is_empty() => {
            return Err(Error::invalid_argument(format!(
                "{what}: the root (rank {root}) gave no recvbuff"
            )))
        }
        _ => 0,
    };
    let (s, n, op) = (send.as_raw_ptr(), send.len(), op.to_raw());
    // SAFETY: as in `all_reduce`; `recv` is only written on the root, where it was checked.
    unsafe { comm.reduce_raw(s, r, n, T::DATA_TYPE, op, root, stream.handle()) }
}

/// Issues an in-place Reduce of `buf` to `root`.
pub(crate) fn reduce_in_place<T: Element>(
    comm: &Comm,
    buf: DeviceSliceMut<'_, T>,
    op: Op<T>,
    root: usize,
    stream: &Stream,
) -> Result<()> {
    on_device(
        comm,
        "ncclReduce",
        &[("buff", buf.device_ordinal())],
        stream,
    )?;
    let (p, n, op) = (buf.as_raw_ptr(), buf.len(), op.to_raw());
    // SAFETY: as in `all_reduce`.
    unsafe { comm.reduce_raw(p, p, n, T::DATA_TYPE, op, root, stream.handle()) }
}

/// Issues an AllGather of every `send` into `recv` (nranks × send's length).
pub(crate) fn all_gather<T: Element>(
    comm: &Comm,
    send: DeviceSlice<'_, T>,
    recv: DeviceSliceMut<'_, T>,
    stream: &Stream,
) -> Result<()> {
    let what = "ncclAllGather";
    let bufs = [
        ("sendbuff", send.device_ordinal()),
        ("recvbuff", recv.device_ordinal()),
    ];
    on_device(comm, what, &bufs, stream)?;
    let need = times_ranks(what, comm, send.len())?;
    let why = format!("{} ranks × sendbuff's {}", comm.count(), send.len());
    holds(what, "recvbuff", recv.len(), need, &why)?;
    let (s, r) = (send.as_raw_ptr(), recv.as_raw_ptr());
    // SAFETY: as in `all_reduce`.
    unsafe { comm.all_gather_raw(s, r, send.len(), T::DATA_TYPE, stream.handle()) }
}

/// The per-rank block of an in-place AllGather or ReduceScatter over `len` elements.
fn block(what: &str, comm: &Comm, len: usize) -> Result<usize> {
    let n = comm.count();
    if !len.is_multiple_of(n) {
        return Err(Error::invalid_argument(format!(
            "{what}: in place, buff's {len} elements must be a multiple of the {n} ranks"
        )));
    }
    Ok(len / n)
}

/// Issues an in-place AllGather: this rank's block of `buf` is its input.
pub(crate) fn all_gather_in_place<T: Element>(
    comm: &Comm,
    buf: DeviceSliceMut<'_, T>,
    stream: &Stream,
) -> Result<()> {
    let what = "ncclAllGather";
    on_device(comm, what, &[("buff", buf.device_ordinal())], stream)?;
    let count = block(what, comm, buf.len())?;
    let p = buf.as_raw_ptr();
    let mine = at::<T>(p, comm.rank() * count);
    // SAFETY: as in `all_reduce`; the input is this rank's block of the same view.
    unsafe { comm.all_gather_raw(mine, p, count, T::DATA_TYPE, stream.handle()) }
}

/// Issues a ReduceScatter of every `send` (nranks × recv's length) into `recv`.
pub(crate) fn reduce_scatter<T: Element>(
    comm: &Comm,
    send: DeviceSlice<'_, T>,
    recv: DeviceSliceMut<'_, T>,
    op: Op<T>,
    stream: &Stream,
) -> Result<()> {
    let what = "ncclReduceScatter";
    let bufs = [
        ("sendbuff", send.device_ordinal()),
        ("recvbuff", recv.device_ordinal()),
    ];
    on_device(comm, what, &bufs, stream)?;
    let need = times_ranks(what, comm, recv.len())?;
    let why = format!("{} ranks × recvbuff's {}", comm.count(), recv.len());
    holds(what, "sendbuff", send.len(), need, &why)?;
    let (s, r, op) = (send.as_raw_ptr(), recv.as_raw_ptr(), op.to_raw());
    // SAFETY: as in `all_reduce`.
    unsafe { comm.reduce_scatter_raw(s, r, recv.len(), T::DATA_TYPE, op, stream.handle()) }
}

/// Issues an in-place ReduceScatter: this rank's block of `buf` receives its result.
pub(crate) fn reduce_scatter_in_place<T: Element>(
    comm: &Comm,
    buf: DeviceSliceMut<'_, T>,
    op: Op<T>,
    stream: &Stream,
) -> Result<()> {
    let what = "ncclReduceScatter";
    on_device(comm, what, &[("buff", buf.device_ordinal())], stream)?;
    let count = block(what, comm, buf.len())?;
    let p = buf.as_raw_ptr();
    let mine = at::<T>(p, comm.rank() * count);
    let op = op.to_raw();
    // SAFETY: as in `all_reduce`; the output is this rank's block of the same view.
    unsafe { comm.reduce_scatter_raw(p, mine, count, T::DATA_TYPE, op, stream.handle()) }
}

/// Issues a send of `buf` to `peer`.
pub(crate) fn send<T: Element>(
    comm: &Comm,
    buf: DeviceSlice<'_, T>,
    peer: usize,
    stream: &Stream,
) -> Result<()> {
    on_device(
        comm,
        "ncclSend",
        &[("sendbuff", buf.device_ordinal())],
        stream,
    )?;
    // SAFETY: as in `all_reduce`.
    unsafe {
        comm.send_raw(
            buf.as_raw_ptr(),
            buf.len(),
            T::DATA_TYPE,
            peer,
            stream.handle(),
        )
    }
}

/// Issues a receive into `buf` from `peer`, which sends exactly `buf.len()` elements.
pub(crate) fn recv<T: Element>(
    comm: &Comm,
    buf: DeviceSliceMut<'_, T>,
    peer: usize,
    stream: &Stream,
) -> Result<()> {
    on_device(
        comm,
        "ncclRecv",
        &[("recvbuff", buf.device_ordinal())],
        stream,
    )?;
    // SAFETY: as in `all_reduce`.
    unsafe {
        comm.recv_raw(
            buf.as_raw_ptr(),
            buf.len(),
            T::DATA_TYPE,
            peer,
            stream.handle(),
        )
    }
}

/// Issues an all-to-all: block `j` of `send` goes to rank `j`; rank `i`'s block lands in
/// block `i` of `recv`. Blocks are `send.len() / nranks` elements.
pub(crate) fn all_to_all<T: Element>(
    comm: &Comm,
    send: DeviceSlice<'_, T>,
    recv: DeviceSliceMut<'_, T>,
    stream: &Stream,
) -> Result<()> {
    let what = "ncclAlltoAll";
    let bufs = [
        ("sendbuff", send.device_ordinal()),
        ("recvbuff", recv.device_ordinal()),
    ];
    on_device(comm, what, &bufs, stream)?;
    let count = send.len() / comm.count();
    if count * comm.count() != send.len() {
        return Err(Error::invalid_argument(format!(
            "{what}: sendbuff's {} elements must be a multiple of the {} ranks",
            send.len(),
            comm.count()
        )));
    }
    holds(
        what,
        "recvbuff",
        recv.len(),
        send.len(),
        "sendbuff's length",
    )?;
    let (s, r) = (send.as_raw_ptr(), recv.as_raw_ptr());
    // SAFETY: as in `all_reduce`; two views, so never the same memory.
    unsafe { comm.all_to_all_raw(s, r, count, T::DATA_TYPE, stream.handle()) }
}
