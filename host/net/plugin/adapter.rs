//! A plugin as the internal network interface: [`PluginNet`] implements [`Net`], its
//! listeners, connects and comms implement [`Listener`], [`Connecting`], [`SendComm`] and
//! [`RecvComm`] over [`Api`]. Regions and requests are named by indices into per-comm maps, so
//! nothing the proxy hands back is ever taken as a plugin pointer unchecked.

use super::abi::CommConfig;
use super::api::{Api, CloseKind, Extra, P};
use crate::error::{Error, Result};
use crate::net::{
    Connecting, Handle, Listener, Mr, Net, Properties, RecvBuf, RecvComm, Request, SendComm,
};
use std::collections::HashMap;
use std::ffi::c_int;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::{Arc, Mutex};

/// One initialised use of a plugin: the process-wide one of a v8-v10 plugin, or a v11
/// communicator's (its context is finalized when the last comm made through it closes).
pub(crate) struct Instance {
    pub api: Arc<Api>,
    /// v11's context (null before v11).
    ctx: P,
    per_comm: bool,
    devs: Vec<(Properties, Extra)>,
    /// Live listen/send/receive comms per device, against maxComms.
    live: Mutex<Vec<usize>>,
}

// SAFETY: the context and the plugin's functions are used from the init and proxy threads,
// as NCCL uses them; plugins are written for that. Mutable state here is behind the mutex.
unsafe impl Send for Instance {}
// SAFETY: as above.
unsafe impl Sync for Instance {}

impl Instance {
    /// Reads the devices of `api` (already initialised; `ctx` is v11's context, `per_comm`
    /// says whether it must be finalized). A plugin without devices is refused.
    pub(crate) fn new(api: Arc<Api>, ctx: P, per_comm: bool) -> Result<Self> {
        let devs = match read_devices(&api) {
            Ok(d) => d,
            Err(e) => {
                if per_comm {
                    if let Err(f) = api.finalize(ctx) {
                        log::warn!("{}", f.message);
                    }
                }
                return Err(e);
            }
        };
        Ok(Instance {
            api,
            ctx,
            per_comm,
            live: Mutex::new(vec![0; devs.len()]),
            devs,
        })
    }

    pub(crate) fn devices(&self) -> &[(Properties, Extra)] {
        &self.devs
    }

    fn dev(&self, dev: usize) -> Result<&(Properties, Extra)> {
        self.devs.get(dev).ok_or_else(|| {
            Error::invalid_argument(format!(
                "NET/Plugin {}: device {dev} does not exist ({} devices)",
                self.api.name,
                self.devs.len()
            ))
        })
    }

    /// Counts one more comm on `dev`, refusing one above the device's maxComms.
    fn take(&self, dev: usize) -> Result<()> {
        let max = self.dev(dev)?.0.max_comms;
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        let n = live
            .get_mut(dev)
            .ok_or_else(|| Error::internal("comm count of a device that does not exist"))?;
        if max > 0 && *n >= max {
            return Err(Error::system(format!(
                "NET/Plugin {}: device {dev} already has {n} comms, its maxComms",
                self.api.name
            )));
        }
        *n += 1;
        Ok(())
    }

    fn give(&self, dev: usize) {
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = live.get_mut(dev) {
            *n = n.saturating_sub(1);
        }
    }
}

/// Every device's properties; refuses a plugin without devices or with device-side offload.
fn read_devices(api: &Api) -> Result<Vec<(Properties, Extra)>> {
    let n = api.devices()?;
    if n == 0 {
        return Err(Error::system(format!(
            "NET/Plugin {}: no devices",
            api.name
        )));
    }
    let devs = (0..n)
        .map(|d| api.properties(d))
        .collect::<Result<Vec<_>>>()?;
    if let Some((d, (_, x))) = devs
        .iter()
        .enumerate()
        .find(|(_, (_, x))| x.device_type != 0)
    {
        return Err(Error::system(format!(
            "NET/Plugin {}: device {d} asks for device-side offload (type {}); only host networks are driven",
            api.name, x.device_type
        )));
    }
    Ok(devs)
}

impl Drop for Instance {
    fn drop(&mut self) {
        if self.per_comm {
            if let Err(e) = self.api.finalize(self.ctx) {
                log::warn!("{}", e.message);
            } else {
                log::info!(
                    "NET/Plugin {}: finalized a communicator's context",
                    self.api.name
                );
            }
        }
    }
}

