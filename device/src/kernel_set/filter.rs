//! The kernel entry points a build can hold, and `NCCL_RS_KERNELS`, the filter that keeps only
//! some of them (NCCL's `ONLY_FUNCS`, for a fast edit–test loop). Plain `core` code: the device
//! crate's build script includes this file to write the kernel list, and the crate itself
//! answers from it which kernels a build holds.
//!
//! The filter is a comma list of `collective[:type[:reduction]]`, `*` matching anything in
//! its place: `all_reduce:f32:sum`, `reduce_scatter:bfloat16`, `all_reduce,p2p`. Types go by
//! NCCL's name (`float`, `bfloat16`) or the short one (`f32`, `bf16`). Broadcast and AllGather
//! move bytes (one kernel each, whatever the type), so only their collective is matched; `p2p`
//! is the send/receive kernel. Unset or empty: every kernel.

/// The collectives that reduce: one kernel per (type, reduction).
pub const REDUCING: [&str; 3] = ["all_reduce", "reduce", "reduce_scatter"];

/// The collectives that only move bytes: one kernel each.
pub const COPIES: [&str; 2] = ["broadcast", "all_gather"];

/// The send/receive kernel's name in the filter.
pub const P2P: &str = "p2p";

/// Element types: (NCCL's name, short name, the device crate's Rust type).
pub const TYPES: [(&str, &str, &str); 12] = [
    ("int8", "i8", "i8"),
    ("uint8", "u8", "u8"),
    ("int32", "i32", "i32"),
    ("uint32", "u32", "u32"),
    ("int64", "i64", "i64"),
    ("uint64", "u64", "u64"),
    ("half", "f16", "$crate::types::F16"),
    ("float", "f32", "f32"),
    ("double", "f64", "f64"),
    ("bfloat16", "bf16", "$crate::types::Bf16"),
    ("f8e4m3", "e4m3", "$crate::types::F8E4M3"),
    ("f8e5m2", "e5m2", "$crate::types::F8E5M2"),
];

/// Reductions: (name, the device crate's Rust type; `T` is the element type).
pub const OPS: [(&str, &str); 6] = [
    ("sum", "$crate::ops::Sum"),
    ("prod", "$crate::ops::Prod"),
    ("max", "$crate::ops::Max"),
    ("min", "$crate::ops::Min"),
    ("avg", "$crate::ops::Avg<T>"),
    ("premulsum", "$crate::ops::PreMulSum<T>"),
];

/// The kernels `filter` keeps, as (entry name, the arguments `for_each_kernel!` passes on:
/// element type, reduction type, collective), in a fixed order; the send/receive kernel last,
/// with empty arguments. The build scripts (the device crate's, which writes the list, and
/// the library's) call this.
pub fn kept(filter: &str) -> std::vec::Vec<(std::string::String, std::string::String)> {
    use std::format;
    let mut out = std::vec::Vec::new();
    for (coll, variant) in [("broadcast", "Broadcast"), ("all_gather", "AllGather")] {
        if selects(filter, coll, "", "") {
            let args = format!("u8, $crate::ops::Sum, $crate::abi::Coll::{variant}");
            out.push((format!("nccl_{coll}"), args));
        }
    }
    for (ty, _, rust_ty) in TYPES {
        for (coll, variant) in [
            ("all_reduce", "AllReduce"),
            ("reduce", "Reduce"),
            ("reduce_scatter", "ReduceScatter"),
        ] {
            for (op, rust_op) in OPS {
                if selects(filter, coll, ty, op) {
                    let rust_op = rust_op.replace("<T>", &format!("<{rust_ty}>"));
                    let args = format!("{rust_ty}, {rust_op}, $crate::abi::Coll::{variant}");
                    out.push((format!("nccl_{coll}_{ty}_{op}"), args));
                }
            }
        }
    }
    if selects(filter, P2P, "", "") {
        out.push((P2P_ENTRY.into(), std::string::String::new()));
    }
    out
}

/// The send/receive kernel's entry point.
pub const P2P_ENTRY: &str = "nccl_p2p";

