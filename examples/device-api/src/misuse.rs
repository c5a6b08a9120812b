//! What a rank learns when its kernel misuses the device API (`kernels::send_past_the_slots`
//! sends an LL line past the slots the device communicator has): the kernel stops before it
//! writes anywhere; on the simulator the stream's error says why, on a GPU the trap ends the
//! context and `DeviceComm::fault` says why. Each rank launches it alone (no peer waits).

use nccl::{Backend, Comm, DevCommRequirements, Module, Stream};
use std::error::Error;

/// What the report must say.
const WANT: &str = "LL slot past the device communicator's ll_slots: 4";

/// One rank: the kernel, then the error its stream reports and the device communicator's
/// fault record, checked.
pub fn rank(comm: &Comm, module: &Module) -> Result<(), Box<dyn Error>> {
    let req = DevCommRequirements {
        ll_blocks: 1,
        ll_slots: 4,
    };
    let dc = comm.dev_comm(req)?;
    let stream = Stream::new(comm.device())?;
    // SAFETY: the device communicator outlives the kernel (the stream is drained below).
    unsafe { module.launch(&kernels::MISUSE, 1, 32, stream.handle(), dc.get())? };
    let error = match stream.synchronize() {
        Ok(()) => return Err("the kernel's misuse went unreported".into()),
        Err(e) => e.to_string(),
    };
    let report = match nccl::cuda::backend() {
        Backend::Sim => error,
        _ => dc.fault().ok_or("a GPU trap left no fault record")?,
    };
    println!("rank {}: {report}", comm.rank());
    match report.contains(WANT) {
        true => Ok(()),
        false => Err(format!("the report does not say \"{WANT}\"").into()),
    }
}
