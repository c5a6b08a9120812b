//! `ncclConfig_t` as C lays it out (NCCL 2.29's: 2.25's fields, then those 2.27, 2.28 and 2.29
//! added): a header (size, magic, version) and the fields in NCCL's order. A field is read
//! only when it lies inside the `size` the caller's header declares, so programs built
//! against an older, shorter struct work too; a newer, longer struct's fields past ours are
//! ignored, as NCCL does. (NCCL also resets the fields a release added when the caller's
//! `version` is older; the size says the same for its headers, and `include/nccl.h` reports
//! an older version than the struct it lays out, so the size alone decides here.)

use crate::comm::Config;
use crate::error::{Error, Result};
use std::ffi::{c_char, c_int, c_uint, CStr};
use std::mem::{offset_of, size_of};

/// `NCCL_API_MAGIC`: `NCCL_CONFIG_INITIALIZER` puts it in `magic`.
pub const NCCL_CONFIG_MAGIC: c_uint = 0xcafe_beef;
/// `NCCL_CONFIG_UNDEF_INT` (INT_MIN): the field is not set.
pub const NCCL_CONFIG_UNDEF_INT: c_int = c_int::MIN;

/// `ncclConfig_t`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NcclConfig {
    /// Bytes of the structure the caller has (`sizeof(ncclConfig_t)` where it was built).
    pub size: usize,
    /// `NCCL_CONFIG_MAGIC` once `NCCL_CONFIG_INITIALIZER` set it.
    pub magic: c_uint,
    /// The NCCL version whose header built the structure.
    pub version: c_uint,
    /// 1: calls block until done; 0: non-blocking communicator.
    pub blocking: c_int,
    /// CUDA thread block cluster size of the kernels.
    pub cga_cluster_size: c_int,
    /// Fewest CTAs (channels) a collective uses.
    pub min_ctas: c_int,
    /// Most CTAs (channels) a collective uses.
    pub max_ctas: c_int,
    /// The network to use, by its name (`NCCL_NET`); null for any.
    pub net_name: *const c_char,
    /// 1: a split child shares its parent's resources.
    pub split_share: c_int,
    /// Network traffic class; `NCCL_CONFIG_UNDEF_INT` for the default.
    pub traffic_class: c_int,
    /// A name for the communicator, shown in logs and RAS reports.
    pub comm_name: *const c_char,
    /// 1: CollNet may be used.
    pub collnet_enable: c_int,
    /// NCCL 2.27: `NCCL_CTA_POLICY_*`.
    pub cta_policy: c_int,
    /// NCCL 2.27: 1: a shrunk child shares its parent's resources (recorded).
    pub shrink_share: c_int,
    /// NCCL 2.27: CTAs of NVLS collectives.
    pub nvls_ctas: c_int,
    /// NCCL 2.28: channels per remote peer of point-to-point calls.
    pub n_channels_per_net_peer: c_int,
    /// NCCL 2.28: NVLink-centric scheduling (0 or 1).
    pub nvlink_centric_sched: c_int,
    /// NCCL 2.29: 0 no CUDA graphs, 1 one graph, 2 graphs mixed.
    pub graph_usage_mode: c_int,
    /// NCCL 2.29: contexts of one-sided operations.
    pub num_rma_ctx: c_int,
}

// The layout C sees on LP64 (checked against include/nccl.h by tests/c/capi_test.c too).
const _: () = {
    assert!(offset_of!(NcclConfig, blocking) == 16);
    assert!(offset_of!(NcclConfig, net_name) == 32);
    assert!(offset_of!(NcclConfig, comm_name) == 48);
    assert!(offset_of!(NcclConfig, cta_policy) == 60);
    assert!(offset_of!(NcclConfig, n_channels_per_net_peer) == 72);
    assert!(size_of::<NcclConfig>() == 88);
};

