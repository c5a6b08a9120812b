//! Registered send/recv rounds, shared by the simulator and GPU suites: every rank sends to
//! its successor and receives from its predecessor between buffers that some ranks registered,
//! and each connection's step counter tells which path a message took.

use super::{lend, Rng};
use nccl::{Comm, DataType};
use nccl_device::abi::Coll;

/// Which ranks register their buffers in a round.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Who {
    All,
    None,
    /// Even ranks register, odd ones do not: every message has one registered end.
    Even,
}

impl Who {
    pub fn registers(self, rank: usize) -> bool {
        match self {
            Who::All => true,
            Who::None => false,
            Who::Even => rank.is_multiple_of(2),
        }
    }
}

/// Bytes rank `from` sends to `from + 1`: over the FIFO's size, odd, different per rank.
pub fn ring_bytes(from: usize, base: usize) -> usize {
    base + 4 * 37 * from + 12
}

/// The bytes rank `from` sends in round `seed`: random, the same in every process.
fn ring_data(from: usize, base: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed.wrapping_mul(1000) + from as u64);
    (0..ring_bytes(from, base))
        .map(|_| rng.next() as u8)
        .collect()
}

/// One round over the communicators of this process (every rank of the job, or some: the
/// others run the same round in their processes): every rank sends to its successor and
/// receives from its predecessor in one group (random bytes, a poisoned receive buffer at an
/// offset inside a larger registered allocation). Checks the bytes and returns, per
/// communicator, how many steps its send connections advanced.
pub fn ring_round(comms: &[Comm], who: Who, base: usize, seed: u64) -> Vec<u64> {
    let n = comms[0].count();
    let streams: Vec<_> = comms
        .iter()
        .map(|c| c.device().stream_create().unwrap())
        .collect();
    // Buffers sit 256 bytes into their allocation, which is what gets registered.
    const LEAD: usize = 256;
    let mut sends = Vec::new();
    let mut recvs = Vec::new();
    let mut regs = Vec::new();
    for (i, c) in comms.iter().enumerate() {
        let r = c.rank();
        let out_bytes = ring_bytes(r, base);
        let in_bytes = ring_bytes((r + n - 1) % n, base);
        let s = c.device().alloc(LEAD + out_bytes).unwrap();
        s.write(LEAD, &ring_data(r, base, seed)).unwrap();
        let rb = c.device().alloc(LEAD + in_bytes + LEAD).unwrap();
        rb.write(0, &vec![0xA5; LEAD + in_bytes + LEAD]).unwrap();
        if who.registers(r) {
            // SAFETY: both buffers outlive their registrations (deregistered below).
            unsafe {
                regs.push((i, c.register_raw(s.ptr(), LEAD + out_bytes).unwrap()));
                regs.push((i, c.register_raw(rb.ptr(), LEAD + in_bytes + LEAD).unwrap()));
            }
        }
        sends.push(s);
        recvs.push(rb);
    }
    let before: Vec<u64> = comms.iter().map(send_steps).collect();
    let lent = lend(comms);
    nccl::group_start();
    for (i, c) in lent.iter().enumerate() {
        let r = c.rank();
        let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
        // SAFETY: the buffers hold these byte counts from LEAD on and live until the sync.
        unsafe {
            c.send_raw(
                sends[i].ptr() + LEAD as u64,
                ring_bytes(r, base),
                DataType::Uint8,
                next,
                streams[i],
            )
            .unwrap();
            c.recv_raw(
                recvs[i].ptr() + LEAD as u64,
                ring_bytes(prev, base),
                DataType::Uint8,
                prev,
                streams[i],
            )
            .unwrap();
        }
    }
    nccl::group_end().unwrap();
    for (i, c) in comms.iter().enumerate() {
        c.device().stream_sync(streams[i]).unwrap();
        let r = c.rank();
        let prev = (r + n - 1) % n;
        let want = ring_data(prev, base, seed);
        let len = want.len();
        let mut got = vec![0u8; LEAD + len + LEAD];
        recvs[i].read(0, &mut got).unwrap();
        assert!(
            got[..LEAD]
                .iter()
                .chain(&got[LEAD + len..])
                .all(|&b| b == 0xA5),
            "{n} ranks, {who:?}: rank {r} has bytes written outside its receive buffer"
        );
        if let Some(k) = (0..len).find(|&k| got[LEAD + k] != want[k]) {
            panic!(
                "{n} ranks, {who:?}, {len} bytes: rank {r}'s byte {k} from rank {prev} is wrong"
            );
        }
    }
    for (i, h) in regs {
        comms[i].deregister(h).unwrap();
    }
    for (c, s) in comms.iter().zip(streams) {
        c.device().stream_destroy(s).unwrap();
    }
    comms
        .iter()
        .zip(before)
        .map(|(c, b)| send_steps(c) - b)
        .collect()
}

/// The steps of rank `c`'s send connections to its successor, summed.
pub fn send_steps(c: &Comm) -> u64 {
    c.p2p_steps((c.rank() + 1) % c.count(), true)
        .unwrap()
        .map_or(0, |v| v.iter().sum())
}

/// Steps a message of `bytes` takes over `conns` connections of `slot`-byte FIFO slots: per
/// part (as `enqueue::p2p::part` cuts them), one when it goes direct (`direct` and the part fills
/// its FIFO of 8 slots), else one per slot (at least one).
pub fn expected_steps(bytes: usize, conns: usize, slot: usize, direct: bool) -> u64 {
    let per = bytes.div_ceil(conns).next_multiple_of(16);
    (0..conns)
        .map(|c| {
            let s = (c * per).min(bytes);
            let len = (s + per).min(bytes) - s;
            if direct && len >= 8 * slot {
                1
            } else {
                len.div_ceil(slot).max(1) as u64
            }
        })
        .sum()
}

/// Checks a round's steps (from [`ring_round`]): the direct path exactly where both ends of a
/// message registered.
pub fn check_steps(comms: &[Comm], who: Who, base: usize, steps: &[u64]) {
    let n = comms[0].count();
    let slot = comms[0].shape().p2p_slot_bytes as usize;
    for (c, &s) in comms.iter().zip(steps) {
        let r = c.rank();
        let conns = c
            .p2p_steps((r + 1) % n, true)
            .unwrap()
            .map_or(1, |v| v.len());
        let bytes = ring_bytes(r, base);
        let both = who.registers(r) && who.registers((r + 1) % n);
        let want = expected_steps(bytes, conns, slot, both);
        assert_eq!(
            s,
            want,
            "{n} ranks, {who:?}, {bytes} bytes: rank {r}'s send to {} took {s} steps",
            (r + 1) % n
        );
    }
}

/// Bytes around each collective's output that must stay as poisoned.
const LEAD: usize = 256;

/// The block rank `r` contributes to round `seed` (`bytes` random bytes, alike in every process).
pub fn ag_block(r: usize, bytes: usize, seed: u64) -> Vec<u8> {
    let mut rng = Rng::new(seed.wrapping_mul(7919) + r as u64);
    (0..bytes).map(|_| rng.next() as u8).collect()
}

