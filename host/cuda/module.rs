//! Modules of the user's own kernels (the device API): PTX a build script compiled with
//! `nccl-kernel-build`, loaded on a GPU, or nothing on the simulator, which calls the kernel's
//! Rust function instead. Either way a [`Module::launch`] runs the same kernel.

use super::{driver, ptx_archs, Device, Imp, StreamHandle};
use crate::error::{Error, Result};
use nccl_device::api::Kernel;
use std::collections::HashMap;

/// The kernels of one PTX module, loaded on one device (nothing to load on the simulator).
pub struct Module {
    device: Device,
    /// On a GPU: the loaded module and its entry points by name.
    loaded: Option<driver::UserModule>,
}

impl std::fmt::Debug for Module {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Module(device {})", self.device.ordinal)
    }
}

impl Module {
    /// Loads the kernels of `ptx` (the `PTX` table `nccl-kernel-build` wrote: architecture,
    /// text) on `device`: on a GPU the text for the newest architecture not above the
    /// device's, JIT-compiled by the driver, every entry point loaded now (a load while other
    /// kernels wait on peers would wait for them); on the simulator nothing.
    pub fn load(device: &Device, ptx: &[(u32, &str)]) -> Result<Module> {
        let loaded = match &*device.imp {
            Imp::Sim(_) => None,
            Imp::Cuda(d) => Some(d.load_user_module(pick(ptx, d.sm())?)?),
        };
        Ok(Module {
            device: device.clone(),
            loaded,
        })
    }

    /// Launches `kernel` on `grid` CTAs of `block` threads in `stream`'s order, with `args` as
    /// its parameter (copied now, as `cuLaunchKernel` copies it). Drop the module only after
    /// the kernels launched from it finished.
    ///
    /// # Safety
    /// What the kernel does with `args` must be sound: the memory it names lives until the
    /// stream passed the kernel, and every rank the kernel waits for launches its side.
    /// `kernel` must be one of this module's (declared by `nccl_device::kernel!` in the crate
    /// the PTX was built from).
    pub unsafe fn launch<A: Copy + Send + Sync + 'static>(
        &self,
        kernel: &Kernel<A>,
        grid: u32,
        block: u32,
        stream: StreamHandle,
        args: A,
    ) -> Result<()> {
        if grid == 0 || !(1..=1024).contains(&block) {
            return Err(Error::invalid_argument(format!(
                "{}: a grid of {grid} CTAs of {block} threads (1 to 1024 threads, at least one \
                 CTA)",
                kernel.name()
            )));
        }
        match (&*self.device.imp, &self.loaded) {
            (Imp::Sim(d), _) => {
                let body = kernel.body();
                d.launch_body(
                    grid,
                    block,
                    stream,
                    std::sync::Arc::new(move || body(&args)),
                )
            }
            (Imp::Cuda(d), Some(m)) => {
                let f = m.function(kernel.name(), std::mem::size_of::<A>())?;
                d.launch_user(f, grid, block, stream, &args as *const A as *const u8)
            }
            (Imp::Cuda(_), None) => Err(Error::internal("a GPU module that was never loaded")),
        }
    }

    /// The device it is loaded on.
    pub fn device(&self) -> &Device {
        &self.device
    }
}

impl Drop for Module {
    /// Unloads the module from its GPU: the kernels launched from it must have finished.
    fn drop(&mut self) {
        if let (Imp::Cuda(d), Some(m)) = (&*self.device.imp, self.loaded.take()) {
            if let Err(e) = d.unload_user_module(m) {
                log::warn!("Module: {e}");
            }
        }
    }
}

/// The text for a device of compute capability `sm`: the newest architecture of the table
/// that is not above it.
fn pick<'a>(ptx: &[(u32, &'a str)], sm: u32) -> Result<&'a str> {
    let built: Vec<String> = ptx.iter().map(|(a, _)| format!("sm_{a}")).collect();
    let best = ptx
        .iter()
        .filter(|(a, _)| *a <= sm)
        .max_by_key(|(a, _)| *a)
        .map(|(_, text)| *text);
    best.ok_or_else(|| {
        let held = match built.is_empty() {
            true => "no PTX (it was built for the simulator only)".to_string(),
            false => format!("PTX for {}", built.join(", ")),
        };
        let arch = ptx_archs::newest_not_above(sm).unwrap_or(ptx_archs::ARCHS[0]);
        Error::invalid_usage(format!(
            "Module::load: the kernel crate holds {held}, none this sm_{sm} GPU can run; \
             rebuild it with NCCL_RS_PTX_ARCHS={arch} (nccl-kernel-build)"
        ))
    })
}

/// Entry points of a PTX text: each name, and the bytes of its one parameter where the PTX
/// says them (`.param .align A .b8 name[BYTES]`, or a scalar of 4 or 8 bytes).
pub(crate) fn entries(ptx: &str) -> Vec<(&str, Option<usize>)> {
    let mut lines = ptx.lines().map(str::trim).peekable();
    let mut found = Vec::new();
    while let Some(line) = lines.next() {
        let Some(name) = line
            .strip_prefix(".visible .entry ")
            .and_then(|l| l.split('(').next())
        else {
            continue;
        };
        let param = lines.peek().filter(|l| l.starts_with(".param"));
        found.push((name.trim(), param.and_then(|l| param_bytes(l))));
    }
    found
}

/// The bytes of a PTX parameter declaration.
fn param_bytes(decl: &str) -> Option<usize> {
    if let Some(open) = decl.find('[') {
        let close = decl[open..].find(']')? + open;
        return decl[open + 1..close].parse().ok();
    }
    let scalar = |w: &str| decl.split_whitespace().any(|t| t == w);
    match () {
        _ if [".b64", ".u64", ".s64", ".f64"].into_iter().any(scalar) => Some(8),
        _ if [".b32", ".u32", ".s32", ".f32"].into_iter().any(scalar) => Some(4),
        _ => None,
    }
}

/// A loaded module's entry points: (function, parameter bytes where known), by name (the
/// driver backend fills it).
pub(crate) type Functions = HashMap<String, (usize, Option<usize>)>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_newest_architecture_a_device_runs() {
        let table = [(80, "a"), (90, "b")];
        assert_eq!(pick(&table, 90).unwrap(), "b");
        assert_eq!(pick(&table, 89).unwrap(), "a");
        assert_eq!(pick(&table, 100).unwrap(), "b");
        let e = pick(&table, 75).unwrap_err().to_string();
        assert!(e.contains("sm_80, sm_90") && e.contains("sm_75"), "{e}");
        let e = pick(&[], 90).unwrap_err().to_string();
        assert!(
            e.contains("simulator only") && e.contains("NCCL_RS_PTX_ARCHS=sm_90"),
            "{e}"
        );
    }

    #[test]
    fn finds_the_entry_points_and_their_parameters() {
        let ptx = "//\n.visible .entry hello(\n\t.param .align 8 .b8 hello_param_0[56]\n)\n\
                   .visible .func _RNv5hello(\n.visible .entry two(\n\t.param .u64 two_p\n)\n\
                   .visible .entry none(\n)\n";
        assert_eq!(
            entries(ptx),
            [("hello", Some(56)), ("two", Some(8)), ("none", None)]
        );
    }
}