/// Whether `filter` keeps the kernel of collective `coll` (a name of [`REDUCING`], [`COPIES`]
/// or [`P2P`]) for type `ty` (NCCL's name) and reduction `op`; `ty` and `op` are ignored for
/// the copies and p2p. A filter of nothing but blanks keeps every kernel.
pub fn selects(filter: &str, coll: &str, ty: &str, op: &str) -> bool {
    if filter.trim().is_empty() {
        return true;
    }
    filter
        .split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .any(|item| item_selects(item, coll, ty, op))
}

fn item_selects(item: &str, coll: &str, ty: &str, op: &str) -> bool {
    let mut parts = item.split(':').map(str::trim);
    let c = parts.next().unwrap_or("");
    if c != "*" && c != coll {
        return false;
    }
    if !REDUCING.contains(&coll) {
        return true;
    }
    let type_ok = match parts.next() {
        None | Some("*") => true,
        Some(t) => nccl_type_name(t) == Some(ty),
    };
    let op_ok = match parts.next() {
        None | Some("*") => true,
        Some(o) => o == op,
    };
    type_ok && op_ok
}

/// NCCL's name of a type given by either of its names.
pub fn nccl_type_name(name: &str) -> Option<&'static str> {
    TYPES
        .iter()
        .find(|(n, s, _)| *n == name || *s == name)
        .map(|(n, _, _)| *n)
}

/// The first item of `filter` that names no collective, type or reduction (or has more than
/// three parts), if any.
pub fn first_unknown(filter: &str) -> Option<&str> {
    filter
        .split(',')
        .map(str::trim)
        .filter(|i| !i.is_empty())
        .find(|item| {
            let parts: [Option<&str>; 4] = {
                let mut it = item.split(':').map(str::trim);
                [it.next(), it.next(), it.next(), it.next()]
            };
            let known_coll =
                |c: &str| c == "*" || c == P2P || REDUCING.contains(&c) || COPIES.contains(&c);
            let known_type = |t: &str| t == "*" || nccl_type_name(t).is_some();
            let known_op = |o: &str| o == "*" || OPS.iter().any(|(n, _)| *n == o);
            !(parts[0].is_some_and(known_coll)
                && parts[1].is_none_or(known_type)
                && parts[2].is_none_or(known_op)
                && parts[3].is_none())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_filter_keeps_what_it_names() {
        assert!(selects("", "all_reduce", "float", "sum"));
        assert!(selects("all_reduce:f32:sum", "all_reduce", "float", "sum"));
        assert!(!selects(
            "all_reduce:f32:sum",
            "all_reduce",
            "float",
            "prod"
        ));
        assert!(!selects(
            "all_reduce:f32:sum",
            "all_reduce",
            "double",
            "sum"
        ));
        assert!(!selects("all_reduce:f32:sum", "reduce", "float", "sum"));
        assert!(!selects("all_reduce:f32:sum", "p2p", "", ""));
        assert!(selects("all_reduce:float", "all_reduce", "float", "max"));
        assert!(selects("reduce, p2p", "p2p", "", ""));
        assert!(selects("*:bf16:*", "reduce_scatter", "bfloat16", "avg"));
        assert!(!selects("*:bf16:*", "reduce_scatter", "half", "avg"));
        assert!(
            selects("*:bf16", "broadcast", "", ""),
            "copies match on the collective"
        );
        assert!(!selects("reduce", "reduce_scatter", "float", "sum"));
    }

    #[test]
    fn every_kernel_without_a_filter() {
        let all = kept("");
        assert_eq!(all.len(), 2 + 3 * 12 * 6 + 1);
        assert_eq!(kept("all_reduce:f32:sum").len(), 1);
        assert_eq!(kept("all_reduce:*:sum,p2p").len(), 13);
        assert_eq!(kept("*:bf16").len(), 2 + 3 * 6 + 1);
    }

    #[test]
    fn unknown_names_are_found() {
        assert_eq!(first_unknown("all_reduce:f32:sum,p2p"), None);
        assert_eq!(first_unknown("*:*:*"), None);
        assert_eq!(first_unknown("allreduce"), Some("allreduce"));
        assert_eq!(first_unknown("all_reduce:f33"), Some("all_reduce:f33"));
        assert_eq!(
            first_unknown("all_reduce:f32:add"),
            Some("all_reduce:f32:add")
        );
        assert_eq!(
            first_unknown("all_reduce:f32:sum:x"),
            Some("all_reduce:f32:sum:x")
        );
    }
}
