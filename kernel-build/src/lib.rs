//! For a build script: compiles a `no_std` crate of GPU kernels (written with
//! `nccl_device::api` and declared with `nccl_device::kernel!`) to PTX, with rustc's own NVPTX
//! backend, for the GPU architectures nccl-rs builds its own kernels for. nccl-rs's build script
//! builds its kernels with the same functions.
//!
//! In the `build.rs` of the crate that launches the kernels:
//!
//! ```no_run
//! nccl_kernel_build::build_kernels("kernels");
//! ```
//!
//! and in that crate: `include!(concat!(env!("OUT_DIR"), "/kernels_ptx.rs"));`, which defines
//! `pub static PTX: &[(u32, &str)]` (architecture, PTX text) for `nccl::Module::load`.
//!
//! Which architectures: `NCCL_RS_PTX_ARCHS` (`all`, `sm_80`, `sm_90`, a comma list) when set,
//! else those of the GPUs `nvidia-smi` lists, none on a machine without GPUs (the table is then
//! empty: the kernels run on the simulator only). `NCCL_RS_SKIP_PTX=1` builds none.
//! The kernel crate is built by the nightly toolchain nccl-rs pins (rustup runs it where the
//! outer build is stable), for `nvptx64-nvidia-cuda` with `-Zbuild-std=core`.

use std::env;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "../../host/cuda/ptx_archs.rs"]
#[allow(dead_code)]
mod ptx_archs;

/// The toolchain file of nccl-rs: the device code builds with its nightly.
const TOOLCHAIN_FILE: &str = include_str!("../../rust-toolchain.toml");

/// The nightly toolchain nccl-rs pins (`rust-toolchain.toml`).
pub fn pinned_toolchain() -> String {
    TOOLCHAIN_FILE
        .lines()
        .find_map(|l| {
            let v = l.trim().strip_prefix("channel")?.trim().strip_prefix('=')?;
            Some(v.trim().trim_matches('"').to_string())
        })
        .expect("nccl-kernel-build: rust-toolchain.toml names no channel")
}

/// Whether the compiler running this build is a nightly (or a local development build).
pub fn is_nightly() -> bool {
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

/// The architectures to build (`sm_NN`) and why those; tells cargo which variables decide.
pub fn chosen_archs() -> (Vec<&'static str>, String) {
    println!("cargo:rerun-if-env-changed=NCCL_RS_SKIP_PTX");
    println!("cargo:rerun-if-env-changed=NCCL_RS_PTX_ARCHS");
    if env::var_os("NCCL_RS_SKIP_PTX").is_some() {
        // For machines that only run the simulator and cannot build for nvptx.
        return (Vec::new(), "NCCL_RS_SKIP_PTX".to_string());
    }
    let requested = env::var("NCCL_RS_PTX_ARCHS").unwrap_or_default();
    let visible = if requested.trim().is_empty() {
        visible_gpus()
    } else {
        ptx_archs::Visible::Unknown
    };
    ptx_archs::choose(&requested, &visible)
        .unwrap_or_else(|e| panic!("nccl-kernel-build: NCCL_RS_PTX_ARCHS: {e}"))
}

/// Where the nested PTX builds keep their target directories: beside the outer build's
/// profiles (`<target>/nccl-ptx`), so every profile and feature set shares one build of each.
/// `out` is `<target>[/<triple>]/<profile>/build/<package>-<hash>/out`.
pub fn shared_ptx_dir(out: &Path) -> PathBuf {
    let target = out
        .ancestors()
        .nth(4)
        .filter(|_| out.ancestors().nth(2).and_then(|b| b.file_name()) == Some("build".as_ref()));
    match target {
        Some(t) => t.join("nccl-ptx"),
        // An unexpected layout: a build of our own.
        None => out.join("nccl-ptx"),
    }
}

/// Whether `arch` (`sm_NN`) has multicast memory: sm_90 and newer.
pub fn has_multimem(arch: &str) -> bool {
    arch.trim_start_matches("sm_")
        .parse::<u32>()
        .is_ok_and(|sm| sm >= 90)
}

/// One nested `cargo rustc` of a library package for `nvptx64-nvidia-cuda`, writing its PTX.
pub struct PtxBuild<'a> {
    /// Where cargo runs (the workspace or package holding `package`).
    pub dir: &'a Path,
    pub package: &'a str,
    pub arch: &'a str,
    pub target_dir: PathBuf,
    /// Flags for every crate of the build (core included), after `-Cpanic=immediate-abort`.
    pub rustflags: Vec<String>,
    /// Flags for the package's own crate only, after `--emit=asm -Ccodegen-units=1`.
    pub crate_flags: Vec<String>,
}

