//! `nccl_bench`: the performance tool of nccl-rs, in the style of nccl-tests, with NVIDIA NCCL
//! as the baseline in the same run (same buffers, same streams, same sizes, same timing code).
//!
//! ```text
//! cargo bench --bench nccl_bench -- -b 8 -e 128M -f 2 -g 4
//! cargo bench --bench nccl_bench -- -C all_gather -g 4
//! cargo bench --bench nccl_bench -- -C all --csv bench.csv --json bench.json
//! cargo bench --bench nccl_bench -- --nodes 2 --ranks-per-node 2 -C all
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
//! longest of the GPUs' times; the reported time is the timed loop's length / iterations on
//! the slowest GPU, as nccl-tests reports it (`--stat median`: the median iteration).
//! Checking (`-c 1`): fresh data before the first call of every size, outputs poisoned, the
//! result compared with a host reference computed with the device crate's own arithmetic
//! (exact for integers, a tolerance from the reduction depth for floats).
//!
//! `--csv FILE` and `--json FILE` write the table's rows as records, one per size and
//! placement, with the run's backend, GPU, versions, host, date and command line (`records`);
//! `docs/perf/make_page.py` turns them (or this text output) into `docs/performance.md`.
//!
//! The modules, one job each: `args` (the command line), `backend` (CUDA or the simulator),
//! `baseline` (NVIDIA NCCL through dlopen), `collective` (what each collective is and how it
//! is launched), `data` (inputs, the host reference, the check), `launch` (one rank per
//! process: `--nodes`, or a cluster launcher's environment), `ranks` (each GPU's
//! communicator, stream, buffers, events), `timing` (events, medians, the rendezvous of
//! per-GPU threads), `idle` (the libraries' threads' CPU while idle), `output` (the nccl-tests text table), `records` (CSV and JSON); this file
//! runs them in order.

mod args;
mod backend;
mod baseline;
mod collective;
mod data;
mod idle;
mod launch;
mod launch_env;
mod output;
mod ranks;
mod ras_load;
mod records;
mod register;
mod timing;

use args::{parse_args, Args, Mode, USAGE};
use backend::{pick_backend, Picked};
use baseline::Nccl;
use collective::{Call, Collective};
use launch::{Member, Role};
use nccl::cuda::{self, Backend};
use nccl::{Comm, RedOpKind};
use output::{Measure, Table, Theirs};
use ranks::{Bench, Lib, Rank};
use records::Records;
use std::ffi::OsString;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use timing::measure;

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
    /// Iterations per CUDA graph (`-G`; 0: direct launches).
    graph: usize,
    /// How a call's time is taken from the timed iterations (`--stat`).
    stat: args::Stat,
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

/// The arguments of a run with none (as `cargo test` runs the target).
const SMOKE_ARGS: [&str; 18] = [
    "--backend",
    "sim",
    "-g",
    "2",
    "-C",
    "all",
    "-b",
    "8",
    "-e",
    "256K",
    "-f",
    "32",
    "-c",
    "1",
    "-n",
    "2",
    "-w",
    "1",
];

