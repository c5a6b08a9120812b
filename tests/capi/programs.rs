//! The C ABI: compiles `tests/c/*.c` against `include/nccl.h` and the `libnccl.so` that cargo
//! built next to this test, runs each program on the simulator and expects it to pass.

use crate::common::{plugins, procs};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The cdylib cargo built with this test (`target/<profile>/deps/libnccl.so`, or one level up).
fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let deps = exe.parent().expect("deps dir").to_path_buf();
    [deps.join("libnccl.so"), deps.join("../libnccl.so")]
        .into_iter()
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("libnccl.so not found near {}", deps.display()))
}

/// A private folder holding the library under both names a program may ask for (the soname
/// is libnccl.so.2 once the build sets it).
fn lib_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("nccl-rs-capi-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let lib = library();
    for n in ["libnccl.so", "libnccl.so.2"] {
        let dst = dir.join(n);
        let _ = std::fs::remove_file(&dst);
        std::fs::copy(&lib, &dst).expect("copy libnccl.so");
    }
    dir
}

#[test]
#[cfg_attr(
    not(all(
        nccl_rs_kernel = "nccl_all_reduce_float_sum",
        nccl_rs_kernel = "nccl_all_reduce_float_premulsum",
        nccl_rs_kernel = "nccl_all_reduce_int32_sum",
        nccl_rs_kernel = "nccl_broadcast",
        nccl_rs_kernel = "nccl_p2p",
        nccl_rs_kernel = "nccl_all_gather"
    )),
    ignore = "needs nccl_all_reduce_float_sum, nccl_all_reduce_float_premulsum, nccl_all_reduce_int32_sum, nccl_broadcast, nccl_p2p, nccl_all_gather, which NCCL_RS_KERNELS left out"
)]
fn c_programs_pass_on_the_simulator() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut srcs: Vec<PathBuf> = std::fs::read_dir(root.join("tests/c"))
        .expect("tests/c")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "c"))
        .collect();
    srcs.sort();
    assert!(!srcs.is_empty(), "no C tests found");
    let dir = lib_dir("progs");
    for src in srcs {
        let exe = plugins::program(&src, &dir);
        let mut cmd = Command::new(&exe);
        cmd.env("NCCL_RS_BACKEND", "sim")
            .env("NCCL_SOCKET_IFNAME", "lo") // bootstrap on loopback only
            .env("LD_LIBRARY_PATH", &dir)
            .env("NCCL_BOOTSTRAP_TIMEOUT_MS", "20000");
        let out = procs::Supervisor::output(&src.display().to_string(), cmd, procs::limit());
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            out.status.success() && text.contains("capi ok"),
            "{} failed ({:?}):\n{text}",
            src.display(),
            out.status
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn every_function_has_its_pnccl_alias() {
    let header =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("include/nccl.h"))
            .expect("nccl.h");
    let names: Vec<&str> = header
        .split(|c: char| !c.is_alphanumeric() && c != '_')
        .filter(|w| w.starts_with("nccl") && w.len() > 4)
        .collect();
    for n in [
        "ncclCommInitRankScalable",
        "ncclCommSplit",
        "ncclGetLastError",
        "ncclAllReduce",
        "ncclBcast",
        "ncclSend",
        "ncclRecv",
        "ncclGroupSimulateEnd",
        // Newer than 2.25, linked by programs built against NCCL 2.27/2.28 (PyTorch 2.11).
        "ncclAlltoAll",
        "ncclGather",
        "ncclScatter",
        "ncclCommShrink",
        "ncclCommWindowRegister",
        "ncclCommWindowDeregister",
        "ncclPutSignal",
        "ncclSignal",
        "ncclWaitSignal",
        "ncclDevCommCreate",
        "ncclDevCommDestroy",
    ] {
        assert!(names.contains(&n), "{n} missing from nccl.h");
        assert!(
            header.contains(&format!("p{n}(")),
            "p{n} missing from nccl.h"
        );
    }
}
