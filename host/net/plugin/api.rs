//! One calling interface over every table version: int sizes (v8) and size_t sizes (v9 on),
//! profiler handles (v10 on, given null), the comm config (v10's connect, v11's init), v11's
//! per-communicator context. Each call checks the plugin's result and turns a failure into an
//! [`Error`] that names the plugin, the call and the code.

use super::abi::{CommConfig, NetAttr, PropsV11, PropsV8, PropsV9};
use super::load::Table;
use super::log::{logger_fn, profiler};
use crate::error::{Error, NcclResult, Result};
use crate::net::{Handle, Properties};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr::null_mut;

/// A plugin pointer (comm, request, memory handle, context).
pub(crate) type P = *mut c_void;

/// What the properties say beyond [`Properties`].
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Extra {
    pub reg_is_global: bool,
    pub force_flush: bool,
    /// Physical devices behind the device (v9 on; empty before).
    pub vdevs: Vec<i32>,
    /// Largest transfer (v9 on; None before: NCCL's 1 GiB cap of int sizes applies).
    pub max_p2p_bytes: Option<usize>,
    pub device_type: i32,
    pub max_multi_request: Option<i32>,
}

/// The table plus the plugin's name, with one method per call.
pub(crate) struct Api {
    pub table: Table,
    pub name: String,
}

/// A member the plugin must provide: its function pointer, or an error naming it.
macro_rules! need {
    ($api:expr, $t:expr, $f:ident) => {
        $t.$f.ok_or_else(|| {
            Error::internal(format!(
                "NET/Plugin {}: its table has no {}",
                $api.name,
                stringify!($f)
            ))
        })?
    };
}

/// A member whose type is the same in every version.
macro_rules! shared {
    ($api:expr, $f:ident) => {
        match $api.table {
            Table::V8(t) => need!($api, t, $f),
            Table::V9(t) => need!($api, t, $f),
            Table::V10(t) => need!($api, t, $f),
            Table::V11(t) => need!($api, t, $f),
        }
    };
}

fn text(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: the plugin's strings are NUL-terminated (the ABI's contract).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

impl Api {
    pub(crate) fn new(table: Table) -> Api {
        let name = text(match table {
            Table::V8(t) => t.name,
            Table::V9(t) => t.name,
            Table::V10(t) => t.name,
            Table::V11(t) => t.name,
        });
        Api {
            table,
            name: if name.is_empty() {
                "unnamed".into()
            } else {
                name
            },
        }
    }

    /// `Ok` for 0, else an error of the same ncclResult_t naming the call.
    fn check(&self, call: &str, rc: c_int) -> Result<()> {
        if rc == 0 {
            return Ok(());
        }
        let code = match rc {
            1 => NcclResult::UnhandledCudaError,
            2 => NcclResult::SystemError,
            4 => NcclResult::InvalidArgument,
            5 => NcclResult::InvalidUsage,
            6 => NcclResult::RemoteError,
            _ => NcclResult::InternalError,
        };
        Err(Error::new(
            code,
            format!("NET/Plugin {}: {call} returned {rc}", self.name),
        ))
    }

    /// The members nccl-rs calls, all present? (Checked before anything is called.)
    pub(crate) fn check_members(&self) -> Result<()> {
        let _ = shared!(self, devices);
        let _ = shared!(self, accept);
        let _ = shared!(self, reg_mr);
        let _ = shared!(self, dereg_mr);
        let _ = shared!(self, test);
        let _ = shared!(self, close_send);
        let _ = shared!(self, close_recv);
        let _ = shared!(self, close_listen);
        macro_rules! varying {
            ($t:expr) => {{
                let _ = need!(self, $t, init);
                let _ = need!(self, $t, get_properties);
                let _ = need!(self, $t, listen);
                let _ = need!(self, $t, connect);
                let _ = need!(self, $t, isend);
                let _ = need!(self, $t, irecv);
            }};
        }
        match self.table {
            Table::V8(t) => varying!(t),
            Table::V9(t) => varying!(t),
            Table::V10(t) => varying!(t),
            Table::V11(t) => {
                varying!(t);
                let _ = need!(self, t, finalize);
            }
        }
        Ok(())
    }

