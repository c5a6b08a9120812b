//! The network plugin ABI, versions 8 to 11, as `#[repr(C)]` declarations matching
//! `include/nccl_net.h` (written for this project from the public description of NCCL's
//! `ncclNet_vN` interface). Sizes are asserted at compile time on 64-bit targets.

use std::ffi::{c_char, c_int, c_void};

/// `ncclResult_t` as the plugin returns it.
pub type NcclResultT = c_int;

/// NCCL_NET_MAX_DEVS_PER_NIC.
pub const MAX_DEVS_PER_NIC: usize = 4;
/// NCCL_NET_TRAFFIC_CLASS_UNDEF.
pub const TRAFFIC_CLASS_UNDEF: c_int = -1;
/// NCCL_NET_ATTR_UNDEF.
pub const ATTR_UNDEF: i32 = -1;

/// The logger handed to `init` (`crate::plugin_log`).
pub use crate::plugin_log::Logger;
/// The profiler callback handed to `init` from v10 on.
pub type Profiler =
    unsafe extern "C" fn(*mut *mut c_void, c_int, *mut c_void, i64, *mut c_void) -> NcclResultT;

/// ncclNetDeviceHandle_t: what connect / accept may return for device-side offloads.
#[repr(C)]
pub struct DeviceHandle {
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub handle: *mut c_void,
    pub size: usize,
    pub needs_proxy_progress: c_int,
}

/// ncclNetVDeviceProps_t (v9 and later).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct VDeviceProps {
    pub ndevs: c_int,
    pub devs: [c_int; MAX_DEVS_PER_NIC],
}

/// ncclNetCommConfig_t (v10's connect, v11's init).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CommConfig {
    pub traffic_class: c_int,
}

/// ncclNetProperties_v8_t.
#[repr(C)]
pub struct PropsV8 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
}

/// ncclNetProperties_v9_t, also v10's.
#[repr(C)]
pub struct PropsV9 {
    pub name: *mut c_char,
    pub pci_path: *mut c_char,
    pub guid: u64,
    pub ptr_support: c_int,
    pub reg_is_global: c_int,
    pub force_flush: c_int,
    pub speed: c_int,
    pub port: c_int,
    pub latency: f32,
    pub max_comms: c_int,
    pub max_recvs: c_int,
    pub net_device_type: c_int,
    pub net_device_version: c_int,
    pub v_props: VDeviceProps,
    pub max_p2p_bytes: usize,
    pub max_coll_bytes: usize,
}

/// ncclNetProperties_v11_t.
#[repr(C)]
pub struct PropsV11 {
    pub v9: PropsV9,
    pub max_multi_request_size: c_int,
}

/// ncclNetCommAttr_v11_t.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CommAttr {
    pub max_concurrent_peers: i32,
    pub min_concurrent_peers: i32,
    pub max_flows_per_peer: i32,
    pub min_flows_per_peer: i32,
}

/// ncclNetAttr_v11_t.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct NetAttr {
    pub send: CommAttr,
    pub recv: CommAttr,
    pub op: u32,
    pub algo: u32,
    pub proto: u32,
}

impl NetAttr {
    /// Every field "no preference" (NCCL_NET_ATTR_INIT).
    pub const UNDEF: NetAttr = NetAttr {
        send: CommAttr {
            max_concurrent_peers: ATTR_UNDEF,
            min_concurrent_peers: ATTR_UNDEF,
            max_flows_per_peer: ATTR_UNDEF,
            min_flows_per_peer: ATTR_UNDEF,
        },
        recv: CommAttr {
            max_concurrent_peers: ATTR_UNDEF,
            min_concurrent_peers: ATTR_UNDEF,
            max_flows_per_peer: ATTR_UNDEF,
            min_flows_per_peer: ATTR_UNDEF,
        },
        op: ATTR_UNDEF as u32,
        algo: ATTR_UNDEF as u32,
        proto: ATTR_UNDEF as u32,
    };
}

type P = *mut c_void;
type PP = *mut *mut c_void;
type DevOut = *mut *mut DeviceHandle;

