//! The SHM transport: peers on one node that do not use p2p (NCCL_P2P_DISABLE, NCCL_P2P_LEVEL,
//! no peer access) meet in host shared memory. The receiver of a connection creates a POSIX
//! shared memory segment holding the FIFOs (Simple, LL, LL128) and both counters, each counter
//! in its own 128-byte line; the sender opens it by name. Each side pins its mapping and maps it
//! into its GPU (`Device::host_register`: CUDA's PORTABLE | DEVICEMAP registration; on the
//! simulator host memory is what kernels address), so both kernels read and write it with the
//! same protocol code as p2p and no proxy thread takes part (NCCL's SHM in its direct mode).
//! Senders and receivers in one process (`ncclCommInitAll`) map the segment twice alike.
//!
//! A segment's name comes from its creator's pid and pid namespace, a counter of the process
//! and the two ranks: unique among live processes, never random. The opener unlinks it once it
//! is mapped (the creator mapped it before publishing the name), so nothing stays in /dev/shm;
//! a creator whose peer never opened it unlinks it when it drops.

use super::p2p::{Layout, PeerAddr, TAG_RECV_BLOCK};
use super::{Conn, Ctx, Dir, Made, Set, Setup, Transport, Want};
use crate::cuda::{DevPtr, Device, HostRegistration};
use crate::error::{Error, Result};
use crate::graph::Transport as Kind;
use nccl_device::abi::{ConnRecv, ConnSend, CTRL_LINE};
use std::ffi::CString;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bootstrap tag of a ring connection's segment record (receiver to sender).
const TAG_SHM_RING: u32 = 0x7368_6d01;

/// A mapping of a POSIX shared memory segment.
struct Segment {
    host: *mut u8,
    bytes: usize,
    /// The name while it may still be linked and is ours to unlink.
    name: Option<CString>,
}

// SAFETY: the mapping is plain shared memory; kernels and peers reach it through their own
// addresses, and this struct only maps, unlinks and unmaps it.
unsafe impl Send for Segment {}
// SAFETY: as above; no method reads or writes the memory.
unsafe impl Sync for Segment {}

fn os_error(what: &str, name: &str) -> Error {
    Error::system(format!(
        "{what}({name}): {} (is /dev/shm large enough? NCCL_SHM_DISABLE=1 turns SHM off)",
        std::io::Error::last_os_error()
    ))
}

