//! Multicast objects (NVLS) in one process: a multicast object names a buffer on each member
//! device; mapping it reserves an address range that the device simulator resolves to the
//! members (`nccl_device::arch::sim::mc_set_window`).

use super::*;

pub(super) struct McObject {
    pub(super) ndev: usize,
    pub(super) bytes: usize,
    pub(super) devices: Vec<i32>,
    /// Bound member buffers (device, address).
    pub(super) members: Vec<(i32, u64)>,
    /// Address ranges it is mapped at.
    pub(super) windows: Vec<u64>,
    /// Holders (the creator and every importer).
    pub(super) refs: usize,
}

pub(super) fn mc_objects() -> &'static Mutex<HashMap<u64, McObject>> {
    static M: OnceLock<Mutex<HashMap<u64, McObject>>> = OnceLock::new();
    M.get_or_init(|| Mutex::new(HashMap::new()))
}

pub(super) static MC_CREATED: AtomicU64 = AtomicU64::new(0);

/// Multicast objects this process created so far (tests check NVLS stays off).
pub fn multicast_objects_created() -> u64 {
    MC_CREATED.load(Ordering::SeqCst)
}

static MC_LAST_BYTES: AtomicU64 = AtomicU64::new(0);

/// The size of the multicast object this process created last (tests check what NVLS's
/// channel count made of it).
pub fn multicast_last_bytes() -> u64 {
    MC_LAST_BYTES.load(Ordering::SeqCst)
}

/// The simulator's multicast granularity.
pub(super) const MC_GRANULARITY: usize = 4096;

/// A multicast object as one rank holds it.
pub struct Multicast {
    pub(super) id: u64,
    pub(super) bytes: usize,
    pub(super) uc: u64,
    pub(super) mc: u64,
    /// `uc` is the caller's memory ([`Device::multicast_bind_mem`]), not freed here.
    pub(super) borrowed: bool,
}

impl Multicast {
    /// The object's size.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl McObject {
    pub(super) fn publish(&self) {
        let members: Vec<u64> = self.members.iter().map(|m| m.1).collect();
        for &w in &self.windows {
            nccl_device::arch::sim::mc_set_window(w, self.bytes as u64, members.clone());
        }
    }
}

impl Device {
    pub fn multicast_create(&self, ndev: usize, bytes: usize) -> Result<(Multicast, [u8; 64])> {
        if ndev == 0 || bytes == 0 || !bytes.is_multiple_of(MC_GRANULARITY) {
            return Err(Error::invalid_argument(format!(
                "multicast object of {ndev} devices and {bytes} bytes \
                 (granularity {MC_GRANULARITY})"
            )));
        }
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        lock(mc_objects()).insert(
            id,
            McObject {
                ndev,
                bytes,
                devices: Vec::new(),
                members: Vec::new(),
                windows: Vec::new(),
                refs: 1,
            },
        );
        MC_CREATED.fetch_add(1, Ordering::SeqCst);
        MC_LAST_BYTES.store(bytes as u64, Ordering::SeqCst);
        let mut h = [0u8; 64];
        h[..4].copy_from_slice(&std::process::id().to_le_bytes());
        h[8..16].copy_from_slice(&id.to_le_bytes());
        Ok((
            Multicast {
                id,
                bytes,
                uc: 0,
                mc: 0,
                borrowed: false,
            },
            h,
        ))
    }

    pub fn multicast_import(&self, h: &[u8; 64], bytes: usize) -> Result<Multicast> {
        let pid = u32::from_le_bytes([h[0], h[1], h[2], h[3]]);
        if pid != std::process::id() {
            return Err(Error::invalid_usage(
                "the simulator's multicast objects do not cross processes",
            ));
        }
        let id = u64::from_le_bytes(h[8..16].try_into().unwrap_or_default());
        let mut objs = lock(mc_objects());
        let o = objs
            .get_mut(&id)
            .ok_or_else(|| Error::invalid_argument("unknown simulated multicast handle"))?;
        if o.bytes != bytes {
            return Err(Error::remote(format!(
                "NVLS: the multicast object has {} bytes, this rank's layout {bytes}",
                o.bytes
            )));
        }
        o.refs += 1;
        Ok(Multicast {
            id,
            bytes: o.bytes,
            uc: 0,
            mc: 0,
            borrowed: false,
        })
    }

