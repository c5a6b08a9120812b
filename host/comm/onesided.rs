//! One-sided operations on windows (NCCL 2.29's host API): `ncclPutSignal` writes a buffer into
//! a peer's window and then raises a signal at that peer, `ncclSignal` raises one alone, and
//! `ncclWaitSignal` holds a stream until signals from given peers arrived. The target does not
//! take part. Inside a node a put is a copy-engine copy and a signal a stream memory write;
//! a wait is a one-CTA kernel (below): no collective kernel, no SMs but that one.
//!
//! Signals: every rank keeps a pad of one u64 per source rank and `Channel` (the user's, and
//! the copy-engine collectives' of `copy_engine.rs`), zeroed, that every rank maps
//! (made with the first window every rank maps, `Comm::make_signals`). A signal from rank `s`
//! to rank `d` writes the number of signals `s` has sent `d` so far into slot `s` of `d`'s pad,
//! after a fence and in the stream's order, so a put's data is visible before its signal. Only
//! `s` writes that slot, and puts and signals take their place in the communicator's order
//! whatever their stream, so the number only grows. A wait (ordered by its stream alone) for `k`
//! more signals from `s` holds the stream until slot `s` reaches what this rank waited for
//! from `s` before plus `k`: a one-CTA kernel spins on the slots
//! ([`nccl_device::abi::WAIT_SIGNALS_ENTRY`]) and watches the abort flag. Not
//! `cuStreamWaitValue64`: CUDA warns that a stream stalled in it stalls the hardware queue it
//! shares, where the awaited write may sit behind it. Both counts are taken on the host when the operation is issued (in
//! call order; at the group's end inside a group), which is why these operations cannot be
//! captured in a CUDA graph: a replay would write and wait for the same numbers again.
//!
//! The wait kernel watches the communicator's abort flag, so an abort releases held streams
//! (their results are undefined, as after any abort).
//!
//! A window is mapped by every rank only where every rank can map every other (one node, p2p;
//! `comm/share.rs`). Where some rank cannot (a communicator across nodes), puts and signals to
//! every peer travel over the network instead (`onesided_net.rs`: a thread of the
//! communicator's own sends them and, at the target, copies them into the window and writes
//! the signal into the pad); waits are the same. A communicator of one node whose ranks cannot
//! map each other reaches them through the network where it has a network path (P2P and SHM
//! off), else refuses one-sided operations with ncclInvalidUsage; so does a put into a window
//! some rank could not map where the others are mapped.

use super::group_scope::ordered;
use super::onesided_net::RemotePuts;
use super::share::Shared;
use super::window::WinHandle;
use super::Comm;
use crate::cuda::{DevBuffer, DevPtr, Device, Kernel, StreamHandle};
use crate::error::{Error, Result};
use nccl_device::abi::{WaitArgs, WAIT_MAX, WAIT_SIGNALS_ENTRY};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// The signals of one purpose: a slot per source rank each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Channel {
    /// `ncclPutSignal`, `ncclSignal`, `ncclWaitSignal`.
    User = 0,
    /// The copy-engine collectives' handshakes (`copy_engine.rs`).
    Collective = 1,
}

/// How many [`Channel`]s a pad holds.
pub(crate) const CHANNELS: usize = 2;

/// A communicator's signal pads.
pub(crate) struct Signals {
    device: Device,
    rank: usize,
    nranks: usize,
    /// Where not every rank maps every other: the network's side. Before `pad`, so that it
    /// drops first: its thread writes signals into the pad until it is joined.
    remote: Option<RemotePuts>,
    /// Every rank's pad as addressed here, kept mapped, where every rank maps every other.
    peers: Option<Shared>,
    /// This rank's pad: slot `c * nranks + s` counts the signals rank `s` sent here on
    /// channel `c`.
    pad: DevBuffer,
    /// The wait kernel, and the abort flag it watches.
    wait_kernel: Kernel,
    abort: u64,
    /// Per peer: the signals this rank sent it, and the signals it waited for from it.
    counts: Mutex<Counts>,
    /// Whether a device communicator's GIN proxy stages puts on the network side
    /// (`gin.rs`): the host's own puts across nodes are refused meanwhile.
    pub(crate) gin_active: AtomicBool,
}