/// The ring collectives that take the zero-copy path, as the rounds below run them: AllGather
/// of `count` bytes per rank, AllReduce (sum) of `count` int32, Broadcast of `count` bytes from
/// rank 1 (rank 0 with one rank).
pub fn elem_bytes(coll: Coll) -> usize {
    match coll {
        Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce => 4,
        _ => 1,
    }
}

pub fn root_of(n: usize) -> usize {
    1 % n
}

/// What rank `r` passes as input and what every rank must end with, in bytes.
pub fn coll_data(coll: Coll, n: usize, r: usize, count: usize, seed: u64) -> (Vec<u8>, Vec<u8>) {
    let bytes = count * elem_bytes(coll);
    let mine = ag_block(r, bytes, seed);
    let want = match coll {
        Coll::AllGather => (0..n).flat_map(|b| ag_block(b, bytes, seed)).collect(),
        Coll::Broadcast => ag_block(root_of(n), bytes, seed),
        _ => {
            let mut sum = vec![0i32; count];
            for b in 0..n {
                for (s, w) in sum.iter_mut().zip(ag_block(b, bytes, seed).chunks(4)) {
                    *s = s.wrapping_add(i32::from_le_bytes([w[0], w[1], w[2], w[3]]));
                }
            }
            sum.iter().flat_map(|v| v.to_le_bytes()).collect()
        }
    };
    (mine, want)
}

/// One collective (`coll`: AllGather, AllReduce or Broadcast, see [`elem_bytes`]) over the
/// communicators of this process (every rank of the job, or some: the others run the same
/// round in their processes), in one group: random inputs, in place or not, into an output
/// poisoned around and inside, which ranks that `who` names registered whole (256 bytes either
/// side included). Checks the result and the bytes around the output, and returns, per
/// communicator, how many ring steps of each channel went direct (the predecessor wrote into
/// its output) during the round.
pub fn coll_round(
    comms: &[Comm],
    coll: Coll,
    who: Who,
    count: usize,
    in_place: bool,
    seed: u64,
) -> Vec<Vec<u64>> {
    let n = comms[0].count();
    let in_bytes = count * elem_bytes(coll);
    let out_bytes = match coll {
        Coll::AllGather => n * in_bytes,
        _ => in_bytes,
    };
    let total = LEAD + out_bytes + LEAD;
    let streams: Vec<_> = comms
        .iter()
        .map(|c| c.device().stream_create().unwrap())
        .collect();
    let mut outs = Vec::new();
    let mut ins = Vec::new();
    let mut regs = Vec::new();
    for (i, c) in comms.iter().enumerate() {
        let r = c.rank();
        let out = c.device().alloc(total).unwrap();
        out.write(0, &vec![0xA5; total]).unwrap();
        let (mine, _) = coll_data(coll, n, r, count, seed);
        // Where our input lies in the output when in place.
        let at = match coll {
            Coll::AllGather => r * in_bytes,
            _ => 0,
        };
        let inp = if in_place {
            if coll != Coll::Broadcast || r == root_of(n) {
                out.write(LEAD + at, &mine).unwrap();
            }
            None
        } else {
            let b = c.device().alloc(in_bytes).unwrap();
            b.write(0, &mine).unwrap();
            Some(b)
        };
        if who.registers(r) {
            // SAFETY: the buffer outlives its registration (deregistered below).
            regs.push((i, unsafe { c.register_raw(out.ptr(), total).unwrap() }));
        }
        outs.push((out, at));
        ins.push(inp);
    }
    let before: Vec<Vec<u64>> = comms
        .iter()
        .map(|c| c.ring_direct_steps().unwrap())
        .collect();
    let lent = lend(comms);
    nccl::group_start();
    for (i, c) in lent.iter().enumerate() {
        let recv = outs[i].0.ptr() + LEAD as u64;
        let send = match &ins[i] {
            Some(b) => b.ptr(),
            None => recv + outs[i].1 as u64,
        };
        // The buffers hold these counts and live until the sync below.
        issue(c, coll, send, recv, count, streams[i]);
    }
    nccl::group_end().unwrap();
    // What every rank must end with (the same for all: made once, not per rank).
    let want = coll_data(coll, n, 0, count, seed).1;
    for (i, c) in comms.iter().enumerate() {
        c.device().stream_sync(streams[i]).unwrap();
        let r = c.rank();
        let mut got = vec![0u8; total];
        outs[i].0.read(0, &mut got).unwrap();
        let what = format!(
            "{} on {n} ranks, {who:?}, count {count}, in place {in_place}: rank {r}",
            coll.name()
        );
        assert!(
            got[..LEAD]
                .iter()
                .chain(&got[LEAD + out_bytes..])
                .all(|&b| b == 0xA5),
            "{what} has bytes written outside its output"
        );
        if let Some(k) = (0..out_bytes).find(|&k| got[LEAD + k] != want[k]) {
            panic!("{what}: output byte {k} is wrong");
        }
    }
    let round = Round {
        bufs: Vec::new(),
        streams,
        regs,
        before,
    };
    end_round(comms, round)
}

