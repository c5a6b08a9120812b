//! Windows (`ncclCommWindowRegister`, NCCL 2.27): a buffer every rank registers together, in
//! one collective call. A window is also an ordinary registration (the zero-copy paths of
//! `register.rs` use it). With `NCCL_WIN_COLL_SYMMETRIC` every rank registers the same size and
//! each rank maps every other rank's window; the communicator then keeps a symmetric state in
//! device memory ([`SymDev`]): every rank's scratch (flag slots and a staging area) and a
//! table of every window's base on every rank, as this rank maps them. Collectives of the
//! symmetric path (`device/src/coll/symmetric.rs`) read the peers' inputs through it.
//!
//! Every rank must take the same path for a call, with no message between the ranks at the
//! call. So the choice depends only on what every rank knows alike: the communicator has a
//! symmetric window (registration is collective, and it agrees on whether every rank can map
//! every other one), the collective and its size. Where this rank's input lies decides only
//! how peers read it: in a window, where it lies; anywhere else (a plain buffer, or a window
//! it is overwritten in, in place), from the rank's staging area, which the kernel fills
//! first. A job that mixes windows and plain buffers across ranks thus stays correct.
//!
//! Every rank maps every other rank's window and scratch (`share.rs`): ranks of this process
//! are addressed as they are, ranks in other processes of the node through CUDA IPC or an
//! exported VMM descriptor. Where some rank cannot map some other (ranks on other nodes, no
//! p2p), the window registers as an ordinary one on every rank (an INFO line says so), and
//! the communicator keeps its ordinary paths.

use super::call::{CollCall, Sizes};
use super::onesided::Signals;
use super::Comm;
use crate::cuda::StreamHandle;
use crate::cuda::{DevBuffer, DevPtr};
use crate::error::{Error, Result};
use nccl_device::abi::{
    sym_src_window, Coll, SymDev, MAX_CHANNELS, PROTO_LL, PROTO_SIMPLE, SYM_FLAG_BYTES,
    SYM_LL_BYTES, SYM_LL_MAX_BYTES, SYM_MAX_RANKS, SYM_MAX_WINDOWS, SYM_SRC_STAGED,
};
use nccl_device::ops::RedOpKind;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

/// What `window_register` returns: an opaque, non-zero number, unique within the communicator.
pub type WinHandle = u64;

/// `NCCL_WIN_COLL_SYMMETRIC`.
pub const WIN_COLL_SYMMETRIC: u32 = 1;

/// One registered window.
struct Window {
    handle: WinHandle,
    base: DevPtr,
    bytes: usize,
    /// The ordinary registration it also is (`register.rs`).
    reg: super::register::RegHandle,
    /// Its slot in the symmetric table, where it is symmetric.
    slot: Option<usize>,
    /// Where every rank maps every other: every rank's window as addressed here, kept mapped
    /// (the symmetric path and one-sided puts read and write through it).
    peers: Option<super::share::Shared>,
    /// Every rank's bytes of it (they differ where it is not symmetric).
    sizes: Vec<u64>,
    /// Live CUDA graphs whose captured calls read the windows through its slot (the loads
    /// form): it cannot go before they do.
    graphs: Arc<AtomicUsize>,
    /// Its multicast object, where the communicator's NVLS is on (`window_mc.rs`).
    mc: Option<super::window_mc::WindowMc>,
}

/// The communicator's symmetric state, made at its first symmetric window.
struct Sym {
    /// The [`SymDev`] the kernels read.
    dev: DevBuffer,
    /// `[[u64; SYM_MAX_RANKS]; SYM_MAX_WINDOWS]`: per slot, every rank's window base.
    table: DevBuffer,
    /// This rank's scratch: flag slots, then the staging area and the LL lines.
    _scratch: DevBuffer,
    /// Every rank's scratch as addressed here, kept mapped.
    _peers: super::share::Shared,
    /// Its size limits (NCCL_RS_SYMMETRIC_MAX_BYTES read once, when the state is made:
    /// every call asks, and every rank must answer alike).
    limits: SymLimits,
}

