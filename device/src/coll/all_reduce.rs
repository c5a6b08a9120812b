//! AllReduce. Ring: per channel slice, a reduce-scatter then an all-gather around the ring,
//! nranks-1 steps each; chunk numbers are ring positions, so chunk `r` is fully reduced at the
//! rank in ring position `r`. Tree: a chain in ring order; each chunk is reduced on its way to
//! ring position 0 and broadcast back down, the two directions pipelined. Across nodes the tree
//! is the double binary tree the host wired ([`dbt`]).

mod dbt;

use super::{align_up, div_ceil, Kernel};
use crate::abi::{
    ConnRecv, ConnSend, TreeDev, DIRECT_OFF, FLAG_RING_DIRECT, FLAG_RING_EXCHANGE,
    FLAG_RING_REGISTERED, FLAG_TREE_EXCHANGE, PROTO_SIMPLE, TREE_MAX_CHILDREN, TREE_REMOTE_PARENT,
};
use crate::ops::{pack_elems, RedOp, Reduced};
use crate::prims::copy::FAN;
use crate::prims::{Dst, Offer, Prims, RingDirect, SimpleFan, Src};
use crate::types::Elem;
pub use dbt::dbt;

/// The chunk (elements per ring step) for a piece of `remaining` elements.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub fn piece_chunk<T>(remaining: usize, nranks: usize, max_chunk: usize) -> usize {
    core::cmp::min(
        max_chunk,
        align_up(div_ceil(remaining, nranks), pack_elems::<T>()),
    )
}

/// # Safety
/// See [`super::run`].
pub unsafe fn ring<T: Elem, O: RedOp<T>, const P: u32>(k: &mut Kernel<T, O, P>) {
    let (nranks, input, output) = (k.nranks, k.input, k.output);
    if nranks == 1 {
        k.local_copy(input.add(k.start), output.add(k.start), k.end - k.start);
        return;
    }
    let ring_ix = k.ring_ix();
    let op = k.op;
    let mut prims = k.prims();
    let max_chunk = k.max_chunk();
    if nranks == 2 && k.args.flags & FLAG_RING_EXCHANGE != 0 {
        // Two ranks (FLAG_RING_EXCHANGE): send our input, add the peer's to it.
        let (mut off, end) = (k.start, k.end);
        while off < end {
            let n = core::cmp::min(end - off, max_chunk);
            let mine = input.add(off);
            prims.send(&op, mine, n, Dst::Fifo);
            prims.recv_reduce_copy(&op, mine, output.add(off), n, Src::Fifo);
            off += n;
        }
        prims.finish();
        return;
    }
    // Registered output buffers (see `Kernel::ring_direct`): the all-gather half writes each
    // finished chunk straight into the successor's output, which passes it on from there. In
    // place, those writes land where the successor's input was: every rank has added its input
    // of a chunk before that chunk is finished.
    //
    // Out of place, the reduce-scatter half goes direct too: the partial sum of chunk c lands
    // in the successor's *output* at chunk c's place, and the successor reads it from there,
    // adds its input and writes the next partial into its own successor's output. Why that
    // place is free, and who writes it when (a rank at ring position p; the predecessor writes
    // our output, the successor reads it back, nobody else touches it):
    // - We receive partials of every chunk but p-1 (whose first partial is our input), each
    //   once per piece, each at its own place: pieces and chunks do not overlap.
    // - The final value of chunk c != p reaches our output[c] later, in the all-gather half,
    //   from the predecessor too. It exists only once every rank added its input to chunk c,
    //   we included: our read of the partial in output[c] precedes our publish of that step
    //   (barrier, then the release of the successor's tail), which precedes, through the
    //   ring's chain of acquires and releases, the step in which the predecessor writes the
    //   final value. So the partial is read before it is overwritten.
    // - Chunk p's last partial lands in output[p], which we then overwrite with the final
    //   value ourselves in the same pass (each element read, then written, by one thread).
    //   Our successor never receives a partial of chunk p (its first send is its input of p),
    //   so the final value we write into its output[p] lands on a free place.
    // - Before our handshake offer the predecessor writes nothing: the offer comes after our
    //   launch, hence after every earlier use of our output in our stream order.
    // In place (input and output overlap), a partial of chunk c would overwrite our input of
    // chunk c before we added it (the predecessor may run up to a FIFO ahead of us), so such a
    // rank does not offer room for partials and its reduce-scatter half keeps the FIFO.
    // The waits and publishes stay those of FIFO steps either way, so both counters advance
    // as before.
    let bytes = k.args.count as usize * core::mem::size_of::<T>();
    let (sb, rb) = (k.args.sendbuff, k.args.recvbuff);
    let apart = sb + bytes as u64 <= rb || rb + bytes as u64 <= sb;
    let direct = k.ring_direct(&mut prims, bytes, true, true, apart);
    let dst = |s: usize| Dst::peer_or_fifo(direct.send_at::<T>(s));
    let to = |s: usize| Dst::peer_or_fifo(direct.partial_at::<T>(s));
    // A partial sum that arrives: in our output already (direct), or in the FIFO.
    let partial = |s: usize| Src::landed_if(direct.recv_partials, output.add(s));
    // A finished chunk that arrives: in our output already (direct), or in the FIFO.
    let arrived = |s: usize| Src::landed_if(direct.recv, output.add(s));
    let mut direct_steps = 0;
    let (mut off, end) = (k.start, k.end);
    while off < end {
        let chunk = piece_chunk::<T>(end - off, nranks, max_chunk);
        let piece = core::cmp::min(end - off, chunk * nranks);
        // Chunk c of this piece: its first element and length (the last ones may be short or empty).
        let span = |c: usize| {
            let s = core::cmp::min(off + c * chunk, off + piece);
            (s, core::cmp::min(chunk, off + piece - s))
        };
        let at = |j: usize| (ring_ix + nranks - j) % nranks;

        // Reduce-scatter: send our part of chunk ring_ix-1, then add ours to what arrives.
        let (s, n) = span(at(1));
        prims.send(&op, input.add(s), n, to(s));
        for j in 2..nranks {
            let (s, n) = span(at(j));
            prims.recv_reduce_send(&op, input.add(s), n, partial(s), to(s));
        }
        // Our chunk is now complete: store it and start it around the ring.
        let (s, n) = span(ring_ix);
        prims.recv_reduce_copy_send(&op, input.add(s), output.add(s), n, partial(s), dst(s));
        // All-gather: forward each finished chunk.
        for j in 1..nranks - 1 {
            let (s, n) = span(at(j));
            prims.recv_copy_send(&op, output.add(s), n, arrived(s), dst(s));
        }
        let (s, n) = span((ring_ix + 1) % nranks);
        prims.recv(&op, output.add(s), n, arrived(s));
        if direct.recv {
            direct_steps += nranks as u64 - 1;
        }
        if direct.recv_partials {
            direct_steps += nranks as u64 - 1;
        }
        off += piece;
    }
    k.count_direct(direct_steps);
    prims.finish();
}

