//! The network interface every inter-node connection goes through, shaped like NCCL's net plugin
//! ABI (`ncclNet_vN`): devices with properties, non-blocking listen / connect / accept over a
//! handle of at most [`HANDLE_BYTES`] bytes, memory registration, and asynchronous isend / irecv
//! completed by `test`. The built-in socket backend (`socket`) implements it; NCCL's network
//! plugins (`libnccl-net*.so`, NCCL_NET_PLUGIN) are adapted to it in `plugin`, which also chooses
//! each communicator's network (NCCL_NET). The proxy threads (`crate::proxy`) are its only users
//! on the data path; the net transport (`crate::transport::net`) makes its connections.
//!
//! Memory is named by registered regions, not raw pointers: [`SendComm::reg_mr`] takes the
//! region once (unsafe: the caller keeps it alive until `dereg_mr`), and every transfer names a
//! region and a byte range inside it, which the backend checks.

use crate::error::Result;
use std::sync::Arc;

pub(crate) mod gdr;
pub(crate) mod nics;
pub(crate) mod plugin;
pub mod socket;

/// The network every inter-node connection of this process uses: the built-in socket network,
/// made on first use (interface choice from `NCCL_SOCKET_IFNAME` / `NCCL_SOCKET_FAMILY`). A
/// failure is kept and returned to every later caller.
pub(crate) fn global() -> Result<Arc<dyn Net>> {
    static NET: std::sync::OnceLock<std::result::Result<Arc<dyn Net>, crate::error::Error>> =
        std::sync::OnceLock::new();
    NET.get_or_init(|| {
        let n = socket::SocketNet::new()?;
        for d in 0..n.ndevs() {
            if let Ok(p) = n.properties(d) {
                log::info!(
                    "NET/Socket : device {d}: {} ({} Mb/s){}",
                    p.name,
                    p.speed_mbps,
                    if p.pci_path.is_empty() {
                        String::new()
                    } else {
                        format!(" at {}", p.pci_path)
                    }
                );
            }
        }
        Ok(Arc::new(n) as Arc<dyn Net>)
    })
    .clone()
}

/// Bytes of a connection handle, as NCCL_NET_HANDLE_MAXSIZE.
pub const HANDLE_BYTES: usize = 128;
/// What a listener publishes and a connector uses to reach it.
pub type Handle = [u8; HANDLE_BYTES];

/// Pointer kinds a network can read and write (NCCL_PTR_HOST, NCCL_PTR_CUDA, NCCL_PTR_DMABUF).
pub const PTR_HOST: u32 = 1;
pub const PTR_CUDA: u32 = 2;
pub const PTR_DMABUF: u32 = 4;

/// A network device's properties (ncclNetProperties).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Properties {
    pub name: String,
    /// sysfs PCI path of the device, for the topology ("" when unknown).
    pub pci_path: String,
    pub guid: u64,
    /// `PTR_*` bits.
    pub ptr_support: u32,
    /// Link speed in Mbit/s.
    pub speed_mbps: u32,
    /// Latency in microseconds.
    pub latency_us: f32,
    pub port: i32,
    /// Most connections the device takes.
    pub max_comms: usize,
    /// Most receives one `irecv` may group.
    pub max_recvs: usize,
    /// The network asks for every GPU Direct RDMA receive to be flushed (forceFlush, v9 on).
    pub force_flush: bool,
}

/// Called by a backend when a transfer made progress, so that a sleeping proxy wakes.
pub type Waker = Arc<dyn Fn() + Send + Sync>;

/// A registered region: an index the backend hands out, valid until deregistered.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mr(pub u64);

/// An outstanding transfer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Request(pub u64);

/// One network (ncclNet_t): a backend and its devices.
pub trait Net: Send + Sync {
    /// The network's name (`NCCL_NET` selects by it): "Socket" for the built-in backend.
    fn name(&self) -> &str;
    fn ndevs(&self) -> usize;
    fn properties(&self, dev: usize) -> Result<Properties>;
    /// Starts listening on `dev`; the handle goes to the peer out of band.
    fn listen(&self, dev: usize) -> Result<(Handle, Box<dyn Listener>)>;
    /// Starts connecting to a peer's handle; drive the result with [`Connecting::poll`].
    fn connect(&self, dev: usize, handle: &Handle) -> Result<Box<dyn Connecting>>;
    /// Whether its comms register GPU memory through a dmabuf (`regMrDmaBuf`).
    fn has_dmabuf_reg(&self) -> bool {
        false
    }
    /// Messages at least this long are handed from the caller's thread to the backend's own
    /// threads and back (the socket network's pieces), a cost per message the tuner counts;
    /// None: no such cost is known (plugins).
    fn handoff_from(&self) -> Option<usize> {
        None
    }
}

/// A connect in progress (non-blocking, as ncclNet's connect returning a null comm).
pub trait Connecting: Send {
    /// `Ok(None)`: not yet, call again; `Ok(Some)`: connected.
    fn poll(&mut self) -> Result<Option<Box<dyn SendComm>>>;
}

