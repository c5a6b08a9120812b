//! Registered ring collectives: rounds whose outputs some ranks registered, checked with the
//! bytes around them, and the direct steps each channel took.

use super::super::{lend, Rng};
use super::capture::issue;
use super::Who;
use nccl::{Comm, DataType};
use nccl_device::abi::Coll;

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
    use super::super::{input, reference, to_bytes};
    let n = comms[0].count();
    let out_bytes = count * std::mem::size_of::<T>();
    let inputs: Vec<Vec<T>> = (0..n).map(|r| input::<T>(count, op, seed, r, n)).collect();
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
    use super::super::{compare, from_bytes, input, reference, to_bytes};
    let n = comms[0].count();
    let block = count * std::mem::size_of::<T>();
    let inputs: Vec<Vec<T>> = (0..n)
        .map(|r| input::<T>(n * count, op, seed, r, n))
        .collect();
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
    use super::super::{input, reference, to_bytes};
    let n = comms[0].count();
    let root = root_of(n);
    let bytes = count * std::mem::size_of::<T>();
    let inputs: Vec<Vec<T>> = (0..n).map(|r| input::<T>(count, op, seed, r, n)).collect();
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
    let vals: Vec<T> = super::super::from_bytes(&got[LEAD..LEAD + bytes]);
    if let Err(e) = super::super::compare(&vals, want, what) {
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