    /// v8 to v10: the process-wide init. (v11 inits per communicator: [`Api::init_comm`].)
    pub(crate) fn init_global(&self) -> Result<()> {
        // SAFETY: the callbacks are valid for the life of the process.
        let rc = unsafe {
            match self.table {
                Table::V8(t) => need!(self, t, init)(logger_fn()),
                Table::V9(t) => need!(self, t, init)(logger_fn()),
                Table::V10(t) => need!(self, t, init)(logger_fn(), profiler),
                Table::V11(_) => return Err(Error::internal("v11 plugins init per communicator")),
            }
        };
        self.check("init", rc)
    }

    /// v11: a communicator's init; returns its context.
    pub(crate) fn init_comm(&self, comm_id: u64, config: CommConfig) -> Result<P> {
        let Table::V11(t) = self.table else {
            return Err(Error::internal("only v11 plugins init per communicator"));
        };
        let mut ctx: P = null_mut();
        let mut config = config;
        // SAFETY: `ctx` and `config` are live for the call; the callbacks for the process.
        let rc =
            unsafe { need!(self, t, init)(&mut ctx, comm_id, &mut config, logger_fn(), profiler) };
        self.check("init", rc)?;
        Ok(ctx)
    }

    /// v11: hands the communicator's attributes to the plugin, if it takes them.
    pub(crate) fn set_net_attr(&self, ctx: P, attr: NetAttr) -> Result<()> {
        if let Table::V11(t) = self.table {
            if let Some(f) = t.set_net_attr {
                let mut attr = attr;
                // SAFETY: `ctx` came from this plugin's init; `attr` lives for the call.
                let rc = unsafe { f(ctx, &mut attr) };
                self.check("setNetAttr", rc)?;
            }
        }
        Ok(())
    }

    /// v11: releases a communicator's context.
    pub(crate) fn finalize(&self, ctx: P) -> Result<()> {
        if let Table::V11(t) = self.table {
            // SAFETY: `ctx` came from this plugin's init and is finalized once.
            let rc = unsafe { need!(self, t, finalize)(ctx) };
            self.check("finalize", rc)?;
        }
        Ok(())
    }

    pub(crate) fn devices(&self) -> Result<usize> {
        let mut n: c_int = 0;
        // SAFETY: `n` is live for the call.
        let rc = unsafe { shared!(self, devices)(&mut n) };
        self.check("devices", rc)?;
        Ok(n.max(0) as usize)
    }

    /// Device `dev`'s properties, in the internal form and the rest.
    pub(crate) fn properties(&self, dev: usize) -> Result<(Properties, Extra)> {
        let d = dev as c_int;
        let v9 = |p: &PropsV9, multi: Option<i32>| {
            let n = (p.v_props.ndevs.clamp(0, 4)) as usize;
            (
                Properties {
                    name: text(p.name),
                    pci_path: text(p.pci_path),
                    guid: p.guid,
                    ptr_support: p.ptr_support as u32,
                    speed_mbps: p.speed.max(0) as u32,
                    latency_us: p.latency,
                    port: p.port,
                    max_comms: p.max_comms.max(0) as usize,
                    max_recvs: p.max_recvs.max(1) as usize,
                    force_flush: p.force_flush != 0,
                },
                Extra {
                    reg_is_global: p.reg_is_global != 0,
                    force_flush: p.force_flush != 0,
                    vdevs: p.v_props.devs[..n].to_vec(),
                    max_p2p_bytes: Some(p.max_p2p_bytes),
                    device_type: p.net_device_type,
                    max_multi_request: multi,
                },
            )
        };
        match self.table {
            Table::V8(t) => {
                // SAFETY: all-zero is a valid PropsV8 (null pointers, zero numbers).
                let mut p: PropsV8 = unsafe { std::mem::zeroed() };
                // SAFETY: `p` has the v8 layout and lives for the call.
                let rc = unsafe { need!(self, t, get_properties)(d, &mut p) };
                self.check("getProperties", rc)?;
                Ok((
                    Properties {
                        name: text(p.name),
                        pci_path: text(p.pci_path),
                        guid: p.guid,
                        ptr_support: p.ptr_support as u32,
                        speed_mbps: p.speed.max(0) as u32,
                        latency_us: p.latency,
                        port: p.port,
                        max_comms: p.max_comms.max(0) as usize,
                        max_recvs: p.max_recvs.max(1) as usize,
                        force_flush: false,
                    },
                    Extra {
                        reg_is_global: p.reg_is_global != 0,
                        device_type: p.net_device_type,
                        ..Extra::default()
                    },
                ))
            }
            Table::V9(_) | Table::V10(_) => {
                // v10's properties have v9's layout.
                let get = match self.table {
                    Table::V9(t) => need!(self, t, get_properties),
                    Table::V10(t) => need!(self, t, get_properties),
                    _ => return Err(Error::internal("unreachable table version")),
                };
                // SAFETY: all-zero is a valid PropsV9.
                let mut p: PropsV9 = unsafe { std::mem::zeroed() };
                // SAFETY: `p` has the v9/v10 layout and lives for the call.
                let rc = unsafe { get(d, &mut p) };
                self.check("getProperties", rc)?;
                Ok(v9(&p, None))
            }
            Table::V11(t) => {
                // SAFETY: all-zero is a valid PropsV11.
                let mut p: PropsV11 = unsafe { std::mem::zeroed() };
                // SAFETY: `p` has the v11 layout and lives for the call.
                let rc = unsafe { need!(self, t, get_properties)(d, &mut p) };
                self.check("getProperties", rc)?;
                Ok(v9(&p.v9, Some(p.max_multi_request_size)))
            }
        }
    }

