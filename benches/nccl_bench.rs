//! `nccl_bench`: the performance tool of nccl-rs, in the style of nccl-tests, with NVIDIA NCCL
//! as the baseline in the same run (same buffers, same streams, same sizes, same timing code).
//!
//! ```text
//! cargo bench --bench nccl_bench -- -b 8 -e 128M -f 2 -g 4
//! cargo bench --bench nccl_bench -- -C all_gather -g 4
//! bench-nccl_bench -g 8 -C all -d all -o sum --baseline /usr/lib/x86_64-linux-gnu/libnccl.so.2
//! ```
//!
//! Sizes follow nccl-tests: the size column is the largest buffer a rank touches (for AllGather
//! and ReduceScatter, nranks × the per-rank count × the element size) and the count column is
//! the count argument of the call (the per-rank count for AllGather and ReduceScatter). In-place
//! calls use the receive buffer as NCCL defines it: AllGather's input is block `rank` of the
//! output, ReduceScatter's output is block `rank` of the input.
//!
//! The backend is CUDA when the driver shows at least one GPU, else the CPU simulator (said so
//! in the output). The simulator cannot be chosen after CUDA was probed in the same process, so
//! a failed probe re-runs this executable with `--backend sim`.
//!
//! Timing: an event per iteration boundary on every GPU's stream; an iteration's time is the
//! longest of the GPUs' times; the reported time is the median over the timed iterations.
//! Checking (`-c 1`): fresh data before the first call of every size, outputs poisoned, the
//! result compared with a host reference computed with the device crate's own arithmetic
//! (exact for integers, a tolerance from the reduction depth for floats).

use nccl::cuda::{self, Backend, DevBuffer, StreamHandle};
use nccl::{Comm, DataType, DevPtr, ReduceOp};
use nccl_device::types::Elem;
use std::ffi::{c_char, c_int, c_void, CStr, OsString};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

const USAGE: &str = "\
usage: nccl_bench [options]      (cargo bench --bench nccl_bench -- [options])
  -C, --collective NAME     all_reduce broadcast reduce all_gather reduce_scatter, or all
                            (one table each); a comma-separated list works too [all_reduce]
  -r, --root N              root rank of broadcast and reduce [0]
  -b, --minbytes SIZE       smallest size, bytes (K/M/G suffixes: powers of 1024) [8]
  -e, --maxbytes SIZE       largest size [128M; 1M on the simulator]
  -f, --stepfactor N        multiply the size by N at each step [2]
  -g, --ngpus N             GPUs to use (ranks 0..N-1 on devices 0..N-1) [all visible];
                            with NCCL_RS_SHARED_GPUS=1, ranks (any number) on devices r % visible
  -w, --warmup_iters N      untimed iterations before each measurement [5; 1 on the simulator]
  -n, --iters N             timed iterations; the median is reported [20; 5 on the simulator]
  -d, --datatype NAME       int8 uint8 int32 uint32 int64 uint64 half float double bfloat16
                            f8e4m3 f8e5m2, or all; a comma-separated list works too [float]
  -o, --op NAME             sum prod max min avg premulsum, or all; a list works too [sum]
  -c, --check 0|1           check the results of the first call of every size [1]
  -t, --mode thread|threads one thread drives every GPU, or a thread per GPU [thread]
      --baseline PATH       NVIDIA libnccl.so.2 to run side by side (CUDA backend only)
      --backend cuda|sim    CUDA GPUs or the CPU simulator [cuda if a GPU is visible, else sim]
  -h, --help                this text";

/// Set by the parent when it re-runs itself on the simulator: why CUDA was not used.
const REASON_ENV: &str = "NCCL_RS_BENCH_SIM_REASON";

use nccl_device::with_elem;

// ------------------------------------------------------------------------------------------
// Arguments
// ------------------------------------------------------------------------------------------

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// One thread launches on every GPU in turn (NVIDIA NCCL inside a group).
    Thread,
    /// A thread per GPU.
    Threads,
}

/// A reduction as the benchmark names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Sum,
    Prod,
    Max,
    Min,
    Avg,
    PreMulSum,
}

impl Op {
    const ALL: [Op; 6] = [Op::Sum, Op::Prod, Op::Max, Op::Min, Op::Avg, Op::PreMulSum];

    fn name(self) -> &'static str {
        match self {
            Op::Sum => "sum",
            Op::Prod => "prod",
            Op::Max => "max",
            Op::Min => "min",
            Op::Avg => "avg",
            Op::PreMulSum => "premulsum",
        }
    }

    fn parse(s: &str) -> Option<Op> {
        Op::ALL
            .into_iter()
            .find(|o| o.name().eq_ignore_ascii_case(s))
    }

    /// The op as nccl-rs takes it for `dt` (PreMulSum by 1, so the result is the sum).
    fn ours(self, dt: DataType) -> ReduceOp {
        match self {
            Op::Sum => ReduceOp::Sum,
            Op::Prod => ReduceOp::Prod,
            Op::Max => ReduceOp::Max,
            Op::Min => ReduceOp::Min,
            Op::Avg => ReduceOp::Avg,
            Op::PreMulSum => ReduceOp::PreMulSum {
                scalar_bits: with_elem!(dt, T => Elem::to_bits(T::from_f64(1.0))),
            },
        }
    }

    /// `ncclRedOp_t`; None where NCCL has no built-in (PreMulSum needs a user-created op).
    fn nccl(self) -> Option<c_int> {
        match self {
            Op::Sum => Some(0),
            Op::Prod => Some(1),
            Op::Max => Some(2),
            Op::Min => Some(3),
            Op::Avg => Some(4),
            Op::PreMulSum => None,
        }
    }
}

struct Args {
    colls: Vec<Collective>,
    root: usize,
    min_bytes: usize,
    max_bytes: Option<usize>,
    step_factor: usize,
    ngpus: Option<usize>,
    warmup: Option<usize>,
    iters: Option<usize>,
    dtypes: Vec<DataType>,
    ops: Vec<Op>,
    check: bool,
    mode: Mode,
    baseline: Option<PathBuf>,
    backend: Option<Backend>,
}

/// `8`, `64K`, `1M`, `2G`, `128MB`, `4KiB`: powers of 1024.
fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let digits = t.chars().take_while(|c| c.is_ascii_digit()).count();
    let (num, suffix) = t.split_at(digits);
    let n: usize = num
        .parse()
        .map_err(|_| format!("'{s}' is not a size (examples: 8, 64K, 1M, 2G)"))?;
    let shift = match suffix.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => {
            return Err(format!(
                "'{s}': unknown size suffix '{suffix}' (use K, M or G)"
            ))
        }
    };
    n.checked_mul(1usize << shift)
        .ok_or_else(|| format!("size '{s}' is too large"))
}

fn parse_number(s: &str, what: &str) -> Result<usize, String> {
    s.trim()
        .parse()
        .map_err(|_| format!("{what}: '{s}' is not a non-negative integer"))
}

fn parse_datatype(s: &str) -> Option<DataType> {
    let alias = match s.to_ascii_lowercase().as_str() {
        "char" => "int8",
        "int" => "int32",
        "float16" | "fp16" | "f16" => "half",
        "float32" | "fp32" | "f32" => "float",
        "float64" | "fp64" | "f64" => "double",
        "bf16" => "bfloat16",
        "fp8e4m3" | "float8e4m3" | "e4m3" => "f8e4m3",
        "fp8e5m2" | "float8e5m2" | "e5m2" => "f8e5m2",
        other => return DataType::ALL.into_iter().find(|d| d.name() == other),
    };
    DataType::ALL.into_iter().find(|d| d.name() == alias)
}

fn parse_datatypes(s: &str) -> Result<Vec<DataType>, String> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(DataType::ALL.to_vec());
    }
    s.split(',')
        .map(|n| {
            parse_datatype(n.trim()).ok_or_else(|| {
                let names: Vec<&str> = DataType::ALL.iter().map(|d| d.name()).collect();
                format!(
                    "unknown datatype '{n}' (one of {}, or all)",
                    names.join(" ")
                )
            })
        })
        .collect()
}

fn parse_ops(s: &str) -> Result<Vec<Op>, String> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(Op::ALL.to_vec());
    }
    s.split(',')
        .map(|n| {
            Op::parse(n.trim()).ok_or_else(|| {
                format!("unknown op '{n}' (one of sum prod max min avg premulsum, or all)")
            })
        })
        .collect()
}

fn parse_collectives(s: &str) -> Result<Vec<Collective>, String> {
    if s.trim().eq_ignore_ascii_case("all") {
        return Ok(Collective::ALL.to_vec());
    }
    s.split(',')
        .map(|n| {
            Collective::parse(n.trim()).ok_or_else(|| {
                let names: Vec<&str> = Collective::ALL.iter().map(|c| c.test_name()).collect();
                format!(
                    "unknown collective '{n}' (one of {}, or all)",
                    names.join(" ")
                )
            })
        })
        .collect()
}