impl Default for NcclConfig {
    /// `NCCL_CONFIG_INITIALIZER`.
    fn default() -> NcclConfig {
        NcclConfig {
            size: size_of::<NcclConfig>(),
            magic: NCCL_CONFIG_MAGIC,
            version: crate::VERSION as c_uint,
            blocking: NCCL_CONFIG_UNDEF_INT,
            cga_cluster_size: NCCL_CONFIG_UNDEF_INT,
            min_ctas: NCCL_CONFIG_UNDEF_INT,
            max_ctas: NCCL_CONFIG_UNDEF_INT,
            net_name: std::ptr::null(),
            split_share: NCCL_CONFIG_UNDEF_INT,
            traffic_class: NCCL_CONFIG_UNDEF_INT,
            comm_name: std::ptr::null(),
            collnet_enable: NCCL_CONFIG_UNDEF_INT,
            cta_policy: NCCL_CONFIG_UNDEF_INT,
            shrink_share: NCCL_CONFIG_UNDEF_INT,
            nvls_ctas: NCCL_CONFIG_UNDEF_INT,
            n_channels_per_net_peer: NCCL_CONFIG_UNDEF_INT,
            nvlink_centric_sched: NCCL_CONFIG_UNDEF_INT,
            graph_usage_mode: NCCL_CONFIG_UNDEF_INT,
            num_rma_ctx: NCCL_CONFIG_UNDEF_INT,
        }
    }
}

/// Reads the field at `offset` if the caller's struct is long enough.
///
/// # Safety
/// `p` points to at least `size` readable bytes.
unsafe fn field<T: Copy>(p: *const NcclConfig, size: usize, offset: usize) -> Option<T> {
    if offset + size_of::<T>() > size {
        return None;
    }
    // SAFETY: inside the caller's declared size (see above).
    Some(unsafe { std::ptr::read_unaligned((p as *const u8).add(offset) as *const T) })
}

fn int(v: Option<c_int>) -> Option<i32> {
    v.filter(|&v| v != NCCL_CONFIG_UNDEF_INT)
}

fn flag(name: &str, v: Option<c_int>) -> Result<Option<bool>> {
    match int(v) {
        None => Ok(None),
        Some(0) => Ok(Some(false)),
        Some(1) => Ok(Some(true)),
        Some(x) => Err(Error::invalid_argument(format!(
            "config.{name} is {x}: use 0 or 1"
        ))),
    }
}

/// # Safety
/// `s` is null or a NUL-terminated string.
unsafe fn text(s: Option<*const c_char>) -> Option<String> {
    let s = s.filter(|p| !p.is_null())?;
    // SAFETY: the caller's contract.
    Some(unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned())
}

