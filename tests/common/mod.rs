//! Shared by the simulator and GPU suites: random inputs, poisoned outputs, a host reference
//! computed with the device crate's own element arithmetic, and the comparison (exact for
//! integers, a tolerance from the reduction depth for floats).
#![allow(dead_code)]

use nccl::{Comm, DataType, ReduceOp, StreamHandle};
use nccl_device::abi::Coll;
use nccl_device::types::Elem;

pub mod faults;
pub mod graphs;
pub mod netns;
pub mod register;

/// A small deterministic generator (xorshift*), so failures reproduce from the seed.
pub struct Rng(u64);
impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E3779B97F4A7C15) | 1)
    }
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545F4914F6CDD1D)
    }
    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

use nccl_device::with_elem;

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
    ReduceOp::Sum,
    ReduceOp::Prod,
    ReduceOp::Max,
    ReduceOp::Min,
    ReduceOp::Avg,
    ReduceOp::PreMulSum { scalar_bits: 0 }, // the scalar is filled in per type
];

/// The op with a scalar of the right type (PreMulSum by 0.5 for floats, 3 for integers).
pub fn typed_op(op: ReduceOp, dt: DataType) -> ReduceOp {
    match op {
        ReduceOp::PreMulSum { .. } => {
            let bits = with_elem!(dt, T => Elem::to_bits(T::from_f64(if dt.is_float() { 0.5 } else { 3.0 })));
            ReduceOp::PreMulSum { scalar_bits: bits }
        }
        o => o,
    }
}

/// A random input of `count` elements for rank `rank`, in a range where the op stays finite.
pub fn input<T: Elem>(count: usize, op: ReduceOp, seed: u64, rank: usize) -> Vec<T> {
    let mut rng = Rng::new(seed ^ ((rank as u64 + 1) << 32));
    (0..count)
        .map(|_| {
            if T::IS_FLOAT {
                match op {
                    ReduceOp::Prod => T::from_f64(rng.uniform(0.5, 1.5)),
                    _ => T::from_f64(rng.uniform(-4.0, 4.0)),
                }
            } else {
                match op {
                    ReduceOp::Prod => T::from_f64((rng.next() % 3) as f64 + 1.0),
                    _ => T::from_bits(rng.next() % 100),
                }
            }
        })
        .collect()
}

/// The reference result and a per-element tolerance.
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
    let n = inputs.len() as f64;
    let eps = epsilon(dt);
    let count = inputs[0].len();
    (0..count)
        .map(|i| {
            let (v, mag) = match op {
                ReduceOp::Sum => fold(inputs, <Sum as RedOp<T>>::new(0), i),
                ReduceOp::Prod => fold(inputs, <Prod as RedOp<T>>::new(0), i),
                ReduceOp::Max => fold(inputs, <Max as RedOp<T>>::new(0), i),
                ReduceOp::Min => fold(inputs, <Min as RedOp<T>>::new(0), i),
                ReduceOp::Avg => fold(inputs, <Avg<T> as RedOp<T>>::new(inputs.len() as u64), i),
                ReduceOp::PreMulSum { scalar_bits } => {
                    fold(inputs, <PreMulSum<T> as RedOp<T>>::new(scalar_bits), i)
                }
                ReduceOp::PreMulSumDevice { .. } => {
                    panic!("reference: pass the device scalar's value as PreMulSum")
                }
                other => panic!("reference: no model of {other:?}"),
            };
            let tol = match op {
                ReduceOp::Max | ReduceOp::Min => 0.0,
                ReduceOp::Prod => 2.0 * n * eps * v.to_f64().abs(),
                _ => 2.0 * n * eps * mag.max(1.0),
            };
            (v, tol)
        })
        .collect()
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
            (g - w).abs() <= *tol || (g.is_nan() && w.is_nan())
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

pub fn to_bytes<T: Copy>(v: &[T]) -> &[u8] {
    // SAFETY: plain element types without padding.
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const u8, std::mem::size_of_val(v)) }
}