/// The arguments, or None for `--help`.
fn parse_args(argv: &[OsString]) -> Result<Option<Args>, String> {
    let mut a = Args {
        colls: vec![Collective::AllReduce],
        root: 0,
        min_bytes: 8,
        max_bytes: None,
        step_factor: 2,
        ngpus: None,
        warmup: None,
        iters: None,
        dtypes: vec![DataType::Float32],
        ops: vec![Op::Sum],
        check: true,
        mode: Mode::Thread,
        baseline: None,
        backend: None,
    };
    let mut i = 0;
    while i < argv.len() {
        let arg = argv[i]
            .to_str()
            .ok_or_else(|| format!("argument {:?} is not UTF-8", argv[i]))?;
        i += 1;
        if arg == "--bench" {
            continue; // cargo bench adds it
        }
        if arg == "-h" || arg == "--help" {
            return Ok(None);
        }
        let (key, inline): (String, Option<String>) = if let Some(rest) = arg.strip_prefix("--") {
            match rest.split_once('=') {
                Some((k, v)) => (k.to_string(), Some(v.to_string())),
                None => (rest.to_string(), None),
            }
        } else if let Some(rest) = arg.strip_prefix('-') {
            let mut chars = rest.chars();
            let Some(c) = chars.next() else {
                return Err("unexpected argument '-'".into());
            };
            let long = match c {
                'b' => "minbytes",
                'e' => "maxbytes",
                'f' => "stepfactor",
                'g' => "ngpus",
                'w' => "warmup_iters",
                'n' => "iters",
                'd' => "datatype",
                'o' => "op",
                'c' => "check",
                't' => "mode",
                'C' => "collective",
                'r' => "root",
                _ => return Err(format!("unknown option '{arg}'")),
            };
            let v = chars.as_str();
            (long.to_string(), (!v.is_empty()).then(|| v.to_string()))
        } else {
            return Err(format!("unexpected argument '{arg}'"));
        };
        let known = [
            "minbytes",
            "maxbytes",
            "stepfactor",
            "ngpus",
            "warmup_iters",
            "iters",
            "datatype",
            "op",
            "check",
            "mode",
            "collective",
            "root",
            "baseline",
            "backend",
        ];
        if !known.contains(&key.as_str()) {
            return Err(format!("unknown option '{arg}'"));
        }
        let value = match inline {
            Some(v) => v,
            None => {
                let v = argv
                    .get(i)
                    .ok_or_else(|| format!("option '{arg}' needs a value"))?;
                i += 1;
                v.to_str()
                    .ok_or_else(|| format!("the value of '{arg}' is not UTF-8"))?
                    .to_string()
            }
        };
        match key.as_str() {
            "minbytes" => a.min_bytes = parse_size(&value)?,
            "maxbytes" => a.max_bytes = Some(parse_size(&value)?),
            "stepfactor" => a.step_factor = parse_number(&value, "--stepfactor")?,
            "ngpus" => a.ngpus = Some(parse_number(&value, "--ngpus")?),
            "warmup_iters" => a.warmup = Some(parse_number(&value, "--warmup_iters")?),
            "iters" => a.iters = Some(parse_number(&value, "--iters")?),
            "datatype" => a.dtypes = parse_datatypes(&value)?,
            "op" => a.ops = parse_ops(&value)?,
            "check" => {
                a.check = match value.trim() {
                    "0" => false,
                    "1" => true,
                    v => return Err(format!("--check: '{v}' (use 0 or 1)")),
                }
            }
            "mode" => {
                a.mode = match value.trim() {
                    "thread" | "1" => Mode::Thread,
                    "threads" => Mode::Threads,
                    v => return Err(format!("--mode: '{v}' (use thread or threads)")),
                }
            }
            "collective" => a.colls = parse_collectives(&value)?,
            "root" => a.root = parse_number(&value, "--root")?,
            "baseline" => a.baseline = Some(PathBuf::from(value)),
            "backend" => {
                a.backend = Some(match value.trim() {
                    "cuda" => Backend::Cuda,
                    "sim" | "simulator" => Backend::Sim,
                    v => return Err(format!("--backend: '{v}' (use cuda or sim)")),
                })
            }
            _ => unreachable!("every key was checked against the known list"),
        }
    }
    if a.step_factor < 2 {
        return Err(format!("--stepfactor {}: use 2 or more", a.step_factor));
    }
    if a.ngpus == Some(0) {
        return Err("--ngpus 0: use at least one GPU".into());
    }
    if a.iters == Some(0) {
        return Err("--iters 0: time at least one iteration".into());
    }
    if let Some(max) = a.max_bytes {
        if a.min_bytes > max {
            return Err(format!(
                "--minbytes {} is larger than --maxbytes {max}",
                a.min_bytes
            ));
        }
    }
    Ok(Some(a))
}

// ------------------------------------------------------------------------------------------
// Backend choice
// ------------------------------------------------------------------------------------------

enum Picked {
    /// Run here, on this backend, for this reason.
    Run(Backend, String),
    /// The simulator ran in a child process; exit with its status.
    Exit(ExitCode),
}

fn pick_backend(args: &Args) -> Picked {
    let explicit = match args.backend {
        Some(Backend::Sim) => Some((Backend::Sim, "--backend sim")),
        Some(Backend::Cuda) => Some((Backend::Cuda, "--backend cuda")),
        None => match std::env::var("NCCL_RS_BACKEND").as_deref() {
            Ok("sim") | Ok("SIM") | Ok("simulator") => Some((Backend::Sim, "NCCL_RS_BACKEND=sim")),
            Ok("cuda") | Ok("CUDA") => Some((Backend::Cuda, "NCCL_RS_BACKEND=cuda")),
            _ => None,
        },
    };
    match explicit {
        Some((Backend::Sim, how)) => {
            if let Err(e) = cuda::set_backend(Backend::Sim) {
                eprintln!("nccl_bench: error: choosing the simulator: {e}");
                return Picked::Exit(ExitCode::FAILURE);
            }
            let why = match std::env::var(REASON_ENV) {
                Ok(r) if args.backend.is_some() => r,
                _ => format!("chosen with {how}"),
            };
            Picked::Run(Backend::Sim, why)
        }
        Some((Backend::Cuda, how)) => match probe_cuda() {
            Ok(n) => Picked::Run(
                Backend::Cuda,
                format!("chosen with {how}; {n} GPU(s) visible"),
            ),
            Err(e) => {
                eprintln!(
                    "nccl_bench: error: the CUDA backend (chosen with {how}) is unusable: {e}"
                );
                Picked::Exit(ExitCode::FAILURE)
            }
        },
        None => match probe_cuda() {
            Ok(n) => Picked::Run(Backend::Cuda, format!("{n} GPU(s) visible")),
            Err(why) => rerun_on_sim(&why),
        },
    }
}

/// Chooses CUDA and counts GPUs; an error says why CUDA cannot be used.
fn probe_cuda() -> Result<usize, String> {
    cuda::set_backend(Backend::Cuda).map_err(|e| e.message)?;
    match cuda::device_count() {
        Ok(0) => Err("the CUDA driver shows no GPU".into()),
        Ok(n) => Ok(n),
        Err(e) => Err(e.message),
    }
}

/// CUDA was probed in this process, so the simulator runs in a fresh copy of it.
fn rerun_on_sim(why: &str) -> Picked {
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!(
                "nccl_bench: error: CUDA is unusable ({why}) and this executable cannot be found to re-run it on the simulator ({e}); pass --backend sim"
            );
            return Picked::Exit(ExitCode::FAILURE);
        }
    };
    let _ = std::io::stdout().flush();
    let status = std::process::Command::new(&exe)
        .args(std::env::args_os().skip(1))
        .args(["--backend", "sim"])
        .env(REASON_ENV, format!("CUDA unusable: {why}"))
        .status();
    match status {
        Ok(s) => match s.code() {
            Some(c) => Picked::Exit(ExitCode::from(c.clamp(0, 255) as u8)),
            None => {
                eprintln!("nccl_bench: the simulator run ended by a signal ({s})");
                Picked::Exit(ExitCode::FAILURE)
            }
        },
        Err(e) => {
            eprintln!(
                "nccl_bench: error: re-running {} on the simulator: {e}",
                exe.display()
            );
            Picked::Exit(ExitCode::FAILURE)
        }
    }
}

// ------------------------------------------------------------------------------------------
// Element types, data and the host reference
// ------------------------------------------------------------------------------------------

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

fn encode<T: Elem>(v: &[T]) -> Vec<u8> {
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
struct CheckData {
    dt: DataType,
    /// Each rank's input.
    inputs: Vec<Vec<u8>>,
    /// The element-wise reduction of every rank's input (what AllReduce, Reduce and
    /// ReduceScatter produce).
    reduced: Vec<u8>,
    /// Per-element tolerance of `reduced` (0 for exact).
    tol: Vec<f64>,
}

/// Where a stretch of a rank's expected output comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Src {
    /// A rank's input, copied exactly.
    Input(usize),
    /// The reduction of every input, within the tolerance.
    Reduced,
}

/// `elems` elements of a rank's output: the period of `src`, starting at element `phase` of it.
#[derive(Clone, Copy, Debug)]
struct Seg {
    src: Src,
    phase: usize,
    elems: usize,
}