/// The Rust config of a C `ncclConfig_t*` (NULL: all defaults).
///
/// # Safety
/// `p` is null or points to a config initialised with `NCCL_CONFIG_INITIALIZER` whose string
/// fields are null or NUL-terminated.
pub unsafe fn read(p: *const NcclConfig) -> Result<Config> {
    if p.is_null() {
        return Ok(Config::default());
    }
    // SAFETY: the header is present in every version of the struct.
    let (size, magic) = unsafe {
        (
            std::ptr::read_unaligned(std::ptr::addr_of!((*p).size)),
            std::ptr::read_unaligned(std::ptr::addr_of!((*p).magic)),
        )
    };
    if magic != NCCL_CONFIG_MAGIC {
        return Err(Error::invalid_argument(format!(
            "config magic {magic:#x} is not {NCCL_CONFIG_MAGIC:#x}: initialise ncclConfig_t with \
             NCCL_CONFIG_INITIALIZER"
        )));
    }
    if size < offset_of!(NcclConfig, blocking) {
        return Err(Error::invalid_argument(format!(
            "config size {size} is too small for an ncclConfig_t"
        )));
    }
    let size = size.min(size_of::<NcclConfig>());
    macro_rules! f {
        ($name:ident) => {
            // SAFETY: `read`'s contract; bounded by `size`.
            unsafe { field(p, size, offset_of!(NcclConfig, $name)) }
        };
    }
    Ok(Config {
        blocking: flag("blocking", f!(blocking))?,
        cga_cluster_size: int(f!(cga_cluster_size)),
        min_ctas: int(f!(min_ctas)),
        max_ctas: int(f!(max_ctas)),
        net_name: {
            let p = f!(net_name);
            // SAFETY: `read`'s contract: null or NUL-terminated.
            unsafe { text(p) }
        },
        split_share: flag("splitShare", f!(split_share))?,
        traffic_class: int(f!(traffic_class)),
        comm_name: {
            let p = f!(comm_name);
            // SAFETY: `read`'s contract: null or NUL-terminated.
            unsafe { text(p) }
        },
        collnet_enable: flag("collnetEnable", f!(collnet_enable))?,
        cta_policy: int(f!(cta_policy)),
        shrink_share: flag("shrinkShare", f!(shrink_share))?,
        nvls_ctas: int(f!(nvls_ctas)),
        n_channels_per_net_peer: int(f!(n_channels_per_net_peer)),
        nvlink_centric_sched: flag("nvlinkCentricSched", f!(nvlink_centric_sched))?,
        graph_usage_mode: int(f!(graph_usage_mode)),
        num_rma_ctx: int(f!(num_rma_ctx)),
        // nccl-rs's own: not in NCCL's struct (NCCL_RS_DETERMINISTIC* decide).
        deterministic: None,
        deterministic_scratch: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_fields_within_the_declared_size() {
        let name = c"trainer";
        let mut c = NcclConfig {
            blocking: 0,
            min_ctas: 2,
            comm_name: name.as_ptr(),
            ..NcclConfig::default()
        };
        // SAFETY: a valid config on the stack.
        let r = unsafe { read(&c) }.unwrap();
        assert_eq!(r.blocking, Some(false));
        assert_eq!(r.min_ctas, Some(2));
        assert_eq!(r.max_ctas, None);
        assert_eq!(r.comm_name.as_deref(), Some("trainer"));
        // An older, shorter struct: fields past its size are not read.
        c.size = offset_of!(NcclConfig, net_name);
        // SAFETY: as above.
        let r = unsafe { read(&c) }.unwrap();
        assert_eq!((r.min_ctas, r.comm_name), (Some(2), None));
        // 2.27's CTAPolicy, read only from a struct that has it.
        c.size = size_of::<NcclConfig>();
        c.cta_policy = 2;
        // SAFETY: as above.
        assert_eq!(unsafe { read(&c) }.unwrap().cta_policy, Some(2));
        c.size = offset_of!(NcclConfig, cta_policy);
        // SAFETY: as above.
        assert_eq!(unsafe { read(&c) }.unwrap().cta_policy, None);
        // 2.28's and 2.29's fields, likewise.
        c.size = size_of::<NcclConfig>();
        (c.n_channels_per_net_peer, c.graph_usage_mode, c.num_rma_ctx) = (8, 1, 3);
        // SAFETY: as above.
        let r = unsafe { read(&c) }.unwrap();
        assert_eq!(
            (r.n_channels_per_net_peer, r.graph_usage_mode, r.num_rma_ctx),
            (Some(8), Some(1), Some(3))
        );
        c.size = offset_of!(NcclConfig, graph_usage_mode);
        // SAFETY: as above.
        let r = unsafe { read(&c) }.unwrap();
        assert_eq!(
            (r.n_channels_per_net_peer, r.graph_usage_mode),
            (Some(8), None)
        );
        c.nvlink_centric_sched = 2;
        // SAFETY: as above.
        assert!(unsafe { read(&c) }.is_err(), "nvlinkCentricSched 2");
        c.nvlink_centric_sched = NCCL_CONFIG_UNDEF_INT;
        c.magic = 0;
        // SAFETY: as above.
        assert!(unsafe { read(&c) }.is_err());
        let bad = NcclConfig {
            blocking: 7,
            ..NcclConfig::default()
        };
        // SAFETY: as above.
        assert!(unsafe { read(&bad) }.is_err());
        // SAFETY: null is allowed.
        assert_eq!(
            unsafe { read(std::ptr::null()) }.unwrap(),
            Config::default()
        );
    }
}
