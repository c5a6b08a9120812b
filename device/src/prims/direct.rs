//! Zero-copy point-to-point: when both ends of a message registered their buffers, the sender
//! copies straight from its user buffer into the receiver's, and no FIFO slot is used.
//!
//! Which path a message takes is agreed on the GPU, per message, so that a rank that passed an
//! unregistered buffer while its peer passed a registered one gets copies, not a hang or a write
//! into memory nobody offered ([`crate::abi::DIRECT_TAG`] says where the words live):
//! 1. the receiver offers an address (its part of the user buffer, or nothing);
//! 2. the sender takes the offer if it can reach that address, copies, and answers "direct";
//!    else it answers "FIFO" and both run the ordinary Simple steps.
//!
//! A direct message takes one step of the connection's counters at both ends (the sender
//! publishes `tail`, the receiver `head`), so the FIFO's flow control stays consistent for the
//! messages after it.

use super::copy::Move;
use super::Prims;
use crate::abi::{
    ChannelDev, ConnRecv, ConnSend, RegEntry, RegTable, AGREE_WORD, DIRECT_DECLINE, DIRECT_DST,
    DIRECT_KEY, DIRECT_OFF, DIRECT_PARTIALS, DIRECT_SAME_SPACE, DIRECT_TAG, DIRECT_WORD,
    RING_DECLINED, RING_PARTIALS,
};
use crate::arch;
use crate::ops::Sum;

/// What a receiver offers its sender: the address of its buffer (in its own address space, or
/// [`DIRECT_DECLINE`]) and the key of the allocation it lies in ([`DIRECT_KEY`]).
#[derive(Clone, Copy)]
pub struct Offer {
    pub addr: u64,
    pub key: u64,
}

impl Offer {
    /// Nothing on offer: the message takes the FIFO.
    pub const DECLINE: Offer = Offer {
        addr: DIRECT_DECLINE,
        key: 0,
    };
}

/// Writes `offer` into the offer line `line` and then (release) `tag` at [`DIRECT_TAG`].
#[cfg_attr(target_arch = "nvptx64", inline(always))]
unsafe fn post_offer(line: u64, offer: Offer, tag: u64) {
    arch::st_volatile(word(line, DIRECT_WORD), offer.addr);
    arch::st_volatile(word(line, DIRECT_KEY), offer.key);
    arch::st_release_sys(word(line, DIRECT_TAG), tag);
}

/// The offer in the offer line `line` (read after the acquire of its tag).
#[cfg_attr(target_arch = "nvptx64", inline(always))]
unsafe fn read_offer(line: u64) -> Offer {
    Offer {
        addr: arch::ld_volatile(word(line, DIRECT_WORD)),
        key: arch::ld_volatile(word(line, DIRECT_KEY)),
    }
}

/// Where a word of a counter line lies.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
fn word(line: u64, offset: usize) -> *mut u64 {
    (line + offset as u64) as *mut u64
}