    pub fn multicast_add_device(&self, mc: &Multicast) -> Result<()> {
        let mut objs = lock(mc_objects());
        let o = objs
            .get_mut(&mc.id)
            .ok_or_else(|| Error::internal("multicast object gone"))?;
        if o.devices.len() >= o.ndev || !o.members.is_empty() {
            return Err(Error::cuda(format!(
                "cuMulticastAddDevice: object of {} devices has {} and {} bound",
                o.ndev,
                o.devices.len(),
                o.members.len()
            )));
        }
        o.devices.push(self.ordinal);
        Ok(())
    }

    /// As CUDA: binding needs every member device added first.
    pub fn multicast_bind_map(&self, mc: &mut Multicast, _align: usize) -> Result<(u64, u64)> {
        self.check_members_added(mc)?;
        let uc = self.alloc(mc.bytes)?;
        match self.bind_at(mc, uc) {
            Ok(va) => Ok((uc, va)),
            Err(e) => {
                let _ = self.free(uc);
                Err(e)
            }
        }
    }

    /// Binds the object's size of this device's memory at `ptr` (the caller's, which must hold
    /// that much) and maps the object: its multicast address.
    pub fn multicast_bind_mem(&self, mc: &mut Multicast, ptr: u64, _align: usize) -> Result<u64> {
        self.check_members_added(mc)?;
        match self.pointer_extent(ptr, mc.bytes)? {
            Some((d, avail)) if d == self.ordinal && avail >= mc.bytes => {}
            _ => {
                return Err(Error::invalid_argument(format!(
                    "multicast binding: {} bytes at {ptr:#x} are not memory of device {}",
                    mc.bytes, self.ordinal
                )))
            }
        }
        let va = self.bind_at(mc, ptr)?;
        mc.borrowed = true;
        Ok(va)
    }

    fn check_members_added(&self, mc: &Multicast) -> Result<()> {
        let objs = lock(mc_objects());
        let o = objs
            .get(&mc.id)
            .ok_or_else(|| Error::internal("multicast object gone"))?;
        if o.devices.len() == o.ndev && o.devices.contains(&self.ordinal) {
            return Ok(());
        }
        Err(Error::cuda(
            "cuMulticastBindMem: not every member device was added, or not this one",
        ))
    }

    /// Makes `uc` this device's member of the object and maps the object: its address.
    fn bind_at(&self, mc: &mut Multicast, uc: u64) -> Result<u64> {
        // The multicast range: reserved address space no one may touch directly.
        // SAFETY: an anonymous PROT_NONE mapping; its result is checked.
        let va = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mc.bytes,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if va == libc::MAP_FAILED {
            return Err(Error::system("mmap of a simulated multicast range failed"));
        }
        let mut objs = lock(mc_objects());
        let o = objs
            .get_mut(&mc.id)
            .ok_or_else(|| Error::internal("multicast object gone"))?;
        o.members.push((self.ordinal, uc));
        o.windows.push(va as u64);
        o.publish();
        mc.uc = uc;
        mc.mc = va as u64;
        Ok(va as u64)
    }

    pub fn multicast_release(&self, mc: &mut Multicast) {
        let mut objs = lock(mc_objects());
        if let Some(o) = objs.get_mut(&mc.id) {
            if mc.mc != 0 {
                o.windows.retain(|&w| w != mc.mc);
                nccl_device::arch::sim::mc_remove_window(mc.mc);
                // SAFETY: our own reservation of mc.bytes.
                unsafe { libc::munmap(mc.mc as *mut libc::c_void, mc.bytes) };
            }
            if mc.uc != 0 {
                o.members.retain(|m| m.1 != mc.uc);
                o.publish();
            }
            o.refs -= 1;
            if o.refs == 0 {
                objs.remove(&mc.id);
            }
        }
        drop(objs);
        if mc.uc != 0 && !mc.borrowed {
            let _ = self.free(mc.uc);
        }
        mc.uc = 0;
        mc.mc = 0;
    }
}