/// Direct steps per channel that [`coll_round`] of `coll` with `count` takes at `c` when the
/// ranks `registered` names registered their outputs and zero-copy is `on`: on a channel whose
/// slice fills a Simple step at least, the steps whose data comes from the ring predecessor
/// finished (all of AllGather's, AllReduce's all-gather half, every step but the root's of
/// Broadcast), and out of place (not `in_place`) AllReduce's reduce-scatter steps too, whose
/// partial sums the predecessor writes into our output, when this rank and its predecessor
/// there both registered; else none. None either where the tuner does not run the call as a
/// Simple ring. AllReduce's element type is any of 4 bytes.
pub fn expected_direct(
    c: &Comm,
    coll: Coll,
    registered: impl Fn(usize) -> bool,
    count: usize,
    in_place: bool,
    on: bool,
) -> Vec<u64> {
    let (n, r) = (c.count(), c.rank());
    let esize = elem_bytes(coll);
    let nbytes = match coll {
        Coll::AllGather => n * count,
        _ => count * esize,
    };
    let nbytes = match coll {
        Coll::ReduceScatter => n * count * esize,
        _ => nbytes,
    };
    let tcoll = match coll {
        Coll::AllGather => nccl::Coll::AllGather,
        Coll::Broadcast => nccl::Coll::Broadcast,
        Coll::ReduceScatter => nccl::Coll::ReduceScatter,
        Coll::Reduce => nccl::Coll::Reduce,
        _ => nccl::Coll::AllReduce,
    };
    let choice = c.tuning(tcoll, nbytes).unwrap();
    let shape = c.shape();
    if (choice.algo, choice.proto, coll) == (nccl::Algo::Tree, nccl::Proto::Simple, Coll::AllReduce)
    {
        if let Some(chain) = c.tree_chain() {
            return expected_tree_direct(c, choice, chain, &registered, count, in_place, on);
        }
    }
    if (choice.algo, choice.proto) != (nccl::Algo::Ring, nccl::Proto::Simple) {
        // Only Simple rings take the path.
        return vec![0; shape.nchannels as usize];
    }
    let mut nch = (choice.nchannels as u32).clamp(1, shape.nchannels) as usize;
    // Elements per step.
    let chunk = (shape.slot_bytes * shape.slice_steps_for(coll)) as usize / esize;
    // Registered calls on fewer CTAs (`enqueue::fewer_ctas`, `Kernel::fewer_ctas`): where every
    // rank registered, every hop can go direct, and each channel's slice fills a step.
    let fewer = shape.reg_ctas as usize;
    let every_hop = match coll {
        Coll::AllReduce => !in_place,
        Coll::AllGather | Coll::Broadcast => true,
        _ => false,
    };
    if on
        && every_hop
        && (0..n).all(&registered)
        && fewer > 0
        && fewer < nch
        && count / nch >= chunk
    {
        nch = fewer;
    }
    let rings = c.channel_rings().unwrap();
    (0..shape.nchannels as usize)
        .map(|ch| {
            let ring = &rings[ch];
            let pos = ring.iter().position(|&x| x == r).unwrap();
            let prev = ring[(pos + n - 1) % n];
            let (s, e) = match coll {
                Coll::AllReduce | Coll::ReduceScatter | Coll::Reduce => {
                    nccl_device::coll::channel_range::<i32>(count, ch, nch)
                }
                _ => nccl_device::coll::channel_range::<u8>(count, ch, nch),
            };
            // Broadcast's root receives nothing; a Reduce's root alone receives in place (the
            // last hop), out of place only.
            let root = r == root_of(n);
            let takes = match coll {
                Coll::Broadcast => !root,
                Coll::Reduce => root && !in_place,
                _ => true,
            };
            let direct =
                ch < nch && e - s >= chunk && on && registered(r) && registered(prev) && takes;
            if !direct {
                return 0;
            }
            match coll {
                Coll::AllGather => (n as u64 - 1) * (e - s).div_ceil(chunk) as u64,
                Coll::Broadcast => (e - s).div_ceil(chunk) as u64,
                // The last hop of each chunk, out of place only.
                Coll::ReduceScatter if in_place => 0,
                Coll::ReduceScatter | Coll::Reduce => (e - s).div_ceil(chunk) as u64,
                _ => {
                    // A piece per loop of the ring kernel, n - 1 direct steps each.
                    let (mut off, mut pieces) = (s, 0);
                    while off < e {
                        let k =
                            nccl_device::coll::all_reduce::piece_chunk::<i32>(e - off, n, chunk);
                        off += (e - off).min(k * n);
                        pieces += 1;
                    }
                    // Both halves when out of place, the all-gather half alone in place.
                    let halves = if in_place { 1 } else { 2 };
                    halves * (n as u64 - 1) * pieces
                }
            }
        })
        .collect()
}

/// [`expected_direct`] for an AllReduce the tuner runs as the one-node tree: each channel's
/// chain in ring order, rooted at ring position 0 (`chain`: the tree's CTAs and its up links'
/// slot bytes). On a channel whose slice fills a step, every step of the way down lands
/// straight in our output when we and our parent (the ring predecessor) registered, and out
/// of place every step of the way up (our child's partial sums) when we and our child (the
/// successor) registered; a step per chunk each way.
fn expected_tree_direct(
    c: &Comm,
    choice: nccl::TuningChoice,
    (ctas, up_slot): (usize, usize),
    registered: &impl Fn(usize) -> bool,
    count: usize,
    in_place: bool,
    on: bool,
) -> Vec<u64> {
    let (n, r, shape) = (c.count(), c.rank(), c.shape());
    let nch = (choice.nchannels as u32).clamp(1, shape.nchannels) as usize;
    let nch = nch.min(ctas);
    // The kernel's chunk: the smaller slot, whole 16-byte packs of int32.
    let chunk = up_slot.min(shape.slot_bytes as usize) / 16 * 4;
    let rings = c.channel_rings().unwrap();
    (0..shape.nchannels as usize)
        .map(|ch| {
            let (s, e) = nccl_device::coll::channel_range::<i32>(count, ch, nch);
            if !on || ch >= nch || e - s < chunk || !registered(r) {
                return 0;
            }
            let ring = &rings[ch];
            let pos = ring.iter().position(|&x| x == r).unwrap();
            let (prev, next) = (ring[(pos + n - 1) % n], ring[(pos + 1) % n]);
            let chunks = (e - s).div_ceil(chunk) as u64;
            let down = pos != 0 && registered(prev);
            let up = pos != n - 1 && !in_place && registered(next);
            chunks * (down as u64 + up as u64)
        })
        .collect()
}

/// One round of a reduction `coll` (AllReduce: [`reduce_round`], ReduceScatter:
/// [`reduce_scatter_round`], Reduce: [`reduce_root_round`]) on `dt` (Float32, else as Int32)
/// whose direct steps must match the model: each rank's, per channel, equal
/// [`expected_direct`]'s. Returns them.
#[allow(clippy::too_many_arguments)]
pub fn reduction_round_as_modelled(
    comms: &[Comm],
    coll: Coll,
    dt: DataType,
    op: nccl::ReduceOp,
    who: Who,
    count: usize,
    in_place: bool,
    seed: u64,
) -> Vec<Vec<u64>> {
    let f32s = dt == DataType::Float32;
    let got = match (coll, f32s) {
        (Coll::ReduceScatter, true) => {
            reduce_scatter_round::<f32>(comms, dt, op, who, count, in_place, seed)
        }
        (Coll::ReduceScatter, false) => {
            reduce_scatter_round::<i32>(comms, dt, op, who, count, in_place, seed)
        }
        (Coll::Reduce, true) => reduce_root_round::<f32>(comms, dt, op, who, count, in_place, seed),
        (Coll::Reduce, false) => {
            reduce_root_round::<i32>(comms, dt, op, who, count, in_place, seed)
        }
        (_, true) => reduce_round::<f32>(comms, dt, op, who, count, in_place, seed),
        (_, false) => reduce_round::<i32>(comms, dt, op, who, count, in_place, seed),
    };
    for (c, g) in comms.iter().zip(&got) {
        let want = expected_direct(c, coll, |r| who.registers(r), count, in_place, true);
        assert_eq!(
            g,
            &want,
            "{} {dt:?} {op:?} on {} ranks, {who:?}, count {count}, in place {in_place}: rank \
             {}'s direct steps per channel",
            coll.name(),
            comms.len(),
            c.rank()
        );
    }
    got
}

/// One AllReduce of `count` elements of `T` (`dt`) with `op` over the communicators of this
/// process, in one group: random inputs (per rank and seed), in place or not, into an output
/// poisoned inside and for 256 bytes either side, which ranks that `who` names registered
/// whole. Checks every rank's result against the host reference (exact for integers, the
/// reduction depth's tolerance for floats) and the bytes around the output, and returns per
/// communicator how many ring steps of each channel went direct during the call.
pub fn reduce_round<T: nccl_device::types::Elem>(
    comms: &[Comm],
    dt: DataType,
    op: nccl::ReduceOp,
    who: Who,
    count: usize,
    in_place: bool,
    seed: u64,
) -> Vec<Vec<u64>> {
    reduce_round_each::<T>(comms, dt, op, who, count, &|_| in_place, seed)
}