impl Segment {
    /// Creates a zeroed segment of `bytes` named `name` and maps it. A leftover of that name
    /// (a process that had our pid died before unlinking it) is replaced.
    fn create(name: &str, bytes: usize) -> Result<Segment> {
        let c = CString::new(name).map_err(|_| Error::internal("shm name holds a NUL byte"))?;
        let flags = libc::O_CREAT | libc::O_EXCL | libc::O_RDWR;
        // SAFETY: plain system calls on a name of ours; every result is checked.
        let fd = unsafe {
            let mut fd = libc::shm_open(c.as_ptr(), flags, 0o600);
            if fd < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EEXIST) {
                libc::shm_unlink(c.as_ptr());
                fd = libc::shm_open(c.as_ptr(), flags, 0o600);
            }
            fd
        };
        if fd < 0 {
            return Err(os_error("shm_open", name));
        }
        // SAFETY: fd is ours; a fresh object grows zero-filled.
        if unsafe { libc::ftruncate(fd, bytes as libc::off_t) } != 0 {
            let e = os_error("ftruncate", name);
            // SAFETY: closing and unlinking what we just created.
            unsafe {
                libc::close(fd);
                libc::shm_unlink(c.as_ptr());
            }
            return Err(e);
        }
        let mapped = Segment::map(fd, name, bytes);
        if mapped.is_err() {
            // SAFETY: unlinking what we just created.
            unsafe { libc::shm_unlink(c.as_ptr()) };
        }
        let host = mapped?;
        Ok(Segment {
            host,
            bytes,
            name: Some(c),
        })
    }

    /// Opens the segment `name` a peer created, checks it is this user's, readable by no one
    /// else, and holds `bytes`, maps it and unlinks the name (both sides have it mapped now).
    /// (Another user could have created a segment of a predictable name first.)
    fn open(name: &str, bytes: usize) -> Result<Segment> {
        let c = CString::new(name).map_err(|_| Error::remote("shm name holds a NUL byte"))?;
        // SAFETY: plain system call; the result is checked.
        let fd = unsafe { libc::shm_open(c.as_ptr(), libc::O_RDWR, 0) };
        if fd < 0 {
            return Err(os_error("shm_open", name));
        }
        // SAFETY: fstat fills a zeroed stat of ours.
        let (size, owner, mode) = unsafe {
            let mut st: libc::stat = std::mem::zeroed();
            if libc::fstat(fd, &mut st) != 0 {
                libc::close(fd);
                return Err(os_error("fstat", name));
            }
            (st.st_size as usize, st.st_uid, st.st_mode & 0o777)
        };
        // SAFETY: plain system call.
        let me = unsafe { libc::geteuid() };
        let wrong = if owner != me || mode & 0o077 != 0 {
            Some(format!(
                "shared memory segment {name} belongs to uid {owner} with mode {mode:o}, not to \
                 this user (uid {me}) alone: refused"
            ))
        } else if size != bytes {
            Some(format!(
                "shared memory segment {name} holds {size} bytes, {bytes} expected"
            ))
        } else {
            None
        };
        if let Some(why) = wrong {
            // SAFETY: fd is ours.
            unsafe { libc::close(fd) };
            return Err(Error::remote(why));
        }
        let host = Segment::map(fd, name, bytes)?;
        // SAFETY: unlinking a name both sides have mapped; the memory stays while mapped.
        unsafe { libc::shm_unlink(c.as_ptr()) };
        Ok(Segment {
            host,
            bytes,
            name: None,
        })
    }

    /// Maps `bytes` of `fd` shared, and closes `fd`.
    fn map(fd: libc::c_int, name: &str, bytes: usize) -> Result<*mut u8> {
        // SAFETY: fd is an open shared memory object of at least `bytes` bytes; the result
        // is checked; fd is closed once (the mapping keeps the object).
        let p = unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            libc::close(fd);
            p
        };
        if p == libc::MAP_FAILED {
            return Err(os_error("mmap", name));
        }
        Ok(p as *mut u8)
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: host and bytes come from our own mmap; the name (if still ours) is unlinked
        // once, and a name the peer unlinked already just fails.
        unsafe {
            libc::munmap(self.host as *mut libc::c_void, self.bytes);
            if let Some(c) = &self.name {
                libc::shm_unlink(c.as_ptr());
            }
        }
    }
}

/// A segment mapped into a device. The registration drops before the mapping (field order).
pub struct ShmMem {
    reg: HostRegistration,
    _seg: Segment,
}

impl ShmMem {
    /// The device address of the segment's first byte.
    pub fn ptr(&self) -> DevPtr {
        self.reg.ptr
    }

