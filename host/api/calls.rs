//! The typed calls, spelled once for each place that issues them: on [`Comm`] directly (the
//! work is ordered on the stream when the call returns) and on the scopes that keep their
//! borrows longer ([`super::Group`], [`super::Capture`]).

/// Writes the typed calls as methods of a scope type `$t<'a>` whose `join(comm, stream)`
/// admits a call; every buffer and the stream are borrowed for `'a`, the scope's life.
macro_rules! scoped_calls {
    ($t:ident) => {
        impl<'a> $t<'a> {
            /// AllReduce of `send` into `recv` (at least as long); see [`Comm::all_reduce`].
            pub fn all_reduce<S, R>(
                &mut self,
                comm: &'a Comm,
                send: S,
                recv: R,
                op: Op<S::Elem>,
                stream: &'a Stream,
            ) -> Result<()>
            where
                S: IntoDeviceSlice<'a>,
                R: IntoDeviceSliceMut<'a, Elem = S::Elem>,
            {
                self.join(comm, stream)?;
                let (s, r) = (send.into_device_slice(), recv.into_device_slice_mut());
                coll::all_reduce(comm, s, r, op, stream)
            }
            /// In-place AllReduce of `buf`.
            pub fn all_reduce_in_place<B: IntoDeviceSliceMut<'a>>(
                &mut self,
                comm: &'a Comm,
                buf: B,
                op: Op<B::Elem>,
                stream: &'a Stream,
            ) -> Result<()> {
                self.join(comm, stream)?;
                coll::all_reduce_in_place(comm, buf.into_device_slice_mut(), op, stream)
            }
            /// Broadcast of `root`'s `send` into every `recv`; see [`Comm::broadcast`].
            pub fn broadcast<S, R>(
                &mut self,
                comm: &'a Comm,
                send: Option<S>,
                recv: R,
                root: usize,
                stream: &'a Stream,
            ) -> Result<()>
            where
                S: IntoDeviceSlice<'a>,
                R: IntoDeviceSliceMut<'a, Elem = S::Elem>,
            {
                self.join(comm, stream)?;
                let s = send.map(|s| s.into_device_slice());
                coll::broadcast(comm, s, recv.into_device_slice_mut(), root, stream)
            }
            /// In-place Broadcast of `buf` from `root`.
            pub fn broadcast_in_place<B: IntoDeviceSliceMut<'a>>(
                &mut self,
                comm: &'a Comm,
                buf: B,
                root: usize,
                stream: &'a Stream,
            ) -> Result<()> {
                self.join(comm, stream)?;
                coll::broadcast_in_place(comm, buf.into_device_slice_mut(), root, stream)
            }
            /// Reduce of every `send` into `root`'s `recv`; see [`Comm::reduce`].
            pub fn reduce<S, R>(
                &mut self,
                comm: &'a Comm,
                send: S,
                recv: Option<R>,
                op: Op<S::Elem>,
                root: usize,
                stream: &'a Stream,
            ) -> Result<()>
            where
                S: IntoDeviceSlice<'a>,
                R: IntoDeviceSliceMut<'a, Elem = S::Elem>,
            {
                self.join(comm, stream)?;
                let r = recv.map(|r| r.into_device_slice_mut());
                coll::reduce(comm, send.into_device_slice(), r, op, root, stream)
            }
            /// In-place Reduce of `buf` to `root`.
            pub fn reduce_in_place<B: IntoDeviceSliceMut<'a>>(
                &mut self,
                comm: &'a Comm,
                buf: B,
                op: Op<B::Elem>,
                root: usize,
                stream: &'a Stream,
            ) -> Result<()> {
                self.join(comm, stream)?;
                coll::reduce_in_place(comm, buf.into_device_slice_mut(), op, root, stream)
            }
            /// AllGather of every `send` into `recv`; see [`Comm::all_gather`].
            pub fn all_gather<S, R>(
                &mut self,
                comm: &'a Comm,
                send: S,
                recv: R,
                stream: &'a Stream,
            ) -> Result<()>
            where
                S: IntoDeviceSlice<'a>,
                R: IntoDeviceSliceMut<'a, Elem = S::Elem>,
            {
                self.join(comm, stream)?;
                let (s, r) = (send.into_device_slice(), recv.into_device_slice_mut());
                coll::all_gather(comm, s, r, stream)
            }
            /// In-place AllGather over `buf` (this rank's block is its input).
            pub fn all_gather_in_place<B: IntoDeviceSliceMut<'a>>(
                &mut self,
                comm: &'a Comm,
                buf: B,
                stream: &'a Stream,
            ) -> Result<()> {
                self.join(comm, stream)?;
                coll::all_gather_in_place(comm, buf.into_device_slice_mut(), stream)
            }
            /// ReduceScatter of every `send` into `recv`; see [`Comm::reduce_scatter`].
            pub fn reduce_scatter<S, R>(
                &mut self,
                comm: &'a Comm,
                send: S,
                recv: R,
                op: Op<S::Elem>,
                stream: &'a Stream,
            ) -> Result<()>
            where
                S: IntoDeviceSlice<'a>,
                R: IntoDeviceSliceMut<'a, Elem = S::Elem>,
            {
                self.join(comm, stream)?;
                let (s, r) = (send.into_device_slice(), recv.into_device_slice_mut());
                coll::reduce_scatter(comm, s, r, op, stream)
            }
            /// In-place ReduceScatter over `buf` (this rank's block receives the result).
            pub fn reduce_scatter_in_place<B: IntoDeviceSliceMut<'a>>(
                &mut self,
                comm: &'a Comm,
                buf: B,
                op: Op<B::Elem>,
                stream: &'a Stream,
            ) -> Result<()> {
                self.join(comm, stream)?;
                coll::reduce_scatter_in_place(comm, buf.into_device_slice_mut(), op, stream)
            }
            /// Sends `buf` to `peer`; see [`Comm::send`].
            pub fn send<S: IntoDeviceSlice<'a>>(
                &mut self,
                comm: &'a Comm,
                buf: S,
                peer: usize,
                stream: &'a Stream,
            ) -> Result<()> {
                self.join(comm, stream)?;
                coll::send(comm, buf.into_device_slice(), peer, stream)
            }
            /// Receives `buf.len()` elements from `peer` into `buf`; see [`Comm::recv`].
            pub fn recv<R: IntoDeviceSliceMut<'a>>(
                &mut self,
                comm: &'a Comm,
                buf: R,
                peer: usize,
                stream: &'a Stream,
            ) -> Result<()> {
                self.join(comm, stream)?;
                coll::recv(comm, buf.into_device_slice_mut(), peer, stream)
            }
            /// All-to-all; see [`Comm::all_to_all`].
            pub fn all_to_all<S, R>(
                &mut self,
                comm: &'a Comm,
                send: S,
                recv: R,
                stream: &'a Stream,
            ) -> Result<()>
            where
                S: IntoDeviceSlice<'a>,
                R: IntoDeviceSliceMut<'a, Elem = S::Elem>,
            {
                self.join(comm, stream)?;
                let (s, r) = (send.into_device_slice(), recv.into_device_slice_mut());
                coll::all_to_all(comm, s, r, stream)
            }
        }
    };
}
pub(crate) use scoped_calls;
