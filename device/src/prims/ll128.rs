//! The LL128 protocol: a step's payload travels in 128-byte lines of 120 data bytes and an
//! 8-byte flag (the step + 1) at the line's end. Eight lanes of a warp write a line together,
//! 16 bytes each in one store instruction; NVLink delivers such a line whole, so a receiver
//! whose flag lane sees the flag has the data of the same line ([`arch::ll128_load`],
//! [`arch::ll128_store`]; the simulator makes lines whole with a lock). 94% of the bytes moved
//! are payload (LL: 50%), and no fence is needed (Simple: one per step). Flow control and step
//! numbers are shared with the other protocols, as in LL. A CTA runs it in whole warps.

use crate::abi::{LL128_LINE_BYTES, LL128_LINE_PAYLOAD};
use crate::arch::{self, Pack16};
use crate::ops::RedOp;
use crate::prims::copy::Move;
use crate::prims::ll::{load8, store8};
use crate::prims::packet::Fifo;
use crate::prims::Prims;
use crate::types::Elem;

const WARP: usize = 32;
/// Lanes writing one line (16 bytes each).
const LANES_PER_LINE: usize = 8;
/// Packs per line; the last one holds 8 data bytes and the flag.
const FLAG_PART: usize = LANES_PER_LINE - 1;

/// The flag of step `step`'s lines.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub fn flag(step: u64) -> u64 {
    step + 1
}

/// Up to 16 bytes at `p` (`avail` of them exist), zero-padded: one 16-byte load where `p` is
/// aligned for it (bypassing L1, as Simple's loads), else two halves ([`load8`]).
#[cfg_attr(target_arch = "nvptx64", inline(always))]
unsafe fn load16(p: *const u8, avail: usize) -> Pack16 {
    if avail >= 16 && (p as usize).is_multiple_of(16) {
        return arch::ld_pack(p as *const Pack16);
    }
    let lo = load8(p, avail);
    let hi = if avail > 8 {
        load8(p.add(8), avail - 8)
    } else {
        Pack16::default()
    };
    Pack16([lo.0[0], lo.0[1], hi.0[0], hi.0[1]])
}

/// The first `avail` (at most 16) bytes of `v` to `p`, as [`load16`] reads them.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
unsafe fn store16(p: *mut u8, avail: usize, v: Pack16) {
    if avail >= 16 && (p as usize).is_multiple_of(16) {
        return arch::st_pack(p as *mut Pack16, v);
    }
    store8(p, avail.min(8), v);
    if avail > 8 {
        store8(p.add(8), avail - 8, Pack16([v.0[2], v.0[3], 0, 0]));
    }
}