/// The symmetric path's size limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SymLimits {
    /// The largest rank block of a call on the path: NCCL_RS_SYMMETRIC_MAX_BYTES.
    pub max_bytes: usize,
    /// Bytes of each rank's staging area.
    pub stage_bytes: usize,
    /// AllReduces of the loads form on 3 ranks or more run two-shot
    /// (NCCL_RS_SYMMETRIC_TWO_SHOT).
    pub two_shot: bool,
}

/// How a call runs on the symmetric path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SymLaunch {
    /// The communicator's [`SymDev`].
    pub dev: DevPtr,
    /// Where this rank's input lies ([`nccl_device::abi::CollArgs::sym_src`]).
    pub src: u64,
    /// The form: LL lines pushed to every rank, or (Simple) loads between barriers.
    pub proto: u32,
    /// An AllReduce of the loads form runs two-shot
    /// ([`nccl_device::abi::FLAG_SYM_TWO_SHOT`]).
    pub two_shot: bool,
    /// An AllReduce of the loads form whose buffers lie in windows with multicast objects:
    /// the multicast addresses of the input and the output, and where the output lies
    /// ([`nccl_device::abi::CollArgs::mc_src`], `mc_dst`, `sym_dst`).
    pub mc: Option<(DevPtr, DevPtr, u64)>,
}

/// The form of the symmetric path for a call of `coll` with rank blocks of `bytes` on `nranks`
/// ranks (`PROTO_LL` or `PROTO_SIMPLE`), or None: it takes what every rank knows alike, so
/// every rank answers the same. `protos`: the forms NCCL_ALGO / NCCL_PROTO leave (LL, loads).
/// LL lines up to [`SYM_LL_MAX_BYTES`]; the loads form where a staged input fits the staging
/// area (ReduceScatter stages every block of its input).
pub(crate) fn symmetric_form(
    coll: Coll,
    bytes: usize,
    nranks: usize,
    limits: SymLimits,
    (ll, loads): (bool, bool),
) -> Option<u32> {
    if bytes == 0 || bytes > limits.max_bytes || !(2..=SYM_MAX_RANKS).contains(&nranks) {
        return None;
    }
    if ll && bytes <= SYM_LL_MAX_BYTES {
        return Some(PROTO_LL);
    }
    let staged = match coll {
        Coll::ReduceScatter => bytes.checked_mul(nranks)?,
        _ => bytes,
    };
    (loads && staged <= limits.stage_bytes).then_some(PROTO_SIMPLE)
}

#[derive(Default)]
struct State {
    windows: Vec<Window>,
    last: WinHandle,
    sym: Option<Sym>,
}

/// A communicator's windows.
#[derive(Default)]
pub(crate) struct Windows {
    state: Mutex<State>,
    /// Calls planned on the symmetric path (what the tests read).
    launches: AtomicU64,
    /// Calls run on the copy engines (`copy_engine.rs`; what the tests read).
    pub(crate) copy_engine: AtomicU64,
    /// The signal pads of one-sided operations (`onesided.rs`), made with the first window
    /// every rank maps.
    signals: OnceLock<Arc<Signals>>,
}

impl Windows {
    /// Calls planned on the symmetric path so far.
    pub(crate) fn symmetric_launches(&self) -> u64 {
        self.launches.load(Ordering::Relaxed)
    }

    /// The signal pads, once made.
    pub(crate) fn signals(&self) -> Option<Arc<Signals>> {
        self.signals.get().cloned()
    }
}

/// What each rank tells the others when it registers a window (one allgather).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Offer {
    /// 0: the window is usable here; else why not (an [`Refusal`] code).
    refused: u32,
    symmetric: u32,
    /// This rank maps every other rank's memory as it is (same address space, p2p).
    maps_all: u32,
    /// This rank reaches some ranks through the network (the communicator spans nodes).
    networked: u32,
    bytes: u64,
    base: u64,
}

const OFFER_BYTES: usize = 4 * 4 + 8 * 2;

