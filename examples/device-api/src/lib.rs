//! The host side of the device-API examples, laid out as a user's project would be: the
//! kernels are a crate of their own (`kernels/`), which the build script compiles to PTX with
//! `nccl-kernel-build`; this crate loads that PTX ([`PTX`]) with `nccl::Module` and launches
//! the kernels on every rank, on GPUs or on the simulator with the same code.
//!
//! Each example runs `[NRANKS] [--processes [--nodes N]]`: ranks as threads of one process
//! (one communicator each, on the GPUs round-robin: ranks sharing a GPU need
//! `NCCL_RS_SHARED_GPUS=1`), or as processes (with CUDA MPS when they share a GPU), spread
//! over `N` simulated nodes (`NCCL_HOSTID`: the ranks of one node are consecutive).

pub mod all_reduce;
pub mod copy_rate;
pub mod fused;
pub mod misuse;
pub mod moe;
pub mod ping;

use nccl::{Backend, Comm, DevCommRequirements, DeviceBuffer, Module, Stream, UniqueId};
use nccl_device::api::Kernel;
use std::error::Error;
use std::process::Command;

include!(concat!(env!("OUT_DIR"), "/kernels_ptx.rs"));

pub use kernels::Place;

/// What an example's rank does, given its communicator and the kernels loaded on its device.
pub type RankBody = fn(&Comm, &Module) -> Result<(), Box<dyn Error>>;

const RANK: &str = "DEVICE_API_EXAMPLE_RANK";
const NRANKS: &str = "DEVICE_API_EXAMPLE_NRANKS";
const ID: &str = "DEVICE_API_EXAMPLE_ID";

/// Runs `body` on every rank as the command line says (`[NRANKS] [--processes]`, 4 ranks by
/// default) and says where it ran.
pub fn main_of(name: &str, body: RankBody) -> Result<(), Box<dyn Error>> {
    if let Ok(rank) = std::env::var(RANK) {
        let nranks: usize = std::env::var(NRANKS)?.parse()?;
        let id = id_from_hex(&std::env::var(ID)?)?;
        return rank_process(rank.parse()?, nranks, &id, body);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let nranks = args
        .first()
        .and_then(|a| a.parse().ok())
        .filter(|&n: &usize| n > 0)
        .unwrap_or(4);
    let backend = choose_backend()?;
    let nodes: usize = args
        .iter()
        .position(|a| a == "--nodes")
        .and_then(|i| args.get(i + 1)?.parse().ok())
        .filter(|&k| k > 0 && k <= nranks)
        .unwrap_or(1);
    let place = if args.iter().any(|a| a == "--processes") {
        launch_processes(nranks, nodes)?;
        match nodes {
            1 => "processes".to_string(),
            k => format!("processes on {k} nodes"),
        }
    } else {
        run_threads(nranks, body)?;
        "threads of one process".to_string()
    };
    let on = match backend {
        Backend::Sim => "simulator",
        _ => "GPU",
    };
    println!("{name} on {nranks} ranks ({place}, {on}): correct on every rank");
    Ok(())
}

/// `NCCL_RS_BACKEND=cuda|sim` when set, else CUDA where the NVIDIA driver lists a GPU and the
/// simulator where it lists none.
pub fn choose_backend() -> nccl::Result<Backend> {
    let gpus = std::fs::read_dir("/proc/driver/nvidia/gpus")
        .map(|mut d| d.next().is_some())
        .unwrap_or(false);
    let backend = match std::env::var("NCCL_RS_BACKEND").as_deref() {
        Ok("sim") | Ok("SIM") | Ok("simulator") => Backend::Sim,
        Ok("cuda") | Ok("CUDA") => Backend::Cuda,
        _ if gpus => Backend::Cuda,
        _ => Backend::Sim,
    };
    nccl::cuda::set_backend(backend)?;
    Ok(backend)
}

/// The device rank `r` uses: the GPUs round-robin.
fn device_of(rank: usize) -> nccl::Result<i32> {
    Ok((rank % nccl::cuda::device_count()?.max(1)) as i32)
}

/// Every rank on a thread of this process.
fn run_threads(nranks: usize, body: RankBody) -> Result<(), Box<dyn Error>> {
    let devices = (0..nranks)
        .map(device_of)
        .collect::<nccl::Result<Vec<_>>>()?;
    let comms = Comm::init_all(&devices)?;
    std::thread::scope(|s| {
        let ranks: Vec<_> = comms
            .into_iter()
            .map(|comm| s.spawn(move || rank_main(&comm, body).map_err(|e| e.to_string())))
            .collect();
        let failed: Vec<String> = ranks
            .into_iter()
            .enumerate()
            .filter_map(|(r, h)| match h.join() {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(format!("rank {r}: {e}")),
                Err(_) => Some(format!("rank {r} panicked")),
            })
            .collect();
        match failed.is_empty() {
            true => Ok(()),
            false => Err(failed.join("; ").into()),
        }
    })
}

/// One rank, its communicator made: loads the kernels on its device and runs `body`.
fn rank_main(comm: &Comm, body: RankBody) -> Result<(), Box<dyn Error>> {
    let module = Module::load(comm.device(), PTX)?;
    body(comm, &module)?;
    comm.finalize()?;
    Ok(())
}

/// Starts this program once per rank and waits for them (the first copy's unique id goes
/// to the others through the environment, as an MPI program would broadcast it); rank `r`
/// on node `r * nodes / nranks`.
fn launch_processes(nranks: usize, nodes: usize) -> Result<(), Box<dyn Error>> {
    let id = nccl::get_unique_id()?;
    let hex: String = id.internal.iter().map(|b| format!("{b:02x}")).collect();
    let exe = std::env::current_exe()?;
    let mut children = Vec::new();
    for r in 0..nranks {
        let child = Command::new(&exe)
            .args(std::env::args().skip(1))
            .env(RANK, r.to_string())
            .env(NRANKS, nranks.to_string())
            .env(ID, &hex)
            .env(
                "NCCL_HOSTID",
                format!("device-api-example-node-{}", r * nodes / nranks),
            )
            .spawn()?;
        children.push(child);
    }
    let mut failed = 0;
    for mut c in children {
        if !c.wait()?.success() {
            failed += 1;
        }
    }
    match failed {
        0 => Ok(()),
        _ => Err(format!("{failed} of {nranks} rank processes failed").into()),
    }
}

/// What each rank process runs.
fn rank_process(
    rank: usize,
    nranks: usize,
    id: &UniqueId,
    body: RankBody,
) -> Result<(), Box<dyn Error>> {
    choose_backend()?;
    let device = nccl::Device::open(device_of(rank)?)?;
    let comm = Comm::init_rank_on(device, nranks, id, rank)?;
    let result = rank_main(&comm, body);
    if let Err(e) = &result {
        eprintln!("rank {rank}: {e}");
    }
    result
}

fn id_from_hex(hex: &str) -> Result<UniqueId, Box<dyn Error>> {
    let mut id = UniqueId {
        internal: [0; std::mem::size_of::<UniqueId>()],
    };
    if hex.len() != 2 * id.internal.len() {
        return Err("the unique id has the wrong length".into());
    }
    for (i, b) in id.internal.iter_mut().enumerate() {
        *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)?;
    }
    Ok(id)
}

