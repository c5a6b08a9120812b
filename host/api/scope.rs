//! Scopes that keep the borrows of their calls: [`group`] (NCCL's group, as a closure) and
//! [`capture`] (a CUDA graph, whose [`CapturedGraph`] holds them for as long as it can be
//! launched).
//!
//! Both are closures, not guards: the library ends them, so a scope cannot be leaked
//! (`mem::forget`) with work still queued on borrowed buffers. When the closure fails or
//! panics, the group's queued work is dropped, never launched, and a capture is discarded.

use super::buffer::{IntoDeviceSlice, IntoDeviceSliceMut};
use super::calls::scoped_calls;
use super::coll;
use super::op::Op;
use super::stream::Stream;
use crate::comm::Comm;
use crate::cuda::Graph;
use crate::enqueue::group::depth;
use crate::error::{Error, Result};
use std::marker::PhantomData;

/// Invariant in `'a`: the borrows a scope takes can be neither shortened nor lengthened.
type Borrows<'a> = PhantomData<fn(&'a ()) -> &'a ()>;

/// Ends every group level open on this thread, dropping what they queued.
pub(super) fn drop_open_groups() {
    while depth() > 0 {
        if let Err(e) = crate::enqueue::group::simulate_end() {
            log::warn!("dropping an unfinished group: {e}");
        }
    }
}

/// Drops the open groups unless disarmed (a panic in the closure).
struct Unwind(bool);
impl Drop for Unwind {
    fn drop(&mut self) {
        if self.0 {
            drop_open_groups();
        }
    }
}

/// Refuses to open a scope inside a group opened with [`crate::group_start`].
fn no_open_group(what: &str) -> Result<()> {
    if depth() > 0 {
        return Err(Error::invalid_usage(format!(
            "{what}: a group is already open on this thread (group_start); typed scopes do \
             not nest in raw groups"
        )));
    }
    Ok(())
}

/// NCCL's group, with the borrows of its calls: see [`group`].
pub struct Group<'a> {
    comms: Vec<&'a Comm>,
    in_capture: bool,
    _borrows: Borrows<'a>,
}

impl<'a> Group<'a> {
    fn join(&mut self, comm: &'a Comm, stream: &'a Stream) -> Result<()> {
        if !self.in_capture && stream.is_capturing()? {
            return Err(Error::invalid_usage(
                "the stream is capturing a graph: issue the group through Capture::group",
            ));
        }
        if !self.comms.iter().any(|c| std::ptr::eq(*c, comm)) {
            self.comms.push(comm);
        }
        Ok(())
    }
}

scoped_calls!(Group);

/// Runs `f` inside `ncclGroupStart` / `ncclGroupEnd`: the calls it makes on the [`Group`]
/// are launched together when it returns, and the buffers they use stay borrowed until then,
/// so none can be dropped or reused while the group holds it. For non-blocking
/// communicators the group is issued in the background, and this waits until that is done
/// (the work is then ordered on its streams, which is all a blocking group promises too);
/// it is never an error.
///
/// When `f` returns an error or panics, the calls it queued are dropped, not launched.
///
/// ```no_run
/// # fn f(comms: &[nccl::Comm], streams: &[nccl::Stream]) -> nccl::Result<()> {
/// use nccl::{DeviceBuffer, Op};
/// let mut bufs = comms
///     .iter()
///     .map(|c| DeviceBuffer::<f32>::zeroed(c.device(), 1024))
///     .collect::<nccl::Result<Vec<_>>>()?;
/// nccl::group(|g| {
///     for ((c, b), s) in comms.iter().zip(&mut bufs).zip(streams) {
///         g.all_reduce_in_place(c, b, Op::SUM, s)?;
///     }
///     Ok(())
/// })?;
/// # Ok(()) }
/// ```
///
/// A buffer cannot be dropped while the group holds it:
///
/// ```compile_fail
/// # fn f(comm: &nccl::Comm, stream: &nccl::Stream) -> nccl::Result<()> {
/// use nccl::{DeviceBuffer, Op};
/// let send = DeviceBuffer::<f32>::zeroed(comm.device(), 8)?;
/// let mut recv = DeviceBuffer::<f32>::zeroed(comm.device(), 8)?;
/// nccl::group(|g| {
///     g.all_reduce(comm, &send, &mut recv, Op::SUM, stream)?;
///     drop(send); // error: `send` is borrowed until the group ends
///     Ok(())
/// })?;
/// # Ok(()) }
/// ```
pub fn group<'a, R>(f: impl FnOnce(&mut Group<'a>) -> Result<R>) -> Result<R> {
    run_group(false, f)
}