    /// Creates a segment of `bytes` for a connection from rank `from` to rank `to` and maps it
    /// into `device`: (the memory, the record the peer opens it with).
    pub fn create(
        device: &Device,
        from: usize,
        to: usize,
        bytes: usize,
    ) -> Result<(ShmMem, Vec<u8>)> {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "/ncclrs-{}@{}-shm-{}-{from}to{to}",
            std::process::id(),
            crate::cuda::sim::pid_namespace(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let bytes = bytes.max(1).next_multiple_of(page_size());
        let seg = Segment::create(&name, bytes)?;
        // SAFETY: the segment is mapped, page-aligned, and outlives the registration (field
        // order of ShmMem).
        let reg = unsafe { device.host_register(seg.host, bytes) }
            .map_err(|e| e.context(format!("registering shared memory {name}")))?;
        let mut record = (bytes as u64).to_le_bytes().to_vec();
        record.extend_from_slice(name.as_bytes());
        Ok((ShmMem { reg, _seg: seg }, record))
    }

    /// Opens and maps into `device` the segment a peer's `record` names, which must hold the
    /// `needed` bytes the connections laid out in it take (the kernels address them from our
    /// layout, not from the record).
    pub fn open(device: &Device, record: &[u8], needed: usize) -> Result<ShmMem> {
        if record.len() < 9 {
            return Err(Error::remote(format!(
                "malformed shm connection record ({} bytes)",
                record.len()
            )));
        }
        let mut b = [0u8; 8];
        b.copy_from_slice(&record[..8]);
        let bytes = u64::from_le_bytes(b) as usize;
        let name = std::str::from_utf8(&record[8..])
            .map_err(|_| Error::remote("malformed shm segment name"))?;
        // The name is opened and then unlinked: only a name of the form `create` gives may be,
        // or a peer could have us map, and remove, any shared memory object we can open.
        if !is_segment_name(name) {
            return Err(Error::remote(format!(
                "shm connection record names {name:?}, not a segment of this transport"
            )));
        }
        if bytes < needed {
            return Err(Error::remote(format!(
                "shared memory segment {name} is {bytes} bytes; its connections need {needed}"
            )));
        }
        let seg = Segment::open(name, bytes)?;
        // SAFETY: as in `create`.
        let reg = unsafe { device.host_register(seg.host, bytes) }
            .map_err(|e| e.context(format!("registering shared memory {name}")))?;
        Ok(ShmMem { reg, _seg: seg })
    }
}

/// The prefix of every segment name `ShmMem::create` gives.
const NAME_PREFIX: &str = "/ncclrs-";

/// Whether `name` has the form of a segment name [`ShmMem::create`] gives:
/// `/ncclrs-<pid>@<pid namespace>-shm-<n>-<from>to<to>`, one leading slash, no other, short
/// enough for a file name.
fn is_segment_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(NAME_PREFIX) else {
        return false;
    };
    let Some((owner, conn)) = rest.split_once("-shm-") else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let owner_ok = owner
        .split_once('@')
        .is_some_and(|(pid, ns)| digits(pid) && digits(ns));
    let conn_ok = conn.split_once('-').is_some_and(|(n, pair)| {
        digits(n)
            && pair
                .split_once("to")
                .is_some_and(|(from, to)| digits(from) && digits(to))
    });
    name.len() < 255 && owner_ok && conn_ok
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// The SHM transport: the pairs the communicator agreed on SHM (peers of this node that p2p
/// does not reach). The receiving side of each (peer, direction) creates a segment and
/// publishes its record; the sending side opens it and publishes nothing.
pub(crate) struct ShmTransport;

impl Transport for ShmTransport {
    fn can_connect(&self, peer: &PeerAddr) -> bool {
        peer.transport == Kind::Shm
    }

    fn setup(&self, cx: &Ctx, set: Set, wants: &[Want]) -> Result<Box<dyn Setup>> {
        let segments = match set {
            Set::Ring { slot_bytes, .. } => Segments::Ring { slot_bytes },
            Set::Links {
                nconns,
                slot_bytes,
                ll,
                key_base,
            } => {
                let (fifo_bytes, ll_bytes) = super::link_fifo_bytes(slot_bytes, ll);
                let layout = LinkLayout {
                    nconns,
                    fifo_bytes,
                    ll_bytes,
                };
                Segments::Links { layout, key_base }
            }
        };
        Ok(Box::new(ShmSetup::new(cx, segments, wants)?))
    }
}

/// How a round lays out its segments, one per (peer, direction).
#[derive(Clone, Copy, Debug)]
enum Segments {
    /// A ring's: a segment holds the channels that connect to that neighbour, in a [`Layout`]
    /// of those channels (its counters and FIFOs); the two ends see the same channels, so both
    /// index it alike.
    Ring { slot_bytes: usize },
    /// Links': a segment holds `layout.nconns` connections, connection `c` keyed
    /// `key_base + c`.
    Links { layout: LinkLayout, key_base: u32 },
}

impl Segments {
    /// The bootstrap tag of a segment's record.
    fn tag(&self) -> u32 {
        match self {
            Segments::Ring { .. } => TAG_SHM_RING,
            Segments::Links { .. } => TAG_RECV_BLOCK,
        }
    }

