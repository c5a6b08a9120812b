//! NCCL's network plugins (`libnccl-net*.so`), loaded unmodified and adapted to the internal
//! network interface ([`crate::net::Net`]).
//!
//! - `load`: which files are tried (NCCL_NET_PLUGIN, as NCCL 2.28), which table versions are
//!   looked for (ncclNetPlugin_v11 down to _v8; ncclCollNetPlugin_vN noted).
//! - `abi`: the `#[repr(C)]` tables and properties, matching `include/nccl_net.h`.
//! - `api`: one calling interface over the four versions.
//! - `adapter`: a plugin as [`Net`], [`crate::net::SendComm`], ...
//! - `log`: the logger and profiler callbacks plugins are given.
//!
//! Choosing the network of a communicator ([`select`]), as NCCL does: the plugins in the order
//! they were listed, then the built-in socket network; the first that initialises and has
//! devices wins, or the one `NCCL_NET` (the config's netName) names. A plugin that fails to
//! load, lacks a member or fails init is skipped with a warning saying why. v8 to v10 plugins
//! are initialised once per process; v11 plugins once per communicator, their context
//! finalized when the communicator's last connection closes.

mod abi;
mod adapter;
mod api;
pub(crate) mod load;
mod log;

use crate::error::{Error, Result};
use crate::net::{Net, PTR_CUDA, PTR_DMABUF, PTR_HOST};
use abi::{CommConfig, NetAttr, TRAFFIC_CLASS_UNDEF};
use adapter::{Instance, PluginNet};
use api::Api;
use load::{LoadError, Table};
use std::sync::{Arc, OnceLock};

/// What a communicator asks of its network.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Choice<'a> {
    /// NCCL_NET or the config's netName: a network's name (case ignored).
    pub name: Option<&'a str>,
    /// The communicator's id (v11 init's commId).
    pub comm_id: u64,
    /// The config's traffic class (v10 connect, v11 init).
    pub traffic_class: Option<i32>,
}

/// A loaded plugin library.
struct Plugin {
    lib: load::Library,
    api: Arc<Api>,
    /// v8 to v10: the process-wide instance, made by the first communicator that asks
    /// (`Err`: why the plugin is disabled).
    global: OnceLock<std::result::Result<Arc<Instance>, String>>,
    /// Its devices were logged.
    logged: OnceLock<()>,
}

impl Plugin {
    /// An instance for a communicator: the shared one (v8 to v10) or a fresh context (v11).
    fn open(&self, choice: &Choice) -> std::result::Result<Arc<Instance>, String> {
        let inst = if let Table::V11(_) = self.api.table {
            let ctx = self
                .api
                .init_comm(choice.comm_id, config(choice))
                .map_err(|e| format!("init failed ({})", e.message))?;
            if let Err(e) = self.api.set_net_attr(ctx, NetAttr::UNDEF) {
                if let Err(f) = self.api.finalize(ctx) {
                    ::log::warn!("{}", f.message);
                }
                return Err(format!("setNetAttr failed ({})", e.message));
            }
            Arc::new(Instance::new(self.api.clone(), ctx, true).map_err(|e| e.message)?)
        } else {
            self.global
                .get_or_init(|| {
                    self.api
                        .init_global()
                        .map_err(|e| format!("init failed ({})", e.message))?;
                    Instance::new(self.api.clone(), std::ptr::null_mut(), false)
                        .map(Arc::new)
                        .map_err(|e| e.message)
                })
                .clone()?
        };
        self.logged.get_or_init(|| self.log_devices(&inst));
        Ok(inst)
    }

    fn log_devices(&self, inst: &Instance) {
        for (d, (p, x)) in inst.devices().iter().enumerate() {
            let mut extra = Vec::new();
            if x.reg_is_global {
                extra.push("regIsGlobal".to_string());
            }
            if x.force_flush {
                extra.push("forceFlush".to_string());
            }
            if x.vdevs.len() > 1 {
                extra.push(format!("virtual device of {:?}", x.vdevs));
            }
            if let Some(m) = x.max_p2p_bytes {
                extra.push(format!("maxP2pBytes {m}"));
            }
            ::log::info!(
                target: crate::debug::INIT,
                "NET/Plugin {} : device {d}: {} speed {} Mb/s latency {} us ptrSupport {} maxComms {} maxRecvs {}{}{}",
                self.api.name,
                p.name,
                p.speed_mbps,
                p.latency_us,
                ptr_names(p.ptr_support),
                p.max_comms,
                p.max_recvs,
                if p.pci_path.is_empty() {
                    String::new()
                } else {
                    format!(" at {}", p.pci_path)
                },
                if extra.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", extra.join(", "))
                }
            );
        }
    }
}

fn config(choice: &Choice) -> CommConfig {
    CommConfig {
        traffic_class: choice.traffic_class.unwrap_or(TRAFFIC_CLASS_UNDEF),
    }
}

