//! cudarc interop (feature `cudarc`): a program that manages its GPU memory and streams with
//! cudarc passes its `CudaSlice`s and `CudaStream` straight to the collectives (the `_on`
//! calls), which keep cudarc's event bookkeeping. One thread per GPU, each all-reducing a
//! buffer cudarc allocated. It needs a GPU (cudarc memory is CUDA memory); without one it says
//! so and exits successfully.
//!
//! ```text
//! cargo run --example cudarc_interop --features cudarc [NRANKS]
//! ```

mod common;

use cudarc::driver::CudaContext;
use nccl::{Backend, Comm, Op};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if common::choose_backend()? != Backend::Cuda {
        println!("cudarc_interop: no GPU here (cudarc allocates CUDA memory); nothing to run");
        return Ok(());
    }
    let gpus = nccl::cuda::device_count()?;
    let n = common::nranks_arg(gpus.max(1));
    let id = nccl::get_unique_id()?;
    let threads: Vec<_> = (0..n)
        .map(|rank| {
            std::thread::spawn(move || -> Result<Vec<f32>, String> {
                let e = |x: &dyn std::fmt::Display| format!("rank {rank}: {x}");
                let ordinal = rank % gpus.max(1);
                let ctx = CudaContext::new(ordinal).map_err(|x| e(&x))?;
                let stream = ctx.new_stream().map_err(|x| e(&x))?;
                let device = nccl::Device::open(ordinal as i32).map_err(|x| e(&x))?;
                let comm = Comm::init_rank_on(device, n, &id, rank).map_err(|x| e(&x))?;
                // cudarc's memory, cudarc's stream: no conversion.
                let send = stream
                    .clone_htod(&vec![(rank + 1) as f32; 1 << 16])
                    .map_err(|x| e(&x))?;
                let mut recv = stream.alloc_zeros::<f32>(1 << 16).map_err(|x| e(&x))?;
                comm.all_reduce_on(&send, &mut recv, Op::Sum, &stream)
                    .map_err(|x| e(&x))?;
                let out = stream.clone_dtoh(&recv).map_err(|x| e(&x))?;
                comm.finalize().map_err(|x| e(&x))?;
                comm.destroy().map_err(|x| e(&x))?;
                Ok(out)
            })
        })
        .collect();
    let want = (n * (n + 1) / 2) as f32;
    for (rank, t) in threads.into_iter().enumerate() {
        let out = t.join().map_err(|_| format!("rank {rank} panicked"))??;
        if out.iter().any(|&x| x != want) {
            return Err(format!("rank {rank}: AllReduce result is not {want}").into());
        }
    }
    println!("{n} ranks: AllReduce on cudarc's CudaSlice and CudaStream correct");
    Ok(())
}