impl Offer {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(OFFER_BYTES);
        for w in [self.refused, self.symmetric, self.maps_all, self.networked] {
            v.extend_from_slice(&w.to_le_bytes());
        }
        v.extend_from_slice(&self.bytes.to_le_bytes());
        v.extend_from_slice(&self.base.to_le_bytes());
        v
    }

    fn decode(rank: usize, b: &[u8]) -> Result<Offer> {
        if b.len() != OFFER_BYTES {
            return Err(Error::remote(format!(
                "rank {rank} sent a window offer of {} bytes, not {OFFER_BYTES}",
                b.len()
            )));
        }
        let w = |i: usize| u32::from_le_bytes(b[i * 4..i * 4 + 4].try_into().unwrap_or_default());
        let d = |at: usize| u64::from_le_bytes(b[at..at + 8].try_into().unwrap_or_default());
        Ok(Offer {
            refused: w(0),
            symmetric: w(1),
            maps_all: w(2),
            networked: w(3),
            bytes: d(16),
            base: d(24),
        })
    }
}

/// Why a rank refused its window (what the others report).
const REFUSED_BUFFER: u32 = 1;

impl Comm {
    /// `ncclCommWindowRegister`: registers `bytes` at `buff` as a window of this communicator,
    /// on every rank at once (a collective call). `flags`: 0 or [`WIN_COLL_SYMMETRIC`]. A
    /// rank's bad buffer fails the call on every rank (each names the rank), so no rank waits
    /// for one that gave up.
    pub(crate) fn window_register(
        &self,
        buff: DevPtr,
        bytes: usize,
        flags: u32,
    ) -> Result<WinHandle> {
        self.check_usable()?;
        if flags & !WIN_COLL_SYMMETRIC != 0 {
            return Err(Error::invalid_argument(format!(
                "window flags {flags:#x} are neither NCCL_WIN_DEFAULT (0) nor \
                 NCCL_WIN_COLL_SYMMETRIC (1)"
            )));
        }
        // Waits that peers release (one-sided, copy-engine, device API) need every kernel
        // loaded before they can hold a stream: before the offers, so every rank has loaded
        // once any returns (`Device::preload_kernels`; once per GPU and process).
        self.device.preload_kernels()?;
        let local = self.check_window_buffer(buff, bytes);
        let me = Offer {
            refused: if local.is_err() { REFUSED_BUFFER } else { 0 },
            symmetric: (flags & WIN_COLL_SYMMETRIC != 0) as u32,
            maps_all: self.maps_every_rank() as u32,
            networked: self.net.is_some() as u32,
            bytes: bytes as u64,
            base: buff,
        };
        let offers = self
            .bootstrap
            .allgather(&me.encode())?
            .iter()
            .enumerate()
            .map(|(r, b)| Offer::decode(r, b))
            .collect::<Result<Vec<Offer>>>()?;
        local?;
        if let Some(r) = offers.iter().position(|o| o.refused != 0) {
            return Err(Error::invalid_usage(format!(
                "ncclCommWindowRegister: rank {r} refused its buffer (see its error), so no \
                 rank registers this window"
            )));
        }
        let symmetric = offers.iter().any(|o| o.symmetric != 0);
        if symmetric {
            check_symmetric(&offers)?;
        }
        let reg = self.register_ptr(buff, bytes)?;
        self.window_register_rest(buff, bytes, reg, &offers)
            .inspect_err(|_| {
                // A peer gone mid-registration: this rank's registration is undone (a window
                // already made was deregistered whole, its registration with it).
                let _ = self.deregister(reg);
            })
    }