pub fn from_bytes<T: Elem>(b: &[u8]) -> Vec<T> {
    let n = b.len() / std::mem::size_of::<T>();
    // SAFETY: reads n elements of plain data from b (unaligned reads).
    (0..n)
        .map(|i| unsafe { std::ptr::read_unaligned((b.as_ptr() as *const T).add(i)) })
        .collect()
}

/// How the test drives the ranks of one process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drive {
    /// One thread launches on every communicator in turn.
    OneThread,
    /// A thread per communicator.
    ThreadPerRank,
    /// One thread, every launch inside ncclGroupStart/End.
    Group,
}

/// Communicators with a stream each (tests running side by side must not share the default
/// stream: two collectives queued in different orders on two devices would wait on each other).
/// A communicator lent to the one thread that issues on it, in the thread-per-rank drives.
#[derive(Clone, Copy)]
pub struct OnItsThread<'a>(pub &'a Comm);

// SAFETY: every field of a `Comm` is thread-safe; `Comm` withholds `Sync` only so that two
// threads never issue on it at once. The drives that lend communicators give each rank's to
// exactly one thread at a time (its rank thread, or this one before and after them).
unsafe impl Send for OnItsThread<'_> {}
// SAFETY: as for `Send`.
unsafe impl Sync for OnItsThread<'_> {}

impl std::ops::Deref for OnItsThread<'_> {
    type Target = Comm;
    fn deref(&self) -> &Comm {
        self.0
    }
}

/// The communicators, to be lent one per thread (see [`OnItsThread`]).
pub fn lend(comms: &[Comm]) -> Vec<OnItsThread<'_>> {
    comms.iter().map(OnItsThread).collect()
}

pub struct Ranks {
    pub comms: Vec<Comm>,
    pub streams: Vec<StreamHandle>,
}

impl Ranks {
    /// With a non-blocking stream each.
    pub fn new(comms: Vec<Comm>) -> Ranks {
        Ranks::with_streams(comms, |d| d.stream_create())
    }

    /// With a blocking stream each (ordered with the legacy default stream, as
    /// `cudaStreamCreate` makes them).
    pub fn blocking(comms: Vec<Comm>) -> Ranks {
        Ranks::with_streams(comms, |d| d.stream_create_blocking())
    }

    fn with_streams(
        comms: Vec<Comm>,
        create: impl Fn(&nccl::Device) -> nccl::Result<StreamHandle>,
    ) -> Ranks {
        let streams = comms
            .iter()
            .map(|c| create(c.device()).expect("create a stream"))
            .collect();
        Ranks { comms, streams }
    }
}

impl Drop for Ranks {
    fn drop(&mut self) {
        for (c, s) in self.comms.iter().zip(&self.streams) {
            let _ = c.device().stream_destroy(*s);
        }
    }
}

