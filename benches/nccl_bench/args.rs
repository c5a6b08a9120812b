//! The command line: options, their defaults and the usage text.

use crate::collective::Collective;
use nccl::cuda::Backend;
use nccl::{DataType, RedOpKind, ReduceOp};
use nccl_device::types::Elem;
use nccl_device::with_elem;
use std::ffi::{c_int, OsString};
use std::path::PathBuf;

pub const USAGE: &str = "\
usage: nccl_bench [options]      (cargo bench --bench nccl_bench -- [options]; with no
                                 options at all, as `cargo test` runs it, a quick checked run
                                 of every collective on 2 simulated GPUs)
  -C, --collective NAME     all_reduce broadcast reduce all_gather reduce_scatter, or all
                            (one table each); a comma-separated list works too [all_reduce]
  -r, --root N              root rank of broadcast and reduce [0]
  -b, --minbytes SIZE       smallest size, bytes (K/M/G suffixes: powers of 1024) [8]
  -e, --maxbytes SIZE       largest size [128M; 1M on the simulator]
  -f, --stepfactor N        multiply the size by N at each step [2]
  -g, --ngpus N             GPUs to use (ranks 0..N-1 on devices 0..N-1) [all visible];
                            with NCCL_RS_SHARED_GPUS=1, ranks (any number) on devices r % visible
  -w, --warmup_iters N      untimed iterations before each measurement [5; 1 on the simulator]
  -n, --iters N             timed iterations [20; 5 on the simulator]
      --stat mean|median    a call's time: the timed loop / iterations on the slowest GPU, as
                            nccl-tests; or the median iteration, each the slowest GPU's [mean]
  -d, --datatype NAME       int8 uint8 int32 uint32 int64 uint64 half float double bfloat16
                            f8e4m3 f8e5m2, or all; a comma-separated list works too [float]
  -o, --op NAME             sum prod max min avg premulsum, or all; a list works too [sum]
  -c, --check 0|1           check the results of the first call of every size [1]
  -t, --mode thread|threads one thread drives every GPU, or a thread per GPU [thread]
  -G, --cudagraph N         capture N iterations in a CUDA graph per GPU and time its replays
                            (each replay's time / N; -w and -n count replays) [0: no graph]
  -R, --local_register 0|1|2  1: register every rank's send and receive buffers with
                            ncclCommRegister (both libraries) before measuring; 2: as
                            symmetric windows (ncclCommWindowRegister, nccl-rs only) [0]
      --baseline PATH       NVIDIA libnccl.so.2 to run side by side (CUDA backend only)
      --baseline-env K=V    set K=V for the baseline alone (repeat for several): only
                            NCCL_SOCKET_NTHREADS and NCCL_NSOCKS_PERTHREAD, which nccl-rs
                            reads once, at its init, before the baseline's starts; NVIDIA
                            NCCL's best socket setting beside nccl-rs's default in one run
      --idle-cpu SECONDS    after the last table, with every communicator alive, report the
                            CPU time the libraries' own threads (nccl-rs's proxy and socket
                            helpers, NVIDIA NCCL's) use over SECONDS of quiet [2 with a
                            process per rank (the network's proxies run); else 0: not done]
      --ras-queries N       while measuring, a thread of this process sends N RAS STATUS
                            queries a second to the process's RAS listener (each a report
                            of every rank's state), to see what RAS costs a job [0]
      --backend cuda|sim    CUDA GPUs or the CPU simulator [cuda if a GPU is visible, else sim]
      --csv FILE            also write every measured row to FILE as CSV: one line per size
                            and placement, with the run's backend, GPU, versions, date, command
      --json FILE           the same records as JSON: {\"meta\": {...}, \"rows\": [{...}, ...]}
      --nodes N             start N x R rank processes on this machine, one rank each, node k's
      --ranks-per-node R    with NCCL_HOSTID=nccl-bench-node-k, so ranks of different nodes
                            meet through the network transport (sockets; GPUs shared under
                            NCCL_RS_SHARED_GPUS=1, with MPS) [R: 1]. Under mpirun, srun or
                            torchrun the rank and size come from RANK/WORLD_SIZE,
                            OMPI_COMM_WORLD_*, PMI_* or SLURM_* instead (the first set wins:
                            torchrun's inside srun), and NCCL_COMM_ID=host:port names the
                            bootstrap root (the baseline's is port + 1)
  -h, --help                this text";

/// How a call's time comes from the timed iterations (`--stat`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stat {
    /// The timed loop's length / iterations on the slowest GPU (nccl-tests' time): what a
    /// stream of back-to-back calls costs per call.
    Mean,
    /// The median over the iterations of each iteration's slowest GPU. Where ranks take turns
    /// waiting (one rank's call is short while its peer's is long, and the other way round the
    /// next time), every iteration's slowest is a long one, so this reads above the mean.
    Median,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// One thread launches on every GPU in turn (NVIDIA NCCL inside a group).
    Thread,
    /// A thread per GPU.
    Threads,
}

/// The op as nccl-rs takes it for `dt` (PreMulSum by 1, so the result is the sum).
pub fn ours(op: RedOpKind, dt: DataType) -> ReduceOp {
    ReduceOp::builtin(op).unwrap_or_else(|| {
        ReduceOp::pre_mul_sum(with_elem!(dt, T => Elem::to_bits(T::from_f64(1.0))))
    })
}

/// `ncclRedOp_t`; None where NCCL has no built-in (PreMulSum needs a user-created op).
pub fn nccl_op(op: RedOpKind) -> Option<c_int> {
    (op != RedOpKind::PreMulSum).then_some(op as c_int)
}

pub struct Args {
    pub colls: Vec<Collective>,
    pub root: usize,
    pub min_bytes: usize,
    pub max_bytes: Option<usize>,
    pub step_factor: usize,
    pub ngpus: Option<usize>,
    pub warmup: Option<usize>,
    pub iters: Option<usize>,
    pub dtypes: Vec<DataType>,
    pub ops: Vec<RedOpKind>,
    pub check: bool,
    pub mode: Mode,
    /// `-G N`: iterations captured per CUDA graph (0: launched directly).
    pub graph: usize,
    /// `--stat`: how a call's time is taken from the timed iterations.
    pub stat: Stat,
    /// `-R 1`: the buffers are registered with each communicator; `-R 2`: as symmetric
    /// windows.
    pub register: u8,
    pub baseline: Option<PathBuf>,
    /// `--baseline-env K=V`: set for the baseline's init (after nccl-rs's).
    pub baseline_env: Vec<(String, String)>,
    pub backend: Option<Backend>,
    /// `--ras-queries N`: RAS STATUS queries a second while measuring (`ras_load`).
    pub ras_queries: usize,
    /// `--csv FILE`: the records, as CSV.
    pub csv: Option<PathBuf>,
    /// `--json FILE`: the records, as JSON.
    pub json: Option<PathBuf>,
    /// `--nodes N`: start N × `ranks_per_node` rank processes, one rank each (`launch`).
    pub nodes: Option<usize>,
    pub ranks_per_node: Option<usize>,
    /// `--idle-cpu S`: seconds of quiet to measure the libraries' threads over (None: the
    /// default for the run's kind).
    pub idle_cpu: Option<f64>,
}

/// Settings `--baseline-env` may give the baseline: nccl-rs reads them only while its
/// communicators are made (the socket network is made then, once per process), so setting
/// them afterwards reaches NVIDIA NCCL alone. Variables nccl-rs reads later would reach both.
const BASELINE_ONLY: [&str; 2] = ["NCCL_SOCKET_NTHREADS", "NCCL_NSOCKS_PERTHREAD"];

/// A duration in seconds, 0 to an hour.
fn parse_seconds(s: &str, what: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if (0.0..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!("{what} '{s}': seconds from 0 to 3600")),
    }
}

/// `NAME=VALUE` of `--baseline-env`, NAME one of [`BASELINE_ONLY`].
fn parse_baseline_env(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("--baseline-env '{s}': use NAME=VALUE"))?;
    let k = k.trim();
    if !BASELINE_ONLY.contains(&k) {
        return Err(format!(
            "--baseline-env {k}: only {} (read by nccl-rs at its init alone)",
            BASELINE_ONLY.join(", ")
        ));
    }
    Ok((k.to_string(), v.trim().to_string()))
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

fn parse_ops(s: &str) -> Result<Vec<RedOpKind>, String> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(RedOpKind::ALL.to_vec());
    }
    s.split(',')
        .map(|n| {
            RedOpKind::ALL
                .into_iter()
                .find(|o| o.name().eq_ignore_ascii_case(n.trim()))
                .ok_or_else(|| {
                    let names: Vec<&str> = RedOpKind::ALL.iter().map(|o| o.name()).collect();
                    format!("unknown op '{n}' (one of {}, or all)", names.join(" "))
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
pub fn parse_args(argv: &[OsString]) -> Result<Option<Args>, String> {
    let mut a = Args::default();
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
        let (key, inline) = split_option(arg)?;
        if !OPTIONS.contains(&key.as_str()) {
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
        set_option(&mut a, &key, value)?;
    }
    check_args(&a)?;
    Ok(Some(a))
}

impl Default for Args {
    /// The defaults of the usage text (those that depend on the backend are None).
    fn default() -> Args {
        Args {
            colls: vec![Collective::AllReduce],
            root: 0,
            min_bytes: 8,
            max_bytes: None,
            step_factor: 2,
            ngpus: None,
            warmup: None,
            iters: None,
            dtypes: vec![DataType::Float32],
            ops: vec![RedOpKind::Sum],
            check: true,
            mode: Mode::Thread,
            graph: 0,
            stat: Stat::Mean,
            register: 0,
            baseline: None,
            baseline_env: Vec::new(),
            backend: None,
            ras_queries: 0,
            csv: None,
            json: None,
            nodes: None,
            ranks_per_node: None,
            idle_cpu: None,
        }
    }
}

/// The long names of the options that take a value (a short option is one of them too).
const OPTIONS: [&str; 24] = [
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
    "cudagraph",
    "stat",
    "local_register",
    "collective",
    "root",
    "baseline",
    "baseline-env",
    "backend",
    "csv",
    "json",
    "nodes",
    "ranks-per-node",
    "idle-cpu",
    "ras-queries",
];

/// An option as its long name and the value written in the same argument, if any:
/// `--name=value`, `--name`, `-xvalue`, `-x`.
fn split_option(arg: &str) -> Result<(String, Option<String>), String> {
    if let Some(rest) = arg.strip_prefix("--") {
        return Ok(match rest.split_once('=') {
            Some((k, v)) => (k.to_string(), Some(v.to_string())),
            None => (rest.to_string(), None),
        });
    }
    let Some(rest) = arg.strip_prefix('-') else {
        return Err(format!("unexpected argument '{arg}'"));
    };
    let mut chars = rest.chars();
    let Some(c) = chars.next() else {
        return Err("unexpected argument '-'".into());
    };
    let long = short_option(c).ok_or_else(|| format!("unknown option '{arg}'"))?;
    let v = chars.as_str();
    Ok((long.to_string(), (!v.is_empty()).then(|| v.to_string())))
}

/// The long name of a one-letter option.
fn short_option(c: char) -> Option<&'static str> {
    Some(match c {
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
        'G' => "cudagraph",
        'R' => "local_register",
        'C' => "collective",
        'r' => "root",
        _ => return None,
    })
}

/// `0` or `1` of `--check` and `--local_register`.
fn parse_switch(s: &str, what: &str) -> Result<bool, String> {
    match s.trim() {
        "0" => Ok(false),
        "1" => Ok(true),
        v => Err(format!("{what}: '{v}' (use 0 or 1)")),
    }
}

/// Sets option `key` (a long name of [`OPTIONS`]) to `value`.
fn set_option(a: &mut Args, key: &str, value: String) -> Result<(), String> {
    match key {
        "minbytes" => a.min_bytes = parse_size(&value)?,
        "maxbytes" => a.max_bytes = Some(parse_size(&value)?),
        "stepfactor" => a.step_factor = parse_number(&value, "--stepfactor")?,
        "ngpus" => a.ngpus = Some(parse_number(&value, "--ngpus")?),
        "warmup_iters" => a.warmup = Some(parse_number(&value, "--warmup_iters")?),
        "iters" => a.iters = Some(parse_number(&value, "--iters")?),
        "datatype" => a.dtypes = parse_datatypes(&value)?,
        "op" => a.ops = parse_ops(&value)?,
        "check" => a.check = parse_switch(&value, "--check")?,
        "mode" => {
            a.mode = match value.trim() {
                "thread" | "1" => Mode::Thread,
                "threads" => Mode::Threads,
                v => return Err(format!("--mode: '{v}' (use thread or threads)")),
            }
        }
        "cudagraph" => a.graph = parse_number(&value, "--cudagraph")?,
        "stat" => {
            a.stat = match value.trim() {
                "mean" => Stat::Mean,
                "median" => Stat::Median,
                v => return Err(format!("--stat: '{v}' (use mean or median)")),
            }
        }
        "local_register" => {
            a.register = match value.as_str() {
                "0" | "1" | "2" => value.parse().unwrap_or(0),
                v => return Err(format!("--local_register: '{v}' (use 0, 1 or 2)")),
            }
        }
        "collective" => a.colls = parse_collectives(&value)?,
        "root" => a.root = parse_number(&value, "--root")?,
        "baseline" => a.baseline = Some(PathBuf::from(value)),
        "baseline-env" => a.baseline_env.push(parse_baseline_env(&value)?),
        "ras-queries" => a.ras_queries = parse_number(&value, "--ras-queries")?,
        "backend" => {
            a.backend = Some(match value.trim() {
                "cuda" => Backend::Cuda,
                "sim" | "simulator" => Backend::Sim,
                v => return Err(format!("--backend: '{v}' (use cuda or sim)")),
            })
        }
        "csv" => a.csv = Some(PathBuf::from(value)),
        "json" => a.json = Some(PathBuf::from(value)),
        "nodes" => a.nodes = Some(parse_number(&value, "--nodes")?),
        "ranks-per-node" => a.ranks_per_node = Some(parse_number(&value, "--ranks-per-node")?),
        "idle-cpu" => a.idle_cpu = Some(parse_seconds(&value, "--idle-cpu")?),
        _ => unreachable!("every key was checked against the known list"),
    }
    Ok(())
}

/// The options' combinations: what one needs of another, and what excludes what.
fn check_args(a: &Args) -> Result<(), String> {
    if a.step_factor < 2 {
        return Err(format!("--stepfactor {}: use 2 or more", a.step_factor));
    }
    if a.ngpus == Some(0) {
        return Err("--ngpus 0: use at least one GPU".into());
    }
    if a.nodes == Some(0) || a.ranks_per_node == Some(0) {
        return Err("--nodes and --ranks-per-node: use at least 1".into());
    }
    if a.ranks_per_node.is_some() && a.nodes.is_none() {
        return Err("--ranks-per-node needs --nodes".into());
    }
    if a.nodes.is_some() && a.ngpus.is_some() {
        return Err("--nodes: every rank process drives one GPU; drop --ngpus".into());
    }
    if a.graph > 0 && a.mode == Mode::Threads {
        return Err(
            "-G: graphs are captured by one thread driving every GPU (use -t thread)".into(),
        );
    }
    if !a.baseline_env.is_empty() && a.baseline.is_none() {
        return Err("--baseline-env needs --baseline".into());
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
    Ok(())
}