    /// Starts listening on `dev`: the handle to publish and the listen comm.
    pub(crate) fn listen(&self, ctx: P, dev: usize) -> Result<(Box<Handle>, P)> {
        let mut handle = Box::new([0u8; crate::net::HANDLE_BYTES]);
        let h = handle.as_mut_ptr() as P;
        let mut comm: P = null_mut();
        let d = dev as c_int;
        // SAFETY: `h` points at HANDLE_BYTES writable bytes (NCCL_NET_HANDLE_MAXSIZE) and
        // `comm` is live for the call; `ctx` is this communicator's (v11) or unused.
        let rc = unsafe {
            match self.table {
                Table::V8(t) => need!(self, t, listen)(d, h, &mut comm),
                Table::V9(t) => need!(self, t, listen)(d, h, &mut comm),
                Table::V10(t) => need!(self, t, listen)(d, h, &mut comm),
                Table::V11(t) => need!(self, t, listen)(ctx, d, h, &mut comm),
            }
        };
        self.check("listen", rc)?;
        if comm.is_null() {
            return Err(Error::internal(format!(
                "NET/Plugin {}: listen returned no listen comm",
                self.name
            )));
        }
        Ok((handle, comm))
    }

    /// One connect attempt: `Ok(None)` until the plugin has the send comm.
    ///
    /// # Safety
    /// `handle` points at the same HANDLE_BYTES bytes for every attempt of one connection (a
    /// plugin may keep state in it); `ctx` is this communicator's context (v11).
    pub(crate) unsafe fn connect(
        &self,
        ctx: P,
        dev: usize,
        config: CommConfig,
        handle: *mut u8,
    ) -> Result<Option<P>> {
        let mut comm: P = null_mut();
        let mut dev_comm: *mut super::abi::DeviceHandle = null_mut();
        let mut config = config;
        let (d, h) = (dev as c_int, handle as P);
        // SAFETY: the caller's contract for `handle` and `ctx`; the out-pointers and `config`
        // live for the call.
        let rc = unsafe {
            match self.table {
                Table::V8(t) => need!(self, t, connect)(d, h, &mut comm, &mut dev_comm),
                Table::V9(t) => need!(self, t, connect)(d, h, &mut comm, &mut dev_comm),
                Table::V10(t) => {
                    need!(self, t, connect)(d, &mut config, h, &mut comm, &mut dev_comm)
                }
                Table::V11(t) => need!(self, t, connect)(ctx, d, h, &mut comm, &mut dev_comm),
            }
        };
        self.check("connect", rc)?;
        Ok((!comm.is_null()).then_some(comm))
    }

    /// One accept attempt: `Ok(None)` until a peer connected.
    ///
    /// # Safety
    /// `listen` is a live listen comm of this plugin.
    pub(crate) unsafe fn accept(&self, listen: P) -> Result<Option<P>> {
        let mut comm: P = null_mut();
        let mut dev_comm: *mut super::abi::DeviceHandle = null_mut();
        // SAFETY: the caller's contract; the out-pointers live for the call.
        let rc = unsafe { shared!(self, accept)(listen, &mut comm, &mut dev_comm) };
        self.check("accept", rc)?;
        Ok((!comm.is_null()).then_some(comm))
    }

