//! Builds the device crate for `nvptx64-nvidia-cuda` into PTX, once per GPU architecture, and
//! lets the library embed the text (`include_str!` of `$OUT_DIR/nccl_<arch>.ptx`). Needs no CUDA
//! toolkit: rustc's own NVPTX backend writes the PTX, the driver compiles it at load time.
//! A nested cargo builds in its own target directory, so the outer build's lock is never waited on.
//! With `NCCL_RS_PTXAS=/path/to/ptxas` it also compiles every kernel to SASS for each
//! architecture built (a module per kernel, as the loader cuts them) and embeds that too: a
//! device of that architecture then loads kernels with no JIT (NVIDIA's NCCL ships SASS the same
//! way); without it the driver JIT-compiles each kernel's PTX on first use (seconds each).

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

#[path = "host/cuda/ptx_cut.rs"]
#[allow(dead_code)]
mod ptx_cut;

#[path = "device/src/kernel_set/filter.rs"]
#[allow(dead_code)]
mod kernel_filter;

/// Registers a kernel thread may use: a launch of up to `MAX_THREADS` = 512 threads
/// (host/cuda/mod.rs) must fit the 64 K register file. The PTX loader passes the same limit to
/// the JIT; a test checks the two agree.
const MAX_REGISTERS: u32 = 65536 / 512;

use nccl_kernel_build as kb;

fn main() {
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=device/src");
    println!("cargo:rerun-if-changed=device/Cargo.toml");
    // The kernel filter (device/src/kernel_set/filter.rs): the device crate's own build script
    // reads it in the PTX build as in the simulator's.
    println!("cargo:rerun-if-env-changed=NCCL_RS_KERNELS");
    kernel_cfgs();
    // C-variadic functions (the net plugins' logger) need a nightly compiler; a crate built on
    // stable gets the fallback in transport/net/plugin/log.rs.
    println!("cargo::rustc-check-cfg=cfg(nccl_rs_variadic)");
    let nightly = kb::is_nightly();
    if nightly {
        println!("cargo:rustc-cfg=nccl_rs_variadic");
    }
    // The C ABI drop-in answers to NVIDIA's soname, so programs linked against it load ours.
    if env::var_os("CARGO_FEATURE_CAPI").is_some() {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    }

    // Which architectures (host/cuda/ptx_archs.rs has the rules): NCCL_RS_PTX_ARCHS when set,
    // else the GPUs this machine shows, none where it shows none.
    let (archs, why) = kb::chosen_archs();
    if archs.is_empty() {
        println!(
            "cargo:warning=nccl-rs: kernels built for the simulator only ({why}); \
             NCCL_RS_PTX_ARCHS=all (or sm_80, sm_90) builds their PTX for GPUs"
        );
    }
    println!("cargo:rerun-if-env-changed=NCCL_RS_PTXAS");
    let ptxas = env::var_os("NCCL_RS_PTXAS").filter(|p| !p.is_empty());
    let mut table = String::from("/// (architecture, deflated PTX text) for every architecture built.\npub static PTX: &[(u32, &[u8])] = &[\n");
    let mut sass = String::new();
    let ptx_of = |arch: &str| out.join(format!("nccl_{arch}.ptx"));
    // One rustc per architecture, each on one codegen unit (minutes): side by side.
    std::thread::scope(|s| {
        let builds: Vec<_> = archs
            .iter()
            .map(|arch| {
                let (manifest, out, ptx) = (&manifest, &out, ptx_of(arch));
                (arch, s.spawn(move || build_ptx(manifest, out, arch, &ptx)))
            })
            .collect();
        for (arch, build) in builds {
            if build.join().is_err() {
                // Both builds print to the same stderr: say which one failed.
                panic!(
                    "nccl-rs build.rs: the PTX build for {arch} failed (its messages are above)"
                );
            }
        }
    });
    for &arch in &archs {
        let ptx = ptx_of(arch);
        let sm: u32 = arch.trim_start_matches("sm_").parse().expect("sm_NN");
        let text = fs::read(&ptx).expect("read PTX");
        let packed = out.join(format!("nccl_{arch}.ptx.deflate"));
        fs::write(&packed, miniz_oxide::deflate::compress_to_vec(&text, 1))
            .expect("write deflated PTX");
        table.push_str(&format!(
            "    ({sm}, include_bytes!(concat!(env!(\"OUT_DIR\"), \"/nccl_{arch}.ptx.deflate\"))),\n"
        ));
        if let Some(ptxas) = ptxas.as_ref().filter(|_| !text.is_empty()) {
            let text = String::from_utf8(text).expect("PTX is text");
            // Cached beside the shared PTX, by the text and the ptxas that compiles it.
            let key = fnv1a(&[
                text.as_bytes(),
                ptxas.as_encoded_bytes(),
                &MAX_REGISTERS.to_le_bytes(),
            ]);
            let dir = kb::shared_ptx_dir(&out).join(format!("sass-{arch}-{key:016x}"));
            for (name, file) in build_sass(Path::new(ptxas), &dir, arch, &text) {
                let file = file.to_str().expect("a UTF-8 target directory");
                sass.push_str(&format!(
                    "    ({sm}, \"{name}\", include_bytes!({file:?})),\n"
                ));
            }
        }
    }
    table.push_str("];\n");
    let built = if archs.is_empty() {
        "none".to_string()
    } else {
        archs.join(", ")
    };
    table.push_str(&format!(
        "/// The architectures built, and why those (host/cuda/ptx_archs.rs).\n\
         pub const PTX_CHOICE: &str = {:?};\n",
        format!("{built}: {why}")
    ));
    table.push_str(&format!(
        "/// (architecture, kernel, deflated cubin) for every kernel compiled to SASS (NCCL_RS_PTXAS).\n\
         pub static SASS: &[(u32, &str, &[u8])] = &[\n{sass}];\n\
         /// The register limit the SASS was compiled with.\n\
         pub const SASS_MAX_REGISTERS: u32 = {MAX_REGISTERS};\n"
    ));
    fs::write(out.join("ptx_table.rs"), table).expect("write ptx_table.rs");
}