/// Whether the one-node tree starts with the zero-copy handshakes: the launch asks
/// ([`FLAG_RING_DIRECT`], Simple steps) and this channel's slice fills a step of `chunk`
/// elements. Every rank decides alike from the call, so both ends of each connection meet.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
fn tree_direct_on<T, O, const P: u32>(k: &Kernel<T, O, P>, chunk: usize) -> bool {
    P == PROTO_SIMPLE && k.args.flags & FLAG_RING_DIRECT != 0 && k.end - k.start >= chunk
}

/// Named barriers of the tree's two thread groups.
const BAR_UP: u32 = 1;
const BAR_DOWN: u32 = 2;

/// The tree AllReduce on channel `c`'s ring as a chain rooted at its position 0: the sum
/// travels up to the root, which finishes each chunk and sends it back down.
///
/// The root does both in one step per chunk (receive from below, add its input, write its
/// output, send down). Every other rank splits its CTA in two groups that run apart, so the
/// way up and the way down stream at once, as in NCCL's split tree: the first half of the
/// threads sends the partial sums up, the second half stores and passes on what comes down.
/// A group waits only on its own direction, so neither can hold the other up. (One group
/// taking turns up and down tied each chunk's way down to a later chunk's way up.)
///
/// # Safety
/// See [`super::run`]; the host wired `tree_up_send`/`tree_up_recv` for every CTA and
/// launched an even number of threads (whole pairs of warps on GPUs).
pub unsafe fn tree<T: Elem, O: RedOp<T>, const P: u32>(k: &mut Kernel<T, O, P>) {
    let (nranks, input, output) = (k.nranks, k.input, k.output);
    if nranks == 1 {
        k.local_copy(input.add(k.start), output.add(k.start), k.end - k.start);
        return;
    }
    if k.args.tree != 0 {
        return dbt(k);
    }
    if P != PROTO_SIMPLE {
        // The chain's up links have Simple FIFOs only; the host launches LL trees across
        // two nodes alone (`dbt_exchange`).
        crate::arch::trap();
    }
    let pos = k.ring_ix();
    let (root, leaf) = (pos == 0, pos == nranks - 1);
    let cta = crate::arch::block_idx() as usize;
    let a = &k.args;
    let up_send = if root {
        core::ptr::null_mut()
    } else {
        (a.tree_up_send as *mut ConnSend).add(cta)
    };
    let up_recv = if leaf {
        core::ptr::null_mut()
    } else {
        (a.tree_up_recv as *mut ConnRecv).add(cta)
    };
    let ch = &mut *k.ch;
    let down_send: *mut ConnSend = if leaf {
        core::ptr::null_mut()
    } else {
        &mut ch.send
    };
    let down_recv: *mut ConnRecv = if root {
        core::ptr::null_mut()
    } else {
        &mut ch.recv
    };
    let (up_slot, down_slot) = (a.tree_slot_bytes, k.slot_bytes);
    let slot = core::cmp::min(up_slot, down_slot) as usize / core::mem::size_of::<T>();
    let chunk = core::cmp::max(
        pack_elems::<T>(),
        core::cmp::min(a.chunk_elems as usize, slot) / pack_elems::<T>() * pack_elems::<T>(),
    );
    let (op, abort, flags) = (k.op, k.abort_flag, k.args.flags);
    let chunks = Chunks::new(k.start, k.end, chunk);
    let (span, nchunks) = (|c: usize| chunks.span(c), chunks.count());
    // Registered outputs (FLAG_RING_DIRECT; see `tree_direct_on`): a child's partial sums land
    // in its parent's output, the finished chunks in the child's.
    let zero_copy = tree_direct_on(k, chunk);
    let (ch_down_reach, ch_up_reach) = (ch.send_reach, ch.prev_reach);
    let (recv_down_on, recv_up_on) = (ch.recv_direct != 0, ch.send_reach != DIRECT_OFF);
    let o = TreeOffers::of(k);
    let (registered, down_offer, up_offer, bytes) = (o.registered, o.down, o.up, o.bytes);
    // What arrives: in our output already (direct), or in the FIFO.
    let mine = |on: bool, s: usize| Src::landed_if(on, output.add(s));
    if root {
        let mut p = Prims::between(down_send, down_slot, up_recv, up_slot)
            .with_abort(abort)
            .with_flags(flags);
        let (mut down, mut up) = (RingDirect::FIFO, RingDirect::FIFO);
        if zero_copy {
            down = p.ring_handshake(false, ch_down_reach, registered, down_offer, bytes, false);
            up = p.tree_handshake(recv_up_on, DIRECT_OFF, registered, up_offer, bytes);
        }
        for c in 0..nchunks {
            let (s, n) = span(c);
            let (from, to) = (mine(up.recv, s), Dst::peer_or_fifo(down.send_at(s)));
            p.recv_reduce_copy_send(&op, input.add(s), output.add(s), n, from, to);
        }
        k.count_direct(if up.recv { nchunks as u64 } else { 0 });
        p.finish();
        return;
    }
    let nthreads = crate::arch::block_dim() as usize;
    let half = nthreads / 2;
    let tid = crate::arch::thread_idx() as usize;
    // Steps our group received straight into our output (counted by its first thread).
    let direct_steps;
    if tid < half {
        // Up: add our input to what the ranks below sent (the leaf sends its input alone).
        let mut up = Prims::on(up_send, up_recv, up_slot)
            .with_abort(abort)
            .with_flags(flags)
            .group(0, half, BAR_UP);
        let mut to = RingDirect::FIFO;
        if zero_copy {
            let recv_on = !leaf && recv_up_on;
            to = up.tree_handshake(recv_on, ch_up_reach, registered, up_offer, bytes);
        }
        for c in 0..nchunks {
            let (s, n) = span(c);
            // The leaf has no receive connection: it sends its input alone.
            let dst = Dst::peer_or_fifo(to.send_at(s));
            up.recv_reduce_send(&op, input.add(s), n, mine(to.recv, s), dst);
        }
        direct_steps = if to.recv { nchunks as u64 } else { 0 };
        up.finish();
    } else {
        // Down: store the finished chunks and pass them on.
        let mut down = Prims::on(down_send, down_recv, down_slot)
            .with_abort(abort)
            .with_flags(flags)
            .group(half, nthreads - half, BAR_DOWN);
        let mut from = RingDirect::FIFO;
        if zero_copy {
            let reach = if leaf { DIRECT_OFF } else { ch_down_reach };
            from = down.ring_handshake(recv_down_on, reach, registered, down_offer, bytes, false);
        }
        for c in 0..nchunks {
            let (s, n) = span(c);
            // The leaf has no send connection: it only stores.
            let (src, dst) = (mine(from.recv, s), Dst::peer_or_fifo(from.send_at(s)));
            down.recv_copy_send(&op, output.add(s), n, src, dst);
        }
        direct_steps = if from.recv { nchunks as u64 } else { 0 };
        down.finish();
    }
    if zero_copy {
        count_direct_by_halves(k, half, direct_steps);
    }
}