    /// [`Comm::window_register`] once every rank's offer is in and the buffer is registered
    /// (`reg`): the mappings, one-sided state, symmetric slot and multicast object.
    fn window_register_rest(
        &self,
        buff: DevPtr,
        bytes: usize,
        reg: super::register::RegHandle,
        offers: &[Offer],
    ) -> Result<WinHandle> {
        let symmetric = offers.iter().any(|o| o.symmetric != 0);
        // Every step below is taken by every rank or by none: each decides on what all know.
        let peers = match offers.iter().all(|o| o.maps_all != 0) {
            true => self.share(buff, bytes)?,
            false => None,
        };
        // One-sided operations: through the mappings, else (across nodes) the network.
        let networked = peers.is_none() && offers.iter().all(|o| o.networked != 0);
        if (peers.is_some() || networked) && self.windows.signals.get().is_none() {
            if let Some(s) = self.make_signals(networked)? {
                let _ = self.windows.signals.set(Arc::new(s));
            }
        }
        let mc = match (symmetric, &peers) {
            (true, Some(_)) => self.window_multicast(buff, bytes)?,
            _ => None,
        };
        let mut st = self.windows.state.lock().unwrap_or_else(|p| p.into_inner());
        let slot = match symmetric {
            true => self.symmetric_slot(&mut st, offers, peers.as_ref())?,
            false => None,
        };
        st.last += 1;
        let handle = st.last;
        st.windows.push(Window {
            handle,
            base: buff,
            bytes,
            reg,
            slot,
            peers,
            sizes: offers.iter().map(|o| o.bytes).collect(),
            graphs: Arc::default(),
            mc,
        });
        drop(st);
        if let Some(remote) = self.windows.signals().as_ref().and_then(|s| s.remote()) {
            // Every rank takes puts into it before any rank's registration returns.
            let ready = remote
                .set_window(handle, Some((buff, bytes as u64)))
                .and_then(|_| self.bootstrap.barrier());
            if let Err(e) = ready {
                let _ = self.window_deregister(handle);
                return Err(e);
            }
        }
        Ok(handle)
    }

    /// Where `bytes` at `ptr` lie inside a symmetric window every rank maps: the same offset
    /// of every rank's part, as addressed here (index: rank); None elsewhere.
    pub(crate) fn symmetric_peers_at(&self, ptr: DevPtr, bytes: usize) -> Option<Vec<DevPtr>> {
        let st = self.windows.state.lock().unwrap_or_else(|p| p.into_inner());
        let w = st.windows.iter().find(|w| {
            w.slot.is_some() && ptr >= w.base && ptr + bytes as u64 <= w.base + w.bytes as u64
        })?;
        let offset = ptr - w.base;
        Some(w.peers.as_ref()?.ptrs.iter().map(|p| p + offset).collect())
    }

    /// Rank `peer`'s part of window `win` as addressed here (None where ranks do not map each
    /// other's windows: the network carries puts), and its bytes.
    pub(crate) fn window_of_peer(
        &self,
        win: WinHandle,
        peer: usize,
    ) -> Result<(Option<DevPtr>, u64)> {
        let st = self.windows.state.lock().unwrap_or_else(|p| p.into_inner());
        let w = st.windows.iter().find(|w| w.handle == win).ok_or_else(|| {
            Error::invalid_argument(format!(
                "window {win:#x} is not registered on this communicator"
            ))
        })?;
        Ok((w.peers.as_ref().map(|p| p.ptrs[peer]), w.sizes[peer]))
    }

    /// Every rank's part of window `win` as addressed here where every rank maps every other,
    /// else this rank's alone; and this rank's bytes of it.
    /// Every rank's part of window `win` as addressed here (one, this rank's, where not every
    /// rank maps every other), its bytes, and its multicast address (0: none).
    pub(crate) fn window_bases(&self, win: WinHandle) -> Result<(Vec<DevPtr>, u64, DevPtr)> {
        let st = self.windows.state.lock().unwrap_or_else(|p| p.into_inner());
        let w = st.windows.iter().find(|w| w.handle == win).ok_or_else(|| {
            Error::invalid_argument(format!(
                "window {win:#x} is not registered on this communicator"
            ))
        })?;
        let bases = match &w.peers {
            Some(p) => p.ptrs.clone(),
            None => vec![w.base],
        };
        Ok((bases, w.bytes as u64, w.mc.as_ref().map_or(0, |m| m.addr)))
    }