fn main() -> ExitCode {
    // NCCL_DEBUG and friends, as nccl-tests users expect (a library never installs it itself).
    nccl::init_logging();
    let mut argv: Vec<OsString> = std::env::args_os().skip(1).collect();
    if argv.is_empty() {
        // `cargo test` runs the bench target (`test = true` in Cargo.toml) with no arguments,
        // and `cargo bench` always passes `--bench`: a quick checked run of every collective
        // on the simulator, so that the test suite builds and runs the main job's code.
        println!(
            "nccl_bench: no arguments (cargo test): {}",
            SMOKE_ARGS.join(" ")
        );
        argv = SMOKE_ARGS.iter().map(OsString::from).collect();
    }
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
    let member = match launch::role(args.nodes, args.ranks_per_node, baseline.as_ref()) {
        Ok(Role::Single) => None,
        Ok(Role::Member(m)) => Some(*m),
        Ok(Role::Parent { nodes, per_node }) => {
            return launch::parent(nodes, per_node, backend, baseline.as_ref()).unwrap_or_else(
                |e| {
                    eprintln!("nccl_bench: error: {e}");
                    ExitCode::FAILURE
                },
            )
        }
        Err(e) => {
            eprintln!("nccl_bench: error: {e}");
            return ExitCode::FAILURE;
        }
    };
    if member.as_ref().is_some_and(|m| m.rank != 0) {
        quiet_stdout();
    }
    match bench(&args, backend, &why, baseline, member) {
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

/// Ranks other than 0 of a run with a process per rank print nothing (errors go to stderr).
fn quiet_stdout() {
    use std::os::fd::AsRawFd;
    if let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") {
        // SAFETY: dup2 onto stdout of a descriptor we own; stdout stays valid.
        unsafe { libc::dup2(null.as_raw_fd(), libc::STDOUT_FILENO) };
    }
}

/// The whole run; Ok(false) when some result was wrong. `member`: this process is one rank of
/// a run with a process per rank.
fn bench(
    args: &Args,
    backend: Backend,
    why: &str,
    baseline: Option<Nccl>,
    member: Option<Member>,
) -> Result<bool, Fail> {
    let sim = backend == Backend::Sim;
    let started = records::utc_now();
    let layout = plan_layout(args, sim, why, baseline.is_some(), member.as_ref())?;
    let s = settings(args, sim);
    print_header(
        args,
        &s,
        layout.ngpus,
        backend,
        why,
        member.as_ref(),
        baseline.as_ref(),
    );
    let host = hostname();
    let gpus = list_devices(&layout, &host)?;
    let meta = records::Meta {
        backend: if sim { "sim" } else { "cuda" },
        gpu: gpus.join(", "),
        nccl_rs_version: nccl::VERSION_STRING.to_string(),
        nccl_version: baseline.as_ref().map(|n| n.version_string()),
        hostname: host,
        date_utc: started,
        warmup_iters: s.warmup,
        iters: s.iters,
        command: records::command_line(),
    };
    let mut records = Records::new(args.csv.as_deref(), args.json.as_deref(), meta)?;

    let (comms, our_init_ms) = init_ours(&layout, member.as_ref())?;
    let our_mem: Vec<usize> = comms.iter().map(|c| c.init_device_bytes()).collect();
    let mut b = open_ranks(comms, args, &s, &layout)?;
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
        init_baseline(lib, &mut b, args, member.as_ref(), &layout.devs)?;
    }
    match args.register {
        1 => register::buffers(&b)?,
        2 => register::windows(&b)?,
        _ => {}
    }

    let load = ras_load::Load::start(args.ras_queries).map_err(Fail::Usage)?;
    let all_right = run_tables(&mut b, args, &s, &mut records)?;
    if let Some(l) = load {
        l.stop();
    }
    report_idle(args, member.is_some());
    b.teardown()?;
    Ok(all_right)
}

/// Where this process's ranks run, as the checks at the start of a run settle it.
struct Layout {
    /// GPUs this process drives (1 when each rank has its own process).
    ngpus: usize,
    /// Ranks in the communicator (in every process).
    world: usize,
    /// `NCCL_RS_SHARED_GPUS=1`: more ranks than GPUs, rank r on device r % visible.
    shared: bool,
    /// The global rank of this process's first rank.
    first: usize,
    /// The device of each of this process's ranks.
    devs: Vec<i32>,
}