/// `cfg(nccl_rs_kernel = "<entry>")` for every kernel this build holds (all of them unless
/// `NCCL_RS_KERNELS` keeps fewer; the device crate's build script refuses a filter with unknown
/// names), so that a test needing a left-out kernel is ignored with its reason:
/// `#[cfg_attr(not(nccl_rs_kernel = "nccl_p2p"), ignore = "...")]`.
fn kernel_cfgs() {
    let spec = env::var("NCCL_RS_KERNELS").unwrap_or_default();
    let every: Vec<String> = kernel_filter::kept("")
        .into_iter()
        .map(|(name, _)| format!("{name:?}"))
        .collect();
    println!(
        "cargo::rustc-check-cfg=cfg(nccl_rs_kernel, values({}))",
        every.join(", ")
    );
    for (name, _) in kernel_filter::kept(spec.trim()) {
        println!("cargo:rustc-cfg=nccl_rs_kernel={name:?}");
    }
}

/// FNV-1a over the parts, for cache keys (the same on every run of the same inputs).
fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &b in part.iter().chain(&[0xff]) {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// Compiles every kernel entry point of `ptx` (one architecture's text) to SASS with `ptxas`,
/// one module per kernel cut as the loader cuts them, on every core, into `dir` (kept: a
/// second build of the same text finds them there); returns each kernel's name and its
/// deflated cubin's path.
fn build_sass(ptxas: &Path, dir: &Path, arch: &str, ptx: &str) -> Vec<(String, PathBuf)> {
    let names: Vec<String> = ptx
        .lines()
        .filter_map(|l| l.strip_prefix(".visible .entry "))
        .filter_map(|l| l.split('(').next())
        .map(str::to_string)
        .collect();
    let cubin_of = |n: &str| dir.join(format!("{n}.cubin.deflate"));
    let done = dir.join("complete");
    if done.exists() {
        return names.iter().map(|n| (n.clone(), cubin_of(n))).collect();
    }
    fs::create_dir_all(dir).expect("make the SASS directory");
    let queue = Mutex::new(names.clone());
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    // The text is read once and every kernel's module cut from it.
    let cutter = ptx_cut::Cutter::new(ptx);
    std::thread::scope(|s| {
        for _ in 0..workers {
            s.spawn(|| loop {
                let Some(name) = queue.lock().expect("SASS queue").pop() else {
                    return;
                };
                let base = dir.join(&name);
                let (src, cubin) = (base.with_extension("ptx"), base.with_extension("cubin"));
                fs::write(&src, cutter.module(&name)).expect("write a kernel's PTX");
                let run = Command::new(ptxas)
                    .arg(format!("-arch={arch}"))
                    .arg(format!("-maxrregcount={MAX_REGISTERS}"))
                    .arg("-o")
                    .arg(&cubin)
                    .arg(&src)
                    .output()
                    .unwrap_or_else(|e| {
                        panic!("nccl-rs build.rs: NCCL_RS_PTXAS={}: {e}", ptxas.display())
                    });
                if !run.status.success() {
                    panic!(
                        "nccl-rs build.rs: ptxas failed on {name} ({arch}): {}",
                        String::from_utf8_lossy(&run.stderr)
                    );
                }
                let bytes = fs::read(&cubin).expect("read a cubin");
                fs::write(
                    base.with_extension("cubin.deflate"),
                    miniz_oxide::deflate::compress_to_vec(&bytes, 6),
                )
                .expect("write a deflated cubin");
                let _ = (fs::remove_file(&src), fs::remove_file(&cubin));
            });
        }
    });
    fs::write(&done, "").expect("mark the SASS complete");
    names.iter().map(|n| (n.clone(), cubin_of(n))).collect()
}

fn build_ptx(manifest: &Path, out: &Path, arch: &str, dest: &Path) {
    // The multicast instructions (NVLS's multimem.ld_reduce / st / red) need sm_90 and PTX
    // ISA 8.1; LLVM would write sm_90's minimum, 7.8. Older architectures build without them
    // (device/src/arch/nvptx.rs traps there instead).
    let mut crate_flags = vec![format!("-Ctarget-cpu={arch}")];
    if kb::has_multimem(arch) {
        crate_flags
            .extend(["-Ctarget-feature=+ptx81", "--cfg", "nccl_rs_multimem"].map(String::from));
    }
    let ptx = kb::PtxBuild {
        dir: manifest,
        package: "nccl-device",
        arch,
        // One target directory per architecture, shared by every outer build.
        target_dir: kb::shared_ptx_dir(out).join(format!("nvptx-{arch}")),
        rustflags: Vec::new(),
        crate_flags,
    }
    .run();
    fs::write(dest, ptx).expect("write PTX");
}