    /// `ncclWinGetUserPtr` (NCCL 2.29): the buffer window `win` was registered with, on this
    /// rank. Not collective.
    pub(crate) fn window_user_ptr(&self, win: WinHandle) -> Result<DevPtr> {
        let st = self.windows.state.lock().unwrap_or_else(|p| p.into_inner());
        st.windows
            .iter()
            .find(|w| w.handle == win)
            .map(|w| w.base)
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "window {win:#x} is not registered on this communicator"
                ))
            })
    }

    /// `ncclCommWindowDeregister` (collective, as registration): the window's slot is emptied
    /// once this rank's launched work is over (its kernels may read through it).
    pub(crate) fn window_deregister(&self, handle: WinHandle) -> Result<()> {
        let mut st = self.windows.state.lock().unwrap_or_else(|p| p.into_inner());
        let i = st
            .windows
            .iter()
            .position(|w| w.handle == handle)
            .ok_or_else(|| {
                Error::invalid_argument(format!(
                    "window {handle:#x} is not registered on this communicator"
                ))
            })?;
        let graphs = st.windows[i].graphs.load(Ordering::Acquire);
        if graphs > 0 {
            return Err(Error::invalid_usage(format!(
                "ncclCommWindowDeregister: {graphs} CUDA graph(s) captured collectives that read \
                 this window: destroy them first (their replays would read through it)"
            )));
        }
        if st.windows[i].mc.is_some() {
            // This rank's kernels launched before may still use the multicast address. Other
            // ranks' kernels may reach this rank's part through it too, as through the LSA
            // mappings of any window: deregistration is collective, after every rank's work
            // on the window (`window_mc.rs`).
            self.flush()?;
        }
        if let (Some(slot), Some(sym)) = (st.windows[i].slot, &st.sym) {
            self.flush()?;
            sym.table
                .write(slot * SYM_MAX_RANKS * 8, &[0u8; SYM_MAX_RANKS * 8])?;
        }
        let w = st.windows.remove(i);
        drop(st);
        if let Some(remote) = self.windows.signals().as_ref().and_then(|s| s.remote()) {
            remote.set_window(handle, None)?;
        }
        self.deregister(w.reg)
    }

    /// The symmetric path's launch for call `c` (AllReduce, AllGather or ReduceScatter; its
    /// `sizes`): the [`SymDev`], the form, and where the input lies
    /// ([`nccl_device::abi::CollArgs::sym_src`]); or None where the communicator has no
    /// symmetric window, NCCL_ALGO / NCCL_PROTO exclude the path, or the call is too large (the
    /// same answer on every rank: [`symmetric_form`]). A call captured on its stream that
    /// reads a window (the loads form) ties the window to the graph: it cannot be
    /// deregistered while the graph lives.
    pub(crate) fn symmetric_launch(
        &self,
        c: &CollCall,
        sizes: &Sizes,
    ) -> Result<Option<SymLaunch>> {
        let st = self.windows.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(sym) = st.sym.as_ref() else {
            return Ok(None);
        };
        if !st.windows.iter().any(|w| w.slot.is_some()) {
            return Ok(None); // the last symmetric window went
        }
        let protos = self.tuner.symmetric_protos(c.coll);
        let Some(proto) = symmetric_form(c.coll, sizes.bytes, self.nranks, sym.limits, protos)
        else {
            return Ok(None);
        };
        // In place, peers would read an input this rank overwrites: it goes through staging.
        let (send, recv) = (c.send, c.recv);
        let (send_end, recv_end) = (
            send + sizes.send_bytes as u64,
            recv + sizes.recv_bytes as u64,
        );
        let overlaps = send < recv_end && recv < send_end;
        let window =
            st.windows.iter().filter(|_| !overlaps).find(|w| {
                w.slot.is_some() && send >= w.base && send_end <= w.base + w.bytes as u64
            });
        let src = match window.and_then(|w| w.slot.map(|s| (s, w))) {
            Some((slot, w)) => {
                if proto != PROTO_LL {
                    self.tie_to_graph(&w.graphs, c.stream)?;
                }
                sym_src_window(slot, send - w.base)
            }
            None => SYM_SRC_STAGED,
        };
        self.windows.launches.fetch_add(1, Ordering::Relaxed);
        let mc = match (window, proto) {
            (Some(input), PROTO_SIMPLE) => self.multimem_launch(c, sizes, input, &st.windows)?,
            _ => None,
        };
        let two_shot = sym.limits.two_shot
            && c.coll == Coll::AllReduce
            && proto == PROTO_SIMPLE
            && self.nranks >= 3;
        Ok(Some(SymLaunch {
            dev: sym.dev.ptr,
            src,
            proto,
            two_shot,
            mc,
        }))
    }

    /// The multimem form of a call of the loads form (NVLS on windows): the multicast
    /// addresses of its input and its output (0 where the form does not use one), and what
    /// this rank publishes at its arrival ([`nccl_device::abi::CollArgs::sym_dst`]: nonzero only
    /// with the form, so that a rank without it keeps every rank from it). Where the count
    /// splits into blocks of whole packs per rank and the buffers the form reaches through
    /// the switch lie 16-byte aligned in windows with multicast objects (all ranks or none
    /// have them): AllReduce both (its input reduced and its output stored through the
    /// switch), AllGather its output (every rank's block stored into every output at once),
    /// ReduceScatter its input (each rank's block reduced from every input at once, its output
    /// plain); a reduction only where the switch has the (type, reduction) without `pre` (sum,
    /// min, max, an integer average). These are this rank's facts: the kernel takes the form
    /// only where every rank's buffers lie at the same places (its arrival publishes them),
    /// one-shot or inside the two-shot's phases alike.
    fn multimem_launch(
        &self,
        c: &CollCall,
        sizes: &Sizes,
        input: &Window,
        windows: &[Window],
    ) -> Result<Option<(DevPtr, DevPtr, u64)>> {
        // The switch adds raw inputs: no `pre` (a float average divides before it adds).
        let reduces = match c.op.kind() {
            RedOpKind::Sum | RedOpKind::Min | RedOpKind::Max => true,
            RedOpKind::Avg => !c.dt.is_float(),
            _ => false,
        } && nccl_device::arch::multimem_op(c.dt, c.op.kind()).is_some();
        // One rank's block of whole packs: AllReduce's buffer splits in `nranks`.
        let block = match c.coll {
            Coll::AllReduce => sizes.bytes / self.nranks,
            _ => sizes.bytes,
        };
        let whole = match c.coll {
            Coll::AllReduce => sizes.bytes.is_multiple_of(16 * self.nranks),
            _ => block.is_multiple_of(16),
        };
        let at_in = c.send - input.base;
        // Both buffers' own addresses aligned: an AllGather loads its input by packs, and an
        // input window without a multicast object may start anywhere.
        let aligned = (c.send | c.recv).is_multiple_of(16);
        if !whole || block == 0 || !at_in.is_multiple_of(16) || !aligned {
            return Ok(None);
        }
        let end = c.recv + sizes.recv_bytes as u64;
        let output = windows
            .iter()
            .find(|w| w.slot.is_some() && c.recv >= w.base && end <= w.base + w.bytes as u64);
        let in_mc = input.mc.as_ref().map(|m| m.addr + at_in);
        let out_mc = output.and_then(|w| Some((w, w.mc.as_ref()?.addr + (c.recv - w.base))));
        let (src, dst, published) = match (c.coll, in_mc, out_mc) {
            (Coll::AllReduce, Some(i), Some((w, o))) if reduces => (i, o, at_out(w, c.recv)),
            (Coll::AllGather, _, Some((w, o))) => (0, o, at_out(w, c.recv)),
            (Coll::ReduceScatter, Some(i), _) if reduces => {
                (i, 0, sym_src_window(input.slot.unwrap_or_default(), at_in))
            }
            _ => return Ok(None),
        };
        if let Some((w, _)) =
            out_mc.filter(|_| dst != 0 && output.map(|w| w.base) != Some(input.base))
        {
            self.tie_to_graph(&w.graphs, c.stream)?;
        }
        Ok(Some((src, dst, published)))
    }

    /// Where `stream` is capturing: counts the graph in `graphs` until CUDA destroys it.
    fn tie_to_graph(&self, graphs: &Arc<AtomicUsize>, stream: StreamHandle) -> Result<()> {
        if !self.device.stream_capturing(stream)? {
            return Ok(());
        }
        graphs.fetch_add(1, Ordering::AcqRel);
        let left = graphs.clone();
        let release = Box::new(move || {
            left.fetch_sub(1, Ordering::AcqRel);
        });
        if self.device.on_graph_release(stream, release)?.is_err() {
            graphs.fetch_sub(1, Ordering::AcqRel);
        }
        Ok(())
    }

    /// The window's buffer must be device memory of this communicator's device, `bytes` long.
    fn check_window_buffer(&self, buff: DevPtr, bytes: usize) -> Result<()> {
        if buff == 0 || bytes == 0 {
            return Err(Error::invalid_argument(format!(
                "ncclCommWindowRegister: an empty window ({bytes} bytes at {buff:#x})"
            )));
        }
        match self.device.pointer_extent(buff, bytes)? {
            Some((d, avail)) if d == self.device.ordinal && avail >= bytes => Ok(()),
            _ => Err(Error::invalid_argument(format!(
                "ncclCommWindowRegister: {bytes} bytes at {buff:#x} are not memory of device {} \
                 (the communicator's)",
                self.device.ordinal
            ))),
        }
    }

    /// Whether this rank can map every other rank's memory: one node, every rank reached
    /// through p2p (in this process or through CUDA IPC), few enough for the symmetric path.
    pub(super) fn maps_every_rank(&self) -> bool {
        self.nranks <= SYM_MAX_RANKS && (0..self.nranks).all(|p| self.reaches_memory_of(p))
    }

    /// A slot of the symmetric table for a new window (every rank picks the same: they
    /// register and deregister in the same order), given every rank's window mapped here
    /// (`peers`), with the symmetric state made first where this is the communicator's first
    /// symmetric window; None, on every rank alike, where some rank cannot map every other one
    /// (said at INFO). Every step is taken by every rank or by none.
    fn symmetric_slot(
        &self,
        st: &mut State,
        offers: &[Offer],
        peers: Option<&super::share::Shared>,
    ) -> Result<Option<usize>> {
        let ordinary = |why: String| {
            log::info!(
                "rank {}: a symmetric window registered as an ordinary one: {why}",
                self.rank
            );
            Ok(None)
        };
        if let Some(r) = offers.iter().position(|o| o.maps_all == 0) {
            return ordinary(format!(
                "rank {r} cannot map every other rank's memory (ranks on other nodes, no p2p, \
                 or more than {SYM_MAX_RANKS} ranks)"
            ));
        }
        let Some(peers) = peers else {
            return ordinary("some rank could not map the window of another".into());
        };
        let used: Vec<usize> = st.windows.iter().filter_map(|w| w.slot).collect();
        let Some(slot) = (0..SYM_MAX_WINDOWS).find(|s| !used.contains(s)) else {
            return ordinary(format!("all {SYM_MAX_WINDOWS} symmetric slots are taken"));
        };
        if st.sym.is_none() {
            match self.make_sym()? {
                Some(sym) => st.sym = Some(sym),
                None => return ordinary("the symmetric scratch could not be mapped".into()),
            }
        }
        let sym = st
            .sym
            .as_ref()
            .ok_or_else(|| Error::internal("symmetric state"))?;
        let row: Vec<u8> = (0..SYM_MAX_RANKS)
            .flat_map(|r| peers.ptrs.get(r).copied().unwrap_or(0).to_le_bytes())
            .collect();
        sym.table.write(slot * SYM_MAX_RANKS * 8, &row)?;
        log::info!(
            "rank {}: symmetric window in slot {slot}: AllReduce, AllGather and ReduceScatter of \
             at most {} bytes per rank take the symmetric path",
            self.rank,
            sym.limits.max_bytes
        );
        Ok(Some(slot))
    }

    /// The symmetric state: this rank's scratch (zeroed flags), every rank's scratch mapped
    /// here (every rank makes it at the same window), the empty table; None, on every rank
    /// alike, where some rank could not map some other's scratch.
    fn make_sym(&self) -> Result<Option<Sym>> {
        let max_bytes = crate::env::RS_SYMMETRIC_MAX_BYTES.int().max(0) as usize;
        let stage_bytes = max_bytes.next_multiple_of(16).max(16);
        let total = SYM_FLAG_BYTES + stage_bytes + SYM_LL_BYTES;
        let scratch = self.device.alloc(total)?;
        // Zero flags: no slot or line looks arrived before its first launch.
        scratch.write(0, &vec![0u8; SYM_FLAG_BYTES])?;
        scratch.write(SYM_FLAG_BYTES + stage_bytes, &vec![0u8; SYM_LL_BYTES])?;
        let table = self.device.alloc(SYM_MAX_WINDOWS * SYM_MAX_RANKS * 8)?;
        table.write(0, &vec![0u8; SYM_MAX_WINDOWS * SYM_MAX_RANKS * 8])?;
        let Some(peers) = self.share(scratch.ptr, total)? else {
            return Ok(None);
        };
        let mut dev = SymDev {
            rank: self.rank as u32,
            nranks: self.nranks as u32,
            stage_bytes: stage_bytes as u64,
            windows: table.ptr,
            launches: [0; MAX_CHANNELS],
            ..SymDev::default()
        };
        dev.scratch[..self.nranks].copy_from_slice(&peers.ptrs);
        let d = self.device.alloc(std::mem::size_of::<SymDev>())?;
        d.write(0, super::as_bytes(std::slice::from_ref(&dev)))?;
        Ok(Some(Sym {
            dev: d,
            table,
            _scratch: scratch,
            _peers: peers,
            limits: SymLimits {
                max_bytes,
                stage_bytes,
                two_shot: crate::env::RS_SYMMETRIC_TWO_SHOT.int() != 0,
            },
        }))
    }
}