/// Runs one AllReduce on every communicator with fresh random data and poisoned outputs, and
/// checks every rank's result.
pub fn check_all_reduce(
    ranks: &Ranks,
    count: usize,
    dt: DataType,
    op: ReduceOp,
    in_place: bool,
    seed: u64,
    drive: Drive,
) -> Result<(), String> {
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
                (DataType::Float32, ReduceOp::Sum),
                (DataType::Int32, ReduceOp::Max),
                (DataType::Bfloat16, ReduceOp::Sum),
                (DataType::Int64, ReduceOp::Prod),
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

/// Runs one collective on every communicator with fresh random data and poisoned outputs, and
/// checks every rank's result against the host reference.
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
) -> Result<(), String> {
    with_elem!(dt, T => check_typed::<T>(ranks, coll, count, op, root, in_place, seed, drive))
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
    let inputs: Vec<Vec<T>> = (0..n).map(|r| input::<T>(in_len, op, seed, r)).collect();
    let want = expected(coll, &inputs, count, op, root);
    let size = std::mem::size_of::<T>();
    let e = |e: nccl::Error| e.to_string();
    // (buffers kept alive, send pointer, recv pointer) per local communicator.
    let mut bufs = Vec::new();
    for c in comms.iter() {
        let r = c.rank();
        let dev = c.device();
        let x = to_bytes(&inputs[r]);
        if in_place {
            let len = in_len.max(out_len) * size;
            let b = dev.alloc(len.max(1)).map_err(e)?;
            b.write(0, &vec![0xA5u8; len]).map_err(e)?;
            let (s, o) = match coll {
                Coll::AllGather => ((r * count * size) as u64, 0),
                Coll::ReduceScatter => (0, (r * count * size) as u64),
                _ => (0, 0),
            };
            b.write(s as usize, x).map_err(e)?;
            let (sp, rp) = (b.ptr() + s, b.ptr() + o);
            bufs.push((vec![b], sp, rp));
        } else {
            let sb = dev.alloc((in_len * size).max(1)).map_err(e)?;
            sb.write(0, x).map_err(e)?;
            let rb = dev.alloc((out_len * size).max(1)).map_err(e)?;
            rb.write(0, &vec![0xA5u8; out_len * size]).map_err(e)?; // poison
            let (sp, rp) = (sb.ptr(), rb.ptr());
            bufs.push((vec![sb, rb], sp, rp));
        }
    }
    let call = |i: usize| -> Result<(), String> {
        let (c, s, (_, sp, rp)) = (&comms[i], streams[i], &bufs[i]);
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
        let Some(want) = &want[c.rank()] else {
            continue;
        };
        let mut out = vec![0u8; out_len * size];
        // SAFETY: the test's own output buffer, idle after the synchronization above.
        unsafe { c.device().copy_dtoh_raw(&mut out, bufs[i].2) }.map_err(e)?;
        compare(
            &from_bytes::<T>(&out),
            want,
            &format!(
                "{} {} {:?} count {count} root {root} {} rank {}",
                coll.name(),
                dt.name(),
                op,
                if in_place { "in-place" } else { "out-of-place" },
                c.rank()
            ),
        )?;
    }
    Ok(())
}

/// For a test binary that forces one protocol (or another parameter, e.g. the slice steps):
/// sets `env` once per process (before the first communicator) and chooses the simulator.
pub fn use_forced_protocol(env: &[(&str, &str)]) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for (k, v) in env {
            std::env::set_var(k, v);
        }
    });
    nccl::cuda::set_backend(nccl::Backend::Sim).expect("choose the simulator");
}

/// Communicators on `n` simulated GPUs under [`use_forced_protocol`]`(env)`, each checked to
/// choose `proto` even for 1 GiB.
pub fn forced_protocol_comms(
    n: usize,
    env: &'static [(&'static str, &'static str)],
    proto: nccl::tune::Proto,
) -> Ranks {
    use_forced_protocol(env);
    let devs: Vec<i32> = (0..n as i32).collect();
    let comms = Comm::init_all(&devs).expect("init_all on the simulator");
    for c in &comms {
        let big = c.tuning(nccl::Coll::AllReduce, 1 << 30).expect("a choice");
        assert_eq!(big.proto, proto, "{env:?} selects {proto:?} at every size");
    }
    Ranks::new(comms)
}

/// The element types of the matrices: all of them, or those NCCL_RS_TEST_TYPES names by their
/// NCCL names (e.g. `float,int8`), for slow runs such as compute-sanitizer's, which cannot afford
/// every kernel family. A name that is no type is an error; stderr says what was left out.
pub fn matrix_types() -> Vec<DataType> {
    let Ok(list) = std::env::var("NCCL_RS_TEST_TYPES") else {
        return DataType::ALL.to_vec();
    };
    let picked: Vec<DataType> = list
        .split(',')
        .map(|s| {
            let s = s.trim();
            DataType::ALL
                .into_iter()
                .find(|t| t.name() == s)
                .unwrap_or_else(|| panic!("NCCL_RS_TEST_TYPES: no type named {s:?}"))
        })
        .collect();
    eprintln!(
        "NCCL_RS_TEST_TYPES={list}: these types only, of all {}",
        DataType::ALL.len()
    );
    picked
}