impl Prims {
    /// The receiving end's side of the handshake over this primitive's receive connection:
    /// offers `offer` (our buffer, or [`Offer::DECLINE`]) and waits for
    /// the sender's answer. Returns true when the sender put the data into the offered buffer
    /// (the message is then done, its step taken); false when it comes through the FIFO.
    ///
    /// # Safety
    /// Every thread of the group calls it alike; the connection is a direct (p2p) one whose
    /// peer runs [`Prims::direct_send`] for the same message.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn direct_recv(&mut self, offer: Offer) -> bool {
        let rc = self.recv;
        let tag = self.recv_step + 1;
        let (offer_line, answer_line) = ((*rc).head, (*rc).tail);
        if self.tid == 0 {
            post_offer(offer_line, offer, tag);
            self.wait(|| arch::ld_acquire_sys(word(answer_line, DIRECT_TAG)) >= tag);
        }
        self.sync();
        // Every thread reads the answer after thread 0's acquire; a thread 0 that gave up
        // (abort) leaves an old tag, which reads as "FIFO".
        let answered = arch::ld_volatile(word(answer_line, DIRECT_TAG)) >= tag;
        let direct = answered && arch::ld_volatile(word(answer_line, DIRECT_WORD)) == 1;
        if direct {
            if self.tid == 0 {
                arch::st_release_sys(offer_line as *mut u64, tag);
            }
            self.recv_step = tag;
        }
        direct
    }

    /// The sending end's side: waits for the receiver's offer and, when `reach` (the item's
    /// [`crate::abi::P2pItem::direct`]) lets us address it, copies `bytes` from `src` there and
    /// answers "direct" (returns true: the message is done); else answers "FIFO" (false).
    ///
    /// # Safety
    /// As [`Prims::direct_recv`], on the send connection; `src` holds `bytes` bytes, and a
    /// `reach` that is a table points at a [`RegTable`] in device memory.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn direct_send(&mut self, reach: u64, src: *const u8, bytes: usize) -> bool {
        let sc = self.send;
        let tag = self.send_step + 1;
        let (offer_line, answer_line) = ((*sc).head, (*sc).tail);
        if self.tid == 0 {
            self.wait(|| arch::ld_acquire_sys(word(offer_line, DIRECT_TAG)) >= tag);
            // Only an offer of this message counts (a thread 0 that gave up on an abort sees
            // an older tag and takes the FIFO).
            let offered = arch::ld_volatile(word(offer_line, DIRECT_TAG)) >= tag;
            let offer = read_offer(offer_line);
            let dst = if offered {
                reach_offer(reach, offer, bytes as u64)
            } else {
                0
            };
            arch::st_volatile(word(offer_line, DIRECT_DST), dst);
        }
        self.sync();
        let dst = arch::ld_volatile(word(offer_line, DIRECT_DST));
        if dst != 0 {
            Move {
                input: src,
                output: dst as *mut u8,
                ..Move::<u8>::none()
            }
            .run_inline(&Sum, bytes, self.tid, self.nthreads);
            self.sync();
        }
        if self.tid == 0 {
            if dst != 0 {
                arch::st_volatile((*sc).tail as *mut u64, tag);
            }
            arch::st_volatile(word(answer_line, DIRECT_WORD), (dst != 0) as u64);
            // Releases the data (the barrier above gathered every thread's stores) and the mode.
            arch::st_release_sys(word(answer_line, DIRECT_TAG), tag);
        }
        if dst != 0 {
            self.send_step = tag;
        }
        dst != 0
    }
}

/// What the ring handshake ([`Prims::ring_handshake`]) agreed for one collective on a
/// channel.
#[derive(Clone, Copy)]
pub struct RingDirect {
    /// The predecessor writes the blocks it passes us straight into our output buffer.
    pub recv: bool,
    /// Where the successor's output buffer starts in our address space (0: what we send it
    /// goes through its FIFO).
    pub send_to: u64,
    /// The predecessor also writes partial sums into our output (AllReduce's reduce-scatter
    /// half): we offered them room ([`RING_PARTIALS`]) and it went direct.
    pub recv_partials: bool,
    /// We write partial sums into the successor's output at `send_to` (it offered them room).
    pub send_partials: bool,
}

impl RingDirect {
    /// Both connections copy through their FIFOs.
    pub const FIFO: RingDirect = RingDirect {
        recv: false,
        send_to: 0,
        recv_partials: false,
        send_partials: false,
    };

    /// Where element `at` of the successor's output lies when partial sums go there, null
    /// when they go through its FIFO.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub fn partial_at<T>(&self, at: usize) -> *mut T {
        if self.send_partials {
            self.send_at(at)
        } else {
            core::ptr::null_mut()
        }
    }

    /// Where element `at` of the successor's output lies, null when what we send it goes
    /// through its FIFO.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub fn send_at<T>(&self, at: usize) -> *mut T {
        match self.send_to {
            0 => core::ptr::null_mut(),
            p => (p as *mut T).wrapping_add(at),
        }
    }
}

