//! The named steps a collective is written in. Each moves `n` elements (at most a step's
//! worth) between this rank's buffers and its ring or tree neighbours, in the launch's
//! protocol, and is one step of flow control on every connection it names:
//!
//! | step                    | receives | this rank's input | writes its output | sends |
//! |-------------------------|----------|-------------------|-------------------|-------|
//! | `send`                  |          | read              |                   | yes   |
//! | `copy_send`             |          | read              | copy              | yes   |
//! | `recv`                  | yes      |                   | store             |       |
//! | `recv_copy_send`        | yes      |                   | store             | yes   |
//! | `recv_reduce_send`      | yes      | reduced in        |                   | yes   |
//! | `recv_reduce_copy`      | yes      | reduced in        | final value       |       |
//! | `recv_reduce_copy_send` | yes      | reduced in        | final value       | yes   |
//! | `recv_reduce_keep`      | yes      | reduced in        | partial sum       |       |
//! | `recv_reduce_keep_send` | yes      | reduced in        | partial sum       | yes   |
//!
//! (NCCL's primitives carry the same names; the two `keep` steps are its `recvReduceCopy`
//! steps without the post-operation.) The operator's `pre` applies to this rank's input
//! wherever a step reads it; `post` applies where a step writes a final value, never to a
//! partial sum kept for a later step. Where the
//! received data comes from is a [`Src`], where the sent data goes a [`Dst`]: the FIFO slot of
//! the step, or (zero-copy, Simple only, after a handshake: [`super::RingDirect`]) a buffer the
//! peer wrote into or we write into. Every thread of the group calls each step with the same
//! arguments.
//!
//! A [`Prims`] without a receive (send) connection skips that half of every step: the first
//! rank of a chain receives nothing, the last sends nothing, and both run the steps of the
//! ranks between. So one call serves every place in a chain, and the kernel inlines the
//! engine once there instead of once per place.

use super::copy::Move;
use super::Prims;
use crate::abi::{PROTO_LL, PROTO_LL128};
use crate::ops::RedOp;
use crate::types::Elem;

/// Where a step finds what it receives.
#[derive(Clone, Copy)]
pub enum Src<T> {
    /// The connection's FIFO slot for the step.
    Fifo,
    /// Already here, in this rank's own buffer: the peer wrote it there (zero-copy). The FIFO
    /// step still counts, so flow control stays as it was.
    Landed(*const T),
}

/// Where a step puts what it sends.
#[derive(Clone, Copy)]
pub enum Dst<T> {
    /// The connection's FIFO slot for the step.
    Fifo,
    /// Straight into the peer's buffer at this address (zero-copy).
    Peer(*mut T),
}

impl<T> Dst<T> {
    /// [`Dst::Peer`] at `at`, or the FIFO where `at` is null (no buffer was agreed).
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub fn peer_or_fifo(at: *mut T) -> Dst<T> {
        if at.is_null() {
            Dst::Fifo
        } else {
            Dst::Peer(at)
        }
    }
}

impl<T> Src<T> {
    /// [`Src::Landed`] at `at` when `landed`, else the FIFO.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub fn landed_if(landed: bool, at: *const T) -> Src<T> {
        if landed {
            Src::Landed(at)
        } else {
            Src::Fifo
        }
    }
}

/// A received block's move: from the FIFO it is stored at `dst`; landed, it lies at `dst`
/// already (the peer wrote it in place) and moves only where it is sent on.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
fn stored<T: Elem>(dst: *mut T, from: Src<T>) -> Move<T> {
    match from {
        Src::Fifo => Move {
            output: dst,
            ..Move::none()
        },
        Src::Landed(_) => Move::none(),
    }
}

impl Prims {
    /// The engine under every named step: in the launch's protocol, waits for the receive
    /// slot (`from`: none when the step receives nothing, or there is no receive connection)
    /// and a free send slot (`to`: likewise), moves the data `mv` names, publishes. LL and
    /// LL128 steps always go through the FIFOs.
    ///
    /// Every call site inlines the whole engine, so a collective calls it directly only where
    /// one call must take several shapes that the named steps would spread over several calls
    /// (and the PTX grow by as many engines).
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub(crate) unsafe fn step<T: Elem, O: RedOp<T>>(
        &mut self,
        op: &O,
        mv: Move<T>,
        n: usize,
        from: Option<Src<T>>,
        to: Option<Dst<T>>,
    ) {
        let from = if self.recv.is_null() { None } else { from };
        let to = if self.send.is_null() { None } else { to };
        let (recv, send) = (from.is_some(), to.is_some());
        match self.proto {
            PROTO_LL => self.step_ll(op, recv, send, mv, n),
            PROTO_LL128 => self.step_ll128(op, recv, send, mv, n),
            _ => self.step_simple(op, mv, n, from, to),
        }
    }

