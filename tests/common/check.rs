//! Collective checks: every rank's input made of values whose every partial sum is exact (so
//! the reference is bit-exact whatever order the ranks reduce in, and the comparison exact),
//! outputs poisoned with a poisoned tail past them, and for every output first a check that
//! nothing still holds the poison, then the values, then the tail.

use super::{from_bytes, lend, skip, to_bytes, Drive, Ranks, Rng};
use nccl::{DataType, RedOpKind, ReduceOp, Scalar};
use nccl_device::abi::Coll;
use nccl_device::types::Elem;
use nccl_device::with_elem;

/// The byte every output (and its tail) is filled with before a call.
pub const POISON: u8 = 0xA5;
/// Poisoned bytes after every output buffer: a write past the output must be seen.
pub const TAIL: usize = 64;

/// Relative precision (one ulp at 1.0) of a float type.
pub fn epsilon(dt: DataType) -> f64 {
    match dt {
        DataType::Float16 => 2f64.powi(-10),
        DataType::Bfloat16 => 2f64.powi(-7),
        DataType::Float32 => 2f64.powi(-23),
        DataType::Float64 => 2f64.powi(-52),
        DataType::Float8e4m3 => 2f64.powi(-3),
        DataType::Float8e5m2 => 2f64.powi(-2),
        _ => 0.0,
    }
}

pub const ALL_OPS: [ReduceOp; 6] = [
    ReduceOp::SUM,
    ReduceOp::PROD,
    ReduceOp::MAX,
    ReduceOp::MIN,
    ReduceOp::AVG,
    ReduceOp::pre_mul_sum(0), // the scalar is filled in per type
];

/// The op with a scalar of the right type (PreMulSum by 0.5 for floats, 3 for integers).
pub fn typed_op(op: ReduceOp, dt: DataType) -> ReduceOp {
    match op.kind() {
        RedOpKind::PreMulSum => {
            let bits = with_elem!(dt, T => Elem::to_bits(T::from_f64(if dt.is_float() { 0.5 } else { 3.0 })));
            ReduceOp::pre_mul_sum(bits)
        }
        _ => op,
    }
}

/// For sums of a float type: (magnitude, ranks) such that `ranks` integers of at most that
/// magnitude, halved or divided by a power of two, add up exactly in every order: their sum
/// stays within the type's exactly represented integers (2 / epsilon).
fn exact_sums(dt: DataType) -> (i64, usize) {
    let exact = (2.0 / epsilon(dt)).min(1e15) as i64;
    let magnitude = (exact / 16).clamp(2, 1000);
    (magnitude, (exact / magnitude) as usize)
}

/// Rank `rank`'s input of `count` elements among `nranks`, for `op`. Integers are random
/// (their arithmetic wraps, exactly, in any order). Floats are small integers: for sums only
/// as many ranks contribute to an element (the others hold 0) as the type adds up exactly,
/// so the device's result is exact whatever order it reduces in; products are ±1 but for a
/// few ranks' ±2 or ±0.5 (exact, within every type's range); Max and Min take any of them.
pub fn input<T: Elem>(count: usize, op: ReduceOp, seed: u64, rank: usize, nranks: usize) -> Vec<T> {
    let mut rng = Rng::new(seed ^ ((rank as u64 + 1) << 32));
    let n = nranks.max(1);
    if !T::IS_FLOAT {
        return (0..count)
            .map(|_| match op.kind() {
                RedOpKind::Prod => T::from_f64((rng.next() % 3) as f64 + 1.0),
                _ => T::from_bits(rng.next() % 100),
            })
            .collect();
    }
    let (mag, ranks) = exact_sums(T::DTYPE);
    (0..count)
        .map(|i| {
            let r = rng.next();
            let sign = if r & 1 == 0 { 1.0 } else { -1.0 };
            let v = match op.kind() {
                RedOpKind::Prod if (rank + i) % n < 4 => {
                    sign * [1.0, 2.0, 0.5][(r >> 1) as usize % 3]
                }
                RedOpKind::Prod => sign,
                RedOpKind::Max | RedOpKind::Min => {
                    ((r >> 1) % (2 * mag as u64 + 1)) as f64 - mag as f64
                }
                _ if (rank + i) % n < ranks => {
                    ((r >> 1) % (2 * mag as u64 + 1)) as f64 - mag as f64
                }
                _ => 0.0,
            };
            T::from_f64(v)
        })
        .collect()
}