/// A rank's data for one launch: its input in a symmetric window, its output buffer, the
/// device communicator and the window as kernels see them.
pub struct RankData<'c> {
    comm: &'c Comm,
    input: DeviceBuffer<f32>,
    output: DeviceBuffer<f32>,
    pub stream: Stream,
}

impl<'c> RankData<'c> {
    /// `input` and `output` (the output buffer's contents when the kernel starts).
    pub fn new(comm: &'c Comm, input: &[f32], output: &[f32]) -> nccl::Result<Self> {
        Ok(RankData {
            comm,
            input: DeviceBuffer::from_slice(comm.device(), input)?,
            output: DeviceBuffer::from_slice(comm.device(), output)?,
            stream: Stream::new(comm.device())?,
        })
    }

    /// Registers the input as a symmetric window, makes the device communicator (with
    /// `req`), launches `kernel` with `args(place)` on `grid` CTAs of 128 threads, and returns
    /// the output once the kernel finished (the window deregistered).
    pub fn run<A: Copy + Send + Sync + 'static>(
        mut self,
        module: &Module,
        (kernel, grid, req): (&Kernel<A>, u32, DevCommRequirements),
        args: impl Fn(Place) -> A,
    ) -> nccl::Result<Vec<f32>> {
        let comm = self.comm;
        let count = self.input.len();
        let window = comm.window(&mut self.input, true)?;
        let dev_comm = comm.dev_comm(req)?;
        let dev_window = comm.dev_window(&dev_comm, window.handle())?;
        let a = args(Place {
            comm: dev_comm.get(),
            input: dev_window.get(),
            output: self.output.as_raw_ptr(),
            count: count as u64,
        });
        // SAFETY: the window, the output and the communicator outlive the kernel (the stream
        // is drained below); every rank launches the same grid.
        unsafe { module.launch(kernel, grid, 128, self.stream.handle(), a)? };
        self.stream.synchronize()?;
        let got = self.output.to_vec_after(&self.stream)?;
        drop((dev_window, dev_comm));
        window.deregister()?;
        Ok(got)
    }
}

/// The first element where `got` differs from `want`, as an error naming the rank.
pub fn check(rank: usize, got: &[f32], want: &[f32]) -> Result<(), Box<dyn Error>> {
    match got
        .iter()
        .zip(want)
        .position(|(g, w)| g.to_bits() != w.to_bits())
    {
        Some(i) => Err(format!("rank {rank}: element {i} is {} not {}", got[i], want[i]).into()),
        None if got.len() != want.len() => {
            Err(format!("rank {rank}: {} elements", got.len()).into())
        }
        None => Ok(()),
    }
}

/// Microseconds per call of `call`: `warmup` calls, then `iters` in a row on `stream`, timed
/// on the host from the first to the stream's drain.
pub fn time_calls(
    stream: &Stream,
    warmup: u32,
    iters: u32,
    mut call: impl FnMut() -> nccl::Result<()>,
) -> nccl::Result<f64> {
    for _ in 0..warmup {
        call()?;
    }
    stream.synchronize()?;
    let t0 = std::time::Instant::now();
    for _ in 0..iters {
        call()?;
    }
    stream.synchronize()?;
    Ok(t0.elapsed().as_secs_f64() * 1e6 / iters as f64)
}