impl Prims {
    /// The zero-copy handshake of a ring collective, on both of this channel's ring
    /// connections at once, before the collective's first step: as a receiver (when `recv_on`)
    /// we offer our output buffer (`offer`) to the predecessor, as a sender (when `reach` is not
    /// [`DIRECT_OFF`]) we take the successor's offer of a `bytes`-long buffer if we can reach
    /// it, and answer. With `partials`, our offer also gives the predecessor room for partial
    /// sums in our output ([`RING_PARTIALS`]: AllReduce's reduce-scatter half, out of place);
    /// the sender takes it along with the buffer. A connection goes direct only when both of its ends registered. A rank
    /// that did not register (`registered` false) declines and answers "FIFO" with one plain
    /// store each, from thread 0 (no fence, no barrier), waiting only for its successor's
    /// offer before it answers; a registered one waits for its successor's offer and its
    /// predecessor's answer. Every offer
    /// is posted before any wait, so the ring cannot wait on itself. The handshake takes no
    /// step: the collective's steps then run with their counters as through the FIFO
    /// ([`super::Src::Landed`], [`super::Dst::Peer`]). Words: see [`RING_DECLINED`].
    ///
    /// # Safety
    /// Every thread of the group calls it alike, on a channel's ring connections wired by the
    /// host; the peers run it for the same collective with the same `recv_on`/`reach != OFF` on
    /// each shared connection, each of which then takes a step at least; a `reach` that is a
    /// table points at a [`RegTable`].
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn ring_handshake(
        &mut self,
        recv_on: bool,
        reach: u64,
        registered: bool,
        offer: Offer,
        bytes: u64,
        partials: bool,
    ) -> RingDirect {
        let (rc, sc) = (self.recv, self.send);
        let send_on = reach != DIRECT_OFF;
        // The connection's step plus one, the same at both ends (a connection's counters are
        // equal at both ends between operations).
        let (rtag, stag) = (self.recv_step + 1, self.send_step + 1);
        let tag_of = |v: u64| v & !(RING_DECLINED | RING_PARTIALS);
        if !registered {
            if self.tid == 0 {
                if recv_on {
                    arch::st_volatile(word((*rc).head, DIRECT_TAG), rtag | RING_DECLINED);
                }
                if send_on {
                    // Not before the successor's offer of this collective: until then its
                    // thread 0 may still be about to read our answer of the last one (a
                    // sender that went direct in a collective whose steps fill no FIFO, as a
                    // Broadcast's, can be here first), and would take this "FIFO" for it.
                    let line = (*sc).head;
                    self.wait(|| tag_of(arch::ld_acquire_sys(word(line, DIRECT_TAG))) >= stag);
                    arch::st_volatile(word((*sc).tail, DIRECT_TAG), stag << 1);
                }
            }
            return RingDirect::FIFO;
        }
        if self.tid == 0 {
            if recv_on {
                let room = if partials { RING_PARTIALS } else { 0 };
                post_offer((*rc).head, offer, rtag | room);
            }
            if send_on {
                let line = (*sc).head;
                self.wait(|| tag_of(arch::ld_acquire_sys(word(line, DIRECT_TAG))) >= stag);
                // Only an offer of this collective counts (an abort leaves an older tag).
                let v = arch::ld_volatile(word(line, DIRECT_TAG));
                let offered = tag_of(v) >= stag && v & RING_DECLINED == 0;
                let dst = match offered {
                    true => reach_offer(reach, read_offer(line), bytes),
                    false => 0,
                };
                arch::st_volatile(word(line, DIRECT_DST), dst);
                let room = dst != 0 && v & RING_PARTIALS != 0;
                arch::st_volatile(word(line, DIRECT_PARTIALS), room as u64);
                arch::st_volatile(word((*sc).tail, DIRECT_TAG), stag << 1 | (dst != 0) as u64);
            }
            if recv_on {
                let line = (*rc).tail;
                self.wait(|| arch::ld_acquire_sys(word(line, DIRECT_TAG)) >> 1 >= rtag);
            }
        }
        self.sync();
        let (send_to, send_partials) = if send_on {
            let line = (*sc).head;
            let dst = arch::ld_volatile(word(line, DIRECT_DST));
            (
                dst,
                dst != 0 && arch::ld_volatile(word(line, DIRECT_PARTIALS)) == 1,
            )
        } else {
            (0, false)
        };
        // Every thread reads the answer after thread 0's acquire; one that gave up (abort)
        // leaves an old tag, which reads as "FIFO".
        let recv = recv_on && {
            let v = arch::ld_volatile(word((*rc).tail, DIRECT_TAG));
            v >> 1 >= rtag && v & 1 == 1
        };
        RingDirect {
            recv,
            send_to,
            recv_partials: recv && partials,
            send_partials,
        }
    }
}

