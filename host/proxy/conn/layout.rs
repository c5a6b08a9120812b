//! Where things sit in a proxied connection's host memory, and how the proxy reads them: its
//! counters as atomics, the first words of a slot for traces.

use super::*;

/// Where things sit in a proxied connection's host memory: tail, head and the slot sizes each in
/// their own line, then NCCL_STEPS slots of `stride` bytes (the FIFO; in GPU memory instead
/// where the network reads and writes it: [`FifoPlace::Gpu`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ConnLayout {
    pub stride: usize,
}

impl ConnLayout {
    pub const TAIL: usize = 0;
    pub const HEAD: usize = CTRL_LINE;
    pub const SIZES: usize = 2 * CTRL_LINE;
    /// The receive side's use of the sizes line: the word where its kernel says which protocol
    /// the steps it waits for carry (`ConnRecv::proxy_proto`).
    pub const PROTO: usize = Self::SIZES;
    pub const FIFO: usize = 3 * CTRL_LINE;

    pub fn total(&self) -> usize {
        Self::FIFO + self.fifo_bytes()
    }
    pub fn fifo_bytes(&self) -> usize {
        NCCL_STEPS as usize * self.stride
    }
    pub(super) fn slot(&self, step: u64) -> usize {
        Self::FIFO + (step % STEPS) as usize * self.stride
    }
}

/// A counter of the connection's host memory at `offset`, as an atomic (checked to lie inside
/// it, aligned).
pub(super) fn counter(mem: &HostMem, offset: usize) -> Result<&AtomicU64> {
    let p = mem
        .host_ptr(offset)
        .filter(|_| offset + 8 <= mem.bytes && offset.is_multiple_of(8))
        .ok_or_else(|| Error::internal("proxy counter outside its connection's memory"))?;
    // SAFETY: p is 8-byte aligned inside `mem`, which outlives the returned borrow; the GPU
    // and this thread access it only with single 8-byte loads and stores.
    Ok(unsafe { &*(p as *const AtomicU64) })
}

/// The first 16 bytes of `step`'s slot as four words: an LL line's `{data, flag, data, flag}`,
/// for the traces and stall warnings that say where a step stopped.
pub(super) fn slot_words(mem: &HostMem, layout: ConnLayout, step: u64) -> [u32; 4] {
    let mut w = [0u32; 4];
    if mem.bytes < layout.total() {
        // The FIFO is in GPU memory: the host does not read it.
        return w;
    }
    if let Some(p) = mem
        .host_ptr(layout.slot(step))
        .filter(|_| layout.slot(step) + 16 <= mem.bytes)
    {
        for (k, v) in w.iter_mut().enumerate() {
            // SAFETY: 16 bytes at the slot's start lie inside `mem` (checked above) and slots
            // are 128-byte aligned; a racing network write makes the words stale, not unsound.
            *v = unsafe { std::ptr::read_volatile((p as *const u32).add(k)) };
        }
    }
    w
}