    /// Bytes of the segment of the connections `ws`.
    fn bytes(&self, ws: &[Want]) -> usize {
        match self {
            Segments::Ring { slot_bytes } => Layout::new(ws.len(), *slot_bytes).total(),
            Segments::Links { layout, .. } => layout.total(),
        }
    }

    /// The kernel structure of `ws[i]`, in the segment of `ws` at `base`.
    fn conn(&self, ws: &[Want], i: usize, base: DevPtr) -> Result<Conn> {
        let w = &ws[i];
        match self {
            Segments::Ring { slot_bytes } => {
                let l = Layout::new(ws.len(), *slot_bytes);
                Ok(match w.dir {
                    Dir::Send => Conn::Send(l.send(base, base, i)),
                    Dir::Recv => Conn::Recv(l.recv(base, base, i)),
                })
            }
            Segments::Links { layout, key_base } => {
                let c = w.key.wrapping_sub(*key_base) as usize;
                if c >= layout.nconns {
                    return Err(Error::internal(format!(
                        "link connection key {} outside {key_base}..+{}",
                        w.key, layout.nconns
                    )));
                }
                Ok(match w.dir {
                    Dir::Send => Conn::Send(layout.send(base, c)),
                    Dir::Recv => Conn::Recv(layout.recv(base, c)),
                })
            }
        }
    }
}

/// A round's SHM sides: per (peer, direction) its connections, and for a receiving side the
/// segment it created and published.
struct ShmSetup {
    segments: Segments,
    sides: Vec<(usize, Dir, Vec<Want>, Option<ShmMem>)>,
}

impl ShmSetup {
    fn new(cx: &Ctx, segments: Segments, wants: &[Want]) -> Result<ShmSetup> {
        let mut sides = Vec::new();
        for (peer, dir, ws) in super::sides(wants) {
            let mem = match dir {
                Dir::Recv => {
                    let (mem, record) =
                        ShmMem::create(cx.device, peer, cx.rank, segments.bytes(&ws))?;
                    cx.bootstrap.send(peer, segments.tag(), &record)?;
                    Some(mem)
                }
                Dir::Send => None,
            };
            sides.push((peer, dir, ws, mem));
        }
        Ok(ShmSetup { segments, sides })
    }
}

impl Setup for ShmSetup {
    /// Opens the segment each receiving peer published, for our sending sides.
    fn connect(self: Box<Self>, cx: &Ctx) -> Result<Made> {
        let segs = self.segments;
        let dev = |r: usize| cx.peers.get(r).map_or(-1, |p| p.device);
        let mut made = Made::default();
        for (peer, _, ws, mem) in self.sides {
            let mem = match mem {
                Some(m) => m,
                None => {
                    let record = cx.bootstrap.recv(peer, segs.tag()).map_err(|e| {
                        e.context(match segs {
                            Segments::Ring { .. } => format!("shm connection to rank {peer}"),
                            Segments::Links { .. } => format!("connecting to rank {peer}"),
                        })
                    })?;
                    ShmMem::open(cx.device, &record, segs.bytes(&ws))
                        .map_err(|e| e.context(format!("rank {peer}'s shared memory")))?
                }
            };
            for (i, w) in ws.iter().enumerate() {
                made.conns.push((*w, segs.conn(&ws, i, mem.ptr())?));
                if matches!(segs, Segments::Ring { .. }) && w.dir == Dir::Send {
                    log::info!(
                        target: crate::debug::INIT,
                        "Channel {:02}/0 : {}[{}] -> {peer}[{}] via SHM/direct/direct",
                        w.key,
                        cx.rank,
                        dev(cx.rank),
                        dev(peer)
                    );
                }
            }
            made.resources.hold(mem);
        }
        Ok(made)
    }
}

/// Where the parts of a send/recv link's segment lie: `nconns` tail lines, `nconns` head
/// lines, `nconns` Simple FIFOs of `fifo_bytes`, then `nconns` LL FIFOs of `ll_bytes` (none
/// when 0, as for send/recv links; the tree's have them).
#[derive(Clone, Copy, Debug)]
pub struct LinkLayout {
    pub nconns: usize,
    pub fifo_bytes: usize,
    pub ll_bytes: usize,
}

impl LinkLayout {
    pub fn total(&self) -> usize {
        self.nconns * (2 * CTRL_LINE + self.fifo_bytes + self.ll_bytes)
    }
    fn ll_fifo(&self, c: usize) -> Option<u64> {
        let simple = self.nconns * (2 * CTRL_LINE + self.fifo_bytes);
        (self.ll_bytes > 0).then(|| (simple + c * self.ll_bytes) as u64)
    }
    fn tail(&self, c: usize) -> u64 {
        (c * CTRL_LINE) as u64
    }
    fn head(&self, c: usize) -> u64 {
        ((self.nconns + c) * CTRL_LINE) as u64
    }
    fn fifo(&self, c: usize) -> u64 {
        (2 * self.nconns * CTRL_LINE + c * self.fifo_bytes) as u64
    }

