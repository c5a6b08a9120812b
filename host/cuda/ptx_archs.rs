//! Which GPU architectures a build compiles the kernels to PTX for. Shared with `build.rs`
//! (`#[path]`), which makes the choice, so that the library's tests check the same rules.
//!
//! `NCCL_RS_PTX_ARCHS` decides when set: `all`, `none`, or a comma list of [`ARCHS`] names.
//! Unset, the build compiles for the GPUs the build machine shows (as `nvcc -arch=native`
//! does): each GPU gets the newest architecture of [`ARCHS`] not above its own, and a machine
//! with no GPU builds no PTX at all, only the simulator's kernels. The PTX is minutes of LLVM
//! per architecture, and a machine that cannot run it gains nothing from it; a build meant for
//! GPUs elsewhere names them (`NCCL_RS_PTX_ARCHS=all`).

/// Architectures the kernels can be built for; the loader picks the newest one not above a
/// device's.
pub const ARCHS: [&str; 2] = ["sm_80", "sm_90"];

/// What the build machine shows of its GPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Visible {
    /// The compute capabilities of its GPUs (90 for 9.0), as `nvidia-smi` lists them.
    Gpus(Vec<u32>),
    /// An NVIDIA device node but no list of GPUs (no `nvidia-smi`): build them all.
    Unknown,
    /// No NVIDIA GPU.
    NoGpu,
}

/// The architectures to build for `requested` (the value of `NCCL_RS_PTX_ARCHS`, empty when
/// unset) on a machine showing `visible`, with a line saying why; an error names what is wrong
/// with `requested`.
pub fn choose(requested: &str, visible: &Visible) -> Result<(Vec<&'static str>, String), String> {
    let requested = requested.trim();
    match requested {
        "all" => return Ok((ARCHS.to_vec(), "NCCL_RS_PTX_ARCHS=all".into())),
        "none" => return Ok((Vec::new(), "NCCL_RS_PTX_ARCHS=none".into())),
        "" => {}
        list => {
            let mut chosen = Vec::new();
            for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
                let Some(arch) = ARCHS.iter().find(|a| **a == name) else {
                    return Err(format!(
                        "NCCL_RS_PTX_ARCHS names `{name}`: the kernels build for {} (or `all`, \
                         `none`); a newer GPU runs the newest of them not above its own",
                        ARCHS.join(", ")
                    ));
                };
                if !chosen.contains(arch) {
                    chosen.push(*arch);
                }
            }
            chosen.sort_unstable();
            return Ok((chosen, format!("NCCL_RS_PTX_ARCHS={list}")));
        }
    }
    let gpus = match visible {
        Visible::NoGpu => return Ok((Vec::new(), "no NVIDIA GPU on the build machine".into())),
        Visible::Unknown => {
            return Ok((
                ARCHS.to_vec(),
                "an NVIDIA device but no nvidia-smi to name its architecture".into(),
            ))
        }
        Visible::Gpus(gpus) => gpus,
    };
    let mut chosen: Vec<&'static str> =
        gpus.iter().filter_map(|sm| newest_not_above(*sm)).collect();
    chosen.sort_unstable();
    chosen.dedup();
    let shown: Vec<String> = gpus.iter().map(|sm| format!("sm_{sm}")).collect();
    Ok((
        chosen,
        format!("the build machine's GPUs ({})", shown.join(", ")),
    ))
}

/// The newest of [`ARCHS`] that a device of compute capability `sm` (e.g. 90) can run.
pub fn newest_not_above(sm: u32) -> Option<&'static str> {
    ARCHS
        .iter()
        .copied()
        .filter(|a| arch_number(a).is_some_and(|n| n <= sm))
        .max_by_key(|a| arch_number(a))
}

/// 90 for `sm_90`.
pub fn arch_number(arch: &str) -> Option<u32> {
    arch.strip_prefix("sm_")?.parse().ok()
}

/// A compute capability as `nvidia-smi --query-gpu=compute_cap` prints it (`9.0`) as 90.
pub fn parse_compute_cap(text: &str) -> Option<u32> {
    let (major, minor) = text.trim().split_once('.')?;
    Some(major.parse::<u32>().ok()? * 10 + minor.parse::<u32>().ok()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_decides_and_a_wrong_name_is_refused() {
        let gpu = Visible::Gpus(vec![90]);
        assert_eq!(choose("all", &Visible::NoGpu).unwrap().0, ARCHS.to_vec());
        assert!(choose("none", &gpu).unwrap().0.is_empty());
        assert_eq!(
            choose(" sm_90, sm_80,sm_90 ", &Visible::NoGpu).unwrap().0,
            vec!["sm_80", "sm_90"]
        );
        let err = choose("sm_89", &gpu).unwrap_err();
        assert!(
            err.contains("`sm_89`") && err.contains("sm_80, sm_90"),
            "{err}"
        );
    }

    #[test]
    fn unset_builds_for_the_machines_gpus() {
        assert_eq!(
            choose("", &Visible::Gpus(vec![90, 90])).unwrap().0,
            vec!["sm_90"]
        );
        // An A10 (8.6) runs sm_80's text, a B200 (10.0) sm_90's; a V100 none.
        assert_eq!(
            choose("", &Visible::Gpus(vec![86, 100, 70])).unwrap().0,
            vec!["sm_80", "sm_90"]
        );
        assert!(choose("", &Visible::Gpus(vec![70])).unwrap().0.is_empty());
        let (none, why) = choose("", &Visible::NoGpu).unwrap();
        assert!(none.is_empty() && why.contains("no NVIDIA GPU"), "{why}");
        assert_eq!(choose("", &Visible::Unknown).unwrap().0, ARCHS.to_vec());
    }

    #[test]
    fn compute_caps_parse() {
        assert_eq!(parse_compute_cap("9.0\n"), Some(90));
        assert_eq!(parse_compute_cap("12.1"), Some(121));
        assert_eq!(parse_compute_cap("No devices were found"), None);
    }
}