/// The reference result and a per-element tolerance: 0 (exact) but for the float average
/// over a rank count that is no power of two, whose 1/n is rounded before the sum.
pub fn reference<T: Elem>(inputs: &[Vec<T>], op: ReduceOp, dt: DataType) -> Vec<(T, f64)> {
    use nccl_device::ops::{Avg, Max, Min, PreMulSum, Prod, RedOp, Sum};
    fn fold<T: Elem, O: RedOp<T>>(inputs: &[Vec<T>], op: O, i: usize) -> (T, f64) {
        let mut acc = op.pre(inputs[0][i]);
        let mut mag = acc.to_f64().abs();
        for x in &inputs[1..] {
            let v = op.pre(x[i]);
            mag += v.to_f64().abs();
            acc = op.reduce(acc, v);
        }
        (op.post(acc), mag)
    }
    let n = inputs.len();
    let inexact = T::IS_FLOAT && op.kind() == RedOpKind::Avg && !n.is_power_of_two();
    let scalar = match op.scalar() {
        Some(Scalar::Host(bits)) => bits,
        Some(Scalar::Device(_)) => panic!("reference: pass the device scalar's value as PreMulSum"),
        None => 0,
    };
    let count = inputs[0].len();
    (0..count)
        .map(|i| {
            let (v, mag) = match op.kind() {
                RedOpKind::Sum => fold(inputs, <Sum as RedOp<T>>::new(0), i),
                RedOpKind::Prod => fold(inputs, <Prod as RedOp<T>>::new(0), i),
                RedOpKind::Max => fold(inputs, <Max as RedOp<T>>::new(0), i),
                RedOpKind::Min => fold(inputs, <Min as RedOp<T>>::new(0), i),
                RedOpKind::Avg => fold(inputs, <Avg<T> as RedOp<T>>::new(n as u64), i),
                RedOpKind::PreMulSum => fold(inputs, <PreMulSum<T> as RedOp<T>>::new(scalar), i),
            };
            let tol = if inexact {
                n as f64 * epsilon(dt) * mag
            } else {
                0.0
            };
            (v, tol)
        })
        .collect()
}

/// Compares `got` (an output's bytes) with the reference: first that no element still holds
/// the poison where the result is something else, out of tolerance (an output never
/// written), then each value
/// (exact, or within the reference's tolerance). The first mismatch as a message.
pub fn compare_bytes<T: Elem>(got: &[u8], want: &[(T, f64)], what: &str) -> Result<(), String> {
    let size = std::mem::size_of::<T>();
    if got.len() != want.len() * size {
        return Err(format!(
            "{what}: {} bytes, want {} elements",
            got.len(),
            want.len()
        ));
    }
    let poisoned = |bytes: &[u8]| bytes.iter().all(|&b| b == POISON);
    // A low-precision float result may round to the poison's value (fp8 has 256): that is
    // no sign of an element never written.
    let poison = from_bytes::<T>(&vec![POISON; size])[0];
    let passes = |w: &T, tol: f64| T::IS_FLOAT && (poison.to_f64() - w.to_f64()).abs() <= tol;
    let left = want
        .iter()
        .enumerate()
        .filter(|(i, (w, tol))| {
            poisoned(&got[i * size..(i + 1) * size])
                && !poisoned(to_bytes(std::slice::from_ref(w)))
                && !passes(w, *tol)
        })
        .map(|(i, _)| i)
        .collect::<Vec<_>>();
    if let Some(first) = left.first() {
        return Err(format!(
            "{what}: {} of {} elements still hold the poison {POISON:#04x} (never written), \
             first [{first}]",
            left.len(),
            want.len()
        ));
    }
    compare(&from_bytes::<T>(got), want, what)
}