/// A rank's expected output: its stretches in order (covering the whole output), and whether
/// the collective defines it at all (Reduce leaves non-root outputs alone).
struct Expect {
    segs: Vec<Seg>,
    defined: bool,
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

fn make_inputs<T: Elem>(op: Op, seed: u64, rank: usize) -> Vec<T> {
    let mut rng = Rng::new(seed ^ ((rank as u64 + 1) << 32));
    (0..PERIOD)
        .map(|_| {
            if T::IS_FLOAT {
                match op {
                    Op::Prod => T::from_f64(rng.uniform(0.5, 1.5)),
                    _ => T::from_f64(rng.uniform(-4.0, 4.0)),
                }
            } else {
                match op {
                    Op::Prod => T::from_f64((rng.next() % 3) as f64 + 1.0),
                    _ => T::from_bits(rng.next() % 100),
                }
            }
        })
        .collect()
}

/// The reduction of every rank's input, element by element, and its tolerance.
fn reduce_ref<T: Elem>(inputs: &[Vec<T>], op: Op, dt: DataType) -> (Vec<T>, Vec<f64>) {
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
    let scalar = match op.ours(dt) {
        ReduceOp::PreMulSum { scalar_bits } => scalar_bits,
        _ => 0,
    };
    (0..PERIOD)
        .map(|i| {
            let (v, mag) = match op {
                Op::Sum => fold(inputs, <Sum as RedOp<T>>::new(0), i),
                Op::Prod => fold(inputs, <Prod as RedOp<T>>::new(0), i),
                Op::Max => fold(inputs, <Max as RedOp<T>>::new(0), i),
                Op::Min => fold(inputs, <Min as RedOp<T>>::new(0), i),
                Op::Avg => fold(inputs, <Avg<T> as RedOp<T>>::new(n as u64), i),
                Op::PreMulSum => fold(inputs, <PreMulSum<T> as RedOp<T>>::new(scalar), i),
            };
            let tol = if !T::IS_FLOAT {
                0.0
            } else {
                match op {
                    Op::Max | Op::Min => 0.0,
                    Op::Prod => 2.0 * n as f64 * eps * v.to_f64().abs(),
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

// ------------------------------------------------------------------------------------------
// Collectives
// ------------------------------------------------------------------------------------------

/// A collective the table can measure: its sizes, its bus-bandwidth factor, how to launch it on
/// either library and what it should produce. SendRecv is nccl-tests' `sendrecv`: every rank
/// sends its buffer to the next rank and receives the previous rank's, in one group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Collective {
    AllReduce,
    Broadcast,
    Reduce,
    AllGather,
    ReduceScatter,
    SendRecv,
}

impl Collective {
    /// The tuner's name for it (none for send/receive: no algorithm or protocol is chosen).
    fn tuned(self) -> Option<nccl::tune::Coll> {
        Some(match self {
            Collective::AllReduce => nccl::tune::Coll::AllReduce,
            Collective::Broadcast => nccl::tune::Coll::Broadcast,
            Collective::Reduce => nccl::tune::Coll::Reduce,
            Collective::AllGather => nccl::tune::Coll::AllGather,
            Collective::ReduceScatter => nccl::tune::Coll::ReduceScatter,
            Collective::SendRecv => return None,
        })
    }
}

/// The element counts of one test of a collective.
#[derive(Clone, Copy, Debug)]
struct Counts {
    /// The count argument of the call (per rank for AllGather and ReduceScatter).
    count: usize,
    /// Bytes the table reports as the size (algbw = size / time): as nccl-tests, the larger of
    /// a rank's input and output.
    size_bytes: usize,
}

impl Collective {
    const ALL: [Collective; 6] = [
        Collective::AllReduce,
        Collective::Broadcast,
        Collective::Reduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::SendRecv,
    ];

    fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "AllReduce",
            Collective::Broadcast => "Broadcast",
            Collective::Reduce => "Reduce",
            Collective::AllGather => "AllGather",
            Collective::ReduceScatter => "ReduceScatter",
            Collective::SendRecv => "SendRecv",
        }
    }

    /// The name nccl-tests gives its test (`all_gather` for `all_gather_perf`).
    fn test_name(self) -> &'static str {
        match self {
            Collective::AllReduce => "all_reduce",
            Collective::Broadcast => "broadcast",
            Collective::Reduce => "reduce",
            Collective::AllGather => "all_gather",
            Collective::ReduceScatter => "reduce_scatter",
            Collective::SendRecv => "sendrecv",
        }
    }

    /// `all_gather`, `allgather`, `AllGather`, `all-gather`.
    fn parse(s: &str) -> Option<Collective> {
        let key = |t: &str| t.replace(['_', '-'], "").to_ascii_lowercase();
        let k = key(s);
        Collective::ALL
            .into_iter()
            .find(|c| key(c.test_name()) == k)
    }

    /// busbw = algbw * factor: what each link carries, comparable across rank counts.
    fn bus_factor(self, nranks: usize) -> f64 {
        let n = nranks as f64;
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::AllGather | Collective::ReduceScatter => (n - 1.0) / n,
            Collective::Broadcast | Collective::Reduce | Collective::SendRecv => 1.0,
        }
    }

    fn has_op(self) -> bool {
        match self {
            Collective::AllReduce | Collective::Reduce | Collective::ReduceScatter => true,
            Collective::Broadcast | Collective::AllGather | Collective::SendRecv => false,
        }
    }

    fn has_root(self) -> bool {
        matches!(self, Collective::Broadcast | Collective::Reduce)
    }

    /// The root column: `root`, or -1 for rootless collectives.
    fn root_column(self, root: usize) -> i64 {
        if self.has_root() {
            root as i64
        } else {
            -1
        }
    }

    /// The counts for a test of `bytes` bytes of `dt` on `nranks` ranks.
    fn counts(self, bytes: usize, dt: DataType, nranks: usize) -> Counts {
        let elems = bytes / dt.size();
        match self {
            Collective::AllGather | Collective::ReduceScatter => {
                let count = elems / nranks;
                Counts {
                    count,
                    size_bytes: count * nranks * dt.size(),
                }
            }
            Collective::AllReduce
            | Collective::Broadcast
            | Collective::Reduce
            | Collective::SendRecv => Counts {
                count: elems,
                size_bytes: elems * dt.size(),
            },
        }
    }

    /// Bytes of a rank's (input, output) for a call of `count` elements of `size` bytes.
    fn io_bytes(self, count: usize, size: usize, nranks: usize) -> (usize, usize) {
        match self {
            Collective::AllGather => (count * size, nranks * count * size),
            Collective::ReduceScatter => (nranks * count * size, count * size),
            Collective::AllReduce
            | Collective::Broadcast
            | Collective::Reduce
            | Collective::SendRecv => (count * size, count * size),
        }
    }

    /// Bytes of (send, recv) buffers per rank for tests up to `max_bytes`: both hold the
    /// largest size, since in-place calls put input and output in the receive buffer.
    fn buffer_bytes(self, max_bytes: usize, _nranks: usize) -> (usize, usize) {
        (max_bytes, max_bytes)
    }

    /// (send, recv) pointers of `rank` for `call`. In place, both lie in the receive buffer
    /// where NCCL defines them: AllGather's input is block `rank` of its output,
    /// ReduceScatter's output is block `rank` of its input.
    fn pointers(self, rank: &Rank, call: &Call) -> (DevPtr, DevPtr) {
        if !call.in_place {
            return (rank.send.ptr, rank.recv.ptr);
        }
        let base = rank.recv.ptr;
        let block = (rank.comm.rank() * call.counts.count * call.dt.size()) as DevPtr;
        match self {
            Collective::AllGather => (base + block, base),
            Collective::ReduceScatter => (base, base + block),
            Collective::AllReduce | Collective::Broadcast | Collective::Reduce => (base, base),
            // Not measured in place (see `in_place_applies`).
            Collective::SendRecv => (rank.send.ptr, rank.recv.ptr),
        }
    }

    /// What `rank`'s output should hold after `call` on `nranks` ranks.
    fn expect(self, rank: usize, nranks: usize, call: &Call) -> Expect {
        let count = call.counts.count;
        let seg = |src, phase| Seg {
            src,
            phase,
            elems: count,
        };
        let (segs, defined) = match self {
            Collective::AllReduce => (vec![seg(Src::Reduced, 0)], true),
            Collective::Reduce => (vec![seg(Src::Reduced, 0)], rank == call.root),
            Collective::Broadcast => (vec![seg(Src::Input(call.root), 0)], true),
            Collective::AllGather => ((0..nranks).map(|r| seg(Src::Input(r), 0)).collect(), true),
            Collective::ReduceScatter => (vec![seg(Src::Reduced, rank * count)], true),
            Collective::SendRecv => (vec![seg(Src::Input((rank + nranks - 1) % nranks), 0)], true),
        };
        Expect { segs, defined }
    }

    /// Whether the in-place columns mean anything: a send/receive pair in one buffer would
    /// race (the previous rank's data may land before ours left), so it runs out of place only.
    fn in_place_applies(self) -> bool {
        self != Collective::SendRecv
    }

    /// The ranks a send/receive pair of `rank` goes to and comes from.
    fn ring_peers(rank: usize, nranks: usize) -> (usize, usize) {
        ((rank + 1) % nranks, (rank + nranks - 1) % nranks)
    }

    /// What an error of `call` on `rank` says about the call.
    fn describe(self, rank: &Rank, call: &Call) -> String {
        let mut s = format!(
            "{} (rank {}, {}",
            self.name(),
            rank.comm.rank(),
            call.dt.name()
        );
        if self.has_op() {
            s += &format!(" {}", call.op.name());
        }
        if self.has_root() {
            s += &format!(" root {}", call.root);
        }
        s += &format!(
            " count {}{})",
            call.counts.count,
            if call.in_place { " in-place" } else { "" }
        );
        s
    }

    fn launch_ours(self, rank: &Rank, call: &Call) -> Result<(), String> {
        let (send, recv) = self.pointers(rank, call);
        let (c, count, dt, stream) = (&rank.comm, call.counts.count, call.dt, rank.stream);
        let op = call.op.ours(dt);
        let r = match self {
            Collective::AllReduce => c.all_reduce(send, recv, count, dt, op, stream),
            Collective::Broadcast => c.broadcast(send, recv, count, dt, call.root, stream),
            Collective::Reduce => c.reduce(send, recv, count, dt, op, call.root, stream),
            Collective::AllGather => c.all_gather(send, recv, count, dt, stream),
            Collective::ReduceScatter => c.reduce_scatter(send, recv, count, dt, op, stream),
            Collective::SendRecv => {
                let (to, from) = Collective::ring_peers(c.rank(), c.count());
                nccl::group_start();
                let sent = c.send(send, count, dt, to, stream);
                let received = c.recv(recv, count, dt, from, stream);
                let ended = nccl::group_end();
                sent.and(received).and(ended)
            }
        };
        r.map_err(|e| format!("nccl-rs {}: {e}", self.describe(rank, call)))
    }

    fn launch_nccl(
        self,
        lib: &Nccl,
        comm: NcclComm,
        rank: &Rank,
        call: &Call,
    ) -> Result<(), String> {
        let (send, recv) = self.pointers(rank, call);
        let (count, dt, stream) = (call.counts.count, call.dt as c_int, rank.stream);
        let op = || {
            call.op
                .nccl()
                .ok_or_else(|| format!("NVIDIA NCCL has no built-in {}", call.op.name()))
        };
        let root = call.root as c_int;
        match self {
            Collective::AllReduce => lib.all_reduce(send, recv, count, dt, op()?, comm, stream),
            Collective::Broadcast => lib.broadcast(send, recv, count, dt, root, comm, stream),
            Collective::Reduce => lib.reduce(send, recv, count, dt, op()?, root, comm, stream),
            Collective::AllGather => lib.all_gather(send, recv, count, dt, comm, stream),
            Collective::ReduceScatter => {
                lib.reduce_scatter(send, recv, count, dt, op()?, comm, stream)
            }
            Collective::SendRecv => {
                let (to, from) = Collective::ring_peers(rank.comm.rank(), rank.comm.count());
                lib.group_start()?;
                let sent = lib.p2p(
                    lib.send,
                    "ncclSend",
                    send,
                    count,
                    dt,
                    to as c_int,
                    comm,
                    stream,
                );
                let received = lib.p2p(
                    lib.recv,
                    "ncclRecv",
                    recv,
                    count,
                    dt,
                    from as c_int,
                    comm,
                    stream,
                );
                let ended = lib.group_end();
                sent.and(received).and(ended)
            }
        }
        .map_err(|e| format!("{e} ({})", self.describe(rank, call)))
    }

    /// Host data for a check of `call` on `nranks` ranks: every rank's input and their
    /// reduction (cheap: one period), whatever the collective.
    fn check_data(self, call: &Call, nranks: usize, seed: u64) -> CheckData {
        fn build<T: Elem>(call: &Call, nranks: usize, seed: u64) -> CheckData {
            let inputs: Vec<Vec<T>> = (0..nranks)
                .map(|r| make_inputs::<T>(call.op, seed, r))
                .collect();
            let (reduced, tol) = reduce_ref(&inputs, call.op, call.dt);
            CheckData {
                dt: call.dt,
                inputs: inputs.iter().map(|v| encode(v)).collect(),
                reduced: encode(&reduced),
                tol,
            }
        }
        with_elem!(call.dt, T => build::<T>(call, nranks, seed))
    }
}

// ------------------------------------------------------------------------------------------
// NVIDIA NCCL, loaded at run time
// ------------------------------------------------------------------------------------------

/// `ncclComm_t`, movable to the thread that drives its GPU.
#[derive(Clone, Copy)]
struct NcclComm(*mut c_void);
// SAFETY: an NCCL communicator may be used from any thread (one thread at a time, which the
// benchmark guarantees: each communicator is driven by exactly one thread).
unsafe impl Send for NcclComm {}
// SAFETY: as above.
unsafe impl Sync for NcclComm {}

/// `ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream)`.
type AllReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    *mut c_void,
    *mut c_void,
) -> c_int;