impl Prims {
    /// One LL128 step; the arguments are [`Prims::step`]'s. `n` elements must fit one LL128
    /// slot's payload, and the CTA must be whole warps (on the simulator, a CTA of fewer than
    /// 32 threads, a multiple of 8, is one narrow warp).
    #[cfg_attr(target_arch = "nvptx64", inline(always))]
    pub(super) unsafe fn step_ll128<T: Elem, O: RedOp<T>>(
        &mut self,
        op: &O,
        recv: bool,
        send: bool,
        mut mv: Move<T>,
        n: usize,
    ) {
        let (rlines, slines) = self.packet_begin(Fifo::Ll128, recv, send, &mut mv);
        let (rflag, sflag) = (flag(self.recv_step), flag(self.send_step));
        let nbytes = n * core::mem::size_of::<T>();
        let payload = LL128_LINE_PAYLOAD as usize;
        let packs_per_line = LL128_LINE_BYTES as usize / 16;
        let nlines = nbytes.div_ceil(payload);
        let (input, output) = (mv.input as *const u8, mv.output as *mut u8);
        let lanes = core::cmp::min(WARP, self.nthreads);
        let mask = if lanes == WARP {
            u32::MAX
        } else {
            (1u32 << lanes) - 1
        };
        let lines_per_warp = lanes / LANES_PER_LINE;
        // A warp's last group is padded with whole lines (no data, flag only; a slot holds a
        // multiple of 4 lines), so every load and store of lines is a whole warp's, as in
        // NCCL: on 4xH200 a partial last group saw stale data under a fresh flag (the forced
        // LL128 tests pass on 2 and 4 H200s since).
        let nlines_padded = nlines.next_multiple_of(lines_per_warp);
        let (warp, lane) = (self.tid / lanes, self.tid % lanes);
        let part = lane % LANES_PER_LINE;
        let nwarps = self.nthreads / lanes;
        // Warp-uniform: every lane of a warp runs the same iterations (votes need them all).
        let mut first = warp * lines_per_warp;
        while first < nlines {
            let line = first + lane / LANES_PER_LINE;
            let active = line < nlines_padded;
            let off = line * payload + part * 16;
            let width = if part == FLAG_PART { 8 } else { 16 };
            let avail = if active && off < nbytes {
                core::cmp::min(width, nbytes - off)
            } else {
                0
            };
            let r = if recv {
                let at = if active {
                    rlines.add(line * packs_per_line)
                } else {
                    core::ptr::null()
                };
                let mut got = Pack16::default();
                self.warp_wait(mask, || match arch::ll128_load(at, part, rflag) {
                    Some(v) => {
                        got = v;
                        true
                    }
                    None => false,
                });
                if part == FLAG_PART {
                    got.0[2] = 0;
                    got.0[3] = 0;
                }
                got
            } else {
                Pack16::default()
            };
            // The user's data after the line, as before. Loaded first, the forced LL128 test
            // failed in the kernel lab (ranks sharing one H200) at a step's last, partial line:
            // stale bytes under a fresh flag. Either a lane that diverged in the byte path
            // loads its part of the line apart from the flag's lane, or one GPU's L2 does not
            // serve a line being written whole (4-group trials with branch-free line accesses
            // failed there too: results/h200-lab-ll128-user-data.txt); NVLink can tell.
            let x = if input.is_null() || avail == 0 {
                Pack16::default()
            } else {
                load16(input.add(off), avail)
            };
            let mut v = mv.combine(op, r, x);
            if !output.is_null() && avail > 0 {
                store16(output.add(off), avail, v);
            }
            if send {
                // A select, not a branch: the line's lanes stay together up to the store.
                let is_flag = part == FLAG_PART;
                v.0[2] = if is_flag { sflag as u32 } else { v.0[2] };
                v.0[3] = if is_flag {
                    (sflag >> 32) as u32
                } else {
                    v.0[3]
                };
                let at = if active {
                    slines.add(line * packs_per_line)
                } else {
                    core::ptr::null_mut()
                };
                arch::ll128_store(at, part, v);
            }
            first += nwarps * lines_per_warp;
        }
        self.packet_end(recv, send, nlines_padded * LL128_LINE_BYTES as usize, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_packs_touch_only_their_bytes() {
        let src: [u8; 20] = core::array::from_fn(|i| i as u8 + 1);
        unsafe {
            let v = load16(src.as_ptr(), 11);
            assert_eq!(v.0, [0x0403_0201, 0x0807_0605, 0x000b_0a09, 0]);
            let mut dst = [0xaau8; 20];
            store16(dst.as_mut_ptr().add(2), 11, v);
            assert_eq!(&dst[..2], &[0xaa, 0xaa]);
            assert_eq!(&dst[2..13], &src[..11]);
            assert!(dst[13..].iter().all(|&b| b == 0xaa));
        }
        assert_eq!(flag(0), 1);
        assert_eq!(LL128_LINE_BYTES as usize, LANES_PER_LINE * 16);
        // Padding a step's lines to whole warps stays inside its slot.
        let slot_lines = crate::abi::LL128_SLOT_BYTES / LL128_LINE_BYTES;
        assert_eq!(slot_lines as usize % (WARP / LANES_PER_LINE), 0);
    }

    /// Every start alignment and length takes its path (one 16-byte access, or two 8-byte
    /// halves in 4-byte words or bytes): each reads exactly its bytes and writes exactly them.
    #[test]
    fn every_alignment_and_length_moves_exactly_its_bytes() {
        #[repr(C, align(16))]
        struct Buf([u8; 64]);
        let mut src = Buf([0; 64]);
        for (i, b) in src.0.iter_mut().enumerate() {
            *b = i as u8 + 1;
        }
        for start in 0..32 {
            for avail in 0..=16 {
                unsafe {
                    let v = load16(src.0.as_ptr().add(start), avail);
                    let bytes: [u8; 16] = core::mem::transmute(v.0);
                    for (k, &b) in bytes.iter().enumerate() {
                        let want = if k < avail { src.0[start + k] } else { 0 };
                        assert_eq!(b, want, "load start {start} avail {avail} byte {k}");
                    }
                    let mut dst = Buf([0xaa; 64]);
                    store16(dst.0.as_mut_ptr().add(start), avail, v);
                    for (k, &b) in dst.0.iter().enumerate() {
                        let mine = (start..start + avail).contains(&k);
                        let want = if mine { src.0[k] } else { 0xaa };
                        assert_eq!(b, want, "store start {start} avail {avail} byte {k}");
                    }
                }
            }
        }
    }
}