impl PtxBuild<'_> {
    /// Runs the build and returns the PTX text; panics (failing the build script) with the
    /// reason when it fails or when the PTX calls a function it does not define.
    pub fn run(&self) -> String {
        let nightly = is_nightly();
        let mut cmd = if nightly {
            Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        } else {
            // The device code needs nightly (build-std, nvptx asm): rustup runs the pinned one.
            let mut c = Command::new("rustup");
            c.args(["run", &pinned_toolchain(), "cargo"]);
            for var in ["RUSTC", "RUSTDOC", "RUSTUP_TOOLCHAIN"] {
                c.env_remove(var);
            }
            c
        };
        cmd.current_dir(self.dir)
            .args(["rustc", "--release", "--lib", "-p", self.package])
            .args(["--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core"])
            .arg("--target-dir")
            .arg(&self.target_dir)
            .args(["--", "--emit=asm", "-Ccodegen-units=1", "-Cdebuginfo=0"])
            .args(&self.crate_flags);
        // The outer build's flags and wrappers (clippy, coverage, host RUSTFLAGS) are not for
        // nvptx.
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
        // core too must turn panics into traps: a kernel cannot unwind, and a call to core's
        // panic machinery would be an undefined symbol in the PTX.
        let mut flags = vec![
            "-Zunstable-options".to_string(),
            "-Cpanic=immediate-abort".into(),
        ];
        flags.extend(self.rustflags.iter().cloned());
        cmd.env("RUSTFLAGS", flags.join(" "));
        let status = cmd.status().unwrap_or_else(|e| {
            panic!(
                "nccl-kernel-build: cannot run cargo for {} ({e}); with a stable compiler the \
                 kernels are built by rustup's {t} toolchain (rustup toolchain install {t} \
                 --component rust-src), or set NCCL_RS_SKIP_PTX=1 to build for the simulator \
                 only",
                self.package,
                t = pinned_toolchain()
            )
        });
        if !status.success() {
            panic!(
                "nccl-kernel-build: {} failed to build for nvptx64-nvidia-cuda ({}); rustc's \
                 message is above",
                self.package, self.arch
            );
        }
        let deps = self.target_dir.join("nvptx64-nvidia-cuda/release/deps");
        let stem = format!("{}-", self.package.replace('-', "_"));
        let newest = fs::read_dir(&deps)
            .expect("the nvptx build wrote no deps folder")
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .filter(|p| {
                p.extension().is_some_and(|x| x == "s")
                    && p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with(&stem))
            })
            .max_by_key(|p| fs::metadata(p).and_then(|m| m.modified()).ok())
            .unwrap_or_else(|| panic!("nccl-kernel-build: {} wrote no PTX", self.package));
        let ptx = fs::read_to_string(&newest).expect("read PTX");
        // An unresolved call would only fail when the driver loads the module: fail here.
        if let Some(line) = ptx.lines().find(|l| l.contains(".extern .func")) {
            panic!(
                "nccl-kernel-build: the PTX of {} for {} calls a function it does not define \
                 (only this crate is compiled to PTX: a function of another crate it calls must \
                 be #[inline] or generic): {line}",
                self.package, self.arch
            );
        }
        ptx
    }
}

/// From a build script: compiles the kernel crate at `crate_dir` (relative to the calling
/// package's directory; a `no_std` library depending on `nccl-device` with
/// `default-features = false`) to PTX for every chosen architecture, and writes
/// `$OUT_DIR/<crate_dir's last component>_ptx.rs` defining
/// `pub static PTX: &[(u32, &str)]`: (architecture number, PTX text), empty where no
/// architecture was chosen.
pub fn build_kernels(crate_dir: &str) {
    let manifest = PathBuf::from(env::var("CARGO_MANIFEST_DIR").expect("run from a build script"));
    let out = PathBuf::from(env::var("OUT_DIR").expect("run from a build script"));
    let dir = manifest.join(crate_dir);
    println!("cargo:rerun-if-changed={}", dir.display());
    // The device crate it builds on (inlined into its PTX).
    println!(
        "cargo:rerun-if-changed={}",
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../device/src")
            .display()
    );
    let package = package_name(&dir.join("Cargo.toml"));
    let (archs, why) = chosen_archs();
    let stem = dir
        .file_name()
        .map(|n| n.to_string_lossy().replace('-', "_"))
        .unwrap_or_else(|| "kernels".into());
    let mut table = format!(
        "/// (architecture, PTX) of `{package}`, for `nccl::Module::load`. Built for: {}.\n\
         pub static PTX: &[(u32, &str)] = &[\n",
        if archs.is_empty() {
            format!("none ({why})")
        } else {
            archs.join(", ")
        }
    );
    if archs.is_empty() {
        println!(
            "cargo:warning={package}: kernels built for the simulator only ({why}); \
             NCCL_RS_PTX_ARCHS=all (or sm_80, sm_90) builds their PTX for GPUs"
        );
    }
    for arch in archs {
        let mut rustflags = vec![format!("-Ctarget-cpu={arch}")];
        if has_multimem(arch) {
            rustflags
                .extend(["-Ctarget-feature=+ptx81", "--cfg", "nccl_rs_multimem"].map(String::from));
        }
        let ptx = PtxBuild {
            dir: &dir,
            package: &package,
            arch,
            target_dir: shared_ptx_dir(&out).join(format!("{package}-{arch}")),
            rustflags,
            crate_flags: Vec::new(),
        }
        .run();
        let file = out.join(format!("{stem}_{arch}.ptx"));
        fs::write(&file, ptx).expect("write PTX");
        let sm = ptx_archs::arch_number(arch).expect("sm_NN");
        table.push_str(&format!(
            "    ({sm}, include_str!({:?})),\n",
            file.display().to_string()
        ));
    }
    table.push_str("];\n");
    fs::write(out.join(format!("{stem}_ptx.rs")), table).expect("write the PTX table");
}

/// The `name` of a package's manifest.
fn package_name(manifest: &Path) -> String {
    let text = fs::read_to_string(manifest)
        .unwrap_or_else(|e| panic!("nccl-kernel-build: {}: {e}", manifest.display()));
    let mut in_package = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package {
            if let Some(v) = line.strip_prefix("name").map(str::trim) {
                if let Some(v) = v.strip_prefix('=') {
                    return v.trim().trim_matches('"').to_string();
                }
            }
        }
    }
    panic!("nccl-kernel-build: {} names no package", manifest.display())
}
