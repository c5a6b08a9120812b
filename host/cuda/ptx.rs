//! The kernels' code as the library embeds it: PTX text for a device's architecture, cut into
//! one module per kernel (`ptx_cut.rs`, which the build shares) so that loading a module
//! JIT-compiles only the kernel about to run; and, where the build made it (`NCCL_RS_PTXAS`),
//! each kernel's SASS, which loads with no JIT at all.

pub use super::ptx_cut::family;
use std::sync::OnceLock;

/// The embedded PTX for the newest architecture not above `sm` (e.g. 90 for sm_90), inflated
/// on first use and kept for the life of the process.
pub fn for_arch(sm: u32) -> Option<&'static str> {
    static TEXTS: OnceLock<Vec<(u32, String)>> = OnceLock::new();
    let texts = TEXTS.get_or_init(|| {
        crate::ptx::PTX
            .iter()
            .filter_map(|(arch, packed)| {
                let bytes = miniz_oxide::inflate::decompress_to_vec(packed).ok()?;
                let text = String::from_utf8(bytes).ok()?;
                (!text.is_empty()).then_some((*arch, text))
            })
            .collect()
    });
    texts
        .iter()
        .filter(|(arch, _)| *arch <= sm)
        .max_by_key(|(arch, _)| *arch)
        .map(|(_, text)| text.as_str())
}

/// Whether this build holds kernels a device of architecture `sm` can run (PTX, or SASS of
/// its major version); the error says what the build holds and how to build for it.
pub fn check_built_for(sm: u32) -> crate::Result<()> {
    let sass = crate::ptx::SASS
        .iter()
        .any(|(arch, _, _)| arch / 10 == sm / 10 && *arch <= sm);
    if for_arch(sm).is_some() || sass {
        return Ok(());
    }
    let wanted = super::ptx_archs::newest_not_above(sm);
    Err(crate::Error::invalid_usage(format!(
        "this build of nccl-rs holds no GPU kernels for sm_{sm} (it holds PTX for {}); {}",
        crate::ptx::PTX_CHOICE,
        match wanted {
            Some(arch) =>
                format!("build it with NCCL_RS_PTX_ARCHS={arch} (or all) to run on this GPU"),
            None => format!(
                "the kernels build for {} and newer",
                super::ptx_archs::ARCHS[0]
            ),
        }
    )))
}

/// The SASS (cubin) of kernel `name` that runs on a device of architecture `sm` (e.g. 90):
/// the build's newest of the same major version not above it (a cubin runs on later minor
/// versions of its major only). None where the build made none (`NCCL_RS_PTXAS` unset), or
/// with `NCCL_RS_SASS=0`, which makes every kernel JIT from PTX.
pub fn sass(sm: u32, name: &str) -> Option<Vec<u8>> {
    miniz_oxide::inflate::decompress_to_vec(packed_sass(sm, name)?).ok()
}

/// Whether [`sass`] has a cubin for kernel `name` on `sm` (without inflating it).
pub fn has_sass(sm: u32, name: &str) -> bool {
    packed_sass(sm, name).is_some()
}

/// The deflated cubin [`sass`] takes.
fn packed_sass(sm: u32, name: &str) -> Option<&'static [u8]> {
    if crate::env::RS_SASS.int() == 0 {
        return None;
    }
    let (_, _, packed) = crate::ptx::SASS
        .iter()
        .filter(|(arch, n, _)| *n == name && arch / 10 == sm / 10 && *arch <= sm)
        .max_by_key(|(arch, _, _)| *arch)?;
    Some(packed)
}

#[cfg(test)]
mod tests {
    use super::super::ptx_cut::items;
    use super::*;
    // Checks of what the build did not embed are skipped visibly (stderr, and a count at exit).
    use crate::test_aids::skipped;

    const NO_PTX: &str = "no PTX for sm_90 in this build (host/cuda/ptx_archs.rs)";