    /// Connection `c`'s sending side in a segment at `base`.
    pub fn send(&self, base: DevPtr, c: usize) -> ConnSend {
        ConnSend {
            fifo: base + self.fifo(c),
            tail: base + self.tail(c),
            head: base + self.head(c),
            ll_fifo: self.ll_fifo(c).map_or(0, |o| base + o),
            ..ConnSend::default()
        }
    }

    /// Connection `c`'s receiving side in a segment at `base`.
    pub fn recv(&self, base: DevPtr, c: usize) -> ConnRecv {
        ConnRecv {
            fifo: base + self.fifo(c),
            tail: base + self.tail(c),
            head: base + self.head(c),
            ll_fifo: self.ll_fifo(c).map_or(0, |o| base + o),
            ..ConnRecv::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_aids::ForeignObject;

    /// A peer's record naming a segment smaller than the connections laid out in it is
    /// refused: the kernels would address past its end.
    #[test]
    fn a_segment_smaller_than_its_connections_is_refused() {
        let _ = crate::cuda::set_backend(crate::cuda::Backend::Sim);
        let dev = Device::open(0).expect("device 0");
        let page = page_size();
        let (_mem, record) = ShmMem::create(&dev, 1, 0, page).expect("segment");
        let e = match ShmMem::open(&dev, &record, page + 1) {
            Err(e) => e,
            Ok(_) => panic!("a {page}-byte segment opened for {} bytes", page + 1),
        };
        assert_eq!(e.code, crate::error::NcclResult::RemoteError);
        assert!(e.message.contains("need"), "{}", e.message);
        // The same record opens for what it holds.
        ShmMem::open(&dev, &record, page).expect("open");
    }

    /// A segment others may read or write (a predictable name another user took first, with
    /// a wide mode) is refused; the same segment once it is this user's alone opens.
    #[test]
    fn a_segment_others_can_reach_is_refused() {
        let name = format!("/nccl-rs-mode-test-{}", std::process::id());
        let c = CString::new(name.as_str()).unwrap();
        let bytes = page_size();
        // SAFETY: plain system calls on a name of this test's; results checked.
        unsafe {
            let fd = libc::shm_open(
                c.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDWR,
                0o600,
            );
            assert!(fd >= 0, "shm_open");
            assert_eq!(libc::ftruncate(fd, bytes as libc::off_t), 0);
            assert_eq!(libc::fchmod(fd, 0o644), 0);
            libc::close(fd);
        }
        let e = Segment::open(&name, bytes)
            .err()
            .expect("a segment others can read");
        assert!(e.message.contains("refused"), "{}", e.message);
        // SAFETY: as above.
        unsafe {
            let fd = libc::shm_open(c.as_ptr(), libc::O_RDWR, 0);
            assert!(fd >= 0, "shm_open again");
            assert_eq!(libc::fchmod(fd, 0o600), 0);
            libc::close(fd);
        }
        // Opening maps it and unlinks the name.
        Segment::open(&name, bytes).expect("this user's segment");
    }

    /// A peer's record naming a shared memory object that is no segment of this transport is
    /// refused before anything opens it: the opener would map it and unlink its name.
    #[test]
    fn a_record_naming_another_object_is_refused() {
        let _ = crate::cuda::set_backend(crate::cuda::Backend::Sim);
        let dev = Device::open(0).expect("device 0");
        let page = page_size();
        // Someone else's object, of the size the record claims.
        let foreign = ForeignObject::create("peervalues-foreign", page);
        let record_for = |name: &str| {
            let mut r = (page as u64).to_le_bytes().to_vec();
            r.extend_from_slice(name.as_bytes());
            r
        };
        let (_mem, good) = ShmMem::create(&dev, 1, 0, page).expect("segment");
        let good_name = std::str::from_utf8(&good[8..]).expect("utf-8").to_string();
        for name in [
            foreign.name.clone(),
            format!("{good_name}/../x"),
            good_name.replace("-shm-", "-"),
            format!("/ncclrs-{}@1-shm-x-0to1", std::process::id()),
            "/".to_string(),
        ] {
            let e = match ShmMem::open(&dev, &record_for(&name), page) {
                Err(e) => e,
                Ok(_) => panic!("a record naming {name:?} was opened"),
            };
            assert_eq!(e.code, crate::error::NcclResult::RemoteError, "{e}");
            assert!(e.message.contains("not a segment"), "{e}");
        }
        // The foreign object is still there (an opener unlinks what it opened).
        assert!(foreign.exists(), "the foreign object was removed");
        // The real record still opens.
        ShmMem::open(&dev, &good, page).expect("open");
    }

    #[test]
    fn link_layout_keeps_counters_apart() {
        let l = LinkLayout {
            nconns: 3,
            fifo_bytes: 8 << 12,
            ll_bytes: 0,
        };
        let s = l.send(0x1000, 2);
        let r = l.recv(0x1000, 2);
        assert_eq!((s.fifo, s.tail, s.head), (r.fifo, r.tail, r.head));
        assert_eq!((s.ll_fifo, r.ll_fifo), (0, 0));
        let mut lines: Vec<u64> = (0..3).flat_map(|c| [l.tail(c), l.head(c)]).collect();
        lines.sort();
        assert!(lines.windows(2).all(|w| w[1] - w[0] >= CTRL_LINE as u64));
        assert_eq!(l.fifo(0), 6 * CTRL_LINE as u64);
        assert_eq!(l.fifo(2) as usize + (8 << 12), l.total());
        // With LL FIFOs: after every Simple FIFO, one per connection, up to the end.
        let ll = LinkLayout {
            ll_bytes: 1 << 12,
            ..l
        };
        let (s, r) = (ll.send(0x1000, 2), ll.recv(0x1000, 2));
        assert_eq!(s.ll_fifo, r.ll_fifo);
        assert_eq!(s.ll_fifo - 0x1000, l.total() as u64 + 2 * (1 << 12));
        assert_eq!(s.ll_fifo as usize - 0x1000 + (1 << 12), ll.total());
    }

    #[test]
    fn segments_are_shared_and_unlinked() {
        let name = format!("/ncclrs-{}@0-shm-test-unit", std::process::id());
        let a = Segment::create(&name, 8192).expect("create");
        let b = Segment::open(&name, 8192).expect("open");
        // The opener unlinked the name: a third open fails.
        assert!(Segment::open(&name, 8192).is_err());
        // SAFETY: both map the same live 8 KiB segment.
        unsafe {
            std::ptr::write_volatile(a.host.add(100), 0x5a);
            assert_eq!(std::ptr::read_volatile(b.host.add(100)), 0x5a);
            assert_eq!(std::ptr::read_volatile(b.host.add(101)), 0);
        }
        drop(a);
        drop(b);
        // A record whose size differs from the segment's is refused.
        let name = format!("/ncclrs-{}@0-shm-test-size", std::process::id());
        let a = Segment::create(&name, 8192).expect("create");
        assert!(Segment::open(&name, 4096).is_err());
        drop(a);
        assert!(
            Segment::open(&name, 8192).is_err(),
            "the creator unlinked it"
        );
    }
}