/// The members every version shares after `listen`/`connect`/`accept` (types that do not vary).
pub type RegMr = unsafe extern "C" fn(P, P, usize, c_int, PP) -> NcclResultT;
pub type RegMrDmaBuf = unsafe extern "C" fn(P, P, usize, c_int, u64, c_int, PP) -> NcclResultT;
pub type DeregMr = unsafe extern "C" fn(P, P) -> NcclResultT;
pub type Iflush = unsafe extern "C" fn(P, c_int, PP, *mut c_int, PP, PP) -> NcclResultT;
pub type Test = unsafe extern "C" fn(P, *mut c_int, *mut c_int) -> NcclResultT;
pub type Close = unsafe extern "C" fn(P) -> NcclResultT;
pub type Devices = unsafe extern "C" fn(*mut c_int) -> NcclResultT;
pub type Accept = unsafe extern "C" fn(P, PP, DevOut) -> NcclResultT;
pub type MakeVDevice = unsafe extern "C" fn(*mut c_int, *mut VDeviceProps) -> NcclResultT;

/// ncclNet_v8_t.
#[repr(C)]
pub struct NetV8 {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(Logger) -> NcclResultT>,
    pub devices: Option<Devices>,
    pub get_properties: Option<unsafe extern "C" fn(c_int, *mut PropsV8) -> NcclResultT>,
    pub listen: Option<unsafe extern "C" fn(c_int, P, PP) -> NcclResultT>,
    pub connect: Option<unsafe extern "C" fn(c_int, P, PP, DevOut) -> NcclResultT>,
    pub accept: Option<Accept>,
    pub reg_mr: Option<RegMr>,
    pub reg_mr_dma_buf: Option<RegMrDmaBuf>,
    pub dereg_mr: Option<DeregMr>,
    pub isend: Option<unsafe extern "C" fn(P, P, c_int, c_int, P, PP) -> NcclResultT>,
    pub irecv:
        Option<unsafe extern "C" fn(P, c_int, PP, *mut c_int, *mut c_int, PP, PP) -> NcclResultT>,
    pub iflush: Option<Iflush>,
    pub test: Option<Test>,
    pub close_send: Option<Close>,
    pub close_recv: Option<Close>,
    pub close_listen: Option<Close>,
    pub get_device_mr: Option<unsafe extern "C" fn(P, P, PP) -> NcclResultT>,
    pub irecv_consumed: Option<unsafe extern "C" fn(P, c_int, P) -> NcclResultT>,
}

/// ncclNet_v9_t.
#[repr(C)]
pub struct NetV9 {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(Logger) -> NcclResultT>,
    pub devices: Option<Devices>,
    pub get_properties: Option<unsafe extern "C" fn(c_int, *mut PropsV9) -> NcclResultT>,
    pub listen: Option<unsafe extern "C" fn(c_int, P, PP) -> NcclResultT>,
    pub connect: Option<unsafe extern "C" fn(c_int, P, PP, DevOut) -> NcclResultT>,
    pub accept: Option<Accept>,
    pub reg_mr: Option<RegMr>,
    pub reg_mr_dma_buf: Option<RegMrDmaBuf>,
    pub dereg_mr: Option<DeregMr>,
    pub isend: Option<unsafe extern "C" fn(P, P, usize, c_int, P, PP) -> NcclResultT>,
    pub irecv:
        Option<unsafe extern "C" fn(P, c_int, PP, *mut usize, *mut c_int, PP, PP) -> NcclResultT>,
    pub iflush: Option<Iflush>,
    pub test: Option<Test>,
    pub close_send: Option<Close>,
    pub close_recv: Option<Close>,
    pub close_listen: Option<Close>,
    pub get_device_mr: Option<unsafe extern "C" fn(P, P, PP) -> NcclResultT>,
    pub irecv_consumed: Option<unsafe extern "C" fn(P, c_int, P) -> NcclResultT>,
    pub make_v_device: Option<MakeVDevice>,
}