/// `ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream)`.
type BroadcastFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    *mut c_void,
    *mut c_void,
) -> c_int;

/// `ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream)`.
type ReduceFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    c_int,
    *mut c_void,
    *mut c_void,
) -> c_int;

/// `ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream)`.
type AllGatherFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    *mut c_void,
    *mut c_void,
) -> c_int;

/// `ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream)`.
type ReduceScatterFn = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    c_int,
    c_int,
    *mut c_void,
    *mut c_void,
) -> c_int;

/// `ncclSend(sendbuff, count, datatype, peer, comm, stream)`; ncclRecv has the same shape.
type SendFn =
    unsafe extern "C" fn(*const c_void, usize, c_int, c_int, *mut c_void, *mut c_void) -> c_int;

/// The entry points of NVIDIA NCCL the benchmark uses (C signatures of `nccl.h`).
struct Nccl {
    path: String,
    version: c_int,
    comm_init_all: unsafe extern "C" fn(*mut *mut c_void, c_int, *const c_int) -> c_int,
    all_reduce: AllReduceFn,
    broadcast: BroadcastFn,
    reduce: ReduceFn,
    all_gather: AllGatherFn,
    reduce_scatter: ReduceScatterFn,
    send: SendFn,
    recv: SendFn,
    group_start: unsafe extern "C" fn() -> c_int,
    group_end: unsafe extern "C" fn() -> c_int,
    comm_destroy: unsafe extern "C" fn(*mut c_void) -> c_int,
    get_error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    get_last_error: Option<unsafe extern "C" fn(*mut c_void) -> *const c_char>,
}

impl Nccl {
    fn load(path: &std::path::Path) -> Result<Nccl, String> {
        let shown = path.display().to_string();
        // SAFETY: loading NVIDIA NCCL runs its initialisers, which only set up the library. The
        // library is never unloaded (leaked below): its threads may outlive any scope of ours.
        let lib = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("cannot load the baseline library {shown}: {e}"))?;
        let lib: &'static libloading::Library = Box::leak(Box::new(lib));
        macro_rules! sym {
            ($name:literal, $t:ty) => {{
                // SAFETY: the type is the C signature nccl.h documents for this symbol.
                let s = unsafe { lib.get::<$t>(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| format!("{shown} is not an NCCL library: no {}: {e}", $name))?;
                *s
            }};
        }
        let get_version = sym!("ncclGetVersion", unsafe extern "C" fn(*mut c_int) -> c_int);
        let _get_unique_id = sym!(
            "ncclGetUniqueId",
            unsafe extern "C" fn(*mut c_void) -> c_int
        );
        let get_last_error = {
            // SAFETY: as in sym!; this one is optional (NCCL 2.13 and later).
            let s = unsafe {
                lib.get::<unsafe extern "C" fn(*mut c_void) -> *const c_char>(b"ncclGetLastError\0")
            };
            s.ok().map(|s| *s)
        };
        let nccl = Nccl {
            path: shown.clone(),
            version: 0,
            comm_init_all: sym!(
                "ncclCommInitAll",
                unsafe extern "C" fn(*mut *mut c_void, c_int, *const c_int) -> c_int
            ),
            all_reduce: sym!("ncclAllReduce", AllReduceFn),
            broadcast: sym!("ncclBroadcast", BroadcastFn),
            reduce: sym!("ncclReduce", ReduceFn),
            all_gather: sym!("ncclAllGather", AllGatherFn),
            reduce_scatter: sym!("ncclReduceScatter", ReduceScatterFn),
            send: sym!("ncclSend", SendFn),
            recv: sym!("ncclRecv", SendFn),
            group_start: sym!("ncclGroupStart", unsafe extern "C" fn() -> c_int),
            group_end: sym!("ncclGroupEnd", unsafe extern "C" fn() -> c_int),
            comm_destroy: sym!(
                "ncclCommDestroy",
                unsafe extern "C" fn(*mut c_void) -> c_int
            ),
            get_error_string: sym!(
                "ncclGetErrorString",
                unsafe extern "C" fn(c_int) -> *const c_char
            ),
            get_last_error,
        };
        let mut version = 0;
        // SAFETY: writes one int.
        let r = unsafe { get_version(&mut version) };
        nccl.check(r, "ncclGetVersion")?;
        Ok(Nccl { version, ..nccl })
    }

    fn version_string(&self) -> String {
        let v = self.version;
        if v >= 10000 {
            format!("{}.{}.{}", v / 10000, v % 10000 / 100, v % 100)
        } else {
            format!("{}.{}.{}", v / 1000, v % 1000 / 100, v % 100)
        }
    }