/// The run's checks: GPUs, ranks and the root against what is visible and what the baseline
/// takes (a bad combination is a usage error).
fn plan_layout(
    args: &Args,
    sim: bool,
    why: &str,
    with_baseline: bool,
    member: Option<&Member>,
) -> Result<Layout, Fail> {
    if sim && with_baseline {
        return Err(Fail::Run(format!(
            "--baseline needs CUDA GPUs, but the CPU simulator was picked ({why})"
        )));
    }
    let visible = cuda::device_count().map_err(|e| format!("counting devices: {e}"))?;
    let ngpus = match member {
        Some(_) => 1,
        None => args.ngpus.unwrap_or(visible),
    };
    let world = member.map_or(ngpus, |m| m.world);
    // The kernel lab: more ranks than GPUs, rank r on device r % visible.
    // Read as the library reads it (environment, then NCCL_CONF_FILE), so both agree.
    let shared = std::env::var("NCCL_RS_SHARED_GPUS").is_ok_and(|v| v.trim() == "1");
    if let Some(m) = member {
        if m.local >= visible && !shared {
            return Err(Fail::Usage(format!(
                "rank process {} of this machine, but only {visible} device(s) visible: NCCL_RS_SHARED_GPUS=1 lets rank processes share GPUs",
                m.local
            )));
        }
    }
    // NVIDIA NCCL refuses two ranks on one GPU of one node, but takes them on two nodes.
    if shared && with_baseline && member.is_none() {
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
    if args.root >= world && args.colls.iter().any(|c| c.has_root()) {
        return Err(Fail::Usage(format!(
            "--root {}: there are only {world} ranks",
            args.root
        )));
    }
    let devs: Vec<i32> = match member {
        Some(m) => vec![(m.local % visible.max(1)) as i32],
        None => (0..ngpus).map(|r| (r % visible.max(1)) as i32).collect(),
    };
    Ok(Layout {
        ngpus,
        world,
        shared,
        first: member.map_or(0, |m| m.rank),
        devs,
    })
}

/// The sizes and iterations of the run: the arguments, with the backend's defaults.
fn settings(args: &Args, sim: bool) -> Settings {
    let default_max = if sim { 1 << 20 } else { 128 << 20 };
    Settings {
        min_bytes: args.min_bytes,
        max_bytes: args.max_bytes.unwrap_or(default_max.max(args.min_bytes)),
        warmup: args.warmup.unwrap_or(if sim { 1 } else { 5 }),
        iters: args.iters.unwrap_or(if sim { 5 } else { 20 }),
        graph: args.graph,
        stat: args.stat,
    }
}

/// The nccl-tests header: the collectives, sizes and iterations, how times are taken, the
/// backend, the versions, this rank's process and the baseline. `ngpus`: GPUs of this process.
fn print_header(
    args: &Args,
    s: &Settings,
    ngpus: usize,
    backend: Backend,
    why: &str,
    member: Option<&Member>,
    baseline: Option<&Nccl>,
) {
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
    println!(
        "# time: {}",
        match s.stat {
            args::Stat::Mean => "the timed loop / iterations, on the slowest GPU (nccl-tests)",
            args::Stat::Median =>
                "the median iteration, each iteration's slowest GPU (--stat median)",
        }
    );
    if s.graph > 0 {
        println!(
            "# CUDA graphs: {} iterations captured per graph; times are a replay's / {}",
            s.graph, s.graph
        );
    }
    match backend {
        Backend::Sim => println!("# backend: CPU simulator ({why})"),
        _ => println!("# backend: CUDA ({why})"),
    }
    println!("# nccl-rs {}", nccl::VERSION_STRING);
    if let Some(m) = member {
        let hostid = std::env::var("NCCL_HOSTID").unwrap_or_default();
        println!(
            "# {} rank processes, one rank each ({}); this is rank {}{}; times are the longest rank's",
            m.world,
            m.from,
            m.rank,
            if hostid.is_empty() {
                String::new()
            } else {
                format!(", NCCL_HOSTID={hostid}")
            }
        );
    }
    if let Some(n) = baseline {
        println!(
            "# baseline: NVIDIA NCCL {} ({})",
            n.version_string(),
            n.path
        );
    }
}

/// The header's "Using devices" lines, a line per rank of this process; returns the devices'
/// distinct names, in rank order.
fn list_devices(layout: &Layout, host: &str) -> Result<Vec<String>, String> {
    println!("#");
    println!("# Using devices");
    if layout.shared {
        println!("#  NCCL_RS_SHARED_GPUS=1: ranks share GPUs (a kernel lab: no NVLink crossed)");
    }
    let pid = std::process::id();
    let mut gpus: Vec<String> = Vec::new();
    for (i, &d) in layout.devs.iter().enumerate() {
        let r = layout.first + i;
        let dev = nccl::Device::open(d).map_err(|e| format!("opening device {d}: {e}"))?;
        let p = dev
            .props()
            .map_err(|e| format!("device {d} properties: {e}"))?;
        println!(
            "#  Rank {r:2} Group  0 Pid {pid:6} on {host:>10} device {d:2} [{}] {}",
            p.bus_id, p.name
        );
        if !gpus.contains(&p.name) {
            gpus.push(p.name);
        }
    }
    Ok(gpus)
}

/// Our communicators, one per rank of this process, and how long their init took (ms).
fn init_ours(layout: &Layout, member: Option<&Member>) -> Result<(Vec<Comm>, f64), String> {
    let t0 = Instant::now();
    let comms = match member {
        Some(m) => {
            let dev =
                nccl::Device::open(layout.devs[0]).map_err(|e| format!("opening the GPU: {e}"))?;
            vec![Comm::init_rank_on(dev, m.world, &m.id, m.rank)
                .map_err(|e| format!("nccl-rs init (rank {} of {}): {e}", m.rank, m.world))?]
        }
        None => Comm::init_all(&layout.devs)
            .map_err(|e| format!("nccl-rs init ({} ranks): {e}", layout.ngpus))?,
    };
    Ok((comms, t0.elapsed().as_secs_f64() * 1e3))
}

/// The ranks around our communicators: each one's stream, send and receive buffers (as large
/// as the largest size of any listed collective needs) and events, with the host staging.
fn open_ranks(
    comms: Vec<Comm>,
    args: &Args,
    s: &Settings,
    layout: &Layout,
) -> Result<Bench, String> {
    let world = layout.world;
    let (send_bytes, recv_bytes) = args
        .colls
        .iter()
        .map(|c| c.buffer_bytes(s.max_bytes, world))
        .fold((0, 0), |(s, r), (s2, r2)| (s.max(s2), r.max(r2)));
    let round = |b: usize| b.max(1).next_multiple_of(256);
    let mut ranks = Vec::with_capacity(layout.ngpus);
    for (i, comm) in comms.into_iter().enumerate() {
        let d = comm.device().clone();
        let e = |what: &str, x: nccl::Error| format!("{what} on device {}: {x}", d.ordinal);
        let stream = nccl::Stream::new(&d).map_err(|x| e("stream create", x))?;
        let send = d
            .alloc(round(send_bytes))
            .map_err(|x| e("allocating the send buffer", x))?;
        let recv = d
            .alloc(round(recv_bytes))
            .map_err(|x| e("allocating the receive buffer", x))?;
        let events = (0..=s.iters)
            .map(|_| nccl::Event::new(&d))
            .collect::<nccl::Result<Vec<_>>>()
            .map_err(|x| e("event create", x))?;
        ranks.push(Rank {
            global: layout.first + i,
            comm: ranks::RankComm(comm),
            stream,
            send,
            recv,
            events,
        });
    }
    Ok(Bench {
        ranks,
        world,
        mode: args.mode,
        nccl: None,
        host: vec![0u8; send_bytes.max(recv_bytes)],
    })
}

/// Each GPU's free device memory, in rank order.
fn free_memory(b: &Bench) -> Result<Vec<usize>, String> {
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
}

/// NVIDIA NCCL's communicators beside ours (`--baseline`), with `--baseline-env` set for them
/// alone; reports their init time and the device memory they took.
fn init_baseline(
    lib: Nccl,
    b: &mut Bench,
    args: &Args,
    member: Option<&Member>,
    devs: &[i32],
) -> Result<(), String> {
    let before = free_memory(b)?;
    if !args.baseline_env.is_empty() {
        // nccl-rs's communicators (and its socket network) are made: what is set now
        // reaches the baseline alone (`args::BASELINE_ONLY`).
        for (k, v) in &args.baseline_env {
            std::env::set_var(k, v);
        }
        let set: Vec<String> = args
            .baseline_env
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        println!("# NVIDIA NCCL alone: {}", set.join(" "));
    }
    if idle_seconds(args, member.is_some()) > 0.0
        && std::env::var_os("NCCL_SET_THREAD_NAME").is_none()
    {
        // NVIDIA NCCL names its threads ("NCCL ...") only when asked: `idle` counts them.
        std::env::set_var("NCCL_SET_THREAD_NAME", "1");
    }
    let t0 = Instant::now();
    let comms = match member {
        Some(m) => {
            let id = m
                .nccl_id
                .ok_or_else(|| "the baseline's unique id did not reach this rank".to_string())?;
            b.ranks[0]
                .comm
                .device()
                .make_current()
                .map_err(|e| format!("make current: {e}"))?;
            vec![lib.comm_init_rank(m.world, id, m.rank)?]
        }
        None => lib.comm_init_all(devs)?,
    };
    let ms = t0.elapsed().as_secs_f64() * 1e3;
    let after = free_memory(b)?;
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
    Ok(())
}

/// A table per collective, its rows written to the records as it ends; Ok(false) when some
/// result was wrong. A failed measurement whose GPU work did not finish ends the process.
fn run_tables(
    b: &mut Bench,
    args: &Args,
    s: &Settings,
    records: &mut Records,
) -> Result<bool, Fail> {
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
        let outcome = measure_all(b, args, s, coll, &mut table, records);
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
        records.write()?;
        all_right &= table.wrong == 0;
    }
    Ok(all_right)
}