/// ncclNet_v10_t.
#[repr(C)]
pub struct NetV10 {
    pub name: *const c_char,
    pub init: Option<unsafe extern "C" fn(Logger, Profiler) -> NcclResultT>,
    pub devices: Option<Devices>,
    pub get_properties: Option<unsafe extern "C" fn(c_int, *mut PropsV9) -> NcclResultT>,
    pub listen: Option<unsafe extern "C" fn(c_int, P, PP) -> NcclResultT>,
    pub connect: Option<unsafe extern "C" fn(c_int, *mut CommConfig, P, PP, DevOut) -> NcclResultT>,
    pub accept: Option<Accept>,
    pub reg_mr: Option<RegMr>,
    pub reg_mr_dma_buf: Option<RegMrDmaBuf>,
    pub dereg_mr: Option<DeregMr>,
    pub isend: Option<unsafe extern "C" fn(P, P, usize, c_int, P, P, PP) -> NcclResultT>,
    pub irecv: Option<
        unsafe extern "C" fn(P, c_int, PP, *mut usize, *mut c_int, PP, PP, PP) -> NcclResultT,
    >,
    pub iflush: Option<Iflush>,
    pub test: Option<Test>,
    pub close_send: Option<Close>,
    pub close_recv: Option<Close>,
    pub close_listen: Option<Close>,
    pub get_device_mr: Option<unsafe extern "C" fn(P, P, PP) -> NcclResultT>,
    pub irecv_consumed: Option<unsafe extern "C" fn(P, c_int, P) -> NcclResultT>,
    pub make_v_device: Option<MakeVDevice>,
}

/// ncclNet_v11_t.
#[repr(C)]
pub struct NetV11 {
    pub name: *const c_char,
    pub init:
        Option<unsafe extern "C" fn(PP, u64, *mut CommConfig, Logger, Profiler) -> NcclResultT>,
    pub devices: Option<Devices>,
    pub get_properties: Option<unsafe extern "C" fn(c_int, *mut PropsV11) -> NcclResultT>,
    pub listen: Option<unsafe extern "C" fn(P, c_int, P, PP) -> NcclResultT>,
    pub connect: Option<unsafe extern "C" fn(P, c_int, P, PP, DevOut) -> NcclResultT>,
    pub accept: Option<Accept>,
    pub reg_mr: Option<RegMr>,
    pub reg_mr_dma_buf: Option<RegMrDmaBuf>,
    pub dereg_mr: Option<DeregMr>,
    pub isend: Option<unsafe extern "C" fn(P, P, usize, c_int, P, P, PP) -> NcclResultT>,
    pub irecv: Option<
        unsafe extern "C" fn(P, c_int, PP, *mut usize, *mut c_int, PP, PP, PP) -> NcclResultT,
    >,
    pub iflush: Option<Iflush>,
    pub test: Option<Test>,
    pub close_send: Option<Close>,
    pub close_recv: Option<Close>,
    pub close_listen: Option<Close>,
    pub get_device_mr: Option<unsafe extern "C" fn(P, P, PP) -> NcclResultT>,
    pub irecv_consumed: Option<unsafe extern "C" fn(P, c_int, P) -> NcclResultT>,
    pub make_v_device: Option<MakeVDevice>,
    pub finalize: Option<unsafe extern "C" fn(P) -> NcclResultT>,
    pub set_net_attr: Option<unsafe extern "C" fn(P, *mut NetAttr) -> NcclResultT>,
}

/// The first member of every `ncclCollNet_vN`: its name (nccl-rs only reports CollNet tables).
#[repr(C)]
pub struct CollNetHead {
    pub name: *const c_char,
}

#[cfg(target_pointer_width = "64")]
const _: () = {
    use std::mem::size_of;
    assert!(size_of::<PropsV8>() == 64);
    assert!(size_of::<PropsV9>() == 104);
    assert!(size_of::<PropsV11>() == 112);
    assert!(size_of::<NetAttr>() == 44);
    assert!(size_of::<DeviceHandle>() == 32);
    assert!(size_of::<NetV8>() == 19 * 8);
    assert!(size_of::<NetV9>() == 20 * 8);
    assert!(size_of::<NetV10>() == 20 * 8);
    assert!(size_of::<NetV11>() == 22 * 8);
};