/// Per (channel, peer): the signals this rank sent it, and those it waited for from it.
#[derive(Default)]
struct Counts {
    sent: Vec<u64>,
    awaited: Vec<u64>,
}

impl Signals {
    /// Queues on `stream` a signal to `peer` on `ch`: the next count of this rank's signals
    /// to it, written into its slot of `peer`'s pad after the stream's earlier writes.
    pub(crate) fn send(&self, stream: StreamHandle, peer: usize, ch: Channel) -> Result<()> {
        self.put(stream, None, peer, ch)
    }

    /// Queues on `stream` the put `data` (a window's handle, an offset in rank `peer`'s part
    /// of it, and the bytes at a local address) if any, then a signal to `peer` on `ch`.
    /// Inside a node the copy was queued by the caller (`data`: None); across nodes the
    /// network carries both.
    fn put(
        &self,
        stream: StreamHandle,
        data: Option<(u64, usize, DevPtr, usize)>,
        peer: usize,
        ch: Channel,
    ) -> Result<()> {
        let at = ch as usize * self.nranks;
        // Counted once queued: a put that failed leaves the count as it was. (Puts and
        // signals take the communicator's order, so no other one runs meanwhile.)
        let value = {
            let c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
            c.sent[at + peer] + 1
        };
        let queued = match (&self.peers, &self.remote, data) {
            (Some(peers), _, None) => {
                let slot = peers.ptrs[peer] + 8 * (at + self.rank) as u64;
                self.device.write_value64(stream, slot, value)
            }
            // To itself across nodes: the caller copied the data; the signal is local.
            (None, Some(_), None) if peer == self.rank => {
                let slot = self.pad.ptr + 8 * (at + self.rank) as u64;
                self.device.write_value64(stream, slot, value)
            }
            (None, Some(_), _) if self.gin_active.load(Ordering::Acquire) => {
                Err(Error::invalid_usage(
                    "one-sided operations across nodes from the host (ncclPutSignal, ncclSignal, \
                     copy-engine collectives) while a device communicator with GIN lives: not \
                     supported yet (their stagings would interleave); drop the DeviceComm first",
                ))
            }
            (None, Some(remote), data) => {
                let (win, offset, src, bytes) = data.unwrap_or_default();
                let wait = |s: StreamHandle, addr: DevPtr, v: u64| self.wait_word(s, addr, v);
                let sent = remote.stage(
                    stream,
                    (src, bytes),
                    peer,
                    (win, offset),
                    (ch as u64, value),
                    &wait,
                )?;
                // The stream goes on once the last chunk was sent.
                self.wait_word(stream, remote.sent_word(), sent)
            }
            (Some(_), _, Some(_)) | (None, None, _) => Err(Error::internal(
                "a put with no way to its target (its window is not mapped here)",
            )),
        };
        queued?;
        self.counts.lock().unwrap_or_else(|p| p.into_inner()).sent[at + peer] = value;
        Ok(())
    }

    /// Holds `stream` until the u64 at `addr` (device memory or mapped host memory) reaches
    /// `value`, or the communicator is aborted: one wait kernel.
    fn wait_word(&self, stream: StreamHandle, addr: DevPtr, value: u64) -> Result<()> {
        let mut args = WaitArgs {
            abort: self.abort,
            count: 1,
            ..WaitArgs::default()
        };
        args.slots[0] = addr;
        args.values[0] = value;
        self.device.launch(self.wait_kernel, 1, 32, stream, &args)
    }

