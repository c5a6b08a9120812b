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

#[path = "host/cuda/ptx_archs.rs"]
#[allow(dead_code)]
mod ptx_archs;

/// What `nvidia-smi` says of this machine's GPUs; an NVIDIA device node without it (or an
/// `nvidia-smi` too old for the query) counts as GPUs of unknown architecture.
fn visible_gpus() -> ptx_archs::Visible {
    use ptx_archs::Visible;
    let listed = Command::new("nvidia-smi")
        .args(["--query-gpu=compute_cap", "--format=csv,noheader"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(ptx_archs::parse_compute_cap)
                .collect::<Vec<u32>>()
        });
    match listed {
        Some(gpus) if !gpus.is_empty() => Visible::Gpus(gpus),
        _ if Path::new("/dev/nvidia0").exists() => Visible::Unknown,
        _ => Visible::NoGpu,
    }
}

fn main() {
    let manifest =
        PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    println!("cargo:rerun-if-changed=device/src");
    println!("cargo:rerun-if-changed=device/Cargo.toml");
    println!("cargo:rerun-if-env-changed=NCCL_RS_SKIP_PTX");
    // The kernel filter (device/src/kernel_set/filter.rs): the device crate's own build script
    // reads it in the PTX build as in the simulator's.
    println!("cargo:rerun-if-env-changed=NCCL_RS_KERNELS");
    kernel_cfgs();
    // C-variadic functions (the net plugins' logger) need a nightly compiler; a crate built on
    // stable gets the fallback in transport/net/plugin/log.rs.
    println!("cargo::rustc-check-cfg=cfg(nccl_rs_variadic)");
    let nightly = is_nightly();
    if nightly {
        println!("cargo:rustc-cfg=nccl_rs_variadic");
    }
    // The C ABI drop-in answers to NVIDIA's soname, so programs linked against it load ours.
    if env::var_os("CARGO_FEATURE_CAPI").is_some() {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libnccl.so.2");
    }

    // Which architectures (host/cuda/ptx_archs.rs has the rules): NCCL_RS_PTX_ARCHS when set,
    // else the GPUs this machine shows, none where it shows none.
    println!("cargo:rerun-if-env-changed=NCCL_RS_PTX_ARCHS");
    let requested = env::var("NCCL_RS_PTX_ARCHS").unwrap_or_default();
    let (archs, why) = if env::var_os("NCCL_RS_SKIP_PTX").is_some() {
        // For machines that only run the simulator and cannot build for nvptx.
        (Vec::new(), "NCCL_RS_SKIP_PTX".to_string())
    } else {
        let visible = if requested.trim().is_empty() {
            visible_gpus()
        } else {
            ptx_archs::Visible::Unknown
        };
        ptx_archs::choose(&requested, &visible).unwrap_or_else(|e| panic!("nccl-rs build.rs: {e}"))
    };
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
                (
                    arch,
                    s.spawn(move || build_ptx(manifest, out, arch, &ptx, nightly)),
                )
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
            let dir = shared_ptx_dir(&out).join(format!("sass-{arch}-{key:016x}"));
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

/// Whether the compiler building this crate is a nightly (or a local development build).
fn is_nightly() -> bool {
    let rustc = env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    Command::new(rustc)
        .arg("-V")
        .output()
        .map(|o| {
            let v = String::from_utf8_lossy(&o.stdout);
            v.contains("-nightly") || v.contains("-dev")
        })
        .unwrap_or(false)
}

/// The nightly toolchain this repository pins (rust-toolchain.toml), for the device build when
/// the crate itself is built by a stable compiler (a project depending on nccl-rs).
fn pinned_toolchain(manifest: &Path) -> String {
    let text = fs::read_to_string(manifest.join("rust-toolchain.toml"))
        .expect("nccl-rs build.rs: read rust-toolchain.toml");
    text.lines()
        .find_map(|l| {
            let v = l.trim().strip_prefix("channel")?.trim().strip_prefix('=')?;
            Some(v.trim().trim_matches('"').to_string())
        })
        .expect("nccl-rs build.rs: rust-toolchain.toml names no channel")
}

/// Whether `arch` (`sm_NN`) has multicast memory: sm_90 and newer.
fn has_multimem(arch: &str) -> bool {
    arch.trim_start_matches("sm_")
        .parse::<u32>()
        .is_ok_and(|sm| sm >= 90)
}

/// Where the PTX builds keep their target directories: beside the outer build's profiles
/// (`<target>/nccl-ptx`), so that every profile and feature set of the workspace shares one
/// build of each architecture's PTX (the nested cargo finds it fresh when the device sources
/// did not change, and its lock orders two outer builds that reach it at once). `out` is
/// `<target>[/<triple>]/<profile>/build/<package>-<hash>/out`.
fn shared_ptx_dir(out: &Path) -> PathBuf {
    let target = out
        .ancestors()
        .nth(4)
        .filter(|_| out.ancestors().nth(2).and_then(|b| b.file_name()) == Some("build".as_ref()));
    match target {
        Some(t) => t.join("nccl-ptx"),
        // An unexpected layout: a build of our own, as before.
        None => out.join("nccl-ptx"),
    }
}

fn build_ptx(manifest: &Path, out: &Path, arch: &str, dest: &Path, nightly: bool) {
    // One target directory per architecture, shared by every outer build: the PTX is picked
    // up by name from it.
    let target_dir = shared_ptx_dir(out).join(format!("nvptx-{arch}"));
    let mut cmd = if nightly {
        Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
    } else {
        // The device crate needs nightly (build-std, nvptx asm): rustup runs the pinned one.
        let mut c = Command::new("rustup");
        c.args(["run", &pinned_toolchain(manifest), "cargo"]);
        c
    };
    cmd.current_dir(manifest)
        .args([
            "rustc",
            "--release",
            "--lib",
            "-p",
            "nccl-device",
            "--target",
            "nvptx64-nvidia-cuda",
        ])
        .args(["-Zbuild-std=core", "--target-dir"])
        .arg(&target_dir)
        .args(["--", "--emit=asm", "-Ccodegen-units=1", "-Cdebuginfo=0"])
        .arg(format!("-Ctarget-cpu={arch}"));
    if has_multimem(arch) {
        // Multicast memory (NVLS's multimem.ld_reduce / st / red) needs sm_90 and PTX ISA 8.1;
        // LLVM would write sm_90's minimum, 7.8. Older architectures build without the NVLS
        // instructions (device/src/arch/nvptx.rs traps there instead).
        cmd.args(["-Ctarget-feature=+ptx81", "--cfg", "nccl_rs_multimem"]);
    }
    // The outer build's flags and wrappers (clippy, coverage, host RUSTFLAGS) are not for nvptx.
    if !nightly {
        // The outer (stable) compiler is not the one for the device crate: rustup run picks.
        for var in ["RUSTC", "RUSTDOC", "RUSTUP_TOOLCHAIN"] {
            cmd.env_remove(var);
        }
    }
    for var in [
        "RUSTFLAGS",
        "CARGO_ENCODED_RUSTFLAGS",
        "RUSTC_WORKSPACE_WRAPPER",
        "RUSTC_WRAPPER",
        "CARGO_TARGET_DIR",
        "CARGO_BUILD_TARGET",
        "CARGO_MAKEFLAGS",
        "MAKEFLAGS",
        "MFLAGS",
    ] {
        cmd.env_remove(var);
    }
    // core too must turn panics into traps: a kernel cannot unwind, and a call to core's panic
    // machinery would be an undefined symbol in the PTX.
    cmd.env("RUSTFLAGS", "-Zunstable-options -Cpanic=immediate-abort");
    let status = cmd.status().unwrap_or_else(|e| {
        panic!(
            "nccl-rs build.rs: cannot run cargo for the device crate ({e}); with a stable \
             compiler the kernels are built by rustup's {} toolchain (rustup toolchain install {} \
             --component rust-src), or set NCCL_RS_SKIP_PTX=1 to build for the simulator only",
            pinned_toolchain(manifest),
            pinned_toolchain(manifest)
        )
    });
    if !status.success() {
        panic!("nccl-rs build.rs: the device crate failed to build for nvptx64-nvidia-cuda ({arch}); rustc's message is above");
    }
    let deps = target_dir.join("nvptx64-nvidia-cuda/release/deps");
    let newest = fs::read_dir(&deps)
        .expect("device build wrote no deps folder")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.extension().is_some_and(|x| x == "s")
                && p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("nccl_device-"))
        })
        .max_by_key(|p| fs::metadata(p).and_then(|m| m.modified()).ok())
        .expect("device build wrote no PTX");
    let ptx = fs::read_to_string(&newest).expect("read PTX");
    // An unresolved call would only fail when the driver loads the module: fail the build instead.
    if let Some(line) = ptx.lines().find(|l| l.contains(".extern .func")) {
        panic!("nccl-rs build.rs: the PTX for {arch} calls an undefined function: {line}");
    }
    fs::write(dest, ptx).expect("write PTX");
}