/// With `NCCL_WIN_COLL_SYMMETRIC` on any rank: on every rank, and the same size everywhere.
fn check_symmetric(offers: &[Offer]) -> Result<()> {
    if let Some(r) = offers.iter().position(|o| o.symmetric == 0) {
        return Err(Error::invalid_usage(format!(
            "ncclCommWindowRegister: NCCL_WIN_COLL_SYMMETRIC must be given on every rank, and \
             rank {r} did not give it"
        )));
    }
    let bytes = offers[0].bytes;
    if let Some(r) = offers.iter().position(|o| o.bytes != bytes) {
        return Err(Error::invalid_usage(format!(
            "ncclCommWindowRegister: a symmetric window must have the same size on every rank: \
             rank 0 registers {bytes} bytes, rank {r} {}",
            offers[r].bytes
        )));
    }
    Ok(())
}

/// What a rank whose output lies at `recv` in window `w` publishes at its arrival.
fn at_out(w: &Window, recv: DevPtr) -> u64 {
    sym_src_window(w.slot.unwrap_or_default(), recv - w.base)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: SymLimits = SymLimits {
        max_bytes: 1 << 20,
        stage_bytes: 1 << 20,
        two_shot: true,
    };

    #[test]
    fn the_form_follows_the_size_and_the_filters() {
        let both = (true, true);
        let form = |coll, bytes, n, protos| symmetric_form(coll, bytes, n, LIMITS, protos);
        assert_eq!(form(Coll::AllReduce, 8, 2, both), Some(PROTO_LL));
        assert_eq!(
            form(Coll::AllGather, SYM_LL_MAX_BYTES, 8, both),
            Some(PROTO_LL)
        );
        assert_eq!(
            form(Coll::AllReduce, SYM_LL_MAX_BYTES + 1, 4, both),
            Some(PROTO_SIMPLE)
        );
        // NCCL_PROTO=^LL: the loads run small calls too; =LL: nothing above the LL form.
        assert_eq!(
            form(Coll::AllReduce, 8, 2, (false, true)),
            Some(PROTO_SIMPLE)
        );
        assert_eq!(
            form(Coll::AllReduce, SYM_LL_MAX_BYTES + 1, 2, (true, false)),
            None
        );
        assert_eq!(form(Coll::AllReduce, 8, 2, (false, false)), None);
        // ReduceScatter stages its whole input: every block must fit.
        assert_eq!(
            form(Coll::ReduceScatter, 256 << 10, 4, both),
            Some(PROTO_SIMPLE)
        );
        assert_eq!(form(Coll::ReduceScatter, (256 << 10) + 1, 4, both), None);
        assert_eq!(
            form(Coll::AllGather, (256 << 10) + 1, 4, both),
            Some(PROTO_SIMPLE)
        );
        // Over the limit, empty, one rank, more ranks than the path serves.
        assert_eq!(form(Coll::AllReduce, (1 << 20) + 1, 2, both), None);
        assert_eq!(form(Coll::AllReduce, 0, 2, both), None);
        assert_eq!(form(Coll::AllReduce, 8, 1, both), None);
        assert_eq!(form(Coll::AllReduce, 8, SYM_MAX_RANKS + 1, both), None);
    }
}
