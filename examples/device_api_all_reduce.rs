//! A one-shot AllReduce written with the device API (`nccl_device::api`), the kind of kernel
//! inference stacks write by hand: every rank's input lies in a symmetric window; the kernel
//! meets the LSA team at a barrier (every input is in place), sums element `i` over every rank
//! with loads from the peers' windows (in rank order: the same bits on every rank), writes the
//! sum to its own output, and meets the team again before any rank may overwrite its input.
//!
//! ```text
//! cargo run --example device_api_all_reduce [NRANKS]
//! ```
//!
//! It runs on the CPU simulator, which runs the kernel's code on host threads; loading such
//! kernels on GPUs is not built yet.

mod common;

use nccl::{Backend, Comm, DeviceBuffer, Stream};
use nccl_device::api::{DevComm, Window};
use nccl_device::arch;

/// The kernel's argument: plain values, copied into every thread.
#[derive(Clone, Copy)]
struct Args {
    comm: DevComm,
    /// Every rank's input (`count` floats at the window's start).
    input: Window,
    /// This rank's output: `count` floats.
    output: u64,
    count: usize,
}

/// The kernel, as every thread of every CTA runs it.
///
/// # Safety
/// `a` names live memory of a communicator every rank launched this kernel on, with the same
/// grid.
unsafe fn one_shot_all_reduce(a: &Args) {
    let cta = arch::block_idx();
    let barrier = a.comm.lsa_barrier(cta);
    if barrier.sync().is_err() {
        return; // aborted
    }
    let stride = (arch::grid_dim() * arch::block_dim()) as usize;
    let mut i = (cta * arch::block_dim() + arch::thread_idx()) as usize;
    while i < a.count {
        let mut sum = 0f32;
        for peer in 0..a.comm.lsa_size {
            sum += *(a.comm.lsa_ptr(&a.input, 4 * i, peer) as *const f32);
        }
        *(a.output as *mut f32).add(i) = sum;
        i += stride;
    }
    // No rank reads this rank's input after this.
    let _ = barrier.sync();
}

/// Rank `r`'s input: small integers, whose sums are exact in f32.
fn input(r: usize, count: usize) -> Vec<f32> {
    (0..count).map(|i| ((r * 7 + i) % 13) as f32).collect()
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if common::choose_backend()? == Backend::Cuda {
        println!("device_api_all_reduce: user kernels load on the simulator only for now");
        nccl::cuda::set_backend(Backend::Sim)?;
    }
    let n = common::nranks_arg(4);
    let count = 10_007;
    let devices: Vec<i32> = (0..n as i32).collect();
    let comms = Comm::init_all(&devices)?;
    // Each rank's collective calls (window, device communicator) on a thread of its own.
    let results: Vec<nccl::Result<Vec<f32>>> = std::thread::scope(|s| {
        let ranks: Vec<_> = comms
            .into_iter()
            .map(|comm| s.spawn(move || run_rank(&comm, count)))
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let want: Vec<f32> = (0..count)
        .map(|i| (0..n).map(|r| input(r, count)[i]).sum())
        .collect();
    for (r, got) in results.into_iter().enumerate() {
        let got = got?;
        if let Some(i) = got.iter().zip(&want).position(|(g, w)| g != w) {
            return Err(format!("rank {r}: element {i} is {} not {}", got[i], want[i]).into());
        }
    }
    println!("device API one-shot AllReduce on {n} ranks: {count} floats correct on every rank");
    Ok(())
}

/// One rank: its input in a symmetric window, the device communicator, the kernel, the output.
fn run_rank(comm: &Comm, count: usize) -> nccl::Result<Vec<f32>> {
    let mut input_buf = DeviceBuffer::from_slice(comm.device(), &input(comm.rank(), count))?;
    let window = comm.window(&mut input_buf, true)?;
    let output = DeviceBuffer::<f32>::from_slice(comm.device(), &vec![f32::NAN; count])?;
    let dev_comm = comm.dev_comm()?;
    let dev_window = comm.dev_window(&dev_comm, window.handle())?;
    let stream = Stream::new(comm.device())?;
    let args = Args {
        comm: dev_comm.get(),
        input: dev_window.get(),
        output: output.as_raw_ptr(),
        count,
    };
    // SAFETY (inside): the buffers and the communicators outlive the kernel (the stream is
    // drained below); every rank launches the same grid.
    comm.device()
        .launch_on_simulator(4, 128, stream.handle(), move || unsafe {
            one_shot_all_reduce(&args)
        })?;
    stream.synchronize()?;
    let got = output.to_vec()?;
    drop(dev_window);
    drop(dev_comm);
    window.deregister()?;
    Ok(got)
}
