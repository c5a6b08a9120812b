//! The backend: CUDA when the driver shows a GPU, else the CPU simulator (in a fresh copy of
//! this process when CUDA was already probed in this one).

use crate::args::Args;
use nccl::cuda::{self, Backend};
use std::io::Write;
use std::process::ExitCode;

/// Set by the parent when it re-runs itself on the simulator: why CUDA was not used.
pub const REASON_ENV: &str = "NCCL_RS_BENCH_SIM_REASON";

pub enum Picked {
    /// Run here, on this backend, for this reason.
    Run(Backend, String),
    /// The simulator ran in a child process; exit with its status.
    Exit(ExitCode),
}

pub fn pick_backend(args: &Args) -> Picked {
    let explicit = match args.backend {
        Some(Backend::Sim) => Some((Backend::Sim, "--backend sim")),
        Some(_) => Some((Backend::Cuda, "--backend cuda")),
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
        Some((_, how)) => match probe_cuda() {
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