    /// Whether NVIDIA NCCL can run `dt` with `op` (no built-in PreMulSum; fp8 from 2.24).
    fn supports(&self, dt: DataType, op: Op) -> bool {
        let fp8 = matches!(dt, DataType::Float8e4m3 | DataType::Float8e5m2);
        op.nccl().is_some() && (!fp8 || self.version >= 22400)
    }

    fn check(&self, r: c_int, what: &str) -> Result<(), String> {
        if r == 0 {
            return Ok(());
        }
        let text = |p: *const c_char| {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: NCCL returns NUL-terminated strings it owns.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        // SAFETY: both return pointers to strings NCCL owns.
        let code = text(unsafe { (self.get_error_string)(r) });
        let last = match self.get_last_error {
            // SAFETY: as above; a null communicator asks for the process's last error.
            Some(f) => text(unsafe { f(std::ptr::null_mut()) }),
            None => String::new(),
        };
        let last = if last.is_empty() {
            String::new()
        } else {
            format!(": {last}")
        };
        Err(format!(
            "NVIDIA NCCL {what} failed: {code} (ncclResult_t {r}){last}"
        ))
    }

    fn comm_init_all(&self, devs: &[i32]) -> Result<Vec<NcclComm>, String> {
        let mut comms = vec![std::ptr::null_mut(); devs.len()];
        // SAFETY: `comms` has room for one communicator per device in `devs`.
        let r =
            unsafe { (self.comm_init_all)(comms.as_mut_ptr(), devs.len() as c_int, devs.as_ptr()) };
        self.check(r, "ncclCommInitAll")?;
        Ok(comms.into_iter().map(NcclComm).collect())
    }

    fn comm_destroy(&self, c: NcclComm) -> Result<(), String> {
        // SAFETY: c came from ncclCommInitAll and is destroyed once.
        let r = unsafe { (self.comm_destroy)(c.0) };
        self.check(r, "ncclCommDestroy")
    }

    fn group_start(&self) -> Result<(), String> {
        // SAFETY: no arguments.
        self.check(unsafe { (self.group_start)() }, "ncclGroupStart")
    }

    fn group_end(&self) -> Result<(), String> {
        // SAFETY: no arguments.
        self.check(unsafe { (self.group_end)() }, "ncclGroupEnd")
    }

    #[allow(clippy::too_many_arguments)]
    fn all_reduce(
        &self,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        dt: c_int,
        op: c_int,
        comm: NcclComm,
        stream: StreamHandle,
    ) -> Result<(), String> {
        // SAFETY: the buffers are device memory of the communicator's GPU (allocated by nccl-rs
        // in the device's primary context, which the CUDA runtime shares) holding at least
        // `count` elements, and the stream is a CUstream of that context.
        let r = unsafe {
            (self.all_reduce)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                dt,
                op,
                comm.0,
                stream.0 as *mut c_void,
            )
        };
        self.check(r, "ncclAllReduce")
    }

    #[allow(clippy::too_many_arguments)]
    fn broadcast(
        &self,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        dt: c_int,
        root: c_int,
        comm: NcclComm,
        stream: StreamHandle,
    ) -> Result<(), String> {
        // SAFETY: as in all_reduce: device memory of the communicator's GPU holding at least
        // `count` elements on both sides, and a CUstream of that context.
        let r = unsafe {
            (self.broadcast)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                dt,
                root,
                comm.0,
                stream.0 as *mut c_void,
            )
        };
        self.check(r, "ncclBroadcast")
    }

    #[allow(clippy::too_many_arguments)]
    fn reduce(
        &self,
        send: DevPtr,
        recv: DevPtr,
        count: usize,
        dt: c_int,
        op: c_int,
        root: c_int,
        comm: NcclComm,
        stream: StreamHandle,
    ) -> Result<(), String> {
        // SAFETY: as in all_reduce: device memory of the communicator's GPU holding at least
        // `count` elements on both sides, and a CUstream of that context.
        let r = unsafe {
            (self.reduce)(
                send as *const c_void,
                recv as *mut c_void,
                count,
                dt,
                op,
                root,
                comm.0,
                stream.0 as *mut c_void,
            )
        };
        self.check(r, "ncclReduce")
    }

    fn all_gather(
        &self,
        send: DevPtr,
        recv: DevPtr,
        sendcount: usize,
        dt: c_int,
        comm: NcclComm,
        stream: StreamHandle,
    ) -> Result<(), String> {
        // SAFETY: as in all_reduce: device memory of the communicator's GPU, `sendcount`
        // elements to read and nranks × `sendcount` to write, and a CUstream of that context.
        let r = unsafe {
            (self.all_gather)(
                send as *const c_void,
                recv as *mut c_void,
                sendcount,
                dt,
                comm.0,
                stream.0 as *mut c_void,
            )
        };
        self.check(r, "ncclAllGather")
    }

    #[allow(clippy::too_many_arguments)]
    fn reduce_scatter(
        &self,
        send: DevPtr,
        recv: DevPtr,
        recvcount: usize,
        dt: c_int,
        op: c_int,
        comm: NcclComm,
        stream: StreamHandle,
    ) -> Result<(), String> {
        // SAFETY: as in all_reduce: device memory of the communicator's GPU, nranks ×
        // `recvcount` elements to read and `recvcount` to write, and a CUstream of that context.
        let r = unsafe {
            (self.reduce_scatter)(
                send as *const c_void,
                recv as *mut c_void,
                recvcount,
                dt,
                op,
                comm.0,
                stream.0 as *mut c_void,
            )
        };
        self.check(r, "ncclReduceScatter")
    }

    /// `ncclSend` or `ncclRecv` (`f`, named `name`): `count` elements of `buf` to or from `peer`.
    #[allow(clippy::too_many_arguments)]
    fn p2p(
        &self,
        f: SendFn,
        name: &str,
        buf: DevPtr,
        count: usize,
        dt: c_int,
        peer: c_int,
        comm: NcclComm,
        stream: StreamHandle,
    ) -> Result<(), String> {
        // SAFETY: as in all_reduce: `count` elements of device memory of the communicator's
        // GPU (read by ncclSend, written by ncclRecv), and a CUstream of that context.
        let r = unsafe { f(buf as *const c_void, count, dt, peer, comm.0, stream.0 as _) };
        self.check(r, name)
    }
}

// ------------------------------------------------------------------------------------------
// Ranks and the measurement loop
// ------------------------------------------------------------------------------------------

/// One GPU's communicator, stream, buffers and timing events.
struct Rank {
    comm: Comm,
    stream: StreamHandle,
    send: DevBuffer,
    recv: DevBuffer,
    /// One per iteration boundary: iters + 1.
    events: Vec<u64>,
}

/// Which library runs a measurement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Lib {
    Ours,
    Nccl,
}

/// One call of the table: collective, type, op, counts, placement.
#[derive(Clone, Copy, Debug)]
struct Call {
    coll: Collective,
    dt: DataType,
    op: Op,
    counts: Counts,
    /// Root rank (Broadcast and Reduce; ignored by the others).
    root: usize,
    in_place: bool,
}

/// What a per-GPU thread says when it stops because another one failed.
const ECHO: &str = "another GPU's thread failed";

/// With NCCL_RS_BENCH_HOST_TIME set, says on stderr how long the host took to issue one
/// timed iteration (the launch and an event record): when it exceeds the GPU's time per
/// iteration, the table measures the host. `rank` usize::MAX: one thread issuing every rank.
fn report_host_time(lib: Lib, rank: usize, call: &Call, t0: Instant, iters: usize) {
    let elapsed = t0.elapsed(); // before the environment lookup below
    if std::env::var_os("NCCL_RS_BENCH_HOST_TIME").is_none() || iters == 0 {
        return;
    }
    let us = elapsed.as_secs_f64() * 1e6 / iters as f64;
    let who = match rank {
        usize::MAX => "all ranks".to_string(),
        r => format!("rank {r}"),
    };
    eprintln!(
        "# host issue {lib:?} {} {} B {who}: {us:.2} us per iteration",
        call.coll.name(),
        call.counts.size_bytes
    );
}

/// A barrier for the per-GPU threads that gives up when one of them fails.
struct Rendezvous {
    n: usize,
    state: Mutex<(usize, u64, bool)>,
    cv: Condvar,
}

impl Rendezvous {
    fn new(n: usize) -> Rendezvous {
        Rendezvous {
            n,
            state: Mutex::new((0, 0, false)),
            cv: Condvar::new(),
        }
    }
    fn wait(&self) -> Result<(), String> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if s.2 {
            return Err(ECHO.into());
        }
        let gen = s.1;
        s.0 += 1;
        if s.0 == self.n {
            s.0 = 0;
            s.1 += 1;
            self.cv.notify_all();
            return Ok(());
        }
        while s.1 == gen && !s.2 {
            s = self.cv.wait(s).unwrap_or_else(|p| p.into_inner());
        }
        if s.1 == gen {
            return Err(ECHO.into());
        }
        Ok(())
    }
    fn fail(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).2 = true;
        self.cv.notify_all();
    }
    fn failed(&self) -> bool {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).2
    }
}

struct Bench {
    ranks: Vec<Rank>,
    mode: Mode,
    nccl: Option<(Nccl, Vec<NcclComm>)>,
    /// Host staging for checks, as large as the largest buffer.
    host: Vec<u8>,
}