/// [`reduce_round`] where `in_place(rank)` says which ranks run in place (the others out of
/// place, in the same call).
pub fn reduce_round_each<T: nccl_device::types::Elem>(
    comms: &[Comm],
    dt: DataType,
    op: nccl::ReduceOp,
    who: Who,
    count: usize,
    in_place: &dyn Fn(usize) -> bool,
    seed: u64,
) -> Vec<Vec<u64>> {
    use super::{input, reference, to_bytes};
    let n = comms[0].count();
    let out_bytes = count * std::mem::size_of::<T>();
    let inputs: Vec<Vec<T>> = (0..n).map(|r| input::<T>(count, op, seed, r)).collect();
    let want = reference(&inputs, op, dt);
    let round = begin_round(comms, who, false, |r| Plan {
        input: to_bytes(&inputs[r]).to_vec(),
        in_place: in_place(r),
        out_bytes,
        in_place_at: 0,
    });
    // SAFETY (the call): the buffers hold `count` elements and live until the round ends.
    launch_round(comms, &round, |c, send, recv, s| unsafe {
        c.all_reduce_raw(send, recv, count, dt, op, s)
    });
    for (c, b) in comms.iter().zip(&round.bufs) {
        let r = c.rank();
        let got = b.contents();
        let what = format!(
            "AllReduce {dt:?} {op:?} on {n} ranks, {who:?}, count {count}, in place {}: \
             rank {r}",
            in_place(r)
        );
        check_output(&got, out_bytes, &want, &what);
    }
    end_round(comms, round)
}

/// One ReduceScatter of `count` elements per rank of `T` (`dt`) with `op` over the
/// communicators of this process, in one group: random inputs of `n * count` elements, in
/// place (the output is the rank's block of the input) or not, in allocations poisoned around
/// (256 bytes either side) that ranks `who` names registered whole. Checks each rank's block
/// against the host reference, that nothing else changed (the other blocks of an in-place
/// input, the bytes around), and returns per communicator the direct steps of each channel.
pub fn reduce_scatter_round<T: nccl_device::types::Elem>(
    comms: &[Comm],
    dt: DataType,
    op: nccl::ReduceOp,
    who: Who,
    count: usize,
    in_place: bool,
    seed: u64,
) -> Vec<Vec<u64>> {
    use super::{compare, from_bytes, input, reference, to_bytes};
    let n = comms[0].count();
    let block = count * std::mem::size_of::<T>();
    let inputs: Vec<Vec<T>> = (0..n).map(|r| input::<T>(n * count, op, seed, r)).collect();
    let round = begin_round(comms, who, false, |r| Plan {
        input: to_bytes(&inputs[r]).to_vec(),
        in_place,
        out_bytes: block,
        in_place_at: r * block,
    });
    // SAFETY (the call): the buffers hold these counts and live until the round ends.
    launch_round(comms, &round, |c, send, recv, s| unsafe {
        c.reduce_scatter_raw(send, recv, count, dt, op, s)
    });
    for (c, b) in comms.iter().zip(&round.bufs) {
        let r = c.rank();
        let (at, total) = (b.at, b.total);
        let got = b.contents();
        let what = format!(
            "ReduceScatter {dt:?} {op:?} on {n} ranks, {who:?}, count {count}, in place \
             {in_place}: rank {r}"
        );
        // Everything but our block: poison around, our input's other blocks in place.
        let mut rest = got.clone();
        let mut want_rest = vec![0xA5; total];
        if in_place {
            want_rest[LEAD..LEAD + n * block].copy_from_slice(to_bytes(&inputs[r]));
        }
        rest[at..at + block].fill(0);
        want_rest[at..at + block].fill(0);
        assert!(
            rest == want_rest,
            "{what} has bytes changed outside its output"
        );
        let slices: Vec<Vec<T>> = inputs
            .iter()
            .map(|v| v[r * count..(r + 1) * count].to_vec())
            .collect();
        let want = reference(&slices, op, dt);
        let vals: Vec<T> = from_bytes(&got[at..at + block]);
        if let Err(e) = compare(&vals, &want, &what) {
            panic!("{e}");
        }
    }
    end_round(comms, round)
}

/// One Reduce to rank [`root_of`] of `count` elements of `T` (`dt`) with `op` over the
/// communicators of this process, in one group: random inputs, in place (every rank's input
/// in its output buffer) or not, outputs poisoned inside and around; ranks `who` names
/// registered their input and output allocations whole. Checks the root's result, that every
/// other rank's output buffer is as it was and the bytes around every output, and returns per
/// communicator the direct steps of each channel.
#[allow(clippy::too_many_arguments)]
pub fn reduce_root_round<T: nccl_device::types::Elem>(
    comms: &[Comm],
    dt: DataType,
    op: nccl::ReduceOp,
    who: Who,
    count: usize,
    in_place: bool,
    seed: u64,
) -> Vec<Vec<u64>> {
    use super::{input, reference, to_bytes};
    let n = comms[0].count();
    let root = root_of(n);
    let bytes = count * std::mem::size_of::<T>();
    let inputs: Vec<Vec<T>> = (0..n).map(|r| input::<T>(count, op, seed, r)).collect();
    let round = begin_round(comms, who, true, |r| Plan {
        input: to_bytes(&inputs[r]).to_vec(),
        in_place,
        out_bytes: bytes,
        in_place_at: 0,
    });
    // SAFETY (the call): the buffers hold `count` elements and live until the round ends.
    launch_round(comms, &round, |c, send, recv, s| unsafe {
        c.reduce_raw(send, recv, count, dt, op, root, s)
    });
    let want = reference(&inputs, op, dt);
    for (c, b) in comms.iter().zip(&round.bufs) {
        let r = c.rank();
        let got = b.contents();
        let what = format!(
            "Reduce {dt:?} {op:?} on {n} ranks, {who:?}, count {count}, in place {in_place}: \
             rank {r}"
        );
        if r == root {
            check_output(&got, bytes, &want, &what);
        } else {
            let mut was = vec![0xA5; b.total];
            if in_place {
                was[LEAD..LEAD + bytes].copy_from_slice(to_bytes(&inputs[r]));
            }
            assert!(
                got == was,
                "{what}: a rank but the root had its output buffer changed"
            );
        }
    }
    end_round(comms, round)
}

/// Checks an output of `bytes` at [`LEAD`] of `got` (its allocation) against `want`, and that
/// the poison around it is whole.
fn check_output<T: nccl_device::types::Elem>(
    got: &[u8],
    bytes: usize,
    want: &[(T, f64)],
    what: &str,
) {
    assert!(
        got[..LEAD]
            .iter()
            .chain(&got[LEAD + bytes..])
            .all(|&b| b == 0xA5),
        "{what} has bytes written outside its output"
    );
    let vals: Vec<T> = super::from_bytes(&got[LEAD..LEAD + bytes]);
    if let Err(e) = super::compare(&vals, want, what) {
        panic!("{e}");
    }
}