    /// Sends `src` (this rank's input, `pre` applied) to the next peer.
    ///
    /// # Safety
    /// `src` holds `n` elements; the connections were wired by the host.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn send<T: Elem, O: RedOp<T>>(
        &mut self,
        op: &O,
        src: *const T,
        n: usize,
        to: Dst<T>,
    ) {
        let mv = Move {
            input: src,
            ..Move::none()
        };
        self.step(op, mv, n, None, Some(to))
    }

    /// Sends `src` (`pre` applied) and copies it into `dst`; a null `dst` copies nothing (the
    /// input is the output already: in place).
    ///
    /// # Safety
    /// As [`Prims::send`]; a non-null `dst` holds `n` elements.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn copy_send<T: Elem, O: RedOp<T>>(
        &mut self,
        op: &O,
        src: *const T,
        dst: *mut T,
        n: usize,
        to: Dst<T>,
    ) {
        let mv = Move {
            input: src,
            output: dst,
            ..Move::none()
        };
        self.step(op, mv, n, None, Some(to))
    }

    /// Receives a finished block into `dst` (landed: it is there already).
    ///
    /// # Safety
    /// As [`Prims::send`]; `dst` holds `n` elements.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn recv<T: Elem, O: RedOp<T>>(
        &mut self,
        op: &O,
        dst: *mut T,
        n: usize,
        from: Src<T>,
    ) {
        self.step(op, stored(dst, from), n, Some(from), None)
    }

    /// Receives a finished block into `dst` and sends it on (landed: it is in `dst` already,
    /// and is sent from there).
    ///
    /// # Safety
    /// As [`Prims::recv`].
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn recv_copy_send<T: Elem, O: RedOp<T>>(
        &mut self,
        op: &O,
        dst: *mut T,
        n: usize,
        from: Src<T>,
        to: Dst<T>,
    ) {
        self.step(op, stored(dst, from), n, Some(from), Some(to))
    }

    /// Receives a partial result, reduces `src` (`pre` applied) into it, sends the sum on.
    ///
    /// # Safety
    /// As [`Prims::send`].
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn recv_reduce_send<T: Elem, O: RedOp<T>>(
        &mut self,
        op: &O,
        src: *const T,
        n: usize,
        from: Src<T>,
        to: Dst<T>,
    ) {
        let mv = Move {
            input: src,
            ..Move::none()
        };
        self.step(op, mv, n, Some(from), Some(to))
    }

    /// Receives a partial result, reduces `src` into it and stores the final value (`post`
    /// applied) in `dst`.
    ///
    /// # Safety
    /// As [`Prims::copy_send`].
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn recv_reduce_copy<T: Elem, O: RedOp<T>>(
        &mut self,
        op: &O,
        src: *const T,
        dst: *mut T,
        n: usize,
        from: Src<T>,
    ) {
        self.step(op, finished(src, dst), n, Some(from), None)
    }

    /// [`Prims::recv_reduce_copy`], and sends the final value on.
    ///
    /// # Safety
    /// As [`Prims::copy_send`].
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn recv_reduce_copy_send<T: Elem, O: RedOp<T>>(
        &mut self,
        op: &O,
        src: *const T,
        dst: *mut T,
        n: usize,
        from: Src<T>,
        to: Dst<T>,
    ) {
        self.step(op, finished(src, dst), n, Some(from), Some(to))
    }

    /// Receives a partial result, reduces `src` into it and keeps the sum in `dst` (no
    /// `post`: a later step goes on from there).
    ///
    /// # Safety
    /// As [`Prims::copy_send`].
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn recv_reduce_keep<T: Elem, O: RedOp<T>>(
        &mut self,
        op: &O,
        src: *const T,
        dst: *mut T,
        n: usize,
        from: Src<T>,
    ) {
        self.step(op, kept(src, dst), n, Some(from), None)
    }

    /// [`Prims::recv_reduce_keep`], and sends the partial sum on.
    ///
    /// # Safety
    /// As [`Prims::copy_send`].
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn recv_reduce_keep_send<T: Elem, O: RedOp<T>>(
        &mut self,
        op: &O,
        src: *const T,
        dst: *mut T,
        n: usize,
        from: Src<T>,
        to: Dst<T>,
    ) {
        self.step(op, kept(src, dst), n, Some(from), Some(to))
    }
}

/// The move of a step that produces final values: `src` reduced with what arrives, into
/// `dst`, `post` applied.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
fn finished<T: Elem>(src: *const T, dst: *mut T) -> Move<T> {
    Move {
        post: true,
        ..kept(src, dst)
    }
}

/// The move of a step that keeps a partial sum: `src` reduced with what arrives, into `dst`.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
fn kept<T: Elem>(src: *const T, dst: *mut T) -> Move<T> {
    Move {
        input: src,
        output: dst,
        ..Move::none()
    }
}
