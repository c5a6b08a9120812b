//! cudarc's `Group` on nccl-rs: [`Comm::group`] collects calls on cudarc views and issues them
//! together, inside one `ncclGroupStart` / `ncclGroupEnd`, when the group ends
//! ([`Group::end`], or its drop).
//!
//! Unlike cudarc's, the group opens nothing in the library until it ends: its calls are kept
//! in the group, with the views' borrows. A group that is leaked (`mem::forget`) therefore
//! never launches work on memory whose borrow is over; its calls are simply never issued.
//! One group at a time per thread: a thread that drives several ranks at once uses
//! [`crate::group`] with this crate's buffers.

use std::cell::Cell;

use super::buffer::{DeviceSlice, DeviceSliceMut};
use super::coll;
use super::cudarc_nccl::{index, Comm, NcclType, ReduceOp};
use super::interop::our_stream;
use super::stream::Stream;
use crate::error::{Error, Result};
use cudarc::driver::{CudaView, CudaViewMut, DeviceSlice as _, SyncOnDrop};

thread_local! {
    /// Whether a [`Group`] is collecting on this thread.
    static OPEN: Cell<bool> = const { Cell::new(false) };
}

/// One collected call: issued on the communicator and the stream at the group's end.
type Call<'g> = Box<dyn FnOnce(&crate::Comm, &Stream) -> Result<()> + 'g>;

/// Several calls of one rank issued together, as cudarc's `Group` (see the module's page).
/// Views must outlive the group, so make them before it, as with cudarc.
pub struct Group<'g> {
    comm: &'g Comm,
    calls: Vec<Call<'g>>,
    /// cudarc's read / write records, dropped (recorded) after the calls are ordered.
    syncs: Vec<SyncOnDrop<'g>>,
    /// Set when another group was collecting on this thread as this one began: every call
    /// is then refused.
    nested: bool,
    ended: bool,
}

impl std::fmt::Debug for Group<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Group")
            .field("rank", &self.comm.rank())
            .field("calls", &self.calls.len())
            .finish()
    }
}

impl Comm {
    /// Starts a group of this rank's calls (cudarc's `Comm::group`); they are issued together
    /// when it ends.
    pub fn group(&self) -> Group<'_> {
        let nested = OPEN.with(|o| o.replace(true));
        Group {
            comm: self,
            calls: Vec::new(),
            syncs: Vec::new(),
            nested,
            ended: false,
        }
    }
}

