//! C code the tests compile with `cc`: plugins (network, tuner) as shared libraries, and the C
//! ABI's test programs. A missing compiler is a failure, not a silent pass: CI and the GPU
//! hosts both have one.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The project's sources: NCCL_RS_SOURCE_DIR, else where this test was built, else the current
/// directory; the first that holds `needed` (a path relative to the root). A test binary
/// carried to a GPU host finds the sources there.
pub fn source_root(needed: &str) -> PathBuf {
    let has = |d: &Path| d.join(needed).is_file() && d.join("include/nccl_net.h").is_file();
    if let Some(d) = std::env::var_os("NCCL_RS_SOURCE_DIR") {
        let d = PathBuf::from(d);
        assert!(
            has(&d),
            "NCCL_RS_SOURCE_DIR={} lacks {needed} or include/nccl_net.h",
            d.display()
        );
        return d;
    }
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    if has(&built) {
        return built;
    }
    let here = std::env::current_dir().expect("the current directory");
    assert!(
        has(&here),
        "no {needed}: set NCCL_RS_SOURCE_DIR to a checkout of nccl-rs (looked in {} and {})",
        built.display(),
        here.display()
    );
    here
}

/// A folder of this process for `what` (plugins, logs, programs), made if needed.
pub fn scratch(what: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("nccl-rs-{what}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("create a temporary folder");
    d
}

/// Runs the compiler command `cmd` (building `what`); panics with its output if it fails.
fn compile(mut cmd: Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("no C compiler ({e}): building {what} needs `cc`"));
    assert!(
        out.status.success(),
        "cc failed ({}) building {what}:\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Compiles the C file `src` (under the sources' root) into the shared library `out`, with
/// include/ on the path and `-D` for each of `defines`.
pub fn shared_library(src: &str, out: &Path, defines: &[&str]) -> PathBuf {
    let root = source_root(src);
    if let Some(parent) = out.parent() {
        std::fs::create_dir_all(parent).expect("create the plugin's folder");
    }
    let mut cmd = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cmd.args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-I"])
        .arg(root.join("include"))
        .arg("-o")
        .arg(out)
        .arg(root.join(src))
        .args(["-ldl", "-lpthread"]);
    for d in defines {
        cmd.arg(format!("-D{d}"));
    }
    compile(cmd, &format!("{} with {defines:?}", out.display()));
    out.to_path_buf()
}

/// Compiles C source text `text` into the shared library `out` (with `-D` for `defines`).
pub fn shared_library_from_text(text: &str, out: &Path, defines: &[&str]) -> PathBuf {
    let src = out.with_extension("c");
    std::fs::write(&src, text).expect("write the plugin's source");
    let mut cmd = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cmd.args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(out)
        .arg(&src);
    for d in defines {
        cmd.arg(format!("-D{d}"));
    }
    compile(cmd, &format!("{} with {defines:?}", out.display()));
    out.to_path_buf()
}

/// Compiles the C program `src` against include/nccl.h and the libnccl.so in `lib_dir`.
pub fn program(src: &Path, lib_dir: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let exe = lib_dir.join(src.file_stem().expect("file name"));
    let mut cmd = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()));
    cmd.args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(src)
        .arg(format!("-I{}", root.join("include").display()))
        .arg(format!("-L{}", lib_dir.display()))
        .arg("-lnccl")
        .arg(format!("-Wl,-rpath,{}", lib_dir.display()))
        .arg("-pthread");
    compile(cmd, &src.display().to_string());
    exe
}