/// A plugin network for one communicator (v11) or for all (v8-v10).
pub(crate) struct PluginNet {
    pub inst: Arc<Instance>,
    /// The communicator's network config (v10 gives it to connect).
    pub config: CommConfig,
}

impl Net for PluginNet {
    fn name(&self) -> &str {
        &self.inst.api.name
    }

    fn ndevs(&self) -> usize {
        self.inst.devs.len()
    }

    fn properties(&self, dev: usize) -> Result<Properties> {
        Ok(self.inst.dev(dev)?.0.clone())
    }

    fn listen(&self, dev: usize) -> Result<(Handle, Box<dyn Listener>)> {
        self.inst.take(dev)?;
        match self.inst.api.listen(self.inst.ctx, dev) {
            Ok((handle, comm)) => Ok((
                *handle,
                Box::new(PluginListener {
                    inst: self.inst.clone(),
                    dev,
                    comm,
                }),
            )),
            Err(e) => {
                self.inst.give(dev);
                Err(e)
            }
        }
    }

    fn connect(&self, dev: usize, handle: &Handle) -> Result<Box<dyn Connecting>> {
        self.inst.dev(dev)?;
        Ok(Box::new(PluginConnecting {
            inst: self.inst.clone(),
            dev,
            config: self.config,
            handle: Box::new(*handle),
        }))
    }

    fn has_dmabuf_reg(&self) -> bool {
        self.inst.api.has_reg_mr_dma_buf()
    }
}

/// A listen comm; closed when dropped (after its accept, as NCCL does).
struct PluginListener {
    inst: Arc<Instance>,
    dev: usize,
    comm: P,
}

// SAFETY: the listen comm is used by one thread at a time (it is owned); see Instance.
unsafe impl Send for PluginListener {}

impl Listener for PluginListener {
    fn accept(&mut self) -> Result<Option<Box<dyn RecvComm>>> {
        // SAFETY: `comm` is this listener's live listen comm.
        let got = unsafe { self.inst.api.accept(self.comm)? };
        let Some(comm) = got else { return Ok(None) };
        self.inst.take(self.dev)?;
        Ok(Some(Box::new(PluginRecvComm {
            ep: Endpoint::new(self.inst.clone(), self.dev, comm, CloseKind::Recv),
        })))
    }
}

impl Drop for PluginListener {
    fn drop(&mut self) {
        // SAFETY: the live listen comm, closed once.
        if let Err(e) = unsafe { self.inst.api.close(CloseKind::Listen, self.comm) } {
            log::warn!("{}", e.message);
        }
        self.inst.give(self.dev);
    }
}

/// A connect in progress: the handle stays at one address for every attempt (plugins may keep
/// their connection stage in it).
struct PluginConnecting {
    inst: Arc<Instance>,
    dev: usize,
    config: CommConfig,
    handle: Box<Handle>,
}

impl Connecting for PluginConnecting {
    fn poll(&mut self) -> Result<Option<Box<dyn SendComm>>> {
        // SAFETY: the handle is this connection's, at a stable address; ctx is the instance's.
        let got = unsafe {
            self.inst.api.connect(
                self.inst.ctx,
                self.dev,
                self.config,
                self.handle.as_mut_ptr(),
            )?
        };
        let Some(comm) = got else { return Ok(None) };
        self.inst.take(self.dev)?;
        Ok(Some(Box::new(PluginSendComm {
            ep: Endpoint::new(self.inst.clone(), self.dev, comm, CloseKind::Send),
        })))
    }
}

/// A registered region: where it is and the plugin's handle.
#[derive(Clone, Copy)]
struct Region {
    ptr: *mut u8,
    len: usize,
    mh: P,
}

/// What a send or receive comm shares: the plugin comm, its regions and its requests.
struct Endpoint {
    inst: Arc<Instance>,
    dev: usize,
    comm: P,
    kind: CloseKind,
    regions: HashMap<u64, Region>,
    /// Request index -> (plugin request, buffers it covers).
    requests: HashMap<u64, (P, usize)>,
    next: u64,
}

impl Endpoint {
    fn new(inst: Arc<Instance>, dev: usize, comm: P, kind: CloseKind) -> Endpoint {
        Endpoint {
            inst,
            dev,
            comm,
            kind,
            regions: HashMap::new(),
            requests: HashMap::new(),
            next: 1,
        }
    }

