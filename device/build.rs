//! Writes the list of kernel entry points this build holds (`$OUT_DIR/kernel_set.rs`): every
//! (collective, element type, reduction), or those `NCCL_RS_KERNELS` keeps
//! (`src/kernel_set/filter.rs`). The PTX build and the simulator's both run this script, so
//! they hold the same kernels; a filter that names nothing known fails the build.

use std::env;
use std::fmt::Write as _;
use std::fs;
use std::path::PathBuf;

#[path = "src/kernel_set/filter.rs"]
mod filter;

fn main() {
    println!("cargo:rerun-if-env-changed=NCCL_RS_KERNELS");
    println!("cargo:rerun-if-changed=src/kernel_set/filter.rs");
    println!("cargo::rustc-check-cfg=cfg(nccl_rs_p2p_kernel)");
    let raw = env::var("NCCL_RS_KERNELS").unwrap_or_default();
    let spec = raw.trim();
    if let Some(bad) = filter::first_unknown(spec) {
        let types: Vec<String> = filter::TYPES
            .iter()
            .map(|(n, s, _)| format!("{n}/{s}"))
            .collect();
        let ops: Vec<&str> = filter::OPS.iter().map(|(n, _)| *n).collect();
        panic!(
            "NCCL_RS_KERNELS={spec}: {bad:?} is not collective[:type[:reduction]]; collectives: \
             {}, {}, {}; types: {}; reductions: {}; `*` matches any",
            filter::REDUCING.join(", "),
            filter::COPIES.join(", "),
            filter::P2P,
            types.join(", "),
            ops.join(", ")
        );
    }
    let kept = filter::kept(spec);
    let p2p = kept.iter().any(|(name, _)| name == filter::P2P_ENTRY);
    if p2p {
        println!("cargo:rustc-cfg=nccl_rs_p2p_kernel");
    }

    let mut out = String::new();
    let filter_const = match spec.is_empty() {
        true => "None".to_string(),
        false => format!("Some({spec:?})"),
    };
    writeln!(
        out,
        "/// `NCCL_RS_KERNELS` as this build saw it (None: unset, every kernel built).\n\
         pub const FILTER: Option<&str> = {filter_const};"
    )
    .unwrap();
    let mut names: Vec<&str> = kept.iter().map(|(n, _)| n.as_str()).collect();
    names.sort_unstable();
    writeln!(
        out,
        "/// Every kernel entry point this build holds, sorted.\npub const BUILT: &[&str] = &{names:?};"
    )
    .unwrap();
    writeln!(
        out,
        "/// Calls `$m!(\"entry_name\", RustType, OpType, Coll::X)` once per collective kernel entry\n\
         /// point this build holds: the reducing collectives once per (element type, reduction),\n\
         /// the copies once (as uint8). Both the PTX entry points and the simulator's dispatch are\n\
         /// made from it.\n\
         macro_rules! for_each_kernel {{\n    ($m:ident) => {{"
    )
    .unwrap();
    for (name, args) in kept.iter().filter(|(name, _)| name != filter::P2P_ENTRY) {
        writeln!(out, "        $m!({name:?}, {args});").unwrap();
    }
    out.push_str("    };\n}\n");
    let dest =
        PathBuf::from(env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("kernel_set.rs");
    fs::write(dest, out).expect("write kernel_set.rs");
}