    /// The network's side of one-sided operations, where it carries them.
    pub(crate) fn remote(&self) -> Option<&RemotePuts> {
        self.remote.as_ref()
    }

    /// Holds `stream` until, for each `(peer, more)` of `waits`, `more` further signals from
    /// `peer` on `ch` arrived: wait kernels of up to [`WAIT_MAX`] waits each.
    pub(crate) fn wait(
        &self,
        stream: StreamHandle,
        ch: Channel,
        waits: &[(usize, u64)],
    ) -> Result<()> {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        for chunk in waits.chunks(WAIT_MAX) {
            let mut args = WaitArgs {
                abort: self.abort,
                count: chunk.len() as u32,
                ..WaitArgs::default()
            };
            for (i, &(peer, more)) in chunk.iter().enumerate() {
                let at = ch as usize * self.nranks + peer;
                c.awaited[at] += more;
                args.slots[i] = self.pad.ptr + 8 * at as u64;
                args.values[i] = c.awaited[at];
            }
            self.device.launch(self.wait_kernel, 1, 32, stream, &args)?;
        }
        Ok(())
    }
}

/// One wait of `ncclWaitSignal`: `ops` more signals from rank `peer`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SignalWait {
    /// The rank whose signals are awaited.
    pub peer: usize,
    /// How many more of them.
    pub ops: u64,
}

impl Comm {
    /// The signal pads (collective: every rank calls it at the same window, the first every
    /// rank maps); None, on every rank alike, where some rank could not map some other's pad.
    /// With `remote`, the network carries puts and signals (every rank calls it so at the
    /// same window, the first where not every rank maps every other; the communicator spans
    /// nodes).
    pub(super) fn make_signals(&self, remote: bool) -> Result<Option<Signals>> {
        let slots = CHANNELS * self.nranks;
        let bytes = 8 * slots;
        let pad = self.device.alloc(bytes)?;
        pad.write(0, &vec![0u8; bytes])?;
        let wait_kernel = self.device.kernel(WAIT_SIGNALS_ENTRY)?;
        let (peers, remote) = match (remote, self.net.as_ref()) {
            (true, Some(net)) => {
                let dev = net.nics.first().copied().unwrap_or(0);
                let r = RemotePuts::connect(
                    &self.device,
                    (self.rank, self.nranks),
                    pad.ptr,
                    &self.bootstrap,
                    (&*net.net, dev),
                    net.timeout,
                    net.proxy.on_error(),
                )
                .map_err(|e| e.context("one-sided operations across nodes"))?;
                (None, Some(r))
            }
            (true, None) => return Ok(None),
            (false, _) => match self.share(pad.ptr, bytes)? {
                Some(p) => (Some(p), None),
                None => return Ok(None),
            },
        };
        Ok(Some(Signals {
            device: self.device.clone(),
            rank: self.rank,
            nranks: self.nranks,
            pad,
            peers,
            remote,
            wait_kernel,
            abort: self.kernel_abort_ptr(),
            counts: Mutex::new(Counts {
                sent: vec![0; slots],
                awaited: vec![0; slots],
            }),
            gin_active: AtomicBool::new(false),
        }))
    }