/// Adds the direct steps of a CTA split in two groups to the channel's count, the groups one
/// after the other (a plain add each): `steps` is the calling thread's group's, counted by its
/// first thread. Every thread of the CTA calls it.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
unsafe fn count_direct_by_halves<T, O, const P: u32>(k: &Kernel<T, O, P>, half: usize, steps: u64) {
    let tid = crate::arch::thread_idx() as usize;
    for first in [0, half] {
        crate::arch::sync_threads();
        if tid == first && steps > 0 {
            (*k.ch).direct_steps += steps;
        }
    }
}

/// What a tree AllReduce's zero-copy handshakes offer and take ([`FLAG_RING_DIRECT`] launches):
/// whether this rank's output is registered ([`FLAG_RING_REGISTERED`]), the offer of our
/// output to a child's partial sums (`up`: only where the output lies apart from the input,
/// else a partial sum would land on an input not yet added, as in [`ring`]) and to the
/// parent's results (`down`: always), and the buffers' length.
struct TreeOffers {
    registered: bool,
    up: Offer,
    down: Offer,
    bytes: u64,
}

impl TreeOffers {
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn of<T, O, const P: u32>(k: &Kernel<T, O, P>) -> TreeOffers {
        let a = &k.args;
        let (recvbuff, bytes) = (a.recvbuff, a.count * core::mem::size_of::<T>() as u64);
        let apart = a.sendbuff + bytes <= recvbuff || recvbuff + bytes <= a.sendbuff;
        let output = Offer {
            addr: recvbuff,
            key: a.offer_key,
        };
        TreeOffers {
            registered: a.flags & FLAG_RING_REGISTERED != 0,
            up: if apart { output } else { Offer::DECLINE },
            down: output,
            bytes,
        }
    }
}