impl Prims {
    /// The zero-copy handshake of a tree's links, on this primitive's connections, before the
    /// first step: as a receiver (when `recv_on`) we offer our output (`offer`) to the peer
    /// below or above (a child's partial sums on the way up, the parent's results on the way
    /// down), or decline (not `registered`, or `offer` is [`Offer::DECLINE`]); as a sender
    /// (when `reach` is not [`DIRECT_OFF`]) we take the peer's offer of a `bytes`-long buffer
    /// if we registered and can reach it, and answer. The words are send/recv's
    /// ([`Prims::direct_recv`]): the one-node tree's up links may be the send/recv
    /// connections, whose next message reads them that way. The sender always waits for the
    /// offer before it answers (so an answer never lands before the receiver read the last
    /// one), a receiver that declined does not wait for the answer. No step is taken. Returns
    /// `recv` (the peer writes into our output) and `send_to` (the peer's output, 0: its FIFO).
    ///
    /// # Safety
    /// As [`Prims::ring_handshake`]; both ends of each connection run it for the same
    /// collective, with `recv_on` at one end equal to `reach != DIRECT_OFF` at the other, and
    /// take a step on it at least.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn tree_handshake(
        &mut self,
        recv_on: bool,
        reach: u64,
        registered: bool,
        offer: Offer,
        bytes: u64,
    ) -> RingDirect {
        let (rc, sc) = (self.recv, self.send);
        let send_on = reach != DIRECT_OFF;
        let (rtag, stag) = (self.recv_step + 1, self.send_step + 1);
        let offering = registered && offer.addr != DIRECT_DECLINE;
        if self.tid == 0 {
            if recv_on {
                link_offer(rc, rtag, if offering { offer } else { Offer::DECLINE });
            }
            if send_on {
                let line = offer_tag(sc);
                self.wait(|| arch::ld_acquire_sys(line) >= stag);
                link_answer(sc, stag, reach, registered, bytes);
            }
            if recv_on && offering {
                let line = answer_tag(rc);
                self.wait(|| arch::ld_acquire_sys(line) >= rtag);
            }
        }
        self.sync();
        let send_to = match send_on {
            true => link_destination(sc),
            false => 0,
        };
        let recv = recv_on && offering && link_direct(rc, rtag);
        RingDirect {
            recv,
            send_to,
            recv_partials: recv,
            send_partials: send_to != 0,
        }
    }
}

// The steps of a tree link's handshake ([`Prims::tree_handshake`], and the fan's in
// `SimpleFan::tree_handshake`), one connection at a time, with send/recv's words. Thread 0
// runs them; the caller waits between them with its own abort rule.

/// The receiving end: offers `offer` (our output, or [`Offer::DECLINE`]) for the message
/// tagged `tag`.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub(super) unsafe fn link_offer(rc: *mut ConnRecv, tag: u64, offer: Offer) {
    post_offer((*rc).head, offer, tag);
}

/// The word the sending end waits on until it reaches `tag`: the receiver's offer is there.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub(super) unsafe fn offer_tag(sc: *mut ConnSend) -> *const u64 {
    word((*sc).head, DIRECT_TAG)
}

/// The sending end, once [`offer_tag`] reached `tag` (or the wait gave up on an abort): takes
/// the offer if it is of this message, we `registered`, and `reach` translates a `bytes`-long
/// buffer at it; keeps the destination (0: the FIFO) for [`link_destination`] and answers.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub(super) unsafe fn link_answer(
    sc: *mut ConnSend,
    tag: u64,
    reach: u64,
    registered: bool,
    bytes: u64,
) {
    let line = (*sc).head;
    // Only an offer of this message counts (an abort leaves an older tag).
    let offered = arch::ld_volatile(word(line, DIRECT_TAG)) >= tag;
    let dst = match offered && registered {
        true => reach_offer(reach, read_offer(line), bytes),
        false => 0,
    };
    arch::st_volatile(word(line, DIRECT_DST), dst);
    let answer = (*sc).tail;
    arch::st_volatile(word(answer, DIRECT_WORD), (dst != 0) as u64);
    arch::st_release_sys(word(answer, DIRECT_TAG), tag);
}

/// What [`link_answer`] decided, for every thread after a barrier behind thread 0's answer.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub(super) unsafe fn link_destination(sc: *mut ConnSend) -> u64 {
    arch::ld_volatile(word((*sc).head, DIRECT_DST))
}

/// The word the receiving end waits on until it reaches `tag`: the sender answered.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub(super) unsafe fn answer_tag(rc: *mut ConnRecv) -> *const u64 {
    word((*rc).tail, DIRECT_TAG)
}

