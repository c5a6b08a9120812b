//! PTX text handling: pick the text for a device's architecture and cut out one family of
//! kernels, so that loading a module JIT-compiles only the kernels that are about to run.

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

/// A module holding the header and shared items of `ptx` and only the entry points whose name
/// starts with `prefix`. Entry bodies end at the first `}` in column 0.
pub fn family(ptx: &str, prefix: &str) -> String {
    let mut out = String::with_capacity(ptx.len() / 8);
    let mut keep = true;
    let mut in_entry = false;
    for line in ptx.lines() {
        if !in_entry {
            if let Some(rest) = line.strip_prefix(".visible .entry ") {
                in_entry = true;
                keep = rest.starts_with(prefix);
            } else if line.starts_with("\t// .globl") {
                continue;
            }
        }
        if keep || !in_entry {
            out.push_str(line);
            out.push('\n');
        }
        if in_entry && line == "}" {
            in_entry = false;
            keep = true;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = ".version 7.8\n.target sm_90\n.address_size 64\n\n.global .align 1 .b8 s[1] = {1};\n\t// .globl\tnccl_a_x\n.visible .entry nccl_a_x(\n\t.param .u64 p\n)\n{\n\tret;\n}\n\t// .globl\tnccl_b_y\n.visible .entry nccl_b_y(\n)\n{\n\tret;\n}\n.func f()\n{\n\tret;\n}\n";

    #[test]
    fn family_keeps_shared_items_and_matching_entries() {
        let m = family(SAMPLE, "nccl_a_");
        assert!(m.contains(".visible .entry nccl_a_x("));
        assert!(!m.contains("nccl_b_y"));
        assert!(m.contains(".global .align 1 .b8 s[1]"));
        assert!(m.contains(".func f()"));
        assert!(m.starts_with(".version 7.8\n.target sm_90"));
    }

    #[test]
    fn embedded_ptx_has_every_kernel() {
        let Some(ptx) = for_arch(90) else {
            eprintln!("PTX not embedded (NCCL_RS_SKIP_PTX): nothing to check");
            return;
        };
        assert!(ptx.contains(".target sm_90"));
        for dt in nccl_device::types::DataType::ALL {
            for op in nccl_device::ops::RedOpKind::ALL {
                let name = format!(".visible .entry nccl_coll_{}_{}(", dt.name(), op.name());
                assert!(ptx.contains(&name), "{name} missing");
            }
        }
        assert_eq!(
            for_arch(86).map(|t| t.contains(".target sm_80")),
            Some(true)
        );
        assert_eq!(for_arch(70), None);
    }
}
