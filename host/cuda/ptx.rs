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

/// A module holding the header and shared items of `ptx`, the entry points whose name starts
/// with `prefix`, and only the functions those entries call (directly or through each other):
/// the driver compiles every function a module holds, visible ones included, so the others
/// would only cost JIT time. Items end at the first `}` in column 0 (definitions) or at the
/// first line ending in `;` before a `{` (declarations).
pub fn family(ptx: &str, prefix: &str) -> String {
    let lines: Vec<&str> = ptx.lines().collect();
    let items = items(&lines);
    // Which line belongs to which item.
    let mut owner = vec![None; lines.len()];
    for (k, it) in items.iter().enumerate() {
        owner[it.lines.clone()].fill(Some(k));
    }
    let mut keep: Vec<bool> = items
        .iter()
        .map(|it| it.entry && it.name.starts_with(prefix))
        .collect();
    // Functions reachable from the kept entries, by name.
    let by_name: std::collections::HashMap<&str, Vec<usize>> = items
        .iter()
        .enumerate()
        .filter(|(_, it)| !it.entry)
        .fold(Default::default(), |mut m, (k, it)| {
            m.entry(it.name).or_default().push(k);
            m
        });
    let mut todo: Vec<usize> = (0..items.len()).filter(|&k| keep[k]).collect();
    while let Some(k) = todo.pop() {
        for line in &lines[items[k].lines.clone()] {
            for word in line.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '$')) {
                for &f in by_name.get(word).into_iter().flatten() {
                    if !keep[f] {
                        keep[f] = true;
                        todo.push(f);
                    }
                }
            }
        }
    }
    let mut out = String::with_capacity(ptx.len() / 8);
    for (i, line) in lines.iter().enumerate() {
        let kept = match owner[i] {
            Some(k) => keep[k],
            None => !line.starts_with("\t// .globl"),
        };
        if kept {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// An entry point or function of a PTX text: a definition or a declaration.
struct Item<'a> {
    name: &'a str,
    entry: bool,
    lines: std::ops::Range<usize>,
}

/// The entries and functions of `lines`, in order.
fn items<'a>(lines: &[&'a str]) -> Vec<Item<'a>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        let head = [
            ".visible .entry ",
            ".entry ",
            ".visible .func ",
            ".func ",
            ".weak .func ",
        ]
        .iter()
        .find_map(|k| line.strip_prefix(k).map(|rest| (k.contains("entry"), rest)));
        let Some((entry, rest)) = head else {
            i += 1;
            continue;
        };
        // `.func (.param .b64 ret) name(`: the name follows the return parameters.
        let rest = match rest.strip_prefix('(') {
            Some(r) => r
                .split_once(')')
                .map_or("", |(_, after)| after.trim_start()),
            None => rest,
        };
        let name = rest
            .split(|c: char| c == '(' || c == ';' || c.is_whitespace())
            .next()
            .unwrap_or("");
        let start = i;
        let mut body = false;
        while i < lines.len() {
            let l = lines[i];
            i += 1;
            if l.starts_with('{') {
                body = true;
            }
            if (body && l == "}") || (!body && l.trim_end().ends_with(';')) {
                break;
            }
        }
        out.push(Item {
            name,
            entry,
            lines: start..i,
        });
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
            eprintln!("PTX not embedded (NCCL_RS_SKIP_PTX): nothing to check");
            return;
        };
        let m = family(ptx, "nccl_coll_float_");
        let lines: Vec<&str> = m.lines().collect();
        let defined: Vec<&str> = items(&lines)
            .iter()
            .filter(|it| lines[it.lines.end - 1] == "}")
            .map(|it| it.name)
            .collect();
        assert_eq!(defined.iter().filter(|n| n.starts_with("nccl_")).count(), 6);
        for line in &lines {
            if let Some(call) = line.trim_start().strip_prefix("call.uni ") {
                let target = call.rsplit_once("), ").map_or(call, |(_, t)| t);
                let target = target.split(',').next().unwrap_or("").trim();
                assert!(defined.contains(&target), "{target} is called, not defined");
            }
        }
        assert!(
            m.len() < ptx.len() / 4,
            "{} of {} bytes",
            m.len(),
            ptx.len()
        );
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
