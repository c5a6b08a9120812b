//! The tree AllReduce across nodes: the double binary tree the host wired, a CTA per place in
//! one of its two trees ([`dbt`]).

use super::*;
use crate::prims::copy::Move;

/// The tree AllReduce across nodes: CTA `c` takes its place in the tree the host wired for it
/// ([`crate::abi::CollArgs::tree`]: one of the double binary tree's two, a chain inside each
/// node), with a parent (none at the root) and up to [`TREE_MAX_CHILDREN`] children. Up: add
/// every child's partial sum to our input and send the sum to the parent; down: store what
/// the parent sends and pass it to every child. As in [`super::tree`], the root does both in one
/// group and every other rank splits its CTA so that both directions stream at once.
///
/// Each direction is one step per chunk over all of its peers ([`SimpleFan`]): the way up
/// reduces every child's slot and our input in one pass and writes the parent's slot; the
/// way down reads the parent's slot once and writes our output and every child's slot; the
/// root reduces its children's slots with its input and writes its output and their slots.
///
/// # Safety
/// See [`crate::coll::run`]; `args.tree` holds a [`TreeDev`] for every CTA whose connections have
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
            p.recv_reduce_copy_send(&op, input.add(s), output.add(s), s, n);
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
            up.recv_reduce_send(&op, input.add(s), s, n);
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
            down.recv_copy_send(&op, out, s, n);
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
/// in two thread groups as in [`super::tree`]); at the top, the two heads trade their nodes' sums over
/// the network and each adds the other's to its own. Every CTA has at most one peer each way,
/// so the steps are plain [`Prims`] ones in the launch's protocol `P` (Simple or LL).
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
    let prims = |send: u64, recv: *mut ConnRecv| {
        Prims::between(send as *mut ConnSend, slot, recv, slot)
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
    // What arrives: in our output already (direct), or in the FIFO.
    let mine = |on: bool, s: usize| Src::landed_if(on, output.add(s));
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
                // Without a child (no receive connection), our input alone.
                let (src, dst, from) = (input.add(s), output.add(s), mine(from.recv, s));
                up.recv_reduce_keep_send(&op, src, dst, n, from, Dst::Fifo);
            }
            if c >= EXCHANGE_AHEAD {
                // The other node's sum plus ours: the result, stored and passed down.
                let (s, n) = span(c - EXCHANGE_AHEAD);
                // Without a child (no send connection), stored only.
                let (ours, dst) = (output.add(s), Dst::peer_or_fifo(to.send_at(s)));
                down.recv_reduce_copy_send(&summed, ours, ours, n, Src::Fifo, dst);
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
            // Without a child (no receive connection), our input alone.
            let dst = Dst::peer_or_fifo(to.send_at(s));
            up.recv_reduce_send(&op, input.add(s), n, mine(to.recv, s), dst);
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
            // Without a child (no send connection), stored only.
            let (src, dst) = (mine(from.recv, s), Dst::peer_or_fifo(from.send_at(s)));
            down.recv_copy_send(&op, output.add(s), n, src, dst);
        }
        direct = from.recv;
        down.finish();
    }
    if zero_copy {
        count_direct_by_halves(k, half, if direct { nchunks as u64 } else { 0 });
    }
}

/// [`dbt`] in a protocol other than Simple (LL): the same tree, with one peer per step, so
/// that the launch's protocol serves every step ([`Prims`] prims in protocol `P`). A rank
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
    let summed = Reduced(op);
    let null_send = core::ptr::null_mut::<ConnSend>();
    let null_recv = core::ptr::null_mut::<ConnRecv>();
    let child_recv = |i: usize| t.up_recv[i] as *mut ConnRecv;
    let child_send = |i: usize| t.down_send[i] as *mut ConnSend;
    let prims = |send: *mut ConnSend, recv: *mut ConnRecv| {
        Prims::between(send, slot, recv, slot)
            .with_proto(P)
            .with_abort(abort)
            .with_flags(flags)
    };
    // Up step `i` receives child `i`'s sum; the last one sends to `last_to` (the parent, or
    // for the root its first child, with the result).
    let ups = |last_to: *mut ConnSend| -> [Prims; TREE_MAX_CHILDREN] {
        core::array::from_fn(|i| match i + 1 == nc {
            true => prims(last_to, child_recv(i)),
            false if i < nc => prims(null_send, child_recv(i)),
            false => prims(null_send, null_recv),
        })
    };
    // Down: child `j` >= 1 gets the result from our output.
    let fans = || -> [Prims; TREE_MAX_CHILDREN] {
        core::array::from_fn(|j| match j >= 1 && j < nc {
            true => prims(child_send(j), null_recv),
            false => prims(null_send, null_recv),
        })
    };
    // Child `i`'s sum added to our input (first) or to the partial sum in our output.
    // Child `i`'s sum added to our input (the first) or to the partial sum in our output.
    // Earlier children's steps keep the partial sum in our output (a recv_reduce_keep); the
    // last one's sends it (a recv_reduce_send), the root's the result, also stored (a
    // recv_reduce_copy_send). The engine is called directly: the three shapes as data, so
    // that each of the two operators inlines it once, not three times.
    let add_child = |p: &mut Prims, i: usize, s: usize, n: usize, last: bool| {
        let mv = Move {
            input: if i == 0 { input.add(s) } else { output.add(s) },
            output: if last && !root {
                core::ptr::null_mut()
            } else {
                output.add(s)
            },
            post: root && last,
            ..Move::none()
        };
        // Only the last child's Prims has a send connection.
        if i == 0 {
            p.step(&op, mv, n, Some(Src::Fifo), Some(Dst::Fifo));
        } else {
            p.step(&summed, mv, n, Some(Src::Fifo), Some(Dst::Fifo));
        }
    };
    let pass_on = |p: &mut Prims, s: usize, n: usize| {
        p.send(&summed, output.add(s), n, Dst::Fifo);
    };
    if root {
        let mut up = ups(child_send(0));
        let mut down = fans();
        for c in 0..nchunks {
            let (s, n) = span(c);
            for (i, p) in up.iter_mut().enumerate().take(nc) {
                add_child(p, i, s, n, i + 1 == nc);
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
                up.send(&op, input.add(s), n, Dst::Fifo);
            }
            up.finish();
            return;
        }
        let mut up = ups(parent_send).map(|p| p.group(0, half, BAR_UP));
        for c in 0..nchunks {
            let (s, n) = span(c);
            for (i, p) in up.iter_mut().enumerate().take(nc) {
                add_child(p, i, s, n, i + 1 == nc);
            }
        }
        up.into_iter().for_each(|p| p.finish());
    } else {
        let first = if nc > 0 { child_send(0) } else { null_send };
        let group = |p: Prims| p.group(half, nthreads - half, BAR_DOWN);
        let mut down = group(prims(first, t.down_recv as *mut ConnRecv));
        let mut rest = fans().map(group);
        for c in 0..nchunks {
            let (s, n) = span(c);
            // A leaf (no send connection) only stores.
            down.recv_copy_send(&op, output.add(s), n, Src::Fifo, Dst::Fifo);
            for p in rest.iter_mut().take(nc).skip(1) {
                pass_on(p, s, n);
            }
        }
        down.finish();
        rest.into_iter().for_each(|p| p.finish());
    }
}
