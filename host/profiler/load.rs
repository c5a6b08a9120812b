//! Finding the profiler plugin, once per process, as NCCL does: `NCCL_PROFILER_PLUGIN` names
//! it (`none` turns profiling off; unset or empty: `libnccl-profiler.so`; `STATIC_PLUGIN`:
//! the program itself). A name that does not open as given, and has no `/` and is not
//! already `lib….so`, is tried as `libnccl-profiler-<name>.so`. The library's table is the
//! first of `ncclProfiler_v6`, `_v5`, `_v4` it exports. A failure is final for the process:
//! an INFO line says why, and nothing is profiled.

use super::abi::{FinalizeFn, InitV4, InitV5, RecordFn, StartFn, StopFn, Table};
use std::ffi::{c_char, CStr};
use std::sync::OnceLock;

/// `init` of the plugin's version.
#[derive(Clone, Copy)]
pub(crate) enum Init {
    V4(InitV4),
    V5(InitV5),
}

/// A loaded profiler plugin.
pub(crate) struct Plugin {
    /// The ABI version of the table found (4, 5 or 6).
    pub version: u32,
    /// The table's name.
    pub name: String,
    pub init: Init,
    pub start: StartFn,
    pub stop: StopFn,
    pub record: RecordFn,
    pub finalize: FinalizeFn,
    /// Kept loaded for the process's life: communicators' contexts live in it.
    _lib: &'static libloading::Library,
}

static PLUGIN: OnceLock<Option<Plugin>> = OnceLock::new();

/// The process's profiler plugin, loaded on the first call; None where there is none.
pub(crate) fn plugin() -> Option<&'static Plugin> {
    PLUGIN.get_or_init(load).as_ref()
}

fn load() -> Option<Plugin> {
    let set = crate::env::PROFILER_PLUGIN.raw().filter(|v| !v.is_empty());
    if set
        .as_deref()
        .is_some_and(|v| v.eq_ignore_ascii_case("none"))
    {
        log::info!("PROFILER/Plugin: NCCL_PROFILER_PLUGIN=none: no profiler");
        return None;
    }
    let name = set.clone().unwrap_or_else(|| "libnccl-profiler.so".into());
    let mut names = vec![name.clone()];
    let plain = !name.contains('/') && !(name.starts_with("lib") && name.ends_with(".so"));
    if set.is_some() && plain && !is_static(&name) {
        names.push(format!("libnccl-profiler-{name}.so"));
    }
    let mut errors = Vec::new();
    for n in &names {
        match open(n) {
            Ok(lib) => {
                let lib: &'static libloading::Library = Box::leak(Box::new(lib));
                return match table(lib) {
                    Some(p) => {
                        log::info!(
                            "PROFILER/Plugin: Loaded {} (v{}) from {n}",
                            p.name,
                            p.version
                        );
                        Some(p)
                    }
                    None => {
                        log::info!(
                            "PROFILER/Plugin: {n} exports none of ncclProfiler_v6, _v5, _v4 \
                             (older versions are not supported): no profiler"
                        );
                        None
                    }
                };
            }
            Err(e) => errors.push(format!("{n}: {e}")),
        }
    }
    log::info!(
        "PROFILER/Plugin: Could not find a profiler plugin ({}): no profiler",
        errors.join("; ")
    );
    None
}

/// NCCL's `STATIC_PLUGIN`: the symbols are in the program (any case; a prefix match).
fn is_static(name: &str) -> bool {
    name.len() >= 13 && name[..13].eq_ignore_ascii_case("STATIC_PLUGIN")
}

fn open(name: &str) -> Result<libloading::Library, libloading::Error> {
    if is_static(name) {
        return Ok(libloading::os::unix::Library::this().into());
    }
    // SAFETY: loading a library runs its initialisers; the user named it as a profiler
    // plugin, exactly as NCCL loads it.
    unsafe { libloading::Library::new(name) }
}

/// The newest table `lib` exports.
fn table(lib: &'static libloading::Library) -> Option<Plugin> {
    // SAFETY: each symbol is a data object of NCCL's `ncclProfiler_vN_t` layout (a name and
    // five function pointers, `init`'s signature by version), living as long as `lib`.
    unsafe {
        for version in [6u32, 5] {
            let sym = format!("ncclProfiler_v{version}\0");
            if let Ok(t) = lib.get::<*const Table<InitV5>>(sym.as_bytes()) {
                if let Some(t) = t.as_ref() {
                    return Some(plugin_of(version, t, Init::V5(t.init), lib));
                }
            }
        }
        let t = lib.get::<*const Table<InitV4>>(b"ncclProfiler_v4\0").ok()?;
        let t = t.as_ref()?;
        Some(plugin_of(4, t, Init::V4(t.init), lib))
    }
}

fn plugin_of<I>(
    version: u32,
    t: &Table<I>,
    init: Init,
    lib: &'static libloading::Library,
) -> Plugin {
    Plugin {
        version,
        name: name_of(t.name),
        init,
        start: t.start_event,
        stop: t.stop_event,
        record: t.record_event_state,
        finalize: t.finalize,
        _lib: lib,
    }
}

fn name_of(p: *const c_char) -> String {
    if p.is_null() {
        return "unnamed".into();
    }
    // SAFETY: the table's name is a NUL-terminated string in the plugin's memory.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
