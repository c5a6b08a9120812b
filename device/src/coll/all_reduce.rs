//! AllReduce. Ring: per channel slice, a reduce-scatter then an all-gather around the ring,
//! nranks-1 steps each; chunk numbers are ring positions, so chunk `r` is fully reduced at the
//! rank in ring position `r`. Tree: a chain in ring order; each chunk is reduced on its way to
//! ring position 0 and broadcast back down, the two directions pipelined. Across nodes the tree
//! is the double binary tree the host wired ([`dbt`]).

use super::{align_up, div_ceil, Kernel};
use crate::abi::{
    ConnRecv, ConnSend, TreeDev, DIRECT_DECLINE, DIRECT_OFF, FLAG_RING_DIRECT, FLAG_RING_EXCHANGE,
    FLAG_RING_REGISTERED, FLAG_TREE_EXCHANGE, PROTO_SIMPLE, TREE_MAX_CHILDREN, TREE_REMOTE_PARENT,
};
use crate::ops::{pack_elems, RedOp, Reduced};
use crate::prims::copy::{Move, FAN};
use crate::prims::{RingDirect, Simple, SimpleFan};
use crate::types::Elem;

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
    let none = Move::<T>::none();
    if nranks == 2 && k.args.flags & FLAG_RING_EXCHANGE != 0 {
        // Two ranks (FLAG_RING_EXCHANGE): send our input, add the peer's to it.
        let (mut off, end) = (k.start, k.end);
        while off < end {
            let n = core::cmp::min(end - off, max_chunk);
            let mine = input.add(off);
            prims.step(
                &op,
                false,
                true,
                Move {
                    input: mine,
                    ..none
                },
                n,
            );
            let mv = Move {
                input: mine,
                output: output.add(off),
                post: true,
                ..none
            };
            prims.step(&op, true, false, mv, n);
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
    let dst = |s: usize| direct.send_at::<T>(s);
    let to = |s: usize| direct.partial_at::<T>(s);
    // A partial sum that arrived: in our output already (direct), or in the FIFO (the step
    // fills in the slot).
    let partial = |s: usize| {
        if direct.recv_partials {
            output.add(s) as *const T
        } else {
            core::ptr::null()
        }
    };
    // A finished chunk that arrived: in our output already (direct), or in the FIFO.
    let arrived = |s: usize| {
        if direct.recv {
            Move {
                recv: output.add(s),
                ..none
            }
        } else {
            Move {
                output: output.add(s),
                ..none
            }
        }
    };
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
        prims.step_to(
            &op,
            false,
            true,
            Move {
                input: input.add(s),
                ..none
            },
            n,
            false,
            to(s),
        );
        for j in 2..nranks {
            let (s, n) = span(at(j));
            prims.step_to(
                &op,
                true,
                true,
                Move {
                    recv: partial(s),
                    input: input.add(s),
                    ..none
                },
                n,
                direct.recv_partials,
                to(s),
            );
        }
        // Our chunk is now complete: store it and start it around the ring.
        let (s, n) = span(ring_ix);
        prims.step_to(
            &op,
            true,
            true,
            Move {
                recv: partial(s),
                input: input.add(s),
                output: output.add(s),
                post: true,
                ..none
            },
            n,
            direct.recv_partials,
            dst(s),
        );
        // All-gather: forward each finished chunk.
        for j in 1..nranks - 1 {
            let (s, n) = span(at(j));
            prims.step_to(&op, true, true, arrived(s), n, direct.recv, dst(s));
        }
        let (s, n) = span((ring_ix + 1) % nranks);
        prims.step_to(
            &op,
            true,
            false,
            arrived(s),
            n,
            direct.recv,
            core::ptr::null_mut(),
        );
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
    let none = Move::<T>::none();
    let chunks = Chunks::new(k.start, k.end, chunk);
    let (span, nchunks) = (|c: usize| chunks.span(c), chunks.count());
    // Registered outputs (FLAG_RING_DIRECT; see `tree_direct_on`): a child's partial sums land
    // in its parent's output, the finished chunks in the child's.
    let zero_copy = tree_direct_on(k, chunk);
    let (ch_down_reach, ch_up_reach) = (ch.send_reach, ch.prev_reach);
    let (recv_down_on, recv_up_on) = (ch.recv_direct != 0, ch.send_reach != DIRECT_OFF);
    let o = TreeOffers::of(k);
    let (registered, recvbuff, up_offer, bytes) = (o.registered, o.down, o.up, o.bytes);
    // Where data already in our output sits (direct), else null: the step reads the FIFO.
    let mine = |on: bool, s: usize| match on {
        true => output.add(s) as *const T,
        false => core::ptr::null(),
    };
    if root {
        let mut p = Simple::between(down_send, down_slot, up_recv, up_slot)
            .with_abort(abort)
            .with_flags(flags);
        let (mut down, mut up) = (RingDirect::FIFO, RingDirect::FIFO);
        if zero_copy {
            down = p.ring_handshake(false, ch_down_reach, registered, recvbuff, bytes, false);
            up = p.tree_handshake(recv_up_on, DIRECT_OFF, registered, up_offer, bytes);
        }
        for c in 0..nchunks {
            let (s, n) = span(c);
            let mv = Move {
                recv: mine(up.recv, s),
                input: input.add(s),
                output: output.add(s),
                post: true,
                ..none
            };
            p.step_to(&op, true, true, mv, n, up.recv, down.send_at(s));
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
        let mut up = Simple::on(up_send, up_recv, up_slot)
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
            let mv = Move {
                recv: mine(to.recv, s),
                input: input.add(s),
                ..none
            };
            up.step_to(&op, !leaf, true, mv, n, to.recv, to.send_at(s));
        }
        direct_steps = if to.recv { nchunks as u64 } else { 0 };
        up.finish();
    } else {
        // Down: store the finished chunks and pass them on.
        let mut down = Simple::on(down_send, down_recv, down_slot)
            .with_abort(abort)
            .with_flags(flags)
            .group(half, nthreads - half, BAR_DOWN);
        let mut from = RingDirect::FIFO;
        if zero_copy {
            let reach = if leaf { DIRECT_OFF } else { ch_down_reach };
            from = down.ring_handshake(recv_down_on, reach, registered, recvbuff, bytes, false);
        }
        for c in 0..nchunks {
            let (s, n) = span(c);
            let mv = way_down(from.recv, output.add(s));
            down.step_to(&op, true, !leaf, mv, n, from.recv, from.send_at(s));
        }
        direct_steps = if from.recv { nchunks as u64 } else { 0 };
        down.finish();
    }
    if zero_copy {
        count_direct_by_halves(k, half, direct_steps);
    }
}

/// A step of a tree's way down at `at` in our output: what landed there already (`landed`,
/// direct) is passed on from there; else what comes through the FIFO is stored there.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
fn way_down<T: Elem>(landed: bool, at: *mut T) -> Move<T> {
    match landed {
        true => Move {
            recv: at,
            ..Move::none()
        },
        false => Move {
            output: at,
            ..Move::none()
        },
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
    up: u64,
    down: u64,
    bytes: u64,
}

impl TreeOffers {
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    fn of<T, O, const P: u32>(k: &Kernel<T, O, P>) -> TreeOffers {
        let a = &k.args;
        let (recvbuff, bytes) = (a.recvbuff, a.count * core::mem::size_of::<T>() as u64);
        let apart = a.sendbuff + bytes <= recvbuff || recvbuff + bytes <= a.sendbuff;
        TreeOffers {
            registered: a.flags & FLAG_RING_REGISTERED != 0,
            up: if apart { recvbuff } else { DIRECT_DECLINE },
            down: recvbuff,
            bytes,
        }
    }
}

/// The tree AllReduce across nodes: CTA `c` takes its place in the tree the host wired for it
/// ([`crate::abi::CollArgs::tree`]: one of the double binary tree's two, a chain inside each
/// node), with a parent (none at the root) and up to [`TREE_MAX_CHILDREN`] children. Up: add
/// every child's partial sum to our input and send the sum to the parent; down: store what
/// the parent sends and pass it to every child. As in [`tree`], the root does both in one
/// group and every other rank splits its CTA so that both directions stream at once.
///
/// Each direction is one step per chunk over all of its peers ([`SimpleFan`]): the way up
/// reduces every child's slot and our input in one pass and writes the parent's slot; the
/// way down reads the parent's slot once and writes our output and every child's slot; the
/// root reduces its children's slots with its input and writes its output and their slots.
///
/// # Safety
/// See [`super::run`]; `args.tree` holds a [`TreeDev`] for every CTA whose connections have
/// FIFO slots of `args.tree_slot_bytes`, and the CTA has an even number of threads.
pub unsafe fn dbt<T: Elem, O: RedOp<T>, const P: u32>(k: &mut Kernel<T, O, P>) {
    let (input, output) = (k.input, k.output);
    let cta = crate::arch::block_idx() as usize;
    let t: TreeDev = *(k.args.tree as *const TreeDev).add(cta);
    if k.args.flags & FLAG_TREE_EXCHANGE != 0 {
        return dbt_exchange(k, &t);
    }
    if P != PROTO_SIMPLE {
        // The fan's steps are Simple ones: other protocols take one peer per step.
        return dbt_steps(k, &t);
    }
    let nc = core::cmp::min(t.nchildren as usize, TREE_MAX_CHILDREN);
    let root = t.up_send == 0;
    if root && nc == 0 {
        k.local_copy(input.add(k.start), output.add(k.start), k.end - k.start);
        return;
    }
    let slot = k.args.tree_slot_bytes;
    let chunk = tree_chunk::<T>(k.args.chunk_elems, slot);
    let (op, abort) = (k.op, k.abort_flag);
    let chunks = Chunks::new(k.start, k.end, chunk);
    let (span, nchunks) = (|c: usize| chunks.span(c), chunks.count());
    let null_send = core::ptr::null_mut::<ConnSend>();
    let null_recv = core::ptr::null_mut::<ConnRecv>();
    // The children's connections (null past the last child), the parent's alone.
    let children_recv: [*mut ConnRecv; FAN] = core::array::from_fn(|i| match i < nc {
        true => t.up_recv[i] as *mut ConnRecv,
        false => null_recv,
    });
    let children_send: [*mut ConnSend; FAN] = core::array::from_fn(|i| match i < nc {
        true => t.down_send[i] as *mut ConnSend,
        false => null_send,
    });
    let null = core::ptr::null_mut::<T>();
    // Registered outputs (see `tree_direct_on`): on the links inside our node (p2p, the
    // chain's), a child's partial sums land in our output and the results in the child's.
    let zero_copy = tree_direct_on(k, chunk);
    let o = TreeOffers::of(k);
    let child_reach: [u64; FAN] = core::array::from_fn(|i| match i < nc {
        true => t.child_reach[i],
        false => DIRECT_OFF,
    });
    let from_children = child_reach.map(|r| r != DIRECT_OFF);
    if root {
        // One step per chunk: the children's sums and our input in, the result out to our
        // output and back down to every child.
        let mut p = SimpleFan::new(children_recv, children_send, slot).with_abort(abort);
        let mut direct = 0;
        if zero_copy {
            direct = p.tree_handshake(from_children, child_reach, o.registered, o.up, o.bytes);
        }
        for c in 0..nchunks {
            let (s, n) = span(c);
            p.step(&op, input.add(s), output.add(s), true, s, n);
        }
        k.count_direct(direct * nchunks as u64);
        p.finish();
        return;
    }
    let nthreads = crate::arch::block_dim() as usize;
    let half = nthreads / 2;
    let direct;
    if (crate::arch::thread_idx() as usize) < half {
        // Up: our input plus every child's partial sum, to the parent (a leaf sends its input).
        let parent = only(t.up_send as *mut ConnSend);
        let mut up = SimpleFan::new(children_recv, parent, slot)
            .with_abort(abort)
            .group(0, half, BAR_UP);
        direct = match zero_copy {
            true => {
                let to_parent = only_reach(t.parent_reach);
                up.tree_handshake(from_children, to_parent, o.registered, o.up, o.bytes)
            }
            false => 0,
        };
        for c in 0..nchunks {
            let (s, n) = span(c);
            up.step(&op, input.add(s), null, false, s, n);
        }
        up.finish();
    } else {
        // Down: the parent's result into our output and on to every child.
        let parent = only(t.down_recv as *mut ConnRecv);
        let mut down = SimpleFan::new(parent, children_send, slot)
            .with_abort(abort)
            .group(half, nthreads - half, BAR_DOWN);
        direct = match zero_copy {
            true => {
                let from_parent = only_reach(t.parent_reach).map(|r| r != DIRECT_OFF);
                down.tree_handshake(from_parent, child_reach, o.registered, o.down, o.bytes)
            }
            false => 0,
        };
        for c in 0..nchunks {
            let (s, n) = span(c);
            // Landed in our output already (direct): the step reads it there, to pass on.
            let out = if direct > 0 { null } else { output.add(s) };
            down.step(&op, core::ptr::null(), out, false, s, n);
        }
        down.finish();
    }
    if zero_copy {
        count_direct_by_halves(k, half, direct * nchunks as u64);
    }
}

/// The tree AllReduce across two nodes with [`FLAG_TREE_EXCHANGE`]: inside each node a chain
/// down from its head (up: each rank adds its input to what its child sent and passes the sum
/// to its parent; down: each stores what its parent sent and passes it on, the two directions
/// in two thread groups as in [`tree`]); at the top, the two heads trade their nodes' sums over
/// the network and each adds the other's to its own. Every CTA has at most one peer each way,
/// so the steps are plain [`Simple`] ones in the launch's protocol `P` (Simple or LL).
///
/// A head keeps its node's sum in its output between its two steps of a chunk: the first
/// (child's sum plus input) sends it to the other head and stores it, the second reads it back
/// beside what the other head sent, stores the result and passes it down. It reads back a
/// value already through the operator's `pre` ([`Reduced`]). The first steps run
/// [`EXCHANGE_AHEAD`] chunks before the second, so the network carries more than one chunk at
/// a time each way.
///
/// # Safety
/// As [`dbt`]; the host set `t.remote` on both heads of a two-node tree, and the flag on every
/// rank alike.
unsafe fn dbt_exchange<T: Elem, O: RedOp<T>, const P: u32>(k: &mut Kernel<T, O, P>, t: &TreeDev) {
    let (input, output) = (k.input, k.output);
    let slot = k.args.tree_slot_bytes;
    let chunk = tree_chunk::<T>(k.args.chunk_elems, slot);
    let (op, abort, flags) = (k.op, k.abort_flag, k.args.flags);
    let chunks = Chunks::new(k.start, k.end, chunk);
    let (span, nchunks) = (|c: usize| chunks.span(c), chunks.count());
    let nc = core::cmp::min(t.nchildren as usize, TREE_MAX_CHILDREN);
    // The other node's head (heads only), and the one child inside our node (if any).
    let (remote_send, remote_recv, local) = match t.remote {
        0 => (0, 0, (0..nc).next()),
        TREE_REMOTE_PARENT => (t.up_send, t.down_recv, (0..nc).next()),
        r => {
            let i = r as usize - 1;
            (t.down_send[i], t.up_recv[i], (0..nc).find(|&c| c != i))
        }
    };
    let child_recv = local.map_or(0, |i| t.up_recv[i]) as *mut ConnRecv;
    let child_send = local.map_or(0, |i| t.down_send[i]) as *mut ConnSend;
    let has_child = local.is_some();
    let none = Move::<T>::none();
    let prims = |send: u64, recv: *mut ConnRecv| {
        Simple::between(send as *mut ConnSend, slot, recv, slot)
            .with_proto(P)
            .with_abort(abort)
            .with_flags(flags)
    };
    // Registered outputs (see `tree_direct_on`; Simple only): on the chain's links inside our
    // node, our child's partial sums land in our output and the results in the child's. The
    // heads' exchange goes through the network, never direct.
    let zero_copy = tree_direct_on(k, chunk);
    let o = TreeOffers::of(k);
    let child_reach = local.map_or(DIRECT_OFF, |i| t.child_reach[i]);
    let from_child = child_reach != DIRECT_OFF;
    // Where data already in our output sits (direct), else null: the step reads the FIFO.
    let mine = |on: bool, s: usize| match on {
        true => output.add(s) as *const T,
        false => core::ptr::null(),
    };
    if t.remote != 0 {
        let mut up = prims(remote_send, child_recv);
        let mut down = prims(child_send as u64, remote_recv as *mut ConnRecv);
        let (mut from, mut to) = (RingDirect::FIFO, RingDirect::FIFO);
        if zero_copy {
            from = up.tree_handshake(from_child, DIRECT_OFF, o.registered, o.up, o.bytes);
            to = down.tree_handshake(false, child_reach, o.registered, o.down, o.bytes);
        }
        let summed = Reduced(op);
        for c in 0..nchunks + EXCHANGE_AHEAD {
            if c < nchunks {
                // Our node's sum: to the other head, and kept in our output.
                let (s, n) = span(c);
                let mv = Move {
                    recv: mine(from.recv, s),
                    input: input.add(s),
                    output: output.add(s),
                    ..none
                };
                up.step_to(
                    &op,
                    has_child,
                    true,
                    mv,
                    n,
                    from.recv,
                    core::ptr::null_mut(),
                );
            }
            if c >= EXCHANGE_AHEAD {
                // The other node's sum plus ours: the result, stored and passed down.
                let (s, n) = span(c - EXCHANGE_AHEAD);
                let mv = Move {
                    input: output.add(s),
                    output: output.add(s),
                    post: true,
                    ..none
                };
                down.step_to(&summed, true, has_child, mv, n, false, to.send_at(s));
            }
        }
        k.count_direct(if from.recv { nchunks as u64 } else { 0 });
        up.finish();
        down.finish();
        return;
    }
    let nthreads = crate::arch::block_dim() as usize;
    let half = nthreads / 2;
    let direct;
    if (crate::arch::thread_idx() as usize) < half {
        // Up: our input plus our child's sum, to our parent.
        let mut up = prims(t.up_send, child_recv).group(0, half, BAR_UP);
        let mut to = RingDirect::FIFO;
        if zero_copy {
            to = up.tree_handshake(from_child, t.parent_reach, o.registered, o.up, o.bytes);
        }
        for c in 0..nchunks {
            let (s, n) = span(c);
            let mv = Move {
                recv: mine(to.recv, s),
                input: input.add(s),
                ..none
            };
            up.step_to(&op, has_child, true, mv, n, to.recv, to.send_at(s));
        }
        direct = to.recv;
        up.finish();
    } else {
        // Down: the result from our parent into our output and on to our child.
        let mut down = prims(child_send as u64, t.down_recv as *mut ConnRecv).group(
            half,
            nthreads - half,
            BAR_DOWN,
        );
        let mut from = RingDirect::FIFO;
        if zero_copy {
            let from_parent = t.parent_reach != DIRECT_OFF;
            from = down.tree_handshake(from_parent, child_reach, o.registered, o.down, o.bytes);
        }
        for c in 0..nchunks {
            let (s, n) = span(c);
            let mv = way_down(from.recv, output.add(s));
            down.step_to(&op, true, has_child, mv, n, from.recv, from.send_at(s));
        }
        direct = from.recv;
        down.finish();
    }
    if zero_copy {
        count_direct_by_halves(k, half, if direct { nchunks as u64 } else { 0 });
    }
}

/// [`dbt`] in a protocol other than Simple (LL): the same tree, with one peer per step, so
/// that the launch's protocol serves every step ([`Simple`] prims in protocol `P`). A rank
/// with `c` children takes `c` steps up a chunk and `c` down where the fan takes one of each.
/// Up, the children's sums are added one per step, the partial sum kept in our output between
/// two steps and read back through [`Reduced`] (its `pre` already applied); the last step
/// sends the sum to the parent (the root applies `post` there and stores the result). Down,
/// the parent's result lands in our output and goes on to the first child in one step, then
/// from our output to each other child.
///
/// The output is free for the partial sums: a chunk's final value reaches it only after our
/// last up step of that chunk sent the sum (through the parent's release and our acquire of
/// its step), and in place the first up step reads each input element before the same thread
/// writes it. Each step reads back only what the group's previous step wrote, after that
/// step's closing barrier (every receiving step ends in one) or the sending step's opening one.
///
/// # Safety
/// As [`dbt`]; the tree's connections inside the node have FIFOs of protocol `P`
/// (`Links::with_ll` on the host), network connections carry every protocol.
unsafe fn dbt_steps<T: Elem, O: RedOp<T>, const P: u32>(k: &mut Kernel<T, O, P>, t: &TreeDev) {
    let (input, output) = (k.input, k.output);
    let nc = core::cmp::min(t.nchildren as usize, TREE_MAX_CHILDREN);
    let root = t.up_send == 0;
    if root && nc == 0 {
        k.local_copy(input.add(k.start), output.add(k.start), k.end - k.start);
        return;
    }
    let slot = k.args.tree_slot_bytes;
    let chunk = tree_chunk::<T>(k.args.chunk_elems, slot);
    let (op, abort, flags) = (k.op, k.abort_flag, k.args.flags);
    let chunks = Chunks::new(k.start, k.end, chunk);
    let (span, nchunks) = (|c: usize| chunks.span(c), chunks.count());
    let none = Move::<T>::none();
    let summed = Reduced(op);
    let null_send = core::ptr::null_mut::<ConnSend>();
    let null_recv = core::ptr::null_mut::<ConnRecv>();
    let child_recv = |i: usize| t.up_recv[i] as *mut ConnRecv;
    let child_send = |i: usize| t.down_send[i] as *mut ConnSend;
    let prims = |send: *mut ConnSend, recv: *mut ConnRecv| {
        Simple::between(send, slot, recv, slot)
            .with_proto(P)
            .with_abort(abort)
            .with_flags(flags)
    };
    // Up step `i` receives child `i`'s sum; the last one sends to `last_to` (the parent, or
    // for the root its first child, with the result).
    let ups = |last_to: *mut ConnSend| -> [Simple; TREE_MAX_CHILDREN] {
        core::array::from_fn(|i| match i + 1 == nc {
            true => prims(last_to, child_recv(i)),
            false if i < nc => prims(null_send, child_recv(i)),
            false => prims(null_send, null_recv),
        })
    };
    // Down: child `j` >= 1 gets the result from our output.
    let fans = || -> [Simple; TREE_MAX_CHILDREN] {
        core::array::from_fn(|j| match j >= 1 && j < nc {
            true => prims(child_send(j), null_recv),
            false => prims(null_send, null_recv),
        })
    };
    // Child `i`'s sum added to our input (first) or to the partial sum in our output.
    let add_child = |p: &mut Simple, i: usize, s: usize, n: usize, send: bool, last: bool| {
        let keep = !send || root;
        let mv = Move {
            input: if i == 0 { input.add(s) } else { output.add(s) },
            output: if keep {
                output.add(s)
            } else {
                core::ptr::null_mut()
            },
            post: root && last,
            ..none
        };
        if i == 0 {
            p.step(&op, true, send, mv, n);
        } else {
            p.step(&summed, true, send, mv, n);
        }
    };
    let pass_on = |p: &mut Simple, s: usize, n: usize| {
        let mv = Move {
            input: output.add(s),
            ..none
        };
        p.step(&summed, false, true, mv, n);
    };
    if root {
        let mut up = ups(child_send(0));
        let mut down = fans();
        for c in 0..nchunks {
            let (s, n) = span(c);
            for (i, p) in up.iter_mut().enumerate().take(nc) {
                add_child(p, i, s, n, i + 1 == nc, i + 1 == nc);
            }
            for p in down.iter_mut().take(nc).skip(1) {
                pass_on(p, s, n);
            }
        }
        up.into_iter().for_each(|p| p.finish());
        down.into_iter().for_each(|p| p.finish());
        return;
    }
    let nthreads = crate::arch::block_dim() as usize;
    let half = nthreads / 2;
    let parent_send = t.up_send as *mut ConnSend;
    if (crate::arch::thread_idx() as usize) < half {
        if nc == 0 {
            // A leaf sends its input.
            let mut up = prims(parent_send, null_recv).group(0, half, BAR_UP);
            for c in 0..nchunks {
                let (s, n) = span(c);
                let mv = Move {
                    input: input.add(s),
                    ..none
                };
                up.step(&op, false, true, mv, n);
            }
            up.finish();
            return;
        }
        let mut up = ups(parent_send).map(|p| p.group(0, half, BAR_UP));
        for c in 0..nchunks {
            let (s, n) = span(c);
            for (i, p) in up.iter_mut().enumerate().take(nc) {
                add_child(p, i, s, n, i + 1 == nc, false);
            }
        }
        up.into_iter().for_each(|p| p.finish());
    } else {
        let first = if nc > 0 { child_send(0) } else { null_send };
        let group = |p: Simple| p.group(half, nthreads - half, BAR_DOWN);
        let mut down = group(prims(first, t.down_recv as *mut ConnRecv));
        let mut rest = fans().map(group);
        for c in 0..nchunks {
            let (s, n) = span(c);
            let mv = Move {
                output: output.add(s),
                ..none
            };
            down.step(&op, true, nc > 0, mv, n);
            for p in rest.iter_mut().take(nc).skip(1) {
                pass_on(p, s, n);
            }
        }
        down.finish();
        rest.into_iter().for_each(|p| p.finish());
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