    const SAMPLE: &str = ".version 7.8\n.target sm_90\n.address_size 64\n\n.global .align 1 .b8 s[1] = {1};\n\t// .globl\tnccl_a_x\n.visible .entry nccl_a_x(\n\t.param .u64 p\n)\n{\n\tret;\n}\n\t// .globl\tnccl_b_y\n.visible .entry nccl_b_y(\n)\n{\n\tret;\n}\n.func f()\n{\n\tret;\n}\n";

    /// Entries `a` and `b`; `a` calls `f` (declared first), `f` calls `g` (with a return value);
    /// `h` is visible but called by nobody kept.
    const CALLS: &str = ".version 7.8\n.target sm_90\n.address_size 64\n\n.func f\n(\n\t.param .b64 f_param_0\n)\n;\n\t// .globl\th\n.visible .func h()\n{\n\tret;\n}\n.func (.param .b32 func_retval0) g(\n)\n{\n\tret;\n}\n.func f(\n\t.param .b64 f_param_0\n)\n{\n\tcall.uni (retval0), g, ();\n\tret;\n}\n.visible .entry nccl_a_x(\n)\n.maxntid 512, 1, 1\n{\n\tcall.uni f, (param0);\n\tret;\n}\n.visible .entry nccl_b_y(\n)\n{\n\tcall.uni h, ();\n\tret;\n}\n";

    #[test]
    fn family_keeps_only_the_functions_its_entries_reach() {
        let a = family(CALLS, "nccl_a_");
        assert!(a.contains(".visible .entry nccl_a_x("));
        assert!(
            a.contains(".func f\n(\n\t.param .b64 f_param_0\n)\n;\n"),
            "{a}"
        );
        assert!(a.contains(".func f(\n"));
        assert!(a.contains(".func (.param .b32 func_retval0) g(\n"));
        assert!(!a.contains("nccl_b_y") && !a.contains(" h("), "{a}");
        let b = family(CALLS, "nccl_b_");
        assert!(b.contains(".visible .func h()\n{\n\tret;\n}\n"));
        assert!(
            !b.contains(" f(") && !b.contains(" g(") && !b.contains("nccl_a_x"),
            "{b}"
        );
        assert!(b.starts_with(".version 7.8\n.target sm_90\n.address_size 64\n"));
    }

    #[test]
    fn family_keeps_shared_items_and_matching_entries() {
        let m = family(SAMPLE, "nccl_a_");
        assert!(m.contains(".visible .entry nccl_a_x("));
        assert!(!m.contains("nccl_b_y"));
        assert!(m.contains(".global .align 1 .b8 s[1]"));
        assert!(!m.contains(".func f()"), "f is called by no kept entry");
        assert!(m.starts_with(".version 7.8\n.target sm_90"));
    }

    #[test]
    fn embedded_family_defines_every_function_it_calls() {
        let Some(ptx) = for_arch(90) else {
            return skipped(NO_PTX, "embedded_family_defines_every_function_it_calls");
        };
        let m = family(ptx, "nccl_all_reduce_float_");
        let lines: Vec<&str> = m.lines().collect();
        let defined: Vec<&str> = items(&lines)
            .iter()
            .filter(|it| lines[it.lines.end - 1] == "}")
            .map(|it| it.name)
            .collect();
        let built = nccl_device::kernel_set::BUILT
            .iter()
            .filter(|n| n.starts_with("nccl_all_reduce_float_"))
            .count();
        assert_eq!(
            defined.iter().filter(|n| n.starts_with("nccl_")).count(),
            built
        );
        for line in &lines {
            if let Some(call) = line.trim_start().strip_prefix("call.uni ") {
                let target = call.rsplit_once("), ").map_or(call, |(_, t)| t);
                let target = target.split(',').next().unwrap_or("").trim();
                assert!(defined.contains(&target), "{target} is called, not defined");
            }
        }
        // AllReduce on floats is 6 of the 219 kernels; a filtered build keeps fewer others.
        let share = if nccl_device::kernel_set::FILTER.is_none() {
            4
        } else {
            1
        };
        assert!(
            m.len() < ptx.len() / share,
            "{} of {} bytes",
            m.len(),
            ptx.len()
        );
    }