/// Compares `got` with the reference; the first mismatch as a message.
pub fn compare<T: Elem>(got: &[T], want: &[(T, f64)], what: &str) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{what}: {} elements, want {}",
            got.len(),
            want.len()
        ));
    }
    let mut wrong = 0usize;
    let mut first = None;
    for (i, (g, (w, tol))) in got.iter().zip(want).enumerate() {
        let ok = if T::IS_FLOAT {
            let (g, w) = (g.to_f64(), w.to_f64());
            (g - w).abs() <= *tol
        } else {
            g == w
        };
        if !ok {
            wrong += 1;
            first.get_or_insert(format!("[{i}] got {g:?} want {w:?} (tol {tol:e})"));
        }
    }
    match first {
        None => Ok(()),
        Some(f) => Err(format!("{what}: {wrong} of {} wrong, first {f}", got.len())),
    }
}

/// Checks that `tail` (the bytes past an output) still holds the poison.
pub fn check_tail(tail: &[u8], what: &str) -> Result<(), String> {
    match tail.iter().position(|&b| b != POISON) {
        None => Ok(()),
        Some(i) => Err(format!(
            "{what}: written past its end (byte {i} of the poisoned tail is {:#04x})",
            tail[i]
        )),
    }
}

/// Whether a check ran, or was skipped (its kernel is not in this build; see `skip`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Checked {
    Ran,
    Skipped,
}

/// Runs one AllReduce on every communicator and checks every rank's result.
pub fn check_all_reduce(
    ranks: &Ranks,
    count: usize,
    dt: DataType,
    op: ReduceOp,
    in_place: bool,
    seed: u64,
    drive: Drive,
) -> Result<Checked, String> {
    check_collective(
        ranks,
        Coll::AllReduce,
        count,
        dt,
        op,
        0,
        in_place,
        seed,
        drive,
    )
}

/// Every collective in and out of place at a few sizes (1 to 40 000 elements), one type and op
/// each, the root moving: the quick all-round check of a communicator across nodes.
pub fn every_collective(ranks: &Ranks, seed: u64) {
    let n = ranks.comms[0].count();
    for (i, coll) in Coll::ALL.into_iter().enumerate() {
        for (j, count) in [1usize, 37, 3000, 40_000].into_iter().enumerate() {
            let (dt, op) = [
                (DataType::Float32, ReduceOp::SUM),
                (DataType::Int32, ReduceOp::MAX),
                (DataType::Bfloat16, ReduceOp::SUM),
                (DataType::Int64, ReduceOp::PROD),
            ][(i + j) % 4];
            let root = (i + j) % n;
            for in_place in [false, true] {
                check_collective(
                    ranks,
                    coll,
                    count,
                    dt,
                    op,
                    root,
                    in_place,
                    seed + (i * 10 + j) as u64,
                    Drive::OneThread,
                )
                .unwrap_or_else(|e| panic!("{} count {count}: {e}", coll.name()));
            }
        }
    }
}

/// Runs one collective on every communicator with fresh inputs and poisoned outputs, and
/// checks every rank's result against the host reference; skipped (visibly) when this build
/// left the collective's kernel out.
#[allow(clippy::too_many_arguments)]
pub fn check_collective(
    ranks: &Ranks,
    coll: Coll,
    count: usize,
    dt: DataType,
    op: ReduceOp,
    root: usize,
    in_place: bool,
    seed: u64,
    drive: Drive,
) -> Result<Checked, String> {
    let what = || {
        let place = if in_place { "in place" } else { "out of place" };
        format!(
            "{} {} {op:?} count {count} {place} on {} ranks",
            coll.name(),
            dt.name(),
            ranks.comms[0].count()
        )
    };
    if !skip::kernel_or_skip(coll, dt, op, &what) {
        return Ok(Checked::Skipped);
    }
    with_elem!(dt, T => check_typed::<T>(ranks, coll, count, op, root, in_place, seed, drive))?;
    Ok(Checked::Ran)
}