/// A listening endpoint (ncclNet's listenComm).
pub trait Listener: Send {
    /// `Ok(None)`: no peer yet (or its handshake is still in progress), call again.
    fn accept(&mut self) -> Result<Option<Box<dyn RecvComm>>>;
}

/// The sending end of a connection. Messages arrive in the order they were sent.
pub trait SendComm: Send {
    /// Registers `len` bytes at `ptr` of `kind` (`PTR_*`).
    ///
    /// # Safety
    /// The region must stay valid for reads until [`SendComm::dereg_mr`] (or the comm's drop).
    unsafe fn reg_mr(&mut self, ptr: *mut u8, len: usize, kind: u32) -> Result<Mr>;
    /// Registers `len` bytes of GPU memory at `ptr` through the dmabuf `fd` (whose range starts
    /// `offset` bytes before `ptr`), as `regMrDmaBuf` with `kind` (`PTR_CUDA`). The caller may
    /// close `fd` once this returns.
    ///
    /// # Safety
    /// As [`SendComm::reg_mr`].
    unsafe fn reg_mr_dmabuf(
        &mut self,
        _ptr: *mut u8,
        _len: usize,
        _kind: u32,
        _offset: u64,
        _fd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<Mr> {
        Err(crate::error::Error::internal(
            "this network registers no memory through a dmabuf",
        ))
    }
    fn dereg_mr(&mut self, mr: Mr) -> Result<()>;
    /// Sends bytes `offset..offset + len` of `mr`. `Ok(None)`: the backend cannot take another
    /// request now, try again later.
    fn isend(&mut self, mr: Mr, offset: usize, len: usize, tag: u32) -> Result<Option<Request>>;
    /// `Ok(Some(bytes))` once the request completed (its buffer may be reused), `Ok(None)` while
    /// in flight. A completed request is forgotten.
    fn test(&mut self, req: Request) -> Result<Option<usize>>;
    /// Called on progress; backends that cannot wake anyone ignore it.
    fn set_waker(&mut self, _waker: Waker) {}
}

/// One buffer of a grouped receive: bytes `offset..offset + max_len` of `mr`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvBuf {
    pub mr: Mr,
    pub offset: usize,
    pub max_len: usize,
    pub tag: u32,
}

/// The receiving end of a connection.
pub trait RecvComm: Send {
    /// Registers `len` bytes at `ptr` of `kind` (`PTR_*`).
    ///
    /// # Safety
    /// The region must stay valid for writes until [`RecvComm::dereg_mr`] (or the comm's drop).
    unsafe fn reg_mr(&mut self, ptr: *mut u8, len: usize, kind: u32) -> Result<Mr>;
    /// Registers `len` bytes of GPU memory at `ptr` through the dmabuf `fd` (whose range starts
    /// `offset` bytes before `ptr`), as `regMrDmaBuf` with `kind` (`PTR_CUDA`). The caller may
    /// close `fd` once this returns.
    ///
    /// # Safety
    /// As [`RecvComm::reg_mr`].
    unsafe fn reg_mr_dmabuf(
        &mut self,
        _ptr: *mut u8,
        _len: usize,
        _kind: u32,
        _offset: u64,
        _fd: std::os::fd::BorrowedFd<'_>,
    ) -> Result<Mr> {
        Err(crate::error::Error::internal(
            "this network registers no memory through a dmabuf",
        ))
    }
    fn dereg_mr(&mut self, mr: Mr) -> Result<()>;
    /// Posts a receive into up to `max_recvs` buffers (one per message). `Ok(None)`: try again.
    /// A message longer than its buffer fails the request.
    fn irecv(&mut self, bufs: &[RecvBuf]) -> Result<Option<Request>>;
    /// Posts a receive of one step that its kernel waits for (so it will come soon): a comm
    /// that several connections share may hold it a moment to post it in one `irecv` with
    /// other connections' (`crate::proxy::shared`). `Ok(None)`: try again.
    fn irecv_awaited(&mut self, buf: RecvBuf) -> Result<Option<Request>> {
        self.irecv(&[buf])
    }
    /// Whether the connection tagged `tag` has steps its kernel waits for that it cannot post
    /// yet (its FIFO is full): a shared comm holds other connections' awaited receives for it.
    fn note_waiting(&mut self, _tag: u32, _waiting: bool) {}
    /// `Ok(Some(sizes))` (one per buffer) once complete, `Ok(None)` while in flight.
    fn test(&mut self, req: Request) -> Result<Option<Vec<usize>>>;
    /// Makes received data visible to the GPU where the network wrote GPU memory. `Ok(None)`:
    /// nothing to flush (host memory, or a network that needs none).
    fn iflush(&mut self, _bufs: &[RecvBuf]) -> Result<Option<Request>> {
        Ok(None)
    }
    fn set_waker(&mut self, _waker: Waker) {}
}
