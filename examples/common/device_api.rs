//! What the device API examples share: running one user kernel on every rank of simulated GPUs
//! of this process, each rank's input in a symmetric window.

use nccl::{Backend, Comm, DeviceBuffer, Stream};
use nccl_device::api::{DevComm, Window};

/// Where a rank's kernel finds its data.
#[derive(Clone, Copy)]
pub struct Place {
    pub comm: DevComm,
    /// Every rank's input: `count` floats at the window's start.
    pub input: Window,
    /// This rank's output: `count` floats, holding `output(rank)` when the kernel starts.
    pub output: u64,
    pub count: usize,
}

/// On `n` simulated GPUs (the simulator, whatever `NCCL_RS_BACKEND` says: user kernels load
/// there only, for now): each rank's `input(rank)` in a symmetric window, its output buffer
/// filled with `output(rank)`, then `kernel` on a grid of 4 CTAs of 128 threads with
/// `args(place)`; every rank's output afterwards.
pub fn run_on_every_rank<A: Copy + Send + Sync + 'static>(
    n: usize,
    count: usize,
    input: &(dyn Fn(usize) -> Vec<f32> + Sync),
    output: &(dyn Fn(usize) -> Vec<f32> + Sync),
    args: &(dyn Fn(Place) -> A + Sync),
    kernel: unsafe fn(&A),
) -> nccl::Result<Vec<Vec<f32>>> {
    if super::choose_backend()? == Backend::Cuda {
        println!("user kernels of the device API load on the simulator only, for now");
        nccl::cuda::set_backend(Backend::Sim)?;
    }
    let comms = Comm::init_all(&(0..n as i32).collect::<Vec<_>>())?;
    // Each rank's collective calls (window, device communicator) on a thread of its own.
    std::thread::scope(|s| {
        let ranks: Vec<_> = comms
            .into_iter()
            .map(|comm| {
                s.spawn(move || {
                    let r = comm.rank();
                    let mut input_buf = DeviceBuffer::from_slice(comm.device(), &input(r))?;
                    let window = comm.window(&mut input_buf, true)?;
                    let out = DeviceBuffer::from_slice(comm.device(), &output(r))?;
                    let dev_comm = comm.dev_comm()?;
                    let dev_window = comm.dev_window(&dev_comm, window.handle())?;
                    let stream = Stream::new(comm.device())?;
                    let a = args(Place {
                        comm: dev_comm.get(),
                        input: dev_window.get(),
                        output: out.as_raw_ptr(),
                        count,
                    });
                    // SAFETY (inside): the buffers and the communicator outlive the kernel
                    // (the stream is drained below); every rank launches the same grid.
                    comm.device()
                        .launch_on_simulator(4, 128, stream.handle(), move || unsafe {
                            kernel(&a)
                        })?;
                    stream.synchronize()?;
                    let got = out.to_vec()?;
                    drop((dev_window, dev_comm));
                    window.deregister()?;
                    Ok(got)
                })
            })
            .collect();
        ranks.into_iter().map(|h| h.join().unwrap()).collect()
    })
}
