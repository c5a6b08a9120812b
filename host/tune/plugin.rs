//! NCCL's tuner plugin interface, loaded at run time from `NCCL_TUNER_PLUGIN` (a path, a library
//! name, or a short name `X` meaning `libnccl-tuner-X.so`).
//!
//! The plugin exports `ncclTunerPlugin_v4` (or `_v3`): a struct of a name and three functions,
//! - `init(nRanks, nNodes, logFunction, void** context)`,
//! - `getCollInfo(context, collType, nBytes, numPipeOps, float** collCostTable, numAlgo,
//!   numProto, [v4: regBuff,] int* nChannels)`: the table is `float[numAlgo][numProto]` of
//!   estimated times (µs), `-1` where a combination is unavailable; the plugin lowers the entries
//!   it prefers (0 forces a choice) and may set `nChannels`;
//! - `destroy(context)`.
//!
//! Every function returns `ncclResult_t` (0: success).

use super::{Coll, NUM_ALGOS, NUM_PROTOS};
use crate::error::{Error, Result};
use std::ffi::{c_char, c_int, c_void, CStr};

use crate::plugin_log::Logger as LogFn;
type InitFn = unsafe extern "C" fn(usize, usize, LogFn, *mut *mut c_void) -> c_int;
type GetV3 = unsafe extern "C" fn(
    *mut c_void,
    c_int,
    usize,
    c_int,
    *mut *mut f32,
    c_int,
    c_int,
    *mut c_int,
) -> c_int;
type GetV4 = unsafe extern "C" fn(
    *mut c_void,
    c_int,
    usize,
    c_int,
    *mut *mut f32,
    c_int,
    c_int,
    c_int,
    *mut c_int,
) -> c_int;
type DestroyFn = unsafe extern "C" fn(*mut c_void) -> c_int;

#[repr(C)]
struct TunerV3 {
    name: *const c_char,
    init: InitFn,
    get_coll_info: GetV3,
    destroy: DestroyFn,
}

#[repr(C)]
struct TunerV4 {
    name: *const c_char,
    init: InitFn,
    get_coll_info: GetV4,
    destroy: DestroyFn,
}

enum Get {
    V3(GetV3),
    V4(GetV4),
}

/// A loaded tuner plugin with its context.
pub struct Plugin {
    /// The plugin's name, as it reports it.
    pub name: String,
    get: Get,
    destroy: DestroyFn,
    context: *mut c_void,
    _lib: libloading::Library,
}

// SAFETY: the plugin's context is only used through &self calls that NCCL's interface allows
// from any thread of the communicator; the library handle is Send.
unsafe impl Send for Plugin {}
// SAFETY: as above; NCCL calls getCollInfo from whichever thread enqueues.
unsafe impl Sync for Plugin {}

impl Plugin {
    /// Loads and initialises the plugin `name` for a communicator of `nranks` ranks on `nnodes`.
    pub fn load(name: &str, nranks: usize, nnodes: usize) -> Result<Plugin> {
        let mut candidates = vec![name.to_string()];
        if !name.contains('/') && !name.ends_with(".so") {
            candidates.push(format!("libnccl-tuner-{name}.so"));
        }
        let mut last = String::new();
        for c in candidates {
            // SAFETY: loading a shared library runs its initialisers; the user chose it as a
            // tuner plugin, as with NCCL.
            match unsafe { libloading::Library::new(&c) } {
                Ok(lib) => return Plugin::init(lib, nranks, nnodes),
                Err(e) => last = format!("{c}: {e}"),
            }
        }
        Err(Error::system(format!("cannot load tuner plugin ({last})")))
    }

    fn init(lib: libloading::Library, nranks: usize, nnodes: usize) -> Result<Plugin> {
        // SAFETY: the symbols are the plugin's exported structs of NCCL's v4/v3 layouts (a name
        // pointer and three function pointers); they live as long as `lib`, which we keep.
        unsafe {
            let (name_ptr, init, get, destroy) =
                if let Ok(s) = lib.get::<*const TunerV4>(b"ncclTunerPlugin_v4\0") {
                    let t = &**s;
                    (t.name, t.init, Get::V4(t.get_coll_info), t.destroy)
                } else if let Ok(s) = lib.get::<*const TunerV3>(b"ncclTunerPlugin_v3\0") {
                    let t = &**s;
                    (t.name, t.init, Get::V3(t.get_coll_info), t.destroy)
                } else {
                    return Err(Error::system(
                        "the library exports neither ncclTunerPlugin_v4 nor ncclTunerPlugin_v3",
                    ));
                };
            let name = if name_ptr.is_null() {
                "unnamed".to_string()
            } else {
                CStr::from_ptr(name_ptr).to_string_lossy().into_owned()
            };
            let mut context: *mut c_void = std::ptr::null_mut();
            let rc = init(nranks, nnodes, crate::plugin_log::logger_fn(), &mut context);
            if rc != 0 {
                return Err(Error::system(format!(
                    "tuner plugin {name}: init returned {rc}"
                )));
            }
            log::info!("Loaded tuner plugin {name}");
            Ok(Plugin {
                name,
                get,
                destroy,
                context,
                _lib: lib,
            })
        }
    }

    /// Lets the plugin adjust `table` (µs per `[algo][proto]`, -1 unavailable) and `nchannels`.
    pub fn get_coll_info(
        &self,
        coll: Coll,
        bytes: usize,
        table: &mut [[f32; NUM_PROTOS]; NUM_ALGOS],
        nchannels: &mut i32,
    ) -> Result<()> {
        let ptr = table.as_mut_ptr() as *mut *mut f32;
        let mut nch: c_int = *nchannels;
        // SAFETY: `ptr` points at NUM_ALGOS×NUM_PROTOS contiguous floats, as the interface's
        // `float (*)[numProto]` reading of `collCostTable` expects; `nch` is a live int.
        let rc = unsafe {
            match self.get {
                Get::V4(f) => f(
                    self.context,
                    coll as c_int,
                    bytes,
                    1,
                    ptr,
                    NUM_ALGOS as c_int,
                    NUM_PROTOS as c_int,
                    0,
                    &mut nch,
                ),
                Get::V3(f) => f(
                    self.context,
                    coll as c_int,
                    bytes,
                    1,
                    ptr,
                    NUM_ALGOS as c_int,
                    NUM_PROTOS as c_int,
                    &mut nch,
                ),
            }
        };
        if rc != 0 {
            return Err(Error::internal(format!(
                "tuner plugin {}: getCollInfo returned {rc}",
                self.name
            )));
        }
        *nchannels = nch;
        Ok(())
    }
}

impl Drop for Plugin {
    fn drop(&mut self) {
        // SAFETY: the context came from this plugin's init and is destroyed once.
        let rc = unsafe { (self.destroy)(self.context) };
        if rc != 0 {
            log::warn!("tuner plugin {}: destroy returned {rc}", self.name);
        }
    }
}