    fn id(&mut self) -> u64 {
        let id = self.next;
        self.next += 1;
        id
    }

    /// # Safety
    /// As [`SendComm::reg_mr`].
    unsafe fn reg_mr(&mut self, ptr: *mut u8, len: usize, kind: u32) -> Result<Mr> {
        // SAFETY: the caller keeps the region valid until dereg_mr; `comm` is live.
        let mh = unsafe { self.inst.api.reg_mr(self.comm, ptr, len, kind)? };
        let id = self.id();
        self.regions.insert(id, Region { ptr, len, mh });
        Ok(Mr(id))
    }

    /// # Safety
    /// As [`SendComm::reg_mr_dmabuf`].
    unsafe fn reg_mr_dmabuf(
        &mut self,
        ptr: *mut u8,
        len: usize,
        kind: u32,
        offset: u64,
        fd: BorrowedFd<'_>,
    ) -> Result<Mr> {
        // SAFETY: the caller keeps the region valid until dereg_mr; `comm` is live; `fd` is
        // open for the call.
        let mh = unsafe {
            self.inst
                .api
                .reg_mr_dma_buf(self.comm, ptr, len, kind, offset, fd.as_raw_fd())?
        };
        let id = self.id();
        self.regions.insert(id, Region { ptr, len, mh });
        Ok(Mr(id))
    }

    fn dereg_mr(&mut self, mr: Mr) -> Result<()> {
        let r = self
            .regions
            .remove(&mr.0)
            .ok_or_else(|| Error::internal("deregistering a region that is not registered"))?;
        // SAFETY: `mh` was registered on this live comm and is deregistered once.
        unsafe { self.inst.api.dereg_mr(self.comm, r.mh) }
    }

    /// The address of `offset..offset + len` of `mr`, checked.
    fn at(&self, mr: Mr, offset: usize, len: usize) -> Result<(*mut u8, P)> {
        let r = self
            .regions
            .get(&mr.0)
            .ok_or_else(|| Error::internal("a transfer names a region that is not registered"))?;
        if offset.checked_add(len).is_none_or(|end| end > r.len) {
            return Err(Error::internal(format!(
                "a transfer of {len} bytes at {offset} leaves its {}-byte region",
                r.len
            )));
        }
        // SAFETY: offset + len <= r.len (checked), so the pointer stays inside the region.
        Ok((unsafe { r.ptr.add(offset) }, r.mh))
    }

    fn track(&mut self, req: Option<P>, n: usize) -> Option<Request> {
        let req = req?;
        let id = self.id();
        self.requests.insert(id, (req, n));
        Some(Request(id))
    }

    /// `Some(sizes)` once `req` completed (and forgets it).
    fn test(&mut self, req: Request) -> Result<Option<Vec<usize>>> {
        let &(p, n) = self
            .requests
            .get(&req.0)
            .ok_or_else(|| Error::internal("testing a request that is not in flight"))?;
        let mut sizes: Vec<c_int> = vec![0; n.max(1)];
        // SAFETY: `p` is a live request of this comm; `sizes` has room for its n buffers.
        let done = unsafe { self.inst.api.test(p, &mut sizes)? };
        if !done {
            return Ok(None);
        }
        self.requests.remove(&req.0);
        sizes.truncate(n);
        Ok(Some(sizes.into_iter().map(|s| s.max(0) as usize).collect()))
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        for (_, r) in self.regions.drain() {
            // SAFETY: registered on this live comm, deregistered once.
            if let Err(e) = unsafe { self.inst.api.dereg_mr(self.comm, r.mh) } {
                log::debug!("{}", e.message);
            }
        }
        // SAFETY: the live comm, closed once; outstanding requests die with it, as in NCCL.
        if let Err(e) = unsafe { self.inst.api.close(self.kind, self.comm) } {
            log::warn!("{}", e.message);
        }
        self.inst.give(self.dev);
    }
}

// SAFETY: an endpoint is owned by one thread at a time (the proxy's); the region pointers are
// only handed to the plugin, which was given them at registration.
unsafe impl Send for Endpoint {}

/// The sending end of a plugin connection.
pub(crate) struct PluginSendComm {
    ep: Endpoint,
}

/// The receiving end of a plugin connection.
pub(crate) struct PluginRecvComm {
    ep: Endpoint,
}