/// How [`begin_round`] lays out one rank's buffers.
struct Plan {
    /// The rank's input.
    input: Vec<u8>,
    /// In place: the input sits at [`LEAD`] of the output's allocation, the output
    /// `in_place_at` bytes into it; out of place, the output sits at [`LEAD`] and the input in
    /// an allocation of its own.
    in_place: bool,
    out_bytes: usize,
    in_place_at: usize,
}

/// One rank's buffers in a round: the allocation holding its output (poisoned with 0xA5,
/// [`LEAD`] bytes at least either side), where the output starts in it and its size, and a
/// separate input (out of place).
struct RankBufs {
    out: nccl::DevBuffer,
    at: usize,
    total: usize,
    input: Option<nccl::DevBuffer>,
}

impl RankBufs {
    /// The output's whole allocation as it is now.
    fn contents(&self) -> Vec<u8> {
        let mut got = vec![0u8; self.total];
        self.out.read(0, &mut got).unwrap();
        got
    }
}

/// A reduction round under way: every rank's buffers, streams and registrations, and each
/// rank's direct steps per channel before it.
struct Round {
    bufs: Vec<RankBufs>,
    streams: Vec<nccl::StreamHandle>,
    regs: Vec<(usize, nccl::RegHandle)>,
    before: Vec<Vec<u64>>,
}

/// Allocates and fills every rank's buffers as `plan(rank)` says; ranks `who` names register
/// their output's allocation whole (and their separate input where `register_input`).
fn begin_round(
    comms: &[Comm],
    who: Who,
    register_input: bool,
    plan: impl Fn(usize) -> Plan,
) -> Round {
    let (mut bufs, mut regs) = (Vec::new(), Vec::new());
    for (i, c) in comms.iter().enumerate() {
        let r = c.rank();
        let p = plan(r);
        let (total, at) = match p.in_place {
            true => (p.input.len() + 2 * LEAD, LEAD + p.in_place_at),
            false => (p.out_bytes + 2 * LEAD, LEAD),
        };
        let out = c.device().alloc(total).unwrap();
        out.write(0, &vec![0xA5; total]).unwrap();
        let input = if p.in_place {
            out.write(LEAD, &p.input).unwrap();
            None
        } else {
            let b = c.device().alloc(p.input.len()).unwrap();
            b.write(0, &p.input).unwrap();
            Some(b)
        };
        if who.registers(r) {
            // SAFETY: the buffers outlive their registrations (released in `end_round`).
            unsafe {
                regs.push((i, c.register_raw(out.ptr(), total).unwrap()));
                if let Some(b) = input.as_ref().filter(|_| register_input) {
                    regs.push((i, c.register_raw(b.ptr(), p.input.len()).unwrap()));
                }
            }
        }
        bufs.push(RankBufs {
            out,
            at,
            total,
            input,
        });
    }
    let streams = comms
        .iter()
        .map(|c| c.device().stream_create().unwrap())
        .collect();
    let before = comms
        .iter()
        .map(|c| c.ring_direct_steps().unwrap())
        .collect();
    Round {
        bufs,
        streams,
        regs,
        before,
    }
}

/// Issues `call(comm, send, recv, stream)` on every rank in one group (send: the separate input,
/// or the input in place at [`LEAD`]; recv: the output) and waits for every stream.
fn launch_round(
    comms: &[Comm],
    round: &Round,
    call: impl Fn(&Comm, nccl::DevPtr, nccl::DevPtr, nccl::StreamHandle) -> nccl::Result<()>,
) {
    let lent = lend(comms);
    nccl::group_start();
    for ((c, b), &s) in lent.iter().zip(&round.bufs).zip(&round.streams) {
        let recv = b.out.ptr() + b.at as u64;
        let send = b
            .input
            .as_ref()
            .map_or(b.out.ptr() + LEAD as u64, |i| i.ptr());
        call(c, send, recv, s).unwrap();
    }
    nccl::group_end().unwrap();
    for (c, &s) in comms.iter().zip(&round.streams) {
        c.device().stream_sync(s).unwrap();
    }
}

/// A round's end: its registrations released, its streams destroyed, and each rank's steps
/// received in place per channel since the round began.
fn end_round(comms: &[Comm], round: Round) -> Vec<Vec<u64>> {
    for (i, h) in round.regs {
        comms[i].deregister(h).unwrap();
    }
    for (c, s) in comms.iter().zip(round.streams) {
        c.device().stream_destroy(s).unwrap();
    }
    comms
        .iter()
        .zip(round.before)
        .map(|(c, b)| {
            let now = c.ring_direct_steps().unwrap();
            now.iter().zip(b).map(|(a, b)| a - b).collect()
        })
        .collect()
}