impl<'g> Group<'g> {
    /// The communicator of the group.
    pub fn comm(&self) -> &'g Comm {
        self.comm
    }

    fn push(&mut self, what: &str, call: Call<'g>, syncs: Vec<SyncOnDrop<'g>>) -> Result<()> {
        self.syncs.extend(syncs);
        if self.nested {
            return Err(Error::invalid_usage(format!(
                "{what}: another cudarc_nccl Group is open on this thread; one group at a \
                 time per thread (nccl::group drives several ranks from one thread)"
            )));
        }
        self.calls.push(call);
        Ok(())
    }

    /// A view the call reads: our slice of it and cudarc's record of the read.
    fn read<T: NcclType>(&self, v: CudaView<'g, T>) -> (DeviceSlice<'g, T>, SyncOnDrop<'g>) {
        let (n, o) = (v.len(), v.stream().context().ordinal() as i32);
        let (p, sync) = v.view_ptr(self.comm.cuda_stream());
        // SAFETY: the view borrows `n` elements of live device memory on device `o` for 'g,
        // which outlives every use of the slice (the group's calls run before it ends).
        (unsafe { DeviceSlice::from_raw(o, p, n) }, sync)
    }

    /// A view the call writes: our slice of it and cudarc's record of the write.
    fn write<T: NcclType>(&self, v: CudaViewMut<'g, T>) -> (DeviceSliceMut<'g, T>, SyncOnDrop<'g>) {
        let (n, o) = (v.len(), v.stream().context().ordinal() as i32);
        let (p, sync) = v.view_ptr_mut(self.comm.cuda_stream());
        // SAFETY: as in `read`; the view is an exclusive borrow, consumed here.
        (unsafe { DeviceSliceMut::from_raw(o, p, n) }, sync)
    }

    /// A call's input and output views, with both records.
    fn read_write<T: NcclType>(
        &self,
        input: CudaView<'g, T>,
        output: CudaViewMut<'g, T>,
    ) -> (
        DeviceSlice<'g, T>,
        DeviceSliceMut<'g, T>,
        Vec<SyncOnDrop<'g>>,
    ) {
        let (s, s_sync) = self.read(input);
        let (r, r_sync) = self.write(output);
        (s, r, vec![s_sync, r_sync])
    }

    /// `ncclSend` of `data` to `peer`.
    pub fn send<'s: 'g, T: NcclType>(&mut self, data: CudaView<'s, T>, peer: i32) -> Result<()> {
        let peer = index("peer", peer)?;
        let (s, sync) = self.read(data);
        let call: Call<'g> = Box::new(move |c, st| coll::send(c, s, peer, st));
        self.push("ncclSend", call, vec![sync])
    }

    /// `ncclRecv` into `buff` from `peer`.
    pub fn recv<'r: 'g, T: NcclType>(&mut self, buff: CudaViewMut<'r, T>, peer: i32) -> Result<()> {
        let peer = index("peer", peer)?;
        let (r, sync) = self.write(buff);
        let call: Call<'g> = Box::new(move |c, st| coll::recv(c, r, peer, st));
        self.push("ncclRecv", call, vec![sync])
    }

    /// `ncclBroadcast` from `root` (`sendbuff` is read on the root only).
    pub fn broadcast<'s: 'g, 'r: 'g, T: NcclType>(
        &mut self,
        sendbuff: Option<CudaView<'s, T>>,
        recvbuff: CudaViewMut<'r, T>,
        root: i32,
    ) -> Result<()> {
        let root = index("root", root)?;
        let mut syncs = Vec::new();
        let s = sendbuff.map(|v| {
            let (s, sync) = self.read(v);
            syncs.push(sync);
            s
        });
        let (r, sync) = self.write(recvbuff);
        syncs.push(sync);
        let call: Call<'g> = Box::new(move |c, st| coll::broadcast(c, s, r, root, st));
        self.push("ncclBroadcast", call, syncs)
    }

    /// In-place `ncclBroadcast` from `root`.
    pub fn broadcast_in_place<'r: 'g, T: NcclType>(
        &mut self,
        recvbuff: CudaViewMut<'r, T>,
        root: i32,
    ) -> Result<()> {
        let root = index("root", root)?;
        let (r, sync) = self.write(recvbuff);
        let call: Call<'g> = Box::new(move |c, st| coll::broadcast_in_place(c, r, root, st));
        self.push("ncclBroadcast", call, vec![sync])
    }

    /// `ncclAllGather`.
    pub fn all_gather<'s: 'g, 'r: 'g, T: NcclType>(
        &mut self,
        sendbuff: CudaView<'s, T>,
        recvbuff: CudaViewMut<'r, T>,
    ) -> Result<()> {
        let (s, r, syncs) = self.read_write(sendbuff, recvbuff);
        let call: Call<'g> = Box::new(move |c, st| coll::all_gather(c, s, r, st));
        self.push("ncclAllGather", call, syncs)
    }

    /// `ncclAllReduce`.
    pub fn all_reduce<'s: 'g, 'r: 'g, T: NcclType>(
        &mut self,
        sendbuff: CudaView<'s, T>,
        recvbuff: CudaViewMut<'r, T>,
        reduce_op: &ReduceOp,
    ) -> Result<()> {
        let op = reduce_op.op();
        let (s, r, syncs) = self.read_write(sendbuff, recvbuff);
        let call: Call<'g> = Box::new(move |c, st| coll::all_reduce(c, s, r, op, st));
        self.push("ncclAllReduce", call, syncs)
    }

    /// In-place `ncclAllReduce`.
    pub fn all_reduce_in_place<'r: 'g, T: NcclType>(
        &mut self,
        buff: CudaViewMut<'r, T>,
        reduce_op: &ReduceOp,
    ) -> Result<()> {
        let op = reduce_op.op();
        let (b, sync) = self.write(buff);
        let call: Call<'g> = Box::new(move |c, st| coll::all_reduce_in_place(c, b, op, st));
        self.push("ncclAllReduce", call, vec![sync])
    }

    /// `ncclReduce` into `root`'s `recvbuff` (None on the other ranks).
    pub fn reduce<'s: 'g, 'r: 'g, T: NcclType>(
        &mut self,
        sendbuff: CudaView<'s, T>,
        recvbuff: Option<CudaViewMut<'r, T>>,
        reduce_op: &ReduceOp,
        root: i32,
    ) -> Result<()> {
        let (op, root) = (reduce_op.op(), index("root", root)?);
        let (s, sync) = self.read(sendbuff);
        let mut syncs = vec![sync];
        let r = recvbuff.map(|v| {
            let (r, sync) = self.write(v);
            syncs.push(sync);
            r
        });
        let call: Call<'g> = Box::new(move |c, st| coll::reduce(c, s, r, op, root, st));
        self.push("ncclReduce", call, syncs)
    }

    /// In-place `ncclReduce` into `root`'s buffer.
    pub fn reduce_in_place<'r: 'g, T: NcclType>(
        &mut self,
        recvbuff: CudaViewMut<'r, T>,
        reduce_op: &ReduceOp,
        root: i32,
    ) -> Result<()> {
        let (op, root) = (reduce_op.op(), index("root", root)?);
        let (b, sync) = self.write(recvbuff);
        let call: Call<'g> = Box::new(move |c, st| coll::reduce_in_place(c, b, op, root, st));
        self.push("ncclReduce", call, vec![sync])
    }

    /// `ncclReduceScatter`.
    pub fn reduce_scatter<'s: 'g, 'r: 'g, T: NcclType>(
        &mut self,
        sendbuff: CudaView<'s, T>,
        recvbuff: CudaViewMut<'r, T>,
        reduce_op: &ReduceOp,
    ) -> Result<()> {
        let op = reduce_op.op();
        let (s, r, syncs) = self.read_write(sendbuff, recvbuff);
        let call: Call<'g> = Box::new(move |c, st| coll::reduce_scatter(c, s, r, op, st));
        self.push("ncclReduceScatter", call, syncs)
    }

    /// Issues the collected calls in one `ncclGroupStart` / `ncclGroupEnd` and returns once
    /// their work is ordered on the stream (the first call's error, or the group's, if any;
    /// after an error nothing of the group is launched). cudarc's records of the views'
    /// reads and writes follow the work.
    pub fn end(mut self) -> Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.ended, true) {
            return Ok(());
        }
        if !self.nested {
            OPEN.with(|o| o.set(false));
        }
        let calls = std::mem::take(&mut self.calls);
        if calls.is_empty() {
            return Ok(());
        }
        let comm = self.comm.inner();
        let st = our_stream("ncclGroupEnd", self.comm.cuda_stream())?;
        crate::group_start();
        for call in calls {
            if let Err(e) = call(comm, &st) {
                super::scope::drop_open_groups();
                return Err(e);
            }
        }
        if crate::group_end()? == crate::GroupStatus::InProgress {
            comm.wait_group()?;
        }
        Ok(())
    }
}

impl Drop for Group<'_> {
    /// Ends the group as [`Group::end`] does; an error can only be logged here (cudarc
    /// panics instead): call `end` to see it.
    fn drop(&mut self) {
        if let Err(e) = self.finish() {
            log::error!("cudarc_nccl::Group dropped with an error: {e}");
        }
    }
}
