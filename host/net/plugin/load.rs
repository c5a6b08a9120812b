//! Finding and opening plugin libraries as NCCL 2.28 does, and finding their tables:
//! `NCCL_NET_PLUGIN` unset means `libnccl-net.so`; set, it is a comma-separated list, each
//! entry tried as given and then as `libnccl-net-<entry>.so` (unless it is a path or already a
//! `lib*.so` name); `none` means no plugin. In a library, `ncclNetPlugin_v11` down to
//! `ncclNetPlugin_v8` are looked up, newest first, and `ncclCollNetPlugin_v11` to `_v8` are
//! noted.

use super::abi::{CollNetHead, NetV10, NetV11, NetV8, NetV9};
use std::ffi::{c_void, CStr};

/// The library tried when `NCCL_NET_PLUGIN` is unset.
pub(crate) const DEFAULT_LIBRARY: &str = "libnccl-net.so";

/// The plugin names `NCCL_NET_PLUGIN` asks for, in order.
pub(crate) fn requested(env: Option<&str>) -> Vec<String> {
    match env.map(str::trim) {
        None => vec![DEFAULT_LIBRARY.to_string()],
        Some(v) if v.eq_ignore_ascii_case("none") => Vec::new(),
        Some(v) => v
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
    }
}

/// The file names tried for one entry: as given, then `libnccl-net-<entry>.so` unless the entry
/// is a path or a `lib*.so` name.
pub(crate) fn candidates(entry: &str) -> Vec<String> {
    let mut c = vec![entry.to_string()];
    let library_name = entry.starts_with("lib") && entry.ends_with(".so");
    if !entry.contains('/') && !library_name {
        c.push(format!("libnccl-net-{entry}.so"));
    }
    c
}

