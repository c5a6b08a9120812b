//! Input data, the host reference (the device crate's own arithmetic) and the check of a
//! call's results against it.

use crate::collective::Call;
use crate::ranks::{Bench, Lib};
use nccl::{DataType, RedOpKind, Scalar};
use nccl_device::types::Elem;
use nccl_device::with_elem;

/// Inputs repeat with this period (a prime, so that no power-of-two chunking lines up with it):
/// the reference is computed once per period and large buffers are filled by copies.
const PERIOD: usize = 9973;

/// xorshift*: deterministic data from a seed.
struct Rng(u64);
impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// One ulp at 1.0.
fn epsilon(dt: DataType) -> f64 {
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

pub fn encode<T: Elem>(v: &[T]) -> Vec<u8> {
    let size = std::mem::size_of::<T>();
    let mut out = Vec::with_capacity(std::mem::size_of_val(v));
    for x in v {
        out.extend_from_slice(&x.to_bits().to_le_bytes()[..size]);
    }
    out
}

fn decode<T: Elem>(b: &[u8]) -> T {
    let mut w = [0u8; 8];
    w[..b.len()].copy_from_slice(b);
    T::from_bits(u64::from_le_bytes(w))
}

/// What one check uploads and compares with, one period of each, encoded as device bytes.
pub struct CheckData {
    pub dt: DataType,
    /// Each rank's input.
    pub inputs: Vec<Vec<u8>>,
    /// The element-wise reduction of every rank's input (what AllReduce, Reduce and
    /// ReduceScatter produce).
    pub reduced: Vec<u8>,
    /// Per-element tolerance of `reduced` (0 for exact).
    pub tol: Vec<f64>,
}

/// Where a stretch of a rank's expected output comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Src {
    /// A rank's input, copied exactly.
    Input(usize),
    /// The reduction of every input, within the tolerance.
    Reduced,
}

/// `elems` elements of a rank's output: the period of `src`, starting at element `phase` of it.
#[derive(Clone, Copy, Debug)]
pub struct Seg {
    pub src: Src,
    pub phase: usize,
    pub elems: usize,
}

/// A rank's expected output: its stretches in order (covering the whole output), and whether
/// the collective defines it at all (Reduce leaves non-root outputs alone).
pub struct Expect {
    pub segs: Vec<Seg>,
    pub defined: bool,
}

impl CheckData {
    /// The period of `src` rotated to start at element `phase`, and its tolerance (None: the
    /// bytes must match exactly).
    fn pattern(&self, src: Src, phase: usize) -> (Vec<u8>, Option<Vec<f64>>) {
        let size = self.dt.size();
        let k = phase % PERIOD;
        let rotate = |v: &[u8]| [&v[k * size..], &v[..k * size]].concat();
        match src {
            Src::Input(r) => (rotate(&self.inputs[r]), None),
            Src::Reduced => (
                rotate(&self.reduced),
                Some([&self.tol[k..], &self.tol[..k]].concat()),
            ),
        }
    }
}

pub fn make_inputs<T: Elem>(op: RedOpKind, seed: u64, rank: usize) -> Vec<T> {
    let mut rng = Rng::new(seed ^ ((rank as u64 + 1) << 32));
    (0..PERIOD)
        .map(|_| {
            if T::IS_FLOAT {
                match op {
                    RedOpKind::Prod => T::from_f64(rng.uniform(0.5, 1.5)),
                    _ => T::from_f64(rng.uniform(-4.0, 4.0)),
                }
            } else {
                match op {
                    RedOpKind::Prod => T::from_f64((rng.next() % 3) as f64 + 1.0),
                    _ => T::from_bits(rng.next() % 100),
                }
            }
        })
        .collect()
}

/// The reduction of every rank's input, element by element, and its tolerance.
pub fn reduce_ref<T: Elem>(inputs: &[Vec<T>], op: RedOpKind, dt: DataType) -> (Vec<T>, Vec<f64>) {
    use nccl_device::ops::{Avg, Max, Min, PreMulSum, Prod, RedOp, Sum};
    fn fold<T: Elem, O: RedOp<T>>(inputs: &[Vec<T>], o: O, i: usize) -> (T, f64) {
        let mut acc = o.pre(inputs[0][i]);
        let mut mag = acc.to_f64().abs();
        for x in &inputs[1..] {
            let v = o.pre(x[i]);
            mag += v.to_f64().abs();
            acc = o.reduce(acc, v);
        }
        (o.post(acc), mag)
    }
    let n = inputs.len();
    let eps = epsilon(dt);
    let scalar = match crate::args::ours(op, dt).scalar() {
        Some(Scalar::Host(bits)) => bits,
        _ => 0,
    };
    (0..PERIOD)
        .map(|i| {
            let (v, mag) = match op {
                RedOpKind::Sum => fold(inputs, <Sum as RedOp<T>>::new(0), i),
                RedOpKind::Prod => fold(inputs, <Prod as RedOp<T>>::new(0), i),
                RedOpKind::Max => fold(inputs, <Max as RedOp<T>>::new(0), i),
                RedOpKind::Min => fold(inputs, <Min as RedOp<T>>::new(0), i),
                RedOpKind::Avg => fold(inputs, <Avg<T> as RedOp<T>>::new(n as u64), i),
                RedOpKind::PreMulSum => fold(inputs, <PreMulSum<T> as RedOp<T>>::new(scalar), i),
            };
            let tol = if !T::IS_FLOAT {
                0.0
            } else {
                match op {
                    RedOpKind::Max | RedOpKind::Min => 0.0,
                    RedOpKind::Prod => 2.0 * n as f64 * eps * v.to_f64().abs(),
                    _ => 2.0 * n as f64 * eps * mag.max(1.0),
                }
            };
            (v, tol)
        })
        .unzip()
}

