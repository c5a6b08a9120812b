//! The LL (low-latency) protocol: a step's payload travels in 16-byte lines of
//! `{data0, flag, data1, flag}`, each written with ONE 16-byte store, the flags equal to the
//! step + 1 (a FIFO starts zeroed, so a flag is never 0). The receiver polls each of its lines
//! until both flags match, then uses the 8 payload bytes: no tail counter, no fence, no barrier
//! before the data moves. Flow control is Simple's: the receiver releases `head` after it has
//! consumed a step (of either protocol: the step numbers and the head counter are shared), and a
//! sender waits for it before writing a slot NCCL_STEPS steps ahead.

use crate::arch::{self, Pack16};
use crate::ops::RedOp;
use crate::prims::copy::Move;
use crate::prims::packet::Fifo;
use crate::prims::Prims;
use crate::types::Elem;

/// The flag of step `step`'s lines.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub fn flag(step: u64) -> u32 {
    (step + 1) as u32
}

/// Up to 8 bytes at `p` (`avail` of them exist) into the low half of a pack, zero-padded; a
/// short or unaligned line is read byte by byte so nothing past the buffer is touched.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub(crate) unsafe fn load8(p: *const u8, avail: usize) -> Pack16 {
    let mut v = Pack16::default();
    if avail >= 8 && (p as usize).is_multiple_of(4) {
        let w = p as *const u32;
        v.0[0] = core::ptr::read_volatile(w);
        v.0[1] = core::ptr::read_volatile(w.add(1));
    } else {
        let m = if avail < 8 { avail } else { 8 };
        let mut k = 0;
        while k < m {
            v.0[k / 4] |= (core::ptr::read_volatile(p.add(k)) as u32) << (8 * (k % 4));
            k += 1;
        }
    }
    v
}

/// The low 8 bytes of `v` to `p`, of which only `avail` exist.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub(crate) unsafe fn store8(p: *mut u8, avail: usize, v: Pack16) {
    if avail >= 8 && (p as usize).is_multiple_of(4) {
        let w = p as *mut u32;
        core::ptr::write_volatile(w, v.0[0]);
        core::ptr::write_volatile(w.add(1), v.0[1]);
    } else {
        let m = if avail < 8 { avail } else { 8 };
        let mut k = 0;
        while k < m {
            core::ptr::write_volatile(p.add(k), (v.0[k / 4] >> (8 * (k % 4))) as u8);
            k += 1;
        }
    }
}

impl Prims {
    /// One LL step; the arguments are [`Prims::step`]'s. `n` elements must fit one LL slot
    /// (`LL_SLOT_BYTES / 2` payload bytes).
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub(super) unsafe fn step_ll<T: Elem, O: RedOp<T>>(
        &mut self,
        op: &O,
        recv: bool,
        send: bool,
        mut mv: Move<T>,
        n: usize,
    ) {
        let (rlines, slines) = self.packet_begin(Fifo::Ll, recv, send, &mut mv);
        let (rflag, sflag) = (flag(self.recv_step), flag(self.send_step));
        let nbytes = n * core::mem::size_of::<T>();
        let nlines = nbytes.div_ceil(8);
        let (input, output) = (mv.input as *const u8, mv.output as *mut u8);
        let mut i = self.tid;
        while i < nlines {
            let avail = nbytes - i * 8;
            let r = if recv {
                let line = rlines.add(i);
                let mut v = Pack16::default();
                self.wait(|| {
                    v = arch::ld_volatile_pack(line);
                    v.0[1] == rflag && v.0[3] == rflag
                });
                Pack16([v.0[0], v.0[2], 0, 0])
            } else {
                Pack16::default()
            };
            let x = if input.is_null() {
                Pack16::default()
            } else {
                load8(input.add(i * 8), avail)
            };
            let v = mv.combine(op, r, x);
            if !output.is_null() {
                store8(output.add(i * 8), avail, v);
            }
            if send {
                // Volatile (as NCCL): the line leaves at once for the peer polling it.
                arch::st_volatile_pack(slines.add(i), Pack16([v.0[0], sflag, v.0[1], sflag]));
            }
            i += self.nthreads;
        }
        self.packet_end(recv, send, nlines * 16, true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_lines_touch_only_their_bytes() {
        let src = [1u8, 2, 3, 4, 5, 6, 7, 8, 9];
        unsafe {
            let v = load8(src.as_ptr().add(1), 3);
            assert_eq!(v.0, [0x0004_0302, 0, 0, 0]);
            let v = load8(src.as_ptr(), 8);
            assert_eq!(v.0, [0x0403_0201, 0x0807_0605, 0, 0]);
            let mut dst = [0xaau8; 9];
            store8(dst.as_mut_ptr().add(1), 5, v);
            assert_eq!(dst, [0xaa, 1, 2, 3, 4, 5, 0xaa, 0xaa, 0xaa]);
        }
        assert_eq!(flag(0), 1);
    }
}