impl Bench {
    fn nranks(&self) -> usize {
        self.ranks.len()
    }

    /// Launches `call` on rank `r` only.
    fn launch_one(&self, lib: Lib, r: usize, call: &Call) -> Result<(), String> {
        let rank = &self.ranks[r];
        match (lib, &self.nccl) {
            (Lib::Ours, _) => call.coll.launch_ours(rank, call),
            (Lib::Nccl, Some((n, comms))) => call.coll.launch_nccl(n, comms[r], rank, call),
            (Lib::Nccl, None) => Err("no baseline library loaded".into()),
        }
    }

    /// Launches `call` on every rank from this thread (NVIDIA NCCL inside one group).
    fn launch_all(&self, lib: Lib, call: &Call) -> Result<(), String> {
        if lib == Lib::Nccl {
            let (n, _) = self.nccl.as_ref().ok_or("no baseline library loaded")?;
            n.group_start()?;
            let launched = (0..self.nranks()).try_for_each(|r| self.launch_one(lib, r, call));
            let ended = n.group_end();
            return launched.and(ended);
        }
        if call.coll == Collective::SendRecv {
            // One thread drives every rank: their connections are made together at the end.
            nccl::group_start();
            let launched = (0..self.nranks()).try_for_each(|r| self.launch_one(lib, r, call));
            let ended = nccl::group_end().map_err(|e| format!("nccl-rs group: {e}"));
            return launched.and(ended);
        }
        (0..self.nranks()).try_for_each(|r| self.launch_one(lib, r, call))
    }

    /// `warmup` untimed calls, then `iters` timed ones: each timed iteration's longest time
    /// over the GPUs, in ms. Every stream is idle on return.
    fn run(&self, lib: Lib, call: &Call, warmup: usize, iters: usize) -> Result<Vec<f64>, String> {
        let per_rank: Vec<Vec<f64>> = match self.mode {
            Mode::Thread => self.run_one_thread(lib, call, warmup, iters)?,
            Mode::Threads => self.run_threads(lib, call, warmup, iters)?,
        };
        Ok((0..iters)
            .map(|i| per_rank.iter().map(|t| t[i]).fold(0.0, f64::max))
            .collect())
    }

    fn run_one_thread(
        &self,
        lib: Lib,
        call: &Call,
        warmup: usize,
        iters: usize,
    ) -> Result<Vec<Vec<f64>>, String> {
        let e = |what: &str, r: &Rank, err: nccl::Error| {
            format!("{what} on device {}: {err}", r.comm.cu_device())
        };
        for _ in 0..warmup {
            self.launch_all(lib, call)?;
        }
        for r in &self.ranks {
            r.comm
                .device()
                .stream_sync(r.stream)
                .map_err(|x| e("stream sync", r, x))?;
        }
        if iters == 0 {
            return Ok(vec![Vec::new(); self.nranks()]);
        }
        for r in &self.ranks {
            r.comm
                .device()
                .event_record(r.events[0], r.stream)
                .map_err(|x| e("event record", r, x))?;
        }
        let t0 = Instant::now();
        for i in 0..iters {
            self.launch_all(lib, call)?;
            for r in &self.ranks {
                r.comm
                    .device()
                    .event_record(r.events[i + 1], r.stream)
                    .map_err(|x| e("event record", r, x))?;
            }
        }
        report_host_time(lib, usize::MAX, call, t0, iters);
        self.ranks
            .iter()
            .map(|r| {
                let d = r.comm.device();
                d.event_sync(r.events[iters])
                    .map_err(|x| e("event sync", r, x))?;
                (0..iters)
                    .map(|i| {
                        d.event_elapsed_ms(r.events[i], r.events[i + 1])
                            .map(f64::from)
                            .map_err(|x| e("event elapsed time", r, x))
                    })
                    .collect()
            })
            .collect()
    }