/// Elements of `got` (periodic expectation `want`) outside the tolerance; `tol` None: exact.
fn count_wrong<T: Elem>(got: &[u8], want: &[u8], tol: Option<&[f64]>) -> usize {
    let size = std::mem::size_of::<T>();
    let mut wrong = 0;
    for chunk in got.chunks(want.len()) {
        let w = &want[..chunk.len()];
        if chunk == w {
            continue;
        }
        for (k, (g, w)) in chunk
            .chunks_exact(size)
            .zip(w.chunks_exact(size))
            .enumerate()
        {
            if g == w {
                continue;
            }
            let Some(tol) = tol.filter(|_| T::IS_FLOAT) else {
                wrong += 1;
                continue;
            };
            let (g, w) = (decode::<T>(g).to_f64(), decode::<T>(w).to_f64());
            if !((g - w).abs() <= tol[k] || (g.is_nan() && w.is_nan())) {
                wrong += 1;
            }
        }
    }
    wrong
}

/// Fills `out` with copies of `period`.
fn tile(period: &[u8], out: &mut [u8]) {
    for chunk in out.chunks_mut(period.len()) {
        chunk.copy_from_slice(&period[..chunk.len()]);
    }
}

impl Bench {
    /// One call on fresh inputs and poisoned outputs; the count of wrong elements, all ranks.
    pub fn check(&mut self, lib: Lib, call: &Call, data: &CheckData) -> Result<usize, String> {
        let n = self.nranks();
        let size = call.dt.size();
        let (send_bytes, recv_bytes) = call.coll.io_bytes(call.counts.count, size, n);
        let mut host = std::mem::take(&mut self.host);
        let res = (|| {
            for rank in &self.ranks {
                let r = rank.global;
                let dev = rank.comm.device();
                let (send, recv) = call.coll.pointers(rank, call);
                let e = |x: nccl::Error| format!("copy to device {}: {x}", dev.ordinal);
                // The whole output poisoned (every element differs from what is expected
                // there), then the input: in place, it lies inside the output.
                let mut off = 0;
                for seg in call.coll.expect(r, n, call).segs {
                    let (want, _) = data.pattern(seg.src, seg.phase);
                    let poison: Vec<u8> = want.iter().map(|b| !b).collect();
                    let len = seg.elems * size;
                    tile(&poison, &mut host[off..off + len]);
                    off += len;
                }
                // SAFETY: the rank's own buffers (their sizes), idle between measurements.
                unsafe { dev.copy_htod_raw(recv, &host[..recv_bytes]) }.map_err(e)?;
                tile(&data.inputs[r], &mut host[..send_bytes]);
                // SAFETY: as above.
                unsafe { dev.copy_htod_raw(send, &host[..send_bytes]) }.map_err(e)?;
                // A copy from pageable memory may return before its DMA lands, and the
                // collective runs on a non-blocking stream: wait on the legacy stream that
                // carried the copies.
                nccl::Stream::legacy(dev).synchronize().map_err(e)?;
            }
            self.run(lib, call, 1, 0)?;
            let mut wrong = 0;
            for rank in &self.ranks {
                let expect = call.coll.expect(rank.global, n, call);
                if !expect.defined {
                    continue;
                }
                let dev = rank.comm.device();
                let (_, recv) = call.coll.pointers(rank, call);
                // SAFETY: the rank's own receive buffer, idle after the run.
                unsafe { dev.copy_dtoh_raw(&mut host[..recv_bytes], recv) }
                    .map_err(|x| format!("copy from device {}: {x}", dev.ordinal))?;
                let mut off = 0;
                for seg in expect.segs {
                    let (want, tol) = data.pattern(seg.src, seg.phase);
                    let got = &host[off..off + seg.elems * size];
                    wrong += with_elem!(data.dt, T => count_wrong::<T>(got, &want, tol.as_deref()));
                    off += got.len();
                }
            }
            Ok(wrong)
        })();
        self.host = host;
        res
    }
}