/// Whether the sender answered `tag` with "direct" (read by every thread after a barrier
/// behind thread 0's wait on [`answer_tag`]; a thread 0 that gave up on an abort leaves an old
/// tag: the FIFO).
#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub(super) unsafe fn link_direct(rc: *mut ConnRecv, tag: u64) -> bool {
    let line = (*rc).tail;
    arch::ld_volatile(word(line, DIRECT_TAG)) >= tag
        && arch::ld_volatile(word(line, DIRECT_WORD)) == 1
}

impl Prims {
    /// The ring agreement behind registered calls on fewer CTAs ([`crate::abi::CollArgs::reg_ctas`]):
    /// an AND of every rank's `mine` around this channel's ring of `nranks`, through the
    /// [`AGREE_WORD`]s of its two connections. Each rank posts to its successor how many ranks,
    /// ending with itself, it knows to be all `ok` (n - 1 hops when all are): a rank whose
    /// `mine` is false posts a final "no" and goes on at once, and a "no" is passed on as soon
    /// as it arrives. Every CTA of every rank that takes part gets the same answer, so they all
    /// cut the data the same way. The tag (this channel's agreements so far, plus one) is the
    /// same at both ends of each connection: both take part in the same launches. Returns
    /// false after an abort.
    ///
    /// # Safety
    /// Every thread of the group calls it alike; `ch` is this CTA's channel, whose ring
    /// connections are p2p ones (counter lines both ends share), and every rank of the ring
    /// runs it in the same launch.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub unsafe fn ring_agree(&mut self, ch: *mut ChannelDev, mine: bool, nranks: usize) -> bool {
        let (rc, sc) = (self.recv, self.send);
        let state = core::ptr::addr_of_mut!((*ch).agree);
        if self.tid == 0 {
            let tag = (arch::ld_volatile(state) >> 1) + 1;
            let (post_at, acked) = (word((*sc).tail, AGREE_WORD), word((*sc).head, AGREE_WORD));
            let (read_at, ack) = (word((*rc).tail, AGREE_WORD), word((*rc).head, AGREE_WORD));
            let n = nranks as u64;
            const KNOWN: u64 = 0x7fff_ffff;
            // The word holds the tag's low 32 bits (the ack word holds all of it).
            let word_tag = tag & 0xffff_ffff;
            // Our successor has read our words of the last agreement.
            self.wait(|| arch::ld_acquire_sys(acked) >= tag - 1);
            let post = |known: u64, ok: bool| {
                arch::st_release_sys(post_at, word_tag << 32 | (known & KNOWN) << 1 | ok as u64);
            };
            let (mut ok, mut known) = (mine, if mine { 1 } else { n });
            post(known, ok);
            while ok && known < n {
                let need = known;
                self.wait(|| {
                    let v = arch::ld_acquire_sys(read_at);
                    v >> 32 == word_tag && (v & 1 == 0 || (v >> 1 & KNOWN) >= need)
                });
                let v = arch::ld_volatile(read_at);
                // An abort leaves an older tag: no agreement.
                ok = v >> 32 == word_tag && v & 1 == 1;
                known = match ok {
                    true => core::cmp::min(n, (v >> 1 & KNOWN) + 1),
                    false => n,
                };
                post(known, ok);
            }
            // Done reading our predecessor's words of this agreement.
            arch::st_release_sys(ack, tag);
            arch::st_volatile(state, tag << 1 | ok as u64);
        }
        self.sync();
        arch::ld_volatile(state) & 1 == 1
    }
}

/// Where the receiver's `offer` of a `bytes`-long buffer lies for us, or 0 if it offers
/// nothing or we cannot reach it (through `reach`, an entry of the allocation it names).
#[cfg_attr(target_arch = "nvptx64", inline(always))]
unsafe fn reach_offer(reach: u64, offer: Offer, bytes: u64) -> u64 {
    if offer.addr == 0 || offer.addr == DIRECT_DECLINE {
        return 0;
    }
    match reach {
        DIRECT_DECLINE | 0 => 0,
        DIRECT_SAME_SPACE => offer.addr,
        table => {
            let t = table as *const RegTable;
            let count = arch::ld_acquire_sys(core::ptr::addr_of!((*t).count));
            let n = core::cmp::min(count as usize, crate::abi::REG_TABLE_ENTRIES);
            let entries: &[RegEntry] =
                core::slice::from_raw_parts(core::ptr::addr_of!((*t).entries).cast(), n);
            RegTable::translate(entries, offer.addr, bytes, offer.key).unwrap_or(0)
        }
    }
}