/// Each rank's expected output, or None where the collective leaves it undefined.
fn expected<T: Elem>(
    coll: Coll,
    inputs: &[Vec<T>],
    count: usize,
    op: ReduceOp,
    root: usize,
) -> Vec<Option<Vec<(T, f64)>>> {
    let n = inputs.len();
    let exact = |v: &[T]| v.iter().map(|&x| (x, 0.0)).collect::<Vec<_>>();
    match coll {
        Coll::AllReduce => {
            let r = reference(inputs, op, T::DTYPE);
            vec![Some(r); n]
        }
        Coll::Reduce => {
            let r = reference(inputs, op, T::DTYPE);
            (0..n).map(|i| (i == root).then(|| r.clone())).collect()
        }
        Coll::Broadcast => vec![Some(exact(&inputs[root])); n],
        Coll::AllGather => {
            let all: Vec<T> = inputs.iter().flatten().copied().collect();
            vec![Some(exact(&all)); n]
        }
        Coll::ReduceScatter => {
            let r = reference(inputs, op, T::DTYPE);
            (0..n)
                .map(|i| Some(r[i * count..(i + 1) * count].to_vec()))
                .collect()
        }
    }
}

/// One local rank's buffers: (kept alive, send pointer, recv pointer, where its poisoned tail
/// starts).
type Bufs = (Vec<nccl::DevBuffer>, u64, u64, u64);

#[allow(clippy::too_many_arguments)]
fn check_typed<T: Elem>(
    ranks: &Ranks,
    coll: Coll,
    count: usize,
    op: ReduceOp,
    root: usize,
    in_place: bool,
    seed: u64,
    drive: Drive,
) -> Result<(), String> {
    let dt = T::DTYPE;
    let op = typed_op(op, dt);
    let lent = lend(&ranks.comms);
    let (comms, streams) = (&lent[..], &ranks.streams);
    let n = comms[0].count();
    let (in_len, out_len) = match coll {
        Coll::AllGather => (count, n * count),
        Coll::ReduceScatter => (n * count, count),
        _ => (count, count),
    };
    // Every process computes every rank's input (they depend on the seed and rank only), so the
    // reference is the same whether the ranks live here or in other processes.
    let inputs: Vec<Vec<T>> = (0..n).map(|r| input::<T>(in_len, op, seed, r, n)).collect();
    let want = expected(coll, &inputs, count, op, root);
    let size = std::mem::size_of::<T>();
    let e = |e: nccl::Error| e.to_string();
    let mut bufs: Vec<Bufs> = Vec::new();
    for c in comms.iter() {
        let r = c.rank();
        let dev = c.device();
        let x = to_bytes(&inputs[r]);
        if in_place {
            let len = in_len.max(out_len) * size;
            let b = dev.alloc(len + TAIL).map_err(e)?;
            b.write(0, &vec![POISON; len + TAIL]).map_err(e)?;
            let (s, o) = match coll {
                Coll::AllGather => ((r * count * size) as u64, 0),
                Coll::ReduceScatter => (0, (r * count * size) as u64),
                _ => (0, 0),
            };
            b.write(s as usize, x).map_err(e)?;
            let (sp, rp, tail) = (b.ptr() + s, b.ptr() + o, b.ptr() + len as u64);
            bufs.push((vec![b], sp, rp, tail));
        } else {
            let sb = dev.alloc((in_len * size).max(1)).map_err(e)?;
            sb.write(0, x).map_err(e)?;
            let len = out_len * size;
            let rb = dev.alloc(len + TAIL).map_err(e)?;
            rb.write(0, &vec![POISON; len + TAIL]).map_err(e)?;
            let (sp, rp, tail) = (sb.ptr(), rb.ptr(), rb.ptr() + len as u64);
            bufs.push((vec![sb, rb], sp, rp, tail));
        }
    }
    let call = |i: usize| -> Result<(), String> {
        let (c, s, (_, sp, rp, _)) = (&comms[i], streams[i], &bufs[i]);
        match coll {
            Coll::AllReduce => unsafe { c.all_reduce_raw(*sp, *rp, count, dt, op, s) },
            Coll::Broadcast => unsafe { c.broadcast_raw(*sp, *rp, count, dt, root, s) },
            Coll::Reduce => unsafe { c.reduce_raw(*sp, *rp, count, dt, op, root, s) },
            Coll::AllGather => unsafe { c.all_gather_raw(*sp, *rp, count, dt, s) },
            Coll::ReduceScatter => unsafe { c.reduce_scatter_raw(*sp, *rp, count, dt, op, s) },
        }
        .map_err(e)
    };
    let sync_all = || -> Result<(), String> {
        for (c, s) in comms.iter().zip(streams) {
            c.device().stream_sync(*s).map_err(e)?;
        }
        Ok(())
    };
    match drive {
        Drive::OneThread => {
            for i in 0..comms.len() {
                call(i)?;
            }
            sync_all()?;
        }
        Drive::Group => {
            nccl::group_start();
            let r: Result<(), String> = (0..comms.len()).try_for_each(call);
            let end = nccl::group_end().map(|_| ()).map_err(e);
            r?;
            end?;
            sync_all()?;
        }
        Drive::ThreadPerRank => {
            let rs: Vec<Result<(), String>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..comms.len())
                    .map(|i| {
                        let call = &call;
                        s.spawn(move || {
                            call(i)?;
                            comms[i].device().stream_sync(streams[i]).map_err(e)
                        })
                    })
                    .collect();
                hs.into_iter()
                    .map(|h| {
                        h.join()
                            .unwrap_or_else(|_| Err("rank thread panicked".into()))
                    })
                    .collect()
            });
            rs.into_iter().collect::<Result<Vec<_>, _>>()?;
        }
    }
    for (i, c) in comms.iter().enumerate() {
        let what = format!(
            "{} {} {:?} count {count} root {root} {} rank {}",
            coll.name(),
            dt.name(),
            op,
            if in_place { "in-place" } else { "out-of-place" },
            c.rank()
        );
        let mut tail = vec![0u8; TAIL];
        // SAFETY: the test's own buffers, idle after the synchronization above.
        unsafe { c.device().copy_dtoh_raw(&mut tail, bufs[i].3) }.map_err(e)?;
        check_tail(&tail, &what)?;
        let Some(want) = &want[c.rank()] else {
            continue;
        };
        let mut out = vec![0u8; out_len * size];
        // SAFETY: as above.
        unsafe { c.device().copy_dtoh_raw(&mut out, bufs[i].2) }.map_err(e)?;
        compare_bytes(&out, want, &what)?;
    }
    Ok(())
}