/// Rounds on registered buffers of CUDA's virtual memory API (`ncclMemAlloc`), for a rank that
/// is a process of its own (its peers run the same rounds): three such buffers, registered
/// once; each of 6 rounds sends `ring_bytes(rank, p2p_base + 64 k)` random bytes to the
/// successor and receives the predecessor's into a poisoned buffer, then runs an AllReduce
/// (int32 sum, out of place) of `count` random elements into a poisoned output; results and
/// the bytes after them are checked in every round. The last round's send steps and
/// AllReduce direct steps per channel must be those of the direct path when `on`, else of the
/// FIFO (the records are in by then: every round needs every rank's launches).
pub fn vmm_rounds(c: &Comm, p2p_base: usize, count: usize, on: bool) {
    let (n, r) = (c.count(), c.rank());
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    let room = (p2p_base + 64 * 6 + 4 * 37 * n + 1024).max(count * 4 + 1024);
    // ncclMemAlloc's memory: sends and AllReduce inputs, receives, AllReduce outputs.
    let bufs: Vec<nccl::DevBuffer> = (0..3)
        .map(|_| c.device().alloc_vmm(room).expect("alloc_vmm"))
        .collect();
    let regs: Vec<_> = bufs
        .iter()
        // SAFETY: the buffers outlive their registrations (deregistered below).
        .map(|b| unsafe { c.register_raw(b.ptr(), room) }.expect("register"))
        .collect();
    let (s, rb, out) = (&bufs[0], &bufs[1], &bufs[2]);
    let stream = c.device().stream_create().unwrap();
    let (mut p2p_steps, mut ring_steps) = (0u64, Vec::new());
    const ROUNDS: u64 = 6;
    for k in 0..ROUNDS {
        // Send/recv: a message of several FIFOs per connection, random bytes, a poisoned
        // receive buffer whose bytes past the message must stay.
        let base = p2p_base + 64 * k as usize;
        let mut rng = Rng::new(600 + k * 1000 + r as u64);
        let mine: Vec<u8> = (0..ring_bytes(r, base)).map(|_| rng.next() as u8).collect();
        s.write(0, &mine).unwrap();
        let len = ring_bytes(prev, base);
        rb.write(0, &vec![0x5A; len + 512]).unwrap();
        let before = send_steps(c);
        nccl::group_start();
        // SAFETY: both buffers hold `room` bytes, more than either message.
        unsafe {
            c.send_raw(s.ptr(), mine.len(), DataType::Uint8, next, stream)
                .unwrap();
            c.recv_raw(rb.ptr(), len, DataType::Uint8, prev, stream)
                .unwrap();
        }
        nccl::group_end().unwrap();
        c.device().stream_sync(stream).unwrap();
        p2p_steps = send_steps(c) - before;
        let mut rng = Rng::new(600 + k * 1000 + prev as u64);
        let want: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        let mut got = vec![0u8; len + 512];
        rb.read(0, &mut got).unwrap();
        assert!(
            got[..len] == want[..],
            "rank {r}, round {k}: wrong bytes from {prev}"
        );
        assert!(
            got[len..].iter().all(|&b| b == 0x5A),
            "rank {r}, round {k}: bytes written past the message"
        );
        // AllReduce (int32 sum) out of place into the registered output, poisoned.
        let (inp, want) = coll_data(Coll::AllReduce, n, r, count, 700 + k);
        s.write(0, &inp).unwrap();
        out.write(0, &vec![0xA5; want.len() + 512]).unwrap();
        let before = c.ring_direct_steps().unwrap();
        // SAFETY: both buffers hold `room` bytes, more than the call's.
        unsafe {
            c.all_reduce_raw(
                s.ptr(),
                out.ptr(),
                count,
                DataType::Int32,
                nccl::ReduceOp::Sum,
                stream,
            )
            .unwrap();
        }
        c.device().stream_sync(stream).unwrap();
        let now = c.ring_direct_steps().unwrap();
        ring_steps = now.iter().zip(&before).map(|(a, b)| a - b).collect();
        let mut got = vec![0u8; want.len() + 512];
        out.read(0, &mut got).unwrap();
        assert!(
            got[..want.len()] == want[..],
            "rank {r}, round {k}: wrong AllReduce"
        );
        assert!(
            got[want.len()..].iter().all(|&b| b == 0xA5),
            "rank {r}, round {k}: AllReduce wrote past its output"
        );
    }
    // Withdrawn (the peers unmap them before their next launch), then one more AllReduce on
    // the same, now unregistered, buffers: the copy path, and no rank leaves before every
    // withdrawal was sent (a send to a rank that has exited waits out its retries).
    for h in regs {
        c.deregister(h).unwrap();
    }
    let (inp, want) = coll_data(Coll::AllReduce, n, r, 1001, 799);
    s.write(0, &inp).unwrap();
    out.write(0, &vec![0xA5; want.len()]).unwrap();
    let before = c.ring_direct_steps().unwrap();
    // SAFETY: both buffers hold `room` bytes, more than the call's.
    unsafe {
        c.all_reduce_raw(
            s.ptr(),
            out.ptr(),
            1001,
            DataType::Int32,
            nccl::ReduceOp::Sum,
            stream,
        )
        .unwrap();
    }
    c.device().stream_sync(stream).unwrap();
    assert_eq!(
        c.ring_direct_steps().unwrap(),
        before,
        "rank {r}: direct after withdrawal"
    );
    let mut got = vec![0u8; want.len()];
    out.read(0, &mut got).unwrap();
    assert!(
        got == want,
        "rank {r}: wrong AllReduce after the withdrawal"
    );
    c.device().stream_destroy(stream).unwrap();
    let slot = c.shape().p2p_slot_bytes as usize;
    let conns = c.p2p_steps(next, true).unwrap().map_or(1, |v| v.len());
    let bytes = ring_bytes(r, p2p_base + 64 * (ROUNDS as usize - 1));
    assert_eq!(
        p2p_steps,
        expected_steps(bytes, conns, slot, on),
        "rank {r} (VMM path on: {on}): send steps of the last round"
    );
    let want_ring = expected_direct(c, Coll::AllReduce, |_| on, count, false, true);
    assert_eq!(
        ring_steps, want_ring,
        "rank {r} (VMM path on: {on}): AllReduce direct steps per channel"
    );
    if on {
        assert!(
            ring_steps.iter().sum::<u64>() > 0,
            "rank {r}: the AllReduce took no direct step ({ring_steps:?})"
        );
    }
}

/// A shape of [`registered_tree_across_nodes`]'s runs: nodes, ranks per node, whether the two
/// nodes' heads exchange at the top (`NCCL_RS_TREE_EXCHANGE`), and whether the last rank leaves
/// its output unregistered.
pub struct TreeShape {
    pub nodes: usize,
    pub per_node: usize,
    pub exchange: bool,
    pub mixed: bool,
}

/// Two nodes with the heads' exchange (chains of 2 and 3: a middle rank goes direct both ways)
/// and without it (the fan: a head takes its chain child's partial sums from its output beside
/// its child nodes' FIFOs), three nodes (a root with three children); the last two with one rank
/// unregistered.
pub const TREE_ACROSS_NODES: [TreeShape; 6] = [
    TreeShape {
        nodes: 2,
        per_node: 2,
        exchange: true,
        mixed: false,
    },
    TreeShape {
        nodes: 2,
        per_node: 3,
        exchange: true,
        mixed: false,
    },
    TreeShape {
        nodes: 2,
        per_node: 2,
        exchange: false,
        mixed: false,
    },
    TreeShape {
        nodes: 3,
        per_node: 2,
        exchange: false,
        mixed: false,
    },
    TreeShape {
        nodes: 2,
        per_node: 3,
        exchange: true,
        mixed: true,
    },
    TreeShape {
        nodes: 3,
        per_node: 2,
        exchange: false,
        mixed: true,
    },
];

impl TreeShape {
    /// The rank processes' environment (loopback sockets, the forced Simple tree, local
    /// registration on).
    pub fn env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("NCCL_SOCKET_IFNAME", "lo".to_string()),
            ("NCCL_PROTO", "Simple".into()),
            ("NCCL_ALGO", "allreduce:tree".into()),
            ("NCCL_LOCAL_REGISTER", "1".into()),
            ("NCCL_RS_TREE_EXCHANGE", (self.exchange as u8).to_string()),
            ("DBT_TEST_PER_NODE", self.per_node.to_string()),
        ];
        if self.mixed {
            env.push(("DBT_TEST_MIXED", "1".into()));
        }
        env
    }
}

