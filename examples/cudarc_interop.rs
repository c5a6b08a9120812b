//! Moving a cudarc program to nccl-rs (feature `cudarc`). The body below is written against
//! cudarc's own NCCL module (`cudarc::nccl::safe`); moving it to nccl-rs took one change, the
//! `use` line:
//!
//! ```text
//! - use cudarc::nccl::safe::{Comm, Id, ReduceOp};
//! + use nccl::cudarc_nccl::{Comm, Id, ReduceOp};
//! ```
//!
//! One thread per rank, each with a cudarc stream on its GPU (ranks share GPUs round-robin when
//! there are fewer), cudarc's `CudaSlice`s all-reduced. It needs a GPU (cudarc memory is CUDA
//! memory); without one it says so and exits successfully. The `_on` calls of `nccl::Comm`
//! (`all_reduce_on`, ...) take the same cudarc buffers with this crate's own `Comm`.
//!
//! ```text
//! cargo run --example cudarc_interop --features cudarc [NRANKS]
//! ```

mod common;

use cudarc::driver::CudaContext;
use nccl::cudarc_nccl::{Comm, Id, ReduceOp};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if common::choose_backend()? != nccl::Backend::Cuda {
        println!("cudarc_interop: no GPU here (cudarc allocates CUDA memory); nothing to run");
        return Ok(());
    }
    let gpus = CudaContext::device_count()? as usize;
    let n = common::nranks_arg(gpus.max(1));
    let id = Id::new()?;
    let threads: Vec<_> = (0..n)
        .map(|rank| {
            std::thread::spawn(move || -> Result<Vec<f32>, String> {
                let e = |x: &dyn std::fmt::Display| format!("rank {rank}: {x}");
                let ctx = CudaContext::new(rank % gpus.max(1)).map_err(|x| e(&x))?;
                let stream = ctx.new_stream().map_err(|x| e(&x))?;
                let comm = Comm::from_rank(stream.clone(), rank, n, id).map_err(|x| e(&x))?;
                let send = stream
                    .clone_htod(&vec![(rank + 1) as f32; 1 << 16])
                    .map_err(|x| e(&x))?;
                let mut recv = stream.alloc_zeros::<f32>(1 << 16).map_err(|x| e(&x))?;
                comm.all_reduce(&send, &mut recv, &ReduceOp::Sum)
                    .map_err(|x| e(&x))?;
                stream.clone_dtoh(&recv).map_err(|x| e(&x))
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
    println!("{n} ranks: AllReduce through nccl::cudarc_nccl on cudarc's CudaSlice correct");
    Ok(())
}