/// The counts of the matrices: `counts`, or with NCCL_RS_TEST_MAX_COUNT=M each count above M
/// replaced by M (duplicates dropped), for slow runs; stderr says so.
pub fn matrix_counts(counts: &[usize]) -> Vec<usize> {
    let Ok(max) = std::env::var("NCCL_RS_TEST_MAX_COUNT") else {
        return counts.to_vec();
    };
    let max: usize = max.trim().parse().expect("NCCL_RS_TEST_MAX_COUNT: a count");
    let mut out: Vec<usize> = Vec::new();
    for &c in counts {
        let c = c.min(max);
        if !out.contains(&c) {
            out.push(c);
        }
    }
    if out != counts {
        eprintln!("NCCL_RS_TEST_MAX_COUNT={max}: counts {out:?} instead of {counts:?}");
    }
    out
}

/// Every element type and reduction at each count, alternating in-place and out-of-place.
pub fn type_op_matrix(ranks: &Ranks, counts: &[usize], drive: Drive) {
    let counts = &matrix_counts(counts)[..];
    for (k, dt) in matrix_types().into_iter().enumerate() {
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
    let counts = &matrix_counts(counts)[..];
    let types = matrix_types();
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

/// Multi-process tests: the parent starts `nranks` copies of the current test binary running
/// test `test_name`, each told its rank and the unique id through the environment.
pub mod procs {
    use nccl::UniqueId;

    const RANK: &str = "NCCL_RS_TEST_RANK";
    const NRANKS: &str = "NCCL_RS_TEST_NRANKS";
    const ID: &str = "NCCL_RS_TEST_ID";

    /// In a child: (rank, nranks, id).
    pub fn child() -> Option<(usize, usize, UniqueId)> {
        let rank = std::env::var(RANK).ok()?.parse().ok()?;
        let nranks = std::env::var(NRANKS).ok()?.parse().ok()?;
        let hex = std::env::var(ID).ok()?;
        let mut id = UniqueId {
            internal: [0; nccl::UNIQUE_ID_BYTES],
        };
        for (i, b) in id.internal.iter_mut().enumerate() {
            *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some((rank, nranks, id))
    }

    /// In the parent: runs the children and fails with their output if any fails.
    pub fn run(test_name: &str, nranks: usize, extra_env: &[(&str, &str)]) {
        run_each(test_name, nranks, extra_env, |_| Vec::new());
    }

    /// Ranks as `nodes` × `per_node` processes: rank r runs on node r / per_node, told so by
    /// its own `NCCL_HOSTID`, so that ranks of different nodes reach each other only through
    /// the network (on this machine's loopback unless `extra_env` says otherwise).
    pub fn run_nodes(test_name: &str, nodes: usize, per_node: usize, extra_env: &[(&str, &str)]) {
        run_each(test_name, nodes * per_node, extra_env, |r| {
            vec![("NCCL_HOSTID".into(), format!("test-node-{}", r / per_node))]
        });
    }

    /// As [`run_nodes`], where rank `victim` is expected to die (it kills itself): its exit
    /// is not checked and does not stop the others, which must pass.
    pub fn run_nodes_with_victim(
        test_name: &str,
        nodes: usize,
        per_node: usize,
        extra_env: &[(&str, &str)],
        victim: usize,
    ) {
        run_inner(test_name, nodes * per_node, extra_env, Some(victim), |r| {
            vec![("NCCL_HOSTID".into(), format!("test-node-{}", r / per_node))]
        });
    }

    /// As [`run`], with environment of each rank's own from `per_rank`.
    pub fn run_each(
        test_name: &str,
        nranks: usize,
        extra_env: &[(&str, &str)],
        per_rank: impl Fn(usize) -> Vec<(String, String)>,
    ) {
        run_inner(test_name, nranks, extra_env, None, per_rank)
    }

    fn run_inner(
        test_name: &str,
        nranks: usize,
        extra_env: &[(&str, &str)],
        victim: Option<usize>,
        per_rank: impl Fn(usize) -> Vec<(String, String)>,
    ) {
        // The root this parent starts listens on loopback, like the ranks (NCCL_SOCKET_IFNAME
        // reaches only the children): tests never use an address of a real interface.
        if std::env::var_os("NCCL_SOCKET_IFNAME").is_none() {
            std::env::set_var("NCCL_SOCKET_IFNAME", "lo");
        }
        let id = nccl::get_unique_id().expect("unique id");
        let hex: String = id.internal.iter().map(|b| format!("{b:02x}")).collect();
        let exe = std::env::current_exe().expect("test binary path");
        let children: Vec<_> = (0..nranks)
            .map(|r| {
                let mut cmd = std::process::Command::new(&exe);
                cmd.args([
                    test_name,
                    "--exact",
                    "--include-ignored",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(RANK, r.to_string())
                .env(NRANKS, nranks.to_string())
                .env(ID, &hex);
                for (k, v) in extra_env {
                    cmd.env(k, v);
                }
                for (k, v) in per_rank(r) {
                    cmd.env(k, v);
                }
                cmd.stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped());
                cmd.spawn().expect("start a rank process")
            })
            .collect();
        // Collect output on threads (pipes must not fill up); when one rank fails, the others
        // are killed, since they would wait on it forever.
        let mut children: Vec<_> = children
            .into_iter()
            .map(|mut c| {
                let mut so = c.stdout.take().expect("piped stdout");
                let mut se = c.stderr.take().expect("piped stderr");
                let t = std::thread::spawn(move || {
                    use std::io::Read;
                    let mut text = String::new();
                    let _ = so.read_to_string(&mut text);
                    let _ = se.read_to_string(&mut text);
                    text
                });
                (c, Some(t), None)
            })
            .collect();
        // A fresh GPU host JIT-compiles every kernel family a rank process loads (minutes for
        // the type matrix); NCCL_RS_TEST_PROC_LIMIT_S raises the limit for such runs.
        let limit_s = std::env::var("NCCL_RS_TEST_PROC_LIMIT_S")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(240);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(limit_s);
        loop {
            let mut running = 0;
            let mut any_failed = false;
            for (r, (c, _, status)) in children.iter_mut().enumerate() {
                if status.is_none() {
                    match c.try_wait() {
                        Ok(Some(s)) => *status = Some(s),
                        _ => running += 1,
                    }
                }
                if Some(r) != victim
                    && status.is_some_and(|s: std::process::ExitStatus| !s.success())
                {
                    any_failed = true;
                }
            }
            if running == 0 {
                break;
            }
            // A victim still there once every other rank is done (stopped, or hung on
            // purpose) is killed: nothing is left behind.
            if let Some(v) = victim {
                let others_done = children
                    .iter()
                    .enumerate()
                    .all(|(r, (_, _, status))| r == v || status.is_some());
                if others_done {
                    let _ = children[v].0.kill();
                }
            }
            if any_failed || std::time::Instant::now() > deadline {
                for (c, _, _) in children.iter_mut() {
                    let _ = c.kill();
                }
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let mut failed = Vec::new();
        for (r, (_, t, status)) in children.iter_mut().enumerate() {
            let text = t.take().and_then(|t| t.join().ok()).unwrap_or_default();
            if Some(r) == victim {
                continue;
            }
            let ok = status.is_some_and(|s| s.success());
            if std::env::var_os("NCCL_RS_TEST_SHOW_RANKS").is_some() {
                eprintln!("--- rank {r} ({status:?}):\n{text}");
            }
            // A child that ran no test (wrong name) must not count as a pass.
            if !ok || !text.contains("1 passed") {
                failed.push(format!("rank {r} ({status:?}):\n{text}"));
            }
        }
        assert!(
            failed.is_empty(),
            "rank processes failed:\n{}",
            failed.join("\n")
        );
    }
}

/// All-to-all through ncclSend/ncclRecv in one group, a different size for every (sender,
/// receiver) pair (`scale` elements and up), self included; checks every received block.
pub fn check_all_to_all(ranks: &Ranks, scale: usize, drive: Drive) -> Result<(), String> {
    let n = ranks.comms[0].count();
    let count = |from: usize, to: usize| scale + 7 * from + 3 * to;
    let value = |from: usize, to: usize, i: usize| ((from * 1000 + to) * 100_000 + i) as i32;
    let e = |e: nccl::Error| e.to_string();
    // Per local rank: (send buffers by peer, recv buffers by peer).
    let mut bufs = Vec::new();
    for c in &ranks.comms {
        let r = c.rank();
        let mut sends = Vec::new();
        let mut recvs = Vec::new();
        for p in 0..n {
            let data: Vec<i32> = (0..count(r, p)).map(|i| value(r, p, i)).collect();
            let s = c.device().alloc(data.len() * 4).map_err(e)?;
            s.write(0, to_bytes(&data)).map_err(e)?;
            let rb = c.device().alloc(count(p, r) * 4).map_err(e)?;
            rb.write(0, &vec![0xA5; count(p, r) * 4]).map_err(e)?;
            sends.push(s);
            recvs.push(rb);
        }
        bufs.push((sends, recvs));
    }
    let lent = lend(&ranks.comms);
    let (comms, streams) = (&lent[..], &ranks.streams);
    let issue = |i: usize| -> Result<(), String> {
        let c = &comms[i];
        let r = c.rank();
        for p in 0..n {
            unsafe {
                c.send_raw(
                    bufs[i].0[p].ptr(),
                    count(r, p),
                    DataType::Int32,
                    p,
                    streams[i],
                )
            }
            .map_err(e)?;
            unsafe {
                c.recv_raw(
                    bufs[i].1[p].ptr(),
                    count(p, r),
                    DataType::Int32,
                    p,
                    streams[i],
                )
            }
            .map_err(e)?;
        }
        Ok(())
    };
    match drive {
        Drive::ThreadPerRank => {
            let rs: Vec<Result<(), String>> = std::thread::scope(|s| {
                let hs: Vec<_> = (0..ranks.comms.len())
                    .map(|i| {
                        let issue = &issue;
                        s.spawn(move || {
                            nccl::group_start();
                            let r = issue(i);
                            let end = nccl::group_end().map(|_| ()).map_err(e);
                            r.and(end)
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
        _ => {
            nccl::group_start();
            let r = (0..ranks.comms.len()).try_for_each(issue);
            let end = nccl::group_end().map(|_| ()).map_err(e);
            r?;
            end?;
        }
    }
    for (i, c) in ranks.comms.iter().enumerate() {
        c.device().stream_sync(ranks.streams[i]).map_err(e)?;
        let r = c.rank();
        for p in 0..n {
            let mut out = vec![0u8; count(p, r) * 4];
            bufs[i].1[p].read(0, &mut out).map_err(e)?;
            let got = from_bytes::<i32>(&out);
            if let Some(k) = (0..got.len()).find(|&k| got[k] != value(p, r, k)) {
                return Err(format!(
                    "all-to-all, {n} ranks: rank {r} from {p}: element {k} of {} is {} want {}",
                    got.len(),
                    got[k],
                    value(p, r, k)
                ));
            }
        }
    }
    Ok(())
}

/// Flow control under pressure: `n` simulated ranks, an in-place float AllReduce of 2^18
/// elements (many FIFO steps per channel), the last rank launching 300 ms after the others so that senders run ahead of it
/// as far as the ring allows; every rank's result is checked.
pub fn late_rank_all_reduce(n: usize) {
    late_rank_all_reduce_at(n, n - 1);
}

/// [`late_rank_all_reduce`] with rank `late` the late one.
pub fn late_rank_all_reduce_at(n: usize, late: usize) {
    let comms =
        Comm::init_all(&(0..n as i32).collect::<Vec<_>>()).expect("init the simulated ranks");
    // Many steps per channel: 64 KiB FIFOs of 8 slots, so a 1 MiB buffer takes many pieces.
    let count = 1 << 18;
    let inputs: Vec<Vec<f32>> = (0..n)
        .map(|r| input::<f32>(count, ReduceOp::Sum, 99, r))
        .collect();
    let want = reference(&inputs, ReduceOp::Sum, DataType::Float32);
    let streams: Vec<_> = comms
        .iter()
        .map(|c| c.device().stream_create().unwrap())
        .collect();
    let bufs: Vec<_> = comms
        .iter()
        .zip(&inputs)
        .map(|(c, x)| {
            let b = c.device().alloc(count * 4).unwrap();
            b.write(0, to_bytes(x)).unwrap();
            b
        })
        .collect();
    // Every other rank first; the late one 300 ms after.
    let order = (0..n).filter(|&i| i != late).chain([late]);
    for i in order {
        let c = &comms[i];
        if i == late {
            std::thread::sleep(std::time::Duration::from_millis(300));
        }
        unsafe {
            c.all_reduce_raw(
                bufs[i].ptr(),
                bufs[i].ptr(),
                count,
                DataType::Float32,
                ReduceOp::Sum,
                streams[i],
            )
        }
        .unwrap();
    }
    for (i, c) in comms.iter().enumerate() {
        c.device().stream_sync(streams[i]).unwrap();
        let mut out = vec![0u8; count * 4];
        bufs[i].read(0, &mut out).unwrap();
        compare(&from_bytes::<f32>(&out), &want, &format!("rank {i}"))
            .unwrap_or_else(|e| panic!("{e}"));
    }
}

/// Send/recv around the ring in one group, `count` i32 each way: every rank sends to the next
/// and receives from the previous, fresh data from `seed`, the receive buffer poisoned first.
pub fn check_ring_shift(ranks: &Ranks, count: usize, seed: u64) {
    let c = &ranks.comms[0];
    let (r, n) = (c.rank(), c.count());
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    // A different stream of values per (seed, sender), known to its receiver.
    let value = |from: usize, i: usize| {
        let x = (seed ^ (from as u64) << 40).wrapping_add(i as u64);
        (x.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 33) as i32
    };
    let data: Vec<i32> = (0..count).map(|i| value(r, i)).collect();
    let dev = c.device();
    let sb = dev.alloc(count * 4).expect("send buffer");
    sb.write(0, to_bytes(&data)).expect("write");
    let rb = dev.alloc(count * 4).expect("recv buffer");
    rb.write(0, &vec![0xA5; count * 4]).expect("poison");
    let st = ranks.streams[0];
    nccl::group_start();
    // SAFETY: both buffers hold `count` i32 and outlive the stream sync below.
    let sent = unsafe { c.send_raw(sb.ptr(), count, DataType::Int32, next, st) };
    let recvd = unsafe { c.recv_raw(rb.ptr(), count, DataType::Int32, prev, st) };
    let end = nccl::group_end();
    sent.and(recvd).expect("send/recv");
    end.expect("group end");
    dev.stream_sync(st).expect("sync");
    let mut out = vec![0u8; count * 4];
    rb.read(0, &mut out).expect("read");
    let got: Vec<i32> = from_bytes(&out);
    if let Some(k) = (0..count).find(|&k| got[k] != value(prev, k)) {
        panic!(
            "rank {r} from {prev}: element {k} of {count} is {} want {}",
            got[k],
            value(prev, k)
        );
    }
}