fn run_group<'a, R>(in_capture: bool, f: impl FnOnce(&mut Group<'a>) -> Result<R>) -> Result<R> {
    no_open_group("nccl::group")?;
    crate::group_start();
    let mut g = Group {
        comms: Vec::new(),
        in_capture,
        _borrows: PhantomData,
    };
    let mut unwind = Unwind(true);
    let r = f(&mut g);
    unwind.0 = false;
    if depth() != 1 {
        drop_open_groups();
        return Err(Error::invalid_usage(
            "nccl::group: the closure left group_start / group_end unbalanced; its calls \
             were dropped",
        ));
    }
    let v = match r {
        Ok(v) => v,
        Err(e) => {
            drop_open_groups();
            return Err(e);
        }
    };
    if crate::group_end()? == crate::GroupStatus::InProgress {
        for c in &g.comms {
            c.wait_group()?;
        }
    }
    Ok(v)
}

/// A graph being captured from a stream, with the borrows of its calls: see [`capture`].
pub struct Capture<'a> {
    _borrows: Borrows<'a>,
}

impl<'a> Capture<'a> {
    fn join(&mut self, _comm: &'a Comm, _stream: &'a Stream) -> Result<()> {
        no_open_group("a call in a capture")
    }

    /// A group inside the capture, whose calls keep their borrows for the graph's life.
    pub fn group<R>(&mut self, f: impl FnOnce(&mut Group<'a>) -> Result<R>) -> Result<R> {
        run_group(true, f)
    }
}

scoped_calls!(Capture);

/// Captures the calls `f` makes into a CUDA graph on `stream` (CUDA's global capture mode):
/// nothing runs now; [`CapturedGraph::launch`] runs them, as often as wanted. The buffers and
/// streams the calls use stay borrowed for as long as the graph lives; dropping the graph
/// waits for its launches to finish.
///
/// When `f` fails or panics, the capture is ended and discarded.
///
/// ```no_run
/// # fn f(comm: &nccl::Comm, stream: &nccl::Stream) -> nccl::Result<()> {
/// let mut buf = nccl::DeviceBuffer::<f32>::zeroed(comm.device(), 1024)?;
/// let graph = nccl::capture(stream, |c| {
///     c.all_reduce_in_place(comm, &mut buf, nccl::Op::SUM, stream)
/// })?;
/// for _ in 0..10 {
///     graph.launch()?;
/// }
/// drop(graph); // waits for the launches; `buf` is free again
/// let sums = buf.to_vec()?;
/// # Ok(()) }
/// ```
///
/// While a capture is open, a [`DeviceBuffer`](crate::DeviceBuffer)'s host copies on the same
/// device fail with `ncclUnhandledCudaError` (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`), from
/// any thread: they wait for the whole device first, which CUDA refuses during a capture.
/// Programs that capture on one thread and copy on another take turns.
///
/// A buffer cannot be dropped (or read, or used by another call) while a graph that may still
/// be launched holds it:
///
/// ```compile_fail
/// # fn f(comm: &nccl::Comm, stream: &nccl::Stream) -> nccl::Result<()> {
/// let mut buf = nccl::DeviceBuffer::<f32>::zeroed(comm.device(), 1024)?;
/// let graph = nccl::capture(stream, |c| {
///     c.all_reduce_in_place(comm, &mut buf, nccl::Op::SUM, stream)
/// })?;
/// drop(buf); // error: `buf` is borrowed by the graph
/// graph.launch()?;
/// # Ok(()) }
/// ```
pub fn capture<'a>(
    stream: &'a Stream,
    f: impl FnOnce(&mut Capture<'a>) -> Result<()>,
) -> Result<CapturedGraph<'a>> {
    no_open_group("nccl::capture")?;
    let dev = stream.device();
    dev.capture_begin(stream.handle())?;
    /// Ends the capture, discarding it, unless disarmed (a panic in the closure).
    struct Discard<'s>(&'s Stream, bool);
    impl Drop for Discard<'_> {
        fn drop(&mut self) {
            if self.1 {
                drop_open_groups();
                let _ = self.0.device().capture_end(self.0.handle());
            }
        }
    }
    let mut discard = Discard(stream, true);
    let mut c = Capture {
        _borrows: PhantomData,
    };
    let r = f(&mut c);
    discard.1 = false;
    let unbalanced = depth() != 0;
    drop_open_groups();
    let graph = dev.capture_end(stream.handle());
    r?;
    if unbalanced {
        return Err(Error::invalid_usage(
            "nccl::capture: the closure left a group open; the capture was discarded",
        ));
    }
    Ok(CapturedGraph {
        graph: graph?,
        stream,
        _borrows: PhantomData,
    })
}

/// A captured graph: launch it as often as wanted. It keeps the borrows of the calls it
/// holds; dropping it waits for its launches.
pub struct CapturedGraph<'a> {
    graph: Graph,
    stream: &'a Stream,
    _borrows: Borrows<'a>,
}

impl CapturedGraph<'_> {
    /// Runs the captured work once more, on the stream it was captured from.
    pub fn launch(&self) -> Result<()> {
        self.graph.launch(self.stream.handle())
    }
}

impl Drop for CapturedGraph<'_> {
    fn drop(&mut self) {
        if let Err(e) = self.stream.synchronize() {
            log::warn!("waiting for a graph's launches: {e}");
        }
    }
}