    /// # Safety
    /// `comm` is a live send or receive comm; the region stays valid until deregistered.
    pub(crate) unsafe fn reg_mr(&self, comm: P, ptr: *mut u8, len: usize, kind: u32) -> Result<P> {
        let mut mh: P = null_mut();
        // SAFETY: the caller's contract; `mh` lives for the call.
        let rc = unsafe { shared!(self, reg_mr)(comm, ptr as P, len, kind as c_int, &mut mh) };
        self.check("regMr", rc)?;
        Ok(mh)
    }

    /// Whether the table has regMrDmaBuf.
    pub(crate) fn has_reg_mr_dma_buf(&self) -> bool {
        match self.table {
            Table::V8(t) => t.reg_mr_dma_buf.is_some(),
            Table::V9(t) => t.reg_mr_dma_buf.is_some(),
            Table::V10(t) => t.reg_mr_dma_buf.is_some(),
            Table::V11(t) => t.reg_mr_dma_buf.is_some(),
        }
    }

    /// regMrDmaBuf: `len` bytes at `ptr` through the dmabuf `fd`, `offset` bytes into it.
    ///
    /// # Safety
    /// As [`Api::reg_mr`]; `fd` is an open dmabuf for the range.
    pub(crate) unsafe fn reg_mr_dma_buf(
        &self,
        comm: P,
        ptr: *mut u8,
        len: usize,
        kind: u32,
        offset: u64,
        fd: c_int,
    ) -> Result<P> {
        let mut mh: P = null_mut();
        // SAFETY: the caller's contract; `mh` lives for the call.
        let rc = unsafe {
            shared!(self, reg_mr_dma_buf)(comm, ptr as P, len, kind as c_int, offset, fd, &mut mh)
        };
        self.check("regMrDmaBuf", rc)?;
        Ok(mh)
    }

    /// # Safety
    /// `comm` is the live comm `mh` was registered with.
    pub(crate) unsafe fn dereg_mr(&self, comm: P, mh: P) -> Result<()> {
        // SAFETY: the caller's contract.
        let rc = unsafe { shared!(self, dereg_mr)(comm, mh) };
        self.check("deregMr", rc)
    }

    /// `Ok(None)`: the plugin cannot take the send now.
    ///
    /// # Safety
    /// `comm` is a live send comm; `data..data+len` lies in the region registered as `mh`.
    pub(crate) unsafe fn isend(
        &self,
        comm: P,
        data: *mut u8,
        len: usize,
        tag: u32,
        mh: P,
    ) -> Result<Option<P>> {
        let mut req: P = null_mut();
        let (d, tag) = (data as P, tag as c_int);
        // SAFETY: the caller's contract; `req` lives for the call; no profiler handle.
        let rc = unsafe {
            match self.table {
                Table::V8(t) => {
                    let n = c_int::try_from(len).map_err(|_| self.too_big(len))?;
                    need!(self, t, isend)(comm, d, n, tag, mh, &mut req)
                }
                Table::V9(t) => need!(self, t, isend)(comm, d, len, tag, mh, &mut req),
                Table::V10(t) => need!(self, t, isend)(comm, d, len, tag, mh, null_mut(), &mut req),
                Table::V11(t) => need!(self, t, isend)(comm, d, len, tag, mh, null_mut(), &mut req),
            }
        };
        self.check("isend", rc)?;
        Ok((!req.is_null()).then_some(req))
    }

    fn too_big(&self, len: usize) -> Error {
        Error::invalid_argument(format!(
            "NET/Plugin {}: a {len}-byte transfer does not fit a v8 plugin's int size",
            self.name
        ))
    }