    #[test]
    fn sass_has_the_register_limit_of_the_jit() {
        assert_eq!(
            crate::ptx::SASS_MAX_REGISTERS,
            65536 / crate::cuda::MAX_THREADS
        );
    }

    #[test]
    fn embedded_sass_is_one_cubin_per_kernel() {
        let Some(ptx) = for_arch(90).filter(|_| !crate::ptx::SASS.is_empty()) else {
            return skipped(
                "no SASS embedded (built without NCCL_RS_PTXAS)",
                "embedded_sass_is_one_cubin_per_kernel",
            );
        };
        let entries: Vec<&str> = ptx
            .lines()
            .filter_map(|l| l.strip_prefix(".visible .entry "))
            .filter_map(|l| l.split('(').next())
            .collect();
        for name in &entries {
            let cubin = sass(90, name).unwrap_or_else(|| panic!("no SASS for {name}"));
            // An ELF image for CUDA: magic, 64-bit, and the entry's name in its symbols.
            assert_eq!(&cubin[..5], b"\x7fELF\x02", "{name}");
            let sym = format!(".text.{name}\0");
            assert!(
                cubin.windows(sym.len()).any(|w| w == sym.as_bytes()),
                "{name}: its cubin holds no {sym:?}"
            );
        }
        assert_eq!(sass(90, "no_such_kernel"), None);
        assert_eq!(
            sass(80, entries[0]).is_some(),
            crate::ptx::SASS.iter().any(|s| s.0 == 80)
        );
        assert_eq!(
            sass(100, entries[0]),
            None,
            "another major version runs no sm_90 cubin"
        );
    }

    #[test]
    fn a_device_the_build_holds_no_kernels_for_is_refused_by_name() {
        let old = check_built_for(70).unwrap_err().to_string();
        assert!(
            old.contains("sm_70") && old.contains("sm_80 and newer"),
            "{old}"
        );
        match for_arch(90) {
            Some(_) => check_built_for(90).unwrap(),
            None => {
                let e = check_built_for(90).unwrap_err().to_string();
                assert!(
                    e.contains("NCCL_RS_PTX_ARCHS=sm_90") && e.contains(crate::ptx::PTX_CHOICE),
                    "{e}"
                );
            }
        }
    }

    #[test]
    fn embedded_ptx_has_every_kernel() {
        let Some(ptx) = for_arch(90) else {
            return skipped(NO_PTX, "embedded_ptx_has_every_kernel");
        };
        assert!(ptx.contains(".target sm_90"));
        // Every kernel the build holds (all of them unless NCCL_RS_KERNELS: the device
        // crate's own test counts them), the signal waits' kernel (always built), and no other.
        let entries = ptx.matches(".visible .entry ").count();
        assert_eq!(entries, nccl_device::kernel_set::BUILT.len() + 1);
        let wait = format!(".visible .entry {}(", nccl_device::abi::WAIT_SIGNALS_ENTRY);
        assert!(ptx.contains(&wait), "{wait} missing");
        for name in nccl_device::kernel_set::BUILT {
            let entry = format!(".visible .entry {name}(");
            assert!(ptx.contains(&entry), "{entry} missing");
        }
        // An sm_86 device takes the sm_80 text where the build made one
        // (NCCL_RS_PTX_ARCHS=sm_90 builds none).
        let sm80 = crate::ptx::PTX.iter().any(|(arch, _)| *arch == 80);
        assert_eq!(
            for_arch(86).map(|t| t.contains(".target sm_80")),
            sm80.then_some(true)
        );
        assert_eq!(for_arch(70), None);
    }
}