/// A CTA's elements `start..end` cut into chunks of `chunk`, the last one short.
#[derive(Clone, Copy)]
struct Chunks {
    start: usize,
    end: usize,
    chunk: usize,
}

impl Chunks {
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn new(start: usize, end: usize, chunk: usize) -> Chunks {
        Chunks { start, end, chunk }
    }

    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn count(&self) -> usize {
        div_ceil(self.end - self.start, self.chunk)
    }

    /// Chunk `c`'s first element and length.
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn span(&self, c: usize) -> (usize, usize) {
        let s = self.start + c * self.chunk;
        (s, core::cmp::min(self.chunk, self.end - s))
    }
}

/// Elements per step of a tree across nodes: the host's chunk, within one of its FIFO slots
/// (`slot` bytes), in whole packs.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
fn tree_chunk<T>(chunk_elems: u32, slot: u32) -> usize {
    let pe = pack_elems::<T>();
    let fits = core::cmp::min(
        chunk_elems as usize,
        slot as usize / core::mem::size_of::<T>(),
    );
    core::cmp::max(pe, fits / pe * pe)
}

/// Chunks a head's first steps run ahead of its second ([`dbt_exchange`]): fewer than the
/// FIFO's `NCCL_STEPS` slots, so the other head always has room for them.
const EXCHANGE_AHEAD: usize = 2;

/// `reach` for the first of [`FAN`] connections, the others off.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
fn only_reach(reach: u64) -> [u64; FAN] {
    core::array::from_fn(|i| if i == 0 { reach } else { DIRECT_OFF })
}

/// `p` alone among [`FAN`] connections.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
fn only<C>(p: *mut C) -> [*mut C; FAN] {
    let mut a = [core::ptr::null_mut(); FAN];
    a[0] = p;
    a
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_split_into_nranks_chunks() {
        assert_eq!(piece_chunk::<f32>(10, 4, 1 << 20), 4);
        assert_eq!(piece_chunk::<f32>(1 << 20, 4, 1024), 1024);
        assert_eq!(piece_chunk::<u8>(1, 8, 1 << 20), 16);
    }
}