/// One rank's part of a [`TreeShape`] run (ranks grouped into nodes in order,
/// `DBT_TEST_PER_NODE` each; with `DBT_TEST_MIXED` the last rank does not register): six int32
/// AllReduces on the tree, out of place and in place by turns, random data, the output
/// poisoned past its end; every result must be the sum, and in the last two rounds (the
/// peers' registration records are in by then) each channel's direct steps must match the
/// model: a step per chunk from the parent where it is in our node and both ends registered,
/// and out of place one from the child in our node likewise.
pub fn registered_tree_across_nodes(comm: &Comm) {
    let (rank, nranks) = (comm.rank(), comm.count());
    let per: usize = std::env::var("DBT_TEST_PER_NODE").unwrap().parse().unwrap();
    let mixed = std::env::var_os("DBT_TEST_MIXED").is_some();
    let registers = |r: usize| !mixed || r != nranks - 1;
    let (ctas, slot) = comm.dbt_geometry().expect("a tree across nodes");
    let places = comm.tree_places().unwrap().expect("a tree across nodes");
    let shape = comm.shape();
    // The kernel's chunk: within a slot of the tree's links, whole 16-byte packs of int32.
    let chunk = (slot.min(shape.slot_bytes as usize) / 4).min(slot / 4) / 4 * 4;
    // Two and a half chunks per CTA (a short one at the end), odd.
    let count = ctas * chunk * 5 / 2 + 1;
    let choice = comm.tuning(nccl::Coll::AllReduce, 4 * count).unwrap();
    assert_eq!(
        (choice.algo, choice.proto),
        (nccl::Algo::Tree, nccl::Proto::Simple),
        "rank {rank}: the forced tree"
    );
    let nch = ((choice.nchannels as u32).clamp(1, shape.nchannels) as usize).min(ctas);
    let node = |x: usize| x / per;
    let model = |in_place: bool| -> Vec<u64> {
        (0..shape.nchannels as usize)
            .map(|ch| {
                let (s, e) = nccl_device::coll::channel_range::<i32>(count, ch, nch);
                if ch >= nch || e - s < chunk || !registers(rank) {
                    return 0;
                }
                let (up, down) = &places[ch];
                let near = |p: usize| node(p) == node(rank) && registers(p);
                let from_parent = up.is_some_and(near);
                let from_child = !in_place && down.iter().any(|&d| near(d));
                (e - s).div_ceil(chunk) as u64 * (from_parent as u64 + from_child as u64)
            })
            .collect()
    };
    // The output and 4 KiB past it (poisoned).
    let room = 4 * count + 4096;
    let inp = comm.device().alloc(room).unwrap();
    let out = comm.device().alloc(room).unwrap();
    // SAFETY: the buffer outlives its registration (withdrawn at the end).
    let reg = registers(rank).then(|| unsafe { comm.register_raw(out.ptr(), room) }.unwrap());
    let mut modelled = 0;
    for k in 0..6u64 {
        let in_place = k % 2 == 1;
        let (mine, want) = coll_data(Coll::AllReduce, nranks, rank, count, 300 + k);
        out.write(0, &vec![0xA5; room]).unwrap();
        let send = match in_place {
            true => {
                out.write(0, &mine).unwrap();
                out.ptr()
            }
            false => {
                inp.write(0, &mine).unwrap();
                inp.ptr()
            }
        };
        let before = comm.ring_direct_steps().unwrap();
        let stream = comm.device().stream_create().unwrap();
        // SAFETY: both buffers hold the call's bytes and live past the sync below.
        unsafe {
            comm.all_reduce_raw(
                send,
                out.ptr(),
                count,
                nccl::DataType::Int32,
                nccl::ReduceOp::Sum,
                stream,
            )
        }
        .unwrap();
        comm.device().stream_sync(stream).unwrap();
        comm.device().stream_destroy(stream).unwrap();
        let mut got = vec![0u8; room];
        out.read(0, &mut got).unwrap();
        assert!(
            got[..want.len()] == want,
            "rank {rank}: round {k}: wrong sum"
        );
        assert!(
            got[want.len()..].iter().all(|&b| b == 0xA5),
            "rank {rank}: round {k}: bytes past the output written"
        );
        let now = comm.ring_direct_steps().unwrap();
        let direct: Vec<u64> = now.iter().zip(before).map(|(a, b)| a - b).collect();
        // The peers' registration records are in after the first rounds.
        if k >= 4 {
            let want = model(in_place);
            modelled += want.iter().sum::<u64>();
            assert_eq!(
                direct, want,
                "rank {rank}: round {k} (in place {in_place}): direct steps per channel \
             (places {places:?})"
            );
        }
    }
    if !mixed {
        assert!(modelled > 0, "rank {rank}: the model says no direct step");
    }
    // Our last call is done: no peer writes into our output any more.
    if let Some(h) = reg {
        comm.deregister(h).unwrap();
    }
}

/// Issues `coll` as [`coll_round`] runs it (AllGather and Broadcast of bytes, AllReduce sum of
/// int32) from `send` into `recv` on `stream`; the buffers must hold what the call needs until
/// it (and any graph capturing it) is done.
fn issue(c: &Comm, coll: Coll, send: u64, recv: u64, count: usize, stream: nccl::StreamHandle) {
    // SAFETY: the callers' buffers hold what the call needs and outlive its replays.
    unsafe {
        match coll {
            Coll::AllGather => c.all_gather_raw(send, recv, count, DataType::Uint8, stream),
            Coll::Broadcast => c.broadcast_raw(
                send,
                recv,
                count,
                DataType::Uint8,
                root_of(c.count()),
                stream,
            ),
            _ => c.all_reduce_raw(
                send,
                recv,
                count,
                DataType::Int32,
                nccl::ReduceOp::Sum,
                stream,
            ),
        }
        .unwrap();
    }
}

/// A captured AllReduce of `count` Int32 replayed a few times (new random data and a poisoned
/// output each time, results checked), whatever each rank's graph registration: a peer
/// whose process has it off sends no marks, and is not waited for.
pub fn captured_allreduce_replays(c: &Comm, count: usize) {
    let (rank, nranks) = (c.rank(), c.count());
    let stream = c.device().stream_create().unwrap();
    let coll = Coll::AllReduce;
    let (mine, want) = coll_data(coll, nranks, rank, count, 0);
    let inp = c.device().alloc(mine.len()).unwrap();
    let out = c.device().alloc(want.len()).unwrap();
    c.device().capture_begin(stream).unwrap();
    issue(c, coll, inp.ptr(), out.ptr(), count, stream);
    let graph = c.device().capture_end(stream).unwrap();
    for replay in 1..4u64 {
        let (mine, want) = coll_data(coll, nranks, rank, count, replay);
        inp.write(0, &mine).unwrap();
        out.write(0, &vec![0xA5; want.len()]).unwrap();
        graph.launch(stream).unwrap();
        c.device().stream_sync(stream).unwrap();
        let mut got = vec![0u8; want.len()];
        out.read(0, &mut got).unwrap();
        assert!(got == want, "rank {rank}: replay {replay}");
    }
    drop(graph);
}