/// A plugin's network table, by version. The tables live in the library's data, which is
/// never unloaded (the library is kept for the life of the process).
#[derive(Clone, Copy)]
pub(crate) enum Table {
    V8(&'static NetV8),
    V9(&'static NetV9),
    V10(&'static NetV10),
    V11(&'static NetV11),
}

// SAFETY: a table is immutable static data of a library that is never unloaded; its function
// pointers may be called from any thread (NCCL calls them from its init and proxy threads).
unsafe impl Send for Table {}
// SAFETY: as above.
unsafe impl Sync for Table {}

impl Table {
    pub(crate) fn version(&self) -> u32 {
        match self {
            Table::V8(_) => 8,
            Table::V9(_) => 9,
            Table::V10(_) => 10,
            Table::V11(_) => 11,
        }
    }
}

/// An opened plugin library and what it exports.
pub(crate) struct Library {
    /// The entry of NCCL_NET_PLUGIN (or the default name) it came from.
    pub entry: String,
    /// The file the loader opened.
    pub path: String,
    pub table: Table,
    /// `ncclCollNetPlugin_vN` found: (N, the table's name).
    pub collnet: Option<(u32, String)>,
    _lib: &'static libloading::Library,
}

/// Why an entry gave no library.
#[derive(Debug)]
pub(crate) enum LoadError {
    /// No file of the entry's names could be found (normal for the default name).
    NotFound(String),
    /// A file was found but could not be loaded, or exports no table we read.
    Failed(String),
}

/// Opens `entry`'s library and finds its tables.
pub(crate) fn open(entry: &str) -> Result<Library, LoadError> {
    let mut missing = Vec::new();
    let mut failures = Vec::new();
    for name in candidates(entry) {
        // SAFETY: loading a library runs its initialisers; the user named it (or NCCL's default
        // name) as a network plugin, exactly as NCCL loads it.
        match unsafe { libloading::Library::new(&name) } {
            Ok(lib) => return tables(entry, &name, Box::leak(Box::new(lib))),
            Err(e) => {
                let text = e.to_string();
                if text.contains("No such file or directory") {
                    missing.push(name);
                } else {
                    failures.push(format!("{name}: {text}"));
                }
            }
        }
    }
    if failures.is_empty() {
        Err(LoadError::NotFound(format!(
            "could not find {}",
            missing.join(" or ")
        )))
    } else {
        Err(LoadError::Failed(failures.join("; ")))
    }
}

/// The file a symbol at `addr` was loaded from, per the dynamic loader.
fn file_of(addr: *const c_void) -> Option<String> {
    // SAFETY: dladdr only reads the loader's tables; `info` is written on success, and its
    // file name points into the loader's memory, which lasts while the library is loaded (for
    // ever here); it is copied out at once.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(addr, &mut info) == 0 || info.dli_fname.is_null() {
            return None;
        }
        Some(
            CStr::from_ptr(info.dli_fname)
                .to_string_lossy()
                .into_owned(),
        )
    }
}

/// The address of data symbol `name` (NUL-terminated) in `lib`, if exported and non-null.
fn symbol(lib: &'static libloading::Library, name: &[u8]) -> Option<*const c_void> {
    // SAFETY: the symbol's address is read, not dereferenced; a data symbol's value as
    // `*const c_void` is its address.
    let p = unsafe { lib.get::<*const c_void>(name).ok().map(|s| *s) }?;
    (!p.is_null()).then_some(p)
}

fn tables(
    entry: &str,
    name: &str,
    lib: &'static libloading::Library,
) -> Result<Library, LoadError> {
    // SAFETY (every cast below): a symbol named ncclNetPlugin_vN is, by the plugin ABI, a
    // static table of layout ncclNet_vN (abi.rs mirrors include/nccl_net.h); the library is
    // never unloaded, so the reference lives for the process.
    let table = if let Some(p) = symbol(lib, b"ncclNetPlugin_v11\0") {
        Table::V11(unsafe { &*(p as *const NetV11) })
    } else if let Some(p) = symbol(lib, b"ncclNetPlugin_v10\0") {
        Table::V10(unsafe { &*(p as *const NetV10) })
    } else if let Some(p) = symbol(lib, b"ncclNetPlugin_v9\0") {
        Table::V9(unsafe { &*(p as *const NetV9) })
    } else if let Some(p) = symbol(lib, b"ncclNetPlugin_v8\0") {
        Table::V8(unsafe { &*(p as *const NetV8) })
    } else {
        let older: Vec<String> = (2..8)
            .filter(|v| symbol(lib, format!("ncclNetPlugin_v{v}\0").as_bytes()).is_some())
            .map(|v| format!("v{v}"))
            .collect();
        let why = if older.is_empty() {
            "it exports no ncclNetPlugin_v11, _v10, _v9 or _v8 symbol".to_string()
        } else {
            format!(
                "it exports only ncclNetPlugin_{} (versions older than 8 are not supported)",
                older.join(", _")
            )
        };
        return Err(LoadError::Failed(format!("{name}: {why}")));
    };
    let collnet = (8..=11u32).rev().find_map(|v| {
        let p = symbol(lib, format!("ncclCollNetPlugin_v{v}\0").as_bytes())?;
        // SAFETY: every ncclCollNet_vN starts with its `const char* name` (see above for the
        // table's lifetime); the name is NUL-terminated or null.
        let n = unsafe { (*(p as *const CollNetHead)).name };
        let n = if n.is_null() {
            "unnamed".to_string()
        } else {
            // SAFETY: non-null NUL-terminated static string of the plugin.
            unsafe { CStr::from_ptr(n) }.to_string_lossy().into_owned()
        };
        Some((v, n))
    });
    let addr = match table {
        Table::V8(t) => t as *const NetV8 as *const c_void,
        Table::V9(t) => t as *const NetV9 as *const c_void,
        Table::V10(t) => t as *const NetV10 as *const c_void,
        Table::V11(t) => t as *const NetV11 as *const c_void,
    };
    Ok(Library {
        entry: entry.to_string(),
        path: file_of(addr).unwrap_or_else(|| name.to_string()),
        table,
        collnet,
        _lib: lib,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_list_is_read_as_nccl_reads_it() {
        assert_eq!(requested(None), vec!["libnccl-net.so"]);
        assert!(requested(Some("none")).is_empty());
        assert!(requested(Some("NONE")).is_empty());
        assert_eq!(
            requested(Some("ofi, /opt/x/libnccl-net-ib.so,,libfoo.so")),
            vec!["ofi", "/opt/x/libnccl-net-ib.so", "libfoo.so"]
        );
        assert_eq!(candidates("ofi"), vec!["ofi", "libnccl-net-ofi.so"]);
        assert_eq!(
            candidates("/opt/libnccl-net.so"),
            vec!["/opt/libnccl-net.so"]
        );
        assert_eq!(candidates("libnccl-net-x.so"), vec!["libnccl-net-x.so"]);
        // A lib* name without .so, or a .so name without lib, still gets the prefixed form.
        assert_eq!(candidates("libx"), vec!["libx", "libnccl-net-libx.so"]);
        assert_eq!(candidates("x.so"), vec!["x.so", "libnccl-net-x.so.so"]);
    }

    #[test]
    fn a_missing_library_is_not_found_not_failed() {
        match open("nccl-rs-no-such-plugin") {
            Err(LoadError::NotFound(why)) => {
                assert!(
                    why.contains("libnccl-net-nccl-rs-no-such-plugin.so"),
                    "{why}"
                )
            }
            Err(LoadError::Failed(why)) => panic!("failed instead of not found: {why}"),
            Ok(_) => panic!("a library that does not exist loaded"),
        }
    }
}