    fn run_threads(
        &self,
        lib: Lib,
        call: &Call,
        warmup: usize,
        iters: usize,
    ) -> Result<Vec<Vec<f64>>, String> {
        let rv = Rendezvous::new(self.nranks());
        let body = |ri: usize| -> Result<Vec<f64>, String> {
            let r = &self.ranks[ri];
            let d = r.comm.device();
            let e = |what: &str, err: nccl::Error| {
                format!("{what} on device {}: {err}", r.comm.cu_device())
            };
            // Waits for the stream to drain, giving up if another thread failed.
            let idle = || -> Result<(), String> {
                loop {
                    if d.stream_query(r.stream).map_err(|x| e("stream query", x))? {
                        return Ok(());
                    }
                    if rv.failed() {
                        return Err(ECHO.into());
                    }
                    std::thread::sleep(Duration::from_micros(50));
                }
            };
            d.make_current().map_err(|x| e("make current", x))?;
            for _ in 0..warmup {
                self.launch_one(lib, ri, call)?;
            }
            idle()?;
            rv.wait()?;
            if iters == 0 {
                return Ok(Vec::new());
            }
            d.event_record(r.events[0], r.stream)
                .map_err(|x| e("event record", x))?;
            let t0 = Instant::now();
            for i in 0..iters {
                self.launch_one(lib, ri, call)?;
                d.event_record(r.events[i + 1], r.stream)
                    .map_err(|x| e("event record", x))?;
            }
            report_host_time(lib, ri, call, t0, iters);
            idle()?;
            (0..iters)
                .map(|i| {
                    d.event_elapsed_ms(r.events[i], r.events[i + 1])
                        .map(f64::from)
                        .map_err(|x| e("event elapsed time", x))
                })
                .collect()
        };
        let results: Vec<Result<Vec<f64>, String>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..self.nranks())
                .map(|ri| {
                    let (body, rv) = (&body, &rv);
                    s.spawn(move || {
                        let res = body(ri);
                        if res.is_err() {
                            rv.fail();
                        }
                        res
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err("a GPU thread panicked".into()))
                })
                .collect()
        });
        // Report the failure itself rather than the other threads giving up because of it.
        let errors: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
        if let Some(first) = errors
            .iter()
            .find(|m| !m.starts_with(ECHO))
            .or(errors.first())
        {
            return Err(first.to_string());
        }
        Ok(results.into_iter().flatten().collect())
    }

    /// One call on fresh inputs and poisoned outputs; the count of wrong elements, all ranks.
    fn check(&mut self, lib: Lib, call: &Call, data: &CheckData) -> Result<usize, String> {
        let n = self.nranks();
        let size = call.dt.size();
        let (send_bytes, recv_bytes) = call.coll.io_bytes(call.counts.count, size, n);
        let mut host = std::mem::take(&mut self.host);
        let res = (|| {
            for (r, rank) in self.ranks.iter().enumerate() {
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
                dev.copy_htod(recv, &host[..recv_bytes]).map_err(e)?;
                tile(&data.inputs[r], &mut host[..send_bytes]);
                dev.copy_htod(send, &host[..send_bytes]).map_err(e)?;
                // A copy from pageable memory may return before its DMA lands, and the
                // collective runs on a non-blocking stream: wait on the legacy stream that
                // carried the copies.
                dev.stream_sync(StreamHandle::default()).map_err(e)?;
            }
            self.run(lib, call, 1, 0)?;
            let mut wrong = 0;
            for (r, rank) in self.ranks.iter().enumerate() {
                let expect = call.coll.expect(r, n, call);
                if !expect.defined {
                    continue;
                }
                let dev = rank.comm.device();
                let (_, recv) = call.coll.pointers(rank, call);
                dev.copy_dtoh(&mut host[..recv_bytes], recv)
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

    /// Whether every stream drained within a few seconds (so buffers may be freed safely).
    fn quiesce(&self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        self.ranks.iter().all(|r| loop {
            match r.comm.device().stream_query(r.stream) {
                Ok(true) => break true,
                Ok(false) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                _ => break false,
            }
        })
    }

    fn teardown(mut self) -> Result<(), String> {
        let mut first: Option<String> = None;
        if let Some((lib, comms)) = self.nccl.take() {
            for c in comms {
                if let Err(e) = lib.comm_destroy(c) {
                    first.get_or_insert(e);
                }
            }
        }
        for r in &self.ranks {
            let d = r.comm.device();
            for &ev in &r.events {
                if let Err(e) = d.event_destroy(ev) {
                    first.get_or_insert(format!("event destroy: {e}"));
                }
            }
            if let Err(e) = d.stream_destroy(r.stream) {
                first.get_or_insert(format!("stream destroy: {e}"));
            }
        }
        match first {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

// ------------------------------------------------------------------------------------------
// The table
// ------------------------------------------------------------------------------------------

/// One placement's figures for one row.
struct Measure {
    time_us: f64,
    busbw: f64,
    algbw: f64,
    wrong: Option<usize>,
    /// NVIDIA NCCL's figures, where it ran.
    nccl: Option<Theirs>,
}

/// NVIDIA NCCL's figures for the same call.
struct Theirs {
    time_us: f64,
    busbw: f64,
    wrong: Option<usize>,
}

struct Table {
    baseline: bool,
    /// Width of the redop column (6 as nccl-tests, 9 when premulsum is listed).
    op_width: usize,
    busbw_sum: f64,
    busbw_n: usize,
    nccl_busbw_sum: f64,
    nccl_busbw_n: usize,
    nccl_wrong: usize,
    ratios: Vec<f64>,
    wrong: usize,
}

fn fmt_time(us: f64) -> String {
    if us >= 10000.0 {
        format!("{us:.0}")
    } else if us >= 100.0 {
        format!("{us:.1}")
    } else {
        format!("{us:.2}")
    }
}

fn median(v: &mut [f64]) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

impl Table {
    /// One placement's columns: time, algbw, busbw, #wrong, then NCCL's time, busbw, ratio.
    fn section(&self, c: [&str; 7]) -> String {
        let [t, a, b, w, nt, nb, r] = c;
        let mut s = format!("  {t:>7}  {a:>6}  {b:>6}  {w:>6}");
        if self.baseline {
            s += &format!("  {nt:>9}  {nb:>10}  {r:>6}");
        }
        s
    }

    /// The columns before the two placements, as wide as nccl-tests' (redop wider when needed).
    fn prefix(&self, size: &str, count: &str, dt: &str, op: &str, root: &str) -> String {
        let w = self.op_width;
        format!("{size:>12}  {count:>12}  {dt:>8}  {op:>w$}  {root:>6}")
    }

    /// A header line: the prefix with its first (blank) column starting with '#'.
    fn comment(line: String) -> String {
        format!("#{}", line.get(1..).unwrap_or(""))
    }

    fn header(&self) {
        let sec = self.section(["", "", "", "", "", "", ""]).len();
        let prefix = self.prefix("", "", "", "", "").len() - 1;
        println!("#");
        println!(
            "#{:prefix$}{:^sec$}{:^sec$}",
            "", "out-of-place", "in-place"
        );
        let cols = self.section([
            "time",
            "algbw",
            "busbw",
            "#wrong",
            "nccl_time",
            "nccl_busbw",
            "ratio",
        ]);
        let head = self.prefix("size", "count", "type", "redop", "root");
        println!("{}{cols}{cols}  algo/proto/ch", Table::comment(head));
        let units = self.section(["(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)", ""]);
        let head = self.prefix("(B)", "(elements)", "", "", "");
        println!("{}{units}{units}", Table::comment(head));
    }

    /// One size's line; `tuned` is what our tuner ran (algorithm/protocol/channels).
    fn row(&mut self, call: &Call, places: &[Option<Measure>; 2], tuned: &str) {
        let op = if call.coll.has_op() {
            call.op.name()
        } else {
            "none"
        };
        let mut line = self.prefix(
            &call.counts.size_bytes.to_string(),
            &call.counts.count.to_string(),
            call.dt.name(),
            op,
            &call.coll.root_column(call.root).to_string(),
        );
        for m in places {
            let Some(m) = m else {
                line += &self.section(["n/a"; 7]);
                continue;
            };
            let wrong = match m.wrong {
                Some(w) => {
                    self.wrong += w;
                    w.to_string()
                }
                None => "N/A".into(),
            };
            self.busbw_sum += m.busbw;
            self.busbw_n += 1;
            let (nt, nb, ratio) = match &m.nccl {
                Some(Theirs {
                    time_us: t,
                    busbw: b,
                    wrong,
                }) => {
                    let (t, b) = (*t, *b);
                    self.nccl_busbw_sum += b;
                    self.nccl_busbw_n += 1;
                    self.nccl_wrong += wrong.unwrap_or(0);
                    let ratio = if b > 0.0 {
                        let r = m.busbw / b;
                        self.ratios.push(r);
                        format!("{r:.2}")
                    } else {
                        "n/a".into()
                    };
                    (fmt_time(t), format!("{b:.2}"), ratio)
                }
                None => ("n/a".into(), "n/a".into(), "n/a".into()),
            };
            line += &self.section([
                &fmt_time(m.time_us),
                &format!("{:.2}", m.algbw),
                &format!("{:.2}", m.busbw),
                &wrong,
                &nt,
                &nb,
                &ratio,
            ]);
        }
        println!("{line}  {tuned}");
        let _ = std::io::stdout().flush();
    }

    fn footer(&self, checked: bool) {
        let stat = |label: &str, value: String| println!("# {label:<21}: {value}");
        if checked {
            let verdict = if self.wrong == 0 { "OK" } else { "FAILED" };
            stat("Wrong values", format!("{} {verdict}", self.wrong));
        }
        let avg = if self.busbw_n > 0 {
            self.busbw_sum / self.busbw_n as f64
        } else {
            0.0
        };
        stat("Avg bus bandwidth", format!("{avg:.4}"));
        if self.baseline {
            if checked {
                let why = if self.nccl_wrong == 0 {
                    ""
                } else {
                    " (NVIDIA NCCL is outside the tolerance too: the check may be too strict)"
                };
                stat("NCCL wrong values", format!("{}{why}", self.nccl_wrong));
            }
            if self.nccl_busbw_n > 0 {
                let avg = self.nccl_busbw_sum / self.nccl_busbw_n as f64;
                stat("NCCL avg bus bandwidth", format!("{avg:.4}"));
            }
            if self.ratios.is_empty() {
                stat("Avg ratio vs NCCL", "n/a (no size ran on both)".into());
            } else {
                let n = self.ratios.len() as f64;
                let mean = self.ratios.iter().sum::<f64>() / n;
                let geo = (self.ratios.iter().map(|r| r.max(1e-12).ln()).sum::<f64>() / n).exp();
                stat(
                    "Avg ratio vs NCCL",
                    format!(
                        "{mean:.4} (busbw ours/NCCL, mean of {} values; geometric mean {geo:.4})",
                        self.ratios.len()
                    ),
                );
            }
        }
        println!("#");
    }
}

// ------------------------------------------------------------------------------------------
// Main
// ------------------------------------------------------------------------------------------

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

fn mib(b: usize) -> String {
    format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
}

/// Settings after defaults for the backend.
struct Settings {
    min_bytes: usize,
    max_bytes: usize,
    warmup: usize,
    iters: usize,
}

/// Errors a run ends with: bad arguments (exit 2) or a failure (exit 1).
enum Fail {
    Usage(String),
    Run(String),
}

impl From<String> for Fail {
    fn from(s: String) -> Fail {
        Fail::Run(s)
    }
}

fn main() -> ExitCode {
    let argv: Vec<OsString> = std::env::args_os().skip(1).collect();
    let args = match parse_args(&argv) {
        Ok(Some(a)) => a,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            eprintln!("nccl_bench: {msg}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    // The baseline first: a wrong path is reported before any device work.
    let baseline = match &args.baseline {
        Some(p) => match Nccl::load(p) {
            Ok(n) => Some(n),
            Err(e) => {
                eprintln!("nccl_bench: error: {e}");
                return ExitCode::FAILURE;
            }
        },
        None => None,
    };
    let (backend, why) = match pick_backend(&args) {
        Picked::Run(b, why) => (b, why),
        Picked::Exit(code) => return code,
    };
    match bench(&args, backend, &why, baseline) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(Fail::Usage(m)) => {
            eprintln!("nccl_bench: {m}");
            ExitCode::from(2)
        }
        Err(Fail::Run(m)) => {
            eprintln!("nccl_bench: error: {m}");
            ExitCode::FAILURE
        }
    }
}

/// The whole run; Ok(false) when some result was wrong.
fn bench(args: &Args, backend: Backend, why: &str, baseline: Option<Nccl>) -> Result<bool, Fail> {
    let sim = backend == Backend::Sim;
    if sim && baseline.is_some() {
        return Err(Fail::Run(format!(
            "--baseline needs CUDA GPUs, but the CPU simulator was picked ({why})"
        )));
    }
    let visible = cuda::device_count().map_err(|e| format!("counting devices: {e}"))?;
    let ngpus = args.ngpus.unwrap_or(visible);
    // The kernel lab: more ranks than GPUs, rank r on device r % visible.
    // Read as the library reads it (environment, then NCCL_CONF_FILE), so both agree.
    let shared = nccl::env::int("NCCL_RS_SHARED_GPUS") == 1;
    if shared && baseline.is_some() {
        return Err(Fail::Usage(
            "NCCL_RS_SHARED_GPUS=1 shares GPUs among ranks, which NVIDIA NCCL refuses: drop --baseline".into(),
        ));
    }
    if ngpus > visible && !shared {
        return Err(Fail::Usage(format!(
            "--ngpus {ngpus}: only {visible} device(s) visible{}",
            if sim {
                " (NCCL_RS_SIM_DEVICES sets how many the simulator shows)"
            } else {
                ""
            }
        )));
    }
    let default_max = if sim { 1 << 20 } else { 128 << 20 };
    let s = Settings {
        min_bytes: args.min_bytes,
        max_bytes: args.max_bytes.unwrap_or(default_max.max(args.min_bytes)),
        warmup: args.warmup.unwrap_or(if sim { 1 } else { 5 }),
        iters: args.iters.unwrap_or(if sim { 5 } else { 20 }),
    };
    if args.root >= ngpus && args.colls.iter().any(|c| c.has_root()) {
        return Err(Fail::Usage(format!(
            "--root {}: there are only {ngpus} ranks",
            args.root
        )));
    }
    let (nthread, ngpu_per_thread) = match args.mode {
        Mode::Thread => (1, ngpus),
        Mode::Threads => (ngpus, 1),
    };
    let names: Vec<&str> = args.colls.iter().map(|c| c.name()).collect();
    println!(
        "# Collective test starting: nccl_bench ({})",
        names.join(", ")
    );
    println!(
        "# nThread {nthread} nGpus {ngpu_per_thread} minBytes {} maxBytes {} step: {}(factor) warmup iters: {} iters: {} validation: {}",
        s.min_bytes, s.max_bytes, args.step_factor, s.warmup, s.iters, args.check as u8
    );
    match backend {
        Backend::Sim => println!("# backend: CPU simulator ({why})"),
        Backend::Cuda => println!("# backend: CUDA ({why})"),
    }
    println!("# nccl-rs {}", nccl::VERSION_STRING);
    if let Some(n) = &baseline {
        println!(
            "# baseline: NVIDIA NCCL {} ({})",
            n.version_string(),
            n.path
        );
    }
    println!("#");
    println!("# Using devices");
    let devs: Vec<i32> = (0..ngpus).map(|r| (r % visible.max(1)) as i32).collect();
    if shared {
        println!("#  NCCL_RS_SHARED_GPUS=1: ranks share GPUs (a kernel lab: no NVLink crossed)");
    }
    let host = hostname();
    let pid = std::process::id();
    for (r, &d) in devs.iter().enumerate() {
        let dev = nccl::Device::open(d).map_err(|e| format!("opening device {d}: {e}"))?;
        let p = dev
            .props()
            .map_err(|e| format!("device {d} properties: {e}"))?;
        println!(
            "#  Rank {r:2} Group  0 Pid {pid:6} on {host:>10} device {d:2} [{}] {}",
            p.bus_id, p.name
        );
    }

    // Our communicators.
    let t0 = Instant::now();
    let comms = Comm::init_all(&devs).map_err(|e| format!("nccl-rs init ({ngpus} ranks): {e}"))?;
    let our_init_ms = t0.elapsed().as_secs_f64() * 1e3;
    let our_mem: Vec<usize> = comms.iter().map(|c| c.init_device_bytes()).collect();

    // Streams, buffers, events.
    let (send_bytes, recv_bytes) = args
        .colls
        .iter()
        .map(|c| c.buffer_bytes(s.max_bytes, ngpus))
        .fold((0, 0), |(s, r), (s2, r2)| (s.max(s2), r.max(r2)));
    let round = |b: usize| b.max(1).next_multiple_of(256);
    let mut ranks = Vec::with_capacity(ngpus);
    for comm in comms {
        let d = comm.device().clone();
        let e = |what: &str, x: nccl::Error| format!("{what} on device {}: {x}", d.ordinal);
        let stream = d.stream_create().map_err(|x| e("stream create", x))?;
        let send = d
            .alloc(round(send_bytes))
            .map_err(|x| e("allocating the send buffer", x))?;
        let recv = d
            .alloc(round(recv_bytes))
            .map_err(|x| e("allocating the receive buffer", x))?;
        let events = (0..=s.iters)
            .map(|_| d.event_create())
            .collect::<nccl::Result<Vec<u64>>>()
            .map_err(|x| e("event create", x))?;
        ranks.push(Rank {
            comm,
            stream,
            send,
            recv,
            events,
        });
    }
    let mut b = Bench {
        ranks,
        mode: args.mode,
        nccl: None,
        host: vec![0u8; send_bytes.max(recv_bytes)],
    };

    println!("#");
    println!(
        "# nccl-rs init: {our_init_ms:.1} ms; device memory per GPU: {}",
        our_mem
            .iter()
            .map(|&m| mib(m))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if let Some(lib) = baseline {
        let free = |b: &Bench| -> Result<Vec<usize>, String> {
            b.ranks
                .iter()
                .map(|r| {
                    r.comm
                        .device()
                        .mem_info()
                        .map(|(f, _)| f)
                        .map_err(|e| format!("mem_info: {e}"))
                })
                .collect()
        };
        let before = free(&b)?;
        let t0 = Instant::now();
        let comms = lib.comm_init_all(&devs)?;
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        let after = free(&b)?;
        println!(
            "# NVIDIA NCCL init: {ms:.1} ms; device memory per GPU: {}",
            before
                .iter()
                .zip(&after)
                .map(|(&a, &z)| mib(a.saturating_sub(z)))
                .collect::<Vec<_>>()
                .join(", ")
        );
        b.nccl = Some((lib, comms));
    }

    let mut all_right = true;
    for &coll in &args.colls {
        let mut table = Table {
            baseline: b.nccl.is_some(),
            op_width: args.ops.iter().map(|o| o.name().len()).fold(6, usize::max),
            busbw_sum: 0.0,
            busbw_n: 0,
            nccl_busbw_sum: 0.0,
            nccl_busbw_n: 0,
            nccl_wrong: 0,
            ratios: Vec::new(),
            wrong: 0,
        };
        println!("#");
        println!("# Collective: {}", coll.name());
        table.header();
        let outcome = measure_all(&mut b, args, &s, coll, &mut table);
        if let Err(m) = outcome {
            if !b.quiesce() {
                // A kernel may still run on some GPU (its peers never came): freeing its
                // buffers could hang or fault, so leave now and let the process exit release
                // them.
                eprintln!("nccl_bench: error: {m}");
                eprintln!("nccl_bench: some GPU work did not finish; exiting without cleanup");
                std::process::exit(1);
            }
            return Err(Fail::Run(m));
        }
        table.footer(args.check);
        all_right &= table.wrong == 0;
    }
    b.teardown()?;
    Ok(all_right)
}

/// Every type, op and size of the table.
fn measure_all(
    b: &mut Bench,
    args: &Args,
    s: &Settings,
    coll: Collective,
    table: &mut Table,
) -> Result<(), String> {
    let n = b.nranks();
    let ops: Vec<Op> = if coll.has_op() {
        args.ops.clone()
    } else {
        vec![Op::Sum]
    };
    for &dt in &args.dtypes {
        for &op in &ops {
            let with_nccl = b.nccl.as_ref().is_some_and(|(l, _)| l.supports(dt, op));
            let mut noted = false;
            let mut size = s.min_bytes;
            loop {
                let counts = coll.counts(size, dt, n);
                let mut place = |in_place: bool| -> Result<Measure, String> {
                    let call = Call {
                        coll,
                        dt,
                        op,
                        counts,
                        root: args.root,
                        in_place,
                    };
                    let seed = (size as u64)
                        .wrapping_mul(1_000_003)
                        .wrapping_add((dt as u64) << 40)
                        .wrapping_add((op as u64) << 48)
                        .wrapping_add((coll as u64) << 56)
                        .wrapping_add(in_place as u64);
                    let data = args.check.then(|| coll.check_data(&call, n, seed));
                    let mut m = measure(b, Lib::Ours, &call, data.as_ref(), s, n)?;
                    if with_nccl {
                        let theirs = measure(b, Lib::Nccl, &call, data.as_ref(), s, n)?;
                        if let Some(w) = theirs.wrong.filter(|&w| w > 0 && !noted) {
                            noted = true;
                            println!(
                                "# note: NVIDIA NCCL gave {w} values outside the tolerance too ({} {} {} bytes {}; not repeated for this type and op)",
                                dt.name(),
                                op.name(),
                                counts.size_bytes,
                                if in_place { "in-place" } else { "out-of-place" }
                            );
                        }
                        m.nccl = Some(Theirs {
                            time_us: theirs.time_us,
                            busbw: theirs.busbw,
                            wrong: theirs.wrong,
                        });
                    }
                    Ok(m)
                };
                let places = [
                    Some(place(false)?),
                    match coll.in_place_applies() {
                        true => Some(place(true)?),
                        false => None,
                    },
                ];
                let call = Call {
                    coll,
                    dt,
                    op,
                    counts,
                    root: args.root,
                    in_place: false,
                };
                let tuned = match coll.tuned() {
                    Some(t) => b.ranks[0]
                        .comm
                        .tuning(t, counts.size_bytes)
                        .map(|c| format!("{}/{}/{}", c.algo, c.proto, c.nchannels))
                        .unwrap_or_else(|_| "-".into()),
                    None => "p2p".into(),
                };
                table.row(&call, &places, &tuned);
                // As nccl-tests: multiply until past the largest size (a 0-byte start goes on at 1).
                size = match size.checked_mul(args.step_factor) {
                    Some(0) => 1,
                    Some(next) if next <= s.max_bytes => next,
                    _ => break,
                };
                if size > s.max_bytes {
                    break;
                }
            }
        }
    }
    Ok(())
}

/// The check (when asked), the warm-up and the timed iterations of one call on one library.
fn measure(
    b: &mut Bench,
    lib: Lib,
    call: &Call,
    data: Option<&CheckData>,
    s: &Settings,
    nranks: usize,
) -> Result<Measure, String> {
    let wrong = match data {
        Some(d) => Some(b.check(lib, call, d)?),
        None => None,
    };
    let mut times = b.run(lib, call, s.warmup, s.iters)?;
    let time_us = median(&mut times) * 1e3;
    let algbw = if time_us > 0.0 {
        call.counts.size_bytes as f64 / 1e3 / time_us
    } else {
        0.0
    };
    Ok(Measure {
        time_us,
        algbw,
        busbw: algbw * call.coll.bus_factor(nranks),
        wrong,
        nccl: None,
    })
}