/// Graph registration with ranks as processes (this process's one rank; every rank runs the
/// same), for each (collective, count) of `colls` on fresh, unregistered buffers (Simple ring
/// steps): an eager round copies; a capture of two calls into two outputs of one allocation
/// registers that allocation once (one live graph registration) and every replay goes direct
/// as [`expected_direct`] models it, twice; an eager call into the same output while the
/// graph lives copies (a graph's registration is not the user's); after the graph is dropped
/// the next call withdraws it (nothing stays registered). New random data and a poisoned
/// output every round.
pub fn captured_coll_rounds(c: &Comm, colls: &[(Coll, usize)]) {
    let (rank, nranks) = (c.rank(), c.count());
    let stream = c.device().stream_create().unwrap();
    for (k, &(coll, count)) in colls.iter().enumerate() {
        let (mine, want) = coll_data(coll, nranks, rank, count, 0);
        let inp = c.device().alloc(mine.len()).unwrap();
        // Two outputs in one allocation: the graph writes both, eager calls the first.
        let half = want.len().next_multiple_of(256);
        let out = c.device().alloc(2 * half).unwrap();
        // One round: new data, poisoned outputs, the results checked (`outs` of them); the
        // direct steps.
        let round = |launch: &dyn Fn(), outs: usize, seed: u64| -> Vec<u64> {
            let (mine, want) = coll_data(coll, nranks, rank, count, seed);
            inp.write(0, &mine).unwrap();
            out.write(0, &vec![0xA5; 2 * half]).unwrap();
            let before = c.ring_direct_steps().unwrap();
            launch();
            c.device().stream_sync(stream).unwrap();
            for o in 0..2 {
                let mut got = vec![0u8; want.len()];
                out.read(o * half, &mut got).unwrap();
                match o < outs {
                    true => assert!(got == want, "rank {rank}: {} (seed {seed})", coll.name()),
                    false => assert!(got.iter().all(|&b| b == 0xA5), "rank {rank}: output {o}"),
                }
            }
            let now = c.ring_direct_steps().unwrap();
            now.iter().zip(before).map(|(a, b)| a - b).collect()
        };
        let call = |o: usize| {
            issue(
                c,
                coll,
                inp.ptr(),
                out.ptr() + (o * half) as u64,
                count,
                stream,
            )
        };
        let eager = || call(0);
        let direct = expected_direct(c, coll, |_| true, count, false, true);
        let copies = vec![0; direct.len()];
        // (A Broadcast's root receives nothing.)
        let receives = coll != Coll::Broadcast || rank != root_of(nranks);
        assert_eq!(
            direct.iter().sum::<u64>() > 0,
            receives,
            "rank {rank}: the model"
        );
        let seed = 1000 * k as u64;
        assert_eq!(
            round(&eager, 1, seed),
            copies,
            "rank {rank}: nothing registered yet"
        );
        c.device().capture_begin(stream).unwrap();
        call(0);
        call(1);
        let graph = c.device().capture_end(stream).unwrap();
        assert_eq!(
            c.graph_registrations(),
            1,
            "rank {rank}: the outputs' allocation, registered once"
        );
        let twice: Vec<u64> = direct.iter().map(|d| 2 * d).collect();
        for replay in 1..4 {
            let got = round(&|| graph.launch(stream).unwrap(), 2, seed + replay);
            assert_eq!(got, twice, "rank {rank}: {} replay {replay}", coll.name());
        }
        let got = round(&eager, 1, seed + 10);
        assert_eq!(got, copies, "rank {rank}: eager while the graph lives");
        drop(graph);
        let got = round(&eager, 1, seed + 11);
        assert_eq!(got, copies, "rank {rank}: eager after the graph is gone");
        assert_eq!(c.graph_registrations(), 0, "rank {rank}: released");
    }
    c.device().stream_destroy(stream).unwrap();
}

/// Graph registration of send/recv with ranks as processes (this process's one rank; every
/// rank runs the same): each rank sends [`ring_bytes`]`(rank, base)` to its successor and
/// receives from its predecessor, over `conns` connections of `slot`-byte slots, on fresh,
/// unregistered buffers. An eager round copies; a capture registers the receive buffer (one
/// live graph registration, which the sender maps) and every replay goes direct
/// ([`expected_steps`]); after the graph is dropped the next round copies, nothing stays
/// registered and the sender unmaps it. New random bytes, a
/// poisoned receive buffer and its tail checked every round.
pub fn captured_p2p_rounds(c: &Comm, base: usize, conns: usize, slot: usize) {
    let (rank, nranks) = (c.rank(), c.count());
    let (next, prev) = ((rank + 1) % nranks, (rank + nranks - 1) % nranks);
    let (out_len, in_len) = (ring_bytes(rank, base), ring_bytes(prev, base));
    let s = c.device().alloc(out_len).unwrap();
    let rb = c.device().alloc(in_len + 512).unwrap();
    let stream = c.device().stream_create().unwrap();
    let data = |from: usize, len: usize, seed: u64| -> Vec<u8> {
        let mut rng = Rng::new(seed * 1000 + from as u64);
        (0..len).map(|_| rng.next() as u8).collect()
    };
    let issue = || {
        nccl::group_start();
        // SAFETY: both buffers hold their message and outlive the graph's replays.
        unsafe {
            c.send_raw(s.ptr(), out_len, DataType::Uint8, next, stream)
                .unwrap();
            c.recv_raw(rb.ptr(), in_len, DataType::Uint8, prev, stream)
                .unwrap();
        }
        nccl::group_end().unwrap();
    };
    // One round: new bytes, a poisoned buffer, the result checked; this rank's send steps.
    let round = |launch: &dyn Fn(), seed: u64| -> u64 {
        s.write(0, &data(rank, out_len, seed)).unwrap();
        rb.write(0, &vec![0x5A; in_len + 512]).unwrap();
        let before = send_steps(c);
        launch();
        c.device().stream_sync(stream).unwrap();
        let mut got = vec![0u8; in_len + 512];
        rb.read(0, &mut got).unwrap();
        assert!(
            got[..in_len] == data(prev, in_len, seed),
            "rank {rank}, seed {seed}"
        );
        assert!(
            got[in_len..].iter().all(|&b| b == 0x5A),
            "rank {rank}: past the end"
        );
        send_steps(c) - before
    };
    let copies = expected_steps(out_len, conns, slot, false);
    let direct = expected_steps(out_len, conns, slot, true);
    assert_eq!(round(&issue, 1), copies, "rank {rank}: nothing registered");
    c.device().capture_begin(stream).unwrap();
    issue();
    let graph = c.device().capture_end(stream).unwrap();
    assert_eq!(
        c.graph_registrations(),
        1,
        "rank {rank}: the captured receive"
    );
    for replay in 2..5 {
        let got = round(&|| graph.launch(stream).unwrap(), replay);
        assert_eq!(got, direct, "rank {rank}: replay {replay} was not direct");
    }
    assert_eq!(
        c.mapped_registrations(next),
        1,
        "rank {rank}: rank {next}'s buffer"
    );
    drop(graph);
    let gone = "after the graph is gone";
    assert_eq!(round(&issue, 9), copies, "rank {rank}: {gone}");
    assert_eq!(c.graph_registrations(), 0, "rank {rank}: released");
    // The successor withdrew it in the round above (at its first call), which this rank's
    // launch of the next drains.
    assert_eq!(round(&issue, 10), copies, "rank {rank}: {gone}");
    assert_eq!(
        c.mapped_registrations(next),
        0,
        "rank {rank}: {next}'s withdrawal"
    );
    c.device().stream_destroy(stream).unwrap();
}