impl SendComm for PluginSendComm {
    unsafe fn reg_mr(&mut self, ptr: *mut u8, len: usize, kind: u32) -> Result<Mr> {
        // SAFETY: forwarded contract.
        unsafe { self.ep.reg_mr(ptr, len, kind) }
    }
    unsafe fn reg_mr_dmabuf(
        &mut self,
        ptr: *mut u8,
        len: usize,
        kind: u32,
        offset: u64,
        fd: BorrowedFd<'_>,
    ) -> Result<Mr> {
        // SAFETY: forwarded contract.
        unsafe { self.ep.reg_mr_dmabuf(ptr, len, kind, offset, fd) }
    }
    fn dereg_mr(&mut self, mr: Mr) -> Result<()> {
        self.ep.dereg_mr(mr)
    }
    fn isend(&mut self, mr: Mr, offset: usize, len: usize, tag: u32) -> Result<Option<Request>> {
        let (ptr, mh) = self.ep.at(mr, offset, len)?;
        // SAFETY: the range lies in the region registered as `mh` on this live comm.
        let req = unsafe { self.ep.inst.api.isend(self.ep.comm, ptr, len, tag, mh)? };
        Ok(self.ep.track(req, 1))
    }
    fn test(&mut self, req: Request) -> Result<Option<usize>> {
        Ok(self.ep.test(req)?.map(|s| s.first().copied().unwrap_or(0)))
    }
}

impl RecvComm for PluginRecvComm {
    unsafe fn reg_mr(&mut self, ptr: *mut u8, len: usize, kind: u32) -> Result<Mr> {
        // SAFETY: forwarded contract.
        unsafe { self.ep.reg_mr(ptr, len, kind) }
    }
    unsafe fn reg_mr_dmabuf(
        &mut self,
        ptr: *mut u8,
        len: usize,
        kind: u32,
        offset: u64,
        fd: BorrowedFd<'_>,
    ) -> Result<Mr> {
        // SAFETY: forwarded contract.
        unsafe { self.ep.reg_mr_dmabuf(ptr, len, kind, offset, fd) }
    }
    fn dereg_mr(&mut self, mr: Mr) -> Result<()> {
        self.ep.dereg_mr(mr)
    }
    fn irecv(&mut self, bufs: &[RecvBuf]) -> Result<Option<Request>> {
        let max = self.ep.inst.dev(self.ep.dev)?.0.max_recvs;
        if bufs.is_empty() || bufs.len() > max {
            return Err(Error::invalid_argument(format!(
                "NET/Plugin {}: a receive of {} buffers (maxRecvs is {max})",
                self.ep.inst.api.name,
                bufs.len()
            )));
        }
        let mut data = Vec::with_capacity(bufs.len());
        let mut mhs = Vec::with_capacity(bufs.len());
        for b in bufs {
            let (ptr, mh) = self.ep.at(b.mr, b.offset, b.max_len)?;
            data.push(ptr as P);
            mhs.push(mh);
        }
        let sizes: Vec<usize> = bufs.iter().map(|b| b.max_len).collect();
        let mut tags: Vec<c_int> = bufs.iter().map(|b| b.tag as c_int).collect();
        // SAFETY: every buffer lies in its registered region on this live comm.
        let req = unsafe {
            self.ep
                .inst
                .api
                .irecv(self.ep.comm, &mut data, &sizes, &mut tags, &mut mhs)?
        };
        Ok(self.ep.track(req, bufs.len()))
    }
    fn test(&mut self, req: Request) -> Result<Option<Vec<usize>>> {
        self.ep.test(req)
    }
    fn iflush(&mut self, bufs: &[RecvBuf]) -> Result<Option<Request>> {
        let mut data = Vec::with_capacity(bufs.len());
        let mut mhs = Vec::with_capacity(bufs.len());
        for b in bufs {
            let (ptr, mh) = self.ep.at(b.mr, b.offset, b.max_len)?;
            data.push(ptr as P);
            mhs.push(mh);
        }
        let sizes: Vec<usize> = bufs.iter().map(|b| b.max_len).collect();
        // SAFETY: every buffer lies in its registered region on this live comm.
        let req = unsafe {
            self.ep
                .inst
                .api
                .iflush(self.ep.comm, &mut data, &sizes, &mut mhs)?
        };
        Ok(self.ep.track(req, bufs.len()))
    }
}