/// The libraries' threads' CPU over the idle window after the tables (`--idle-cpu`), when
/// there is one.
fn report_idle(args: &Args, process_per_rank: bool) {
    let idle = idle_seconds(args, process_per_rank);
    if idle > 0.0 {
        println!("#");
        println!(
            "{}",
            idle::report(Duration::from_millis(500), Duration::from_secs_f64(idle))
        );
    }
}

/// Seconds of quiet `idle` measures after the tables (`--idle-cpu`): by default only in runs
/// with a process per rank, whose peers are on other nodes (so proxies run); the window is
/// short against a run of tables.
fn idle_seconds(args: &Args, process_per_rank: bool) -> f64 {
    let default = if process_per_rank { 2.0 } else { 0.0 };
    args.idle_cpu.unwrap_or(default)
}

/// Every type, op and size of the table.
fn measure_all(
    b: &mut Bench,
    args: &Args,
    s: &Settings,
    coll: Collective,
    table: &mut Table,
    records: &mut Records,
) -> Result<(), String> {
    let n = b.nranks();
    let ops: Vec<RedOpKind> = if coll.has_op() {
        args.ops.clone()
    } else {
        vec![RedOpKind::Sum]
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
                    // One rank: a copy engine copy out of place, nothing in place.
                    Some(_) if n == 1 && op != RedOpKind::PreMulSum => "copy".into(),
                    Some(t) => b.ranks[0]
                        .comm
                        .tuning(t, counts.size_bytes)
                        .map(|c| format!("{}/{}/{}", c.algo, c.proto, c.nchannels))
                        .unwrap_or_else(|_| "-".into()),
                    None => "p2p".into(),
                };
                table.row(&call, &places, &tuned);
                records.push(&call, &places, &tuned, n);
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