    /// A grouped receive of `data.len()` buffers. `Ok(None)`: not now.
    ///
    /// # Safety
    /// `comm` is a live receive comm; each buffer lies in the region registered as its handle.
    pub(crate) unsafe fn irecv(
        &self,
        comm: P,
        data: &mut [P],
        sizes: &[usize],
        tags: &mut [c_int],
        mhs: &mut [P],
    ) -> Result<Option<P>> {
        let n = data.len();
        if sizes.len() != n || tags.len() != n || mhs.len() != n {
            return Err(Error::internal("irecv arrays of different lengths"));
        }
        let mut req: P = null_mut();
        let (d, t_, m) = (data.as_mut_ptr(), tags.as_mut_ptr(), mhs.as_mut_ptr());
        let nn = n as c_int;
        // SAFETY: the caller's contract; every array holds n entries and lives for the call
        // (the plugin copies what it keeps); no profiler handles.
        let rc = unsafe {
            match self.table {
                Table::V8(t) => {
                    let mut s: Vec<c_int> = sizes
                        .iter()
                        .map(|&x| c_int::try_from(x).map_err(|_| self.too_big(x)))
                        .collect::<Result<_>>()?;
                    need!(self, t, irecv)(comm, nn, d, s.as_mut_ptr(), t_, m, &mut req)
                }
                Table::V9(t) => {
                    let mut s = sizes.to_vec();
                    need!(self, t, irecv)(comm, nn, d, s.as_mut_ptr(), t_, m, &mut req)
                }
                Table::V10(t) => {
                    let mut s = sizes.to_vec();
                    let mut ph = vec![null_mut(); n];
                    need!(self, t, irecv)(
                        comm,
                        nn,
                        d,
                        s.as_mut_ptr(),
                        t_,
                        m,
                        ph.as_mut_ptr(),
                        &mut req,
                    )
                }
                Table::V11(t) => {
                    let mut s = sizes.to_vec();
                    let mut ph = vec![null_mut(); n];
                    need!(self, t, irecv)(
                        comm,
                        nn,
                        d,
                        s.as_mut_ptr(),
                        t_,
                        m,
                        ph.as_mut_ptr(),
                        &mut req,
                    )
                }
            }
        };
        self.check("irecv", rc)?;
        Ok((!req.is_null()).then_some(req))
    }

    /// A flush of received GPU memory. `Ok(None)`: the plugin has no iflush or needed none.
    ///
    /// # Safety
    /// As [`Api::irecv`].
    pub(crate) unsafe fn iflush(
        &self,
        comm: P,
        data: &mut [P],
        sizes: &[usize],
        mhs: &mut [P],
    ) -> Result<Option<P>> {
        let f = match self.table {
            Table::V8(t) => t.iflush,
            Table::V9(t) => t.iflush,
            Table::V10(t) => t.iflush,
            Table::V11(t) => t.iflush,
        };
        let Some(f) = f else { return Ok(None) };
        let mut s: Vec<c_int> = sizes
            .iter()
            .map(|&x| c_int::try_from(x).map_err(|_| self.too_big(x)))
            .collect::<Result<_>>()?;
        let mut req: P = null_mut();
        // SAFETY: the caller's contract; arrays of data.len() entries live for the call.
        let rc = unsafe {
            f(
                comm,
                data.len() as c_int,
                data.as_mut_ptr(),
                s.as_mut_ptr(),
                mhs.as_mut_ptr(),
                &mut req,
            )
        };
        self.check("iflush", rc)?;
        Ok((!req.is_null()).then_some(req))
    }

    /// Tests a request; on completion `sizes` holds its sizes (one per grouped buffer).
    ///
    /// # Safety
    /// `req` is a live request of this plugin; `sizes` has room for its buffer count.
    pub(crate) unsafe fn test(&self, req: P, sizes: &mut [c_int]) -> Result<bool> {
        let mut done: c_int = 0;
        // SAFETY: the caller's contract.
        let rc = unsafe { shared!(self, test)(req, &mut done, sizes.as_mut_ptr()) };
        self.check("test", rc)?;
        Ok(done != 0)
    }

    /// # Safety
    /// `comm` is a live comm of the kind named, closed once.
    pub(crate) unsafe fn close(&self, kind: CloseKind, comm: P) -> Result<()> {
        // SAFETY: the caller's contract.
        let rc = unsafe {
            match kind {
                CloseKind::Send => shared!(self, close_send)(comm),
                CloseKind::Recv => shared!(self, close_recv)(comm),
                CloseKind::Listen => shared!(self, close_listen)(comm),
            }
        };
        self.check(
            match kind {
                CloseKind::Send => "closeSend",
                CloseKind::Recv => "closeRecv",
                CloseKind::Listen => "closeListen",
            },
            rc,
        )
    }
}

#[derive(Clone, Copy, Debug)]
pub(crate) enum CloseKind {
    Send,
    Recv,
    Listen,
}