    /// `ncclPutSignal`: copies `bytes` at `local` into rank `peer`'s part of window `win`,
    /// `offset` bytes in, then raises a signal at `peer`; in `stream`'s order and the
    /// communicator's (at the group's end inside a group).
    pub(crate) fn put_signal(
        &self,
        local: DevPtr,
        bytes: usize,
        peer: usize,
        win: WinHandle,
        offset: usize,
        stream: StreamHandle,
    ) -> Result<()> {
        let signals = self.one_sided([peer], stream)?;
        let (target, size) = self.window_of_peer(win, peer)?;
        // Unmapped: the network carries it, or (to itself) a local copy does.
        let target = match (target, signals.remote().is_some()) {
            (Some(t), _) => Some(t),
            (None, true) if peer == self.rank => self.window_bases(win)?.0.first().copied(),
            (None, true) => None,
            (None, false) => {
                return Err(Error::invalid_usage(format!(
                    "window {win:#x} is not mapped by every rank (some rank could not map some \
                     other's part of it), so one-sided operations cannot reach it"
                )))
            }
        };
        if offset
            .checked_add(bytes)
            .is_none_or(|end| end as u64 > size)
        {
            return Err(Error::invalid_argument(format!(
                "{bytes} bytes at offset {offset} do not fit rank {peer}'s part of window \
                 {win:#x} ({size} bytes)"
            )));
        }
        if bytes > 0 {
            self.check_local(local, bytes)?;
        }
        let (device, order) = (self.device.clone(), self.order.clone());
        ordered(move || {
            order.launch(stream, || match target {
                Some(target) => {
                    if bytes > 0 {
                        device.copy_dtod_async(target + offset as u64, local, bytes, stream)?;
                    }
                    signals.send(stream, peer, Channel::User)
                }
                None => {
                    let data = (win, offset, local, bytes);
                    signals.put(stream, Some(data), peer, Channel::User)
                }
            })
        })
    }

    /// `ncclSignal`: raises a signal at rank `peer`, in `stream`'s order.
    pub(crate) fn signal(&self, peer: usize, stream: StreamHandle) -> Result<()> {
        let signals = self.one_sided([peer], stream)?;
        let order = self.order.clone();
        ordered(move || order.launch(stream, || signals.send(stream, peer, Channel::User)))
    }

    /// `ncclWaitSignal`: holds `stream` until every wait's signals arrived. Ordered by its
    /// stream alone, not in the communicator's order: it may hold its stream for as long as
    /// the peers take, and the rank's work on other streams (its own puts included) must go
    /// on meanwhile.
    pub(crate) fn wait_signal(&self, waits: &[SignalWait], stream: StreamHandle) -> Result<()> {
        if waits.is_empty() {
            return Ok(()); // nothing to wait for
        }
        let signals = self.one_sided(waits.iter().map(|w| w.peer), stream)?;
        let waits: Vec<(usize, u64)> = waits
            .iter()
            .filter(|w| w.ops > 0)
            .map(|w| (w.peer, w.ops))
            .collect();
        ordered(move || signals.wait(stream, Channel::User, &waits))
    }

    /// The checks every one-sided operation makes, once per call: its peers, a stream not
    /// capturing, and the signal pads (which exist once every rank maps every other's windows).
    fn one_sided(
        &self,
        peers: impl IntoIterator<Item = usize>,
        stream: StreamHandle,
    ) -> Result<Arc<Signals>> {
        if let Some(peer) = peers.into_iter().find(|&p| p >= self.nranks) {
            return Err(Error::invalid_argument(format!(
                "peer {peer} is out of range (nranks {})",
                self.nranks
            )));
        }
        if self.device.stream_capturing(stream)? {
            return Err(Error::invalid_usage(
                "one-sided operations cannot be captured in a CUDA graph here (their signal \
                 counts are taken when they are issued)",
            ));
        }
        self.windows.signals().ok_or_else(|| {
            Error::invalid_usage(
                "no window is registered where one-sided operations can reach every rank \
                 (ncclCommWindowRegister first; on one node the ranks must reach each other \
                 through p2p)",
            )
        })
    }

    /// `bytes` at `local` must be memory of this communicator's device.
    fn check_local(&self, local: DevPtr, bytes: usize) -> Result<()> {
        match self.device.pointer_extent(local, bytes)? {
            Some((d, avail)) if d == self.device.ordinal && avail >= bytes => Ok(()),
            _ => Err(Error::invalid_argument(format!(
                "localbuff: {bytes} bytes at {local:#x} are not memory of device {} (the \
                 communicator's)",
                self.device.ordinal
            ))),
        }
    }
}