/// `HOST|CUDA|DMABUF` for pointer-support bits.
pub(crate) fn ptr_names(bits: u32) -> String {
    let names: Vec<&str> = [
        (PTR_HOST, "HOST"),
        (PTR_CUDA, "CUDA"),
        (PTR_DMABUF, "DMABUF"),
    ]
    .into_iter()
    .filter(|(b, _)| bits & b != 0)
    .map(|(_, n)| n)
    .collect();
    if names.is_empty() {
        "none".into()
    } else {
        names.join("|")
    }
}

/// The plugins of this process, loaded once from NCCL_NET_PLUGIN.
fn plugins() -> &'static [Plugin] {
    static PLUGINS: OnceLock<Vec<Plugin>> = OnceLock::new();
    PLUGINS.get_or_init(|| {
        let env = crate::env::NET_PLUGIN.raw();
        if let Some(v) = &env {
            ::log::info!(target: crate::debug::INIT, "NET/Plugin: NCCL_NET_PLUGIN set to {v}");
        }
        let mut out = Vec::new();
        for entry in load::requested(env.as_deref()) {
            match load::open(&entry) {
                Ok(lib) => {
                    let api = Api::new(lib.table);
                    if let Err(e) = api.check_members() {
                        ::log::warn!(
                            "NET/Plugin: {} ({}): {}; skipped",
                            lib.path,
                            entry,
                            e.message
                        );
                        continue;
                    }
                    ::log::info!(
                target: crate::debug::INIT,
                        "NET/Plugin: Loaded net plugin {} (ncclNetPlugin_v{}) from {}",
                        api.name,
                        lib.table.version(),
                        lib.path
                    );
                    if let Some((v, n)) = &lib.collnet {
                        ::log::info!(
                target: crate::debug::INIT,
                            "NET/Plugin: {} also exports ncclCollNetPlugin_v{v} ({n}); nccl-rs runs no CollNet algorithm{}",
                            lib.path,
                            if crate::env::COLLNET_ENABLE.int() != 0 {
                                ", so NCCL_COLLNET_ENABLE=1 has no effect"
                            } else {
                                ""
                            }
                        );
                    }
                    out.push(Plugin {
                        lib,
                        api: Arc::new(api),
                        global: OnceLock::new(),
                        logged: OnceLock::new(),
                    });
                }
                // The default library missing is the ordinary case: no plugin installed.
                Err(LoadError::NotFound(why)) if env.is_none() => {
                    ::log::info!(target: crate::debug::INIT, "NET/Plugin: {why}; using the internal network")
                }
                Err(LoadError::NotFound(why)) | Err(LoadError::Failed(why)) => {
                    ::log::warn!("NET/Plugin: NCCL_NET_PLUGIN entry {entry}: {why}; skipped")
                }
            }
        }
        out
    })
}

/// The network of a communicator: the first plugin (in NCCL_NET_PLUGIN's order) that
/// initialises with devices, else the built-in socket network; or the network `choice.name`
/// names, an error listing the loaded networks if none has that name.
pub(crate) fn select(choice: &Choice) -> Result<Arc<dyn Net>> {
    let mut loaded = Vec::new();
    for p in plugins() {
        let name = &p.api.name;
        loaded.push(name.clone());
        if choice
            .name
            .is_some_and(|want| !want.eq_ignore_ascii_case(name))
        {
            continue;
        }
        match p.open(choice) {
            Ok(inst) => {
                ::log::info!(
                target: crate::debug::INIT,
                    "NET/Plugin: Using network {name} (ncclNetPlugin_v{}, {} from NCCL_NET_PLUGIN entry {})",
                    p.lib.table.version(),
                    p.lib.path,
                    p.lib.entry
                );
                return Ok(Arc::new(PluginNet {
                    inst,
                    config: config(choice),
                }));
            }
            Err(why) => ::log::warn!(
                "NET/Plugin: {name} ({}): {why}; skipped, trying the next network",
                p.lib.path
            ),
        }
    }
    match choice.name {
        Some(want) if !want.eq_ignore_ascii_case("Socket") => {
            loaded.push("Socket".into());
            Err(Error::invalid_usage(format!(
                "NCCL_NET={want}: no network of that name is available (networks loaded: {})",
                loaded.join(", ")
            )))
        }
        _ => super::global(),
    }
}

/// A communicator's id for v11 plugins: a hash (FNV-1a) of its unique id's bytes, as NCCL
/// hands the hash of its unique id.
pub(crate) fn comm_id(unique_id: &[u8]) -> u64 {
    unique_id.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointer_kinds_are_named() {
        assert_eq!(ptr_names(PTR_HOST), "HOST");
        assert_eq!(
            ptr_names(PTR_HOST | PTR_CUDA | PTR_DMABUF),
            "HOST|CUDA|DMABUF"
        );
        assert_eq!(ptr_names(0), "none");
    }

    #[test]
    fn comm_ids_differ_with_the_unique_id() {
        assert_ne!(comm_id(&[1, 2, 3]), comm_id(&[1, 2, 4]));
        assert_eq!(comm_id(&[7; 128]), comm_id(&[7; 128]));
    }
}