/// Every element type and reduction at each count, alternating in-place and out-of-place.
pub fn type_op_matrix(ranks: &Ranks, counts: &[usize], drive: Drive) {
    let counts = &super::matrix_counts(counts)[..];
    for (k, dt) in super::matrix_types().into_iter().enumerate() {
        for op in ALL_OPS {
            for (i, &count) in counts.iter().enumerate() {
                let in_place = (i + k) % 2 == 1;
                check_all_reduce(ranks, count, dt, op, in_place, (k * 100 + i) as u64, drive)
                    .unwrap_or_else(|e| panic!("{} ranks: {e}", ranks.comms[0].count()));
            }
        }
    }
}

/// Every collective with every type, a rotating reduction and root, at each count, in-place and
/// out-of-place.
pub fn collective_matrix(ranks: &Ranks, counts: &[usize], drive: Drive) {
    let n = ranks.comms[0].count();
    let counts = &super::matrix_counts(counts)[..];
    let types = super::matrix_types();
    for coll in Coll::ALL {
        for (k, dt) in types.iter().copied().enumerate() {
            for (i, &count) in counts.iter().enumerate() {
                for in_place in [false, true] {
                    let op = ALL_OPS[(k + i) % ALL_OPS.len()];
                    let root = (k + i + 1) % n;
                    check_collective(
                        ranks,
                        coll,
                        count,
                        dt,
                        op,
                        root,
                        in_place,
                        (k * 1000 + i) as u64,
                        drive,
                    )
                    .unwrap_or_else(|e| panic!("{n} ranks: {e}"));
                }
            }
        }
    }
}

/// Communicators on `n` simulated GPUs of a process whose environment forces a protocol (an
/// `isolated` child), each checked to choose `proto` even for 1 GiB: the setting reached them.
pub fn forced_protocol_comms(n: usize, proto: nccl::tune::Proto) -> Ranks {
    let ranks = super::sim_ranks(n);
    for c in &ranks.comms {
        let big = c.tuning(nccl::Coll::AllReduce, 1 << 30).expect("a choice");
        assert_eq!(big.proto, proto, "the forced protocol at every size");
    }
    ranks
}
