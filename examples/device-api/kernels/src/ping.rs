//! Timing puts between two ranks: rank 0 puts `puts` blocks of `bytes` into rank 1's window
//! (each with a [`DATA`] signal); rank 1, once all arrived, puts 8 bytes back with an [`ACK`]
//! signal; rank 0's kernel ends when the ack arrived. One `bytes = 8, puts = 1` launch is a
//! round trip; a large one measures bandwidth. Other ranks do nothing.

use nccl_device::api::{DevComm, Window};
use nccl_device::kernel;

pub const DATA: u32 = 0;
pub const ACK: u32 = 1;

#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Ping {
    pub comm: DevComm,
    /// At least `bytes` on every rank.
    pub win: Window,
    /// `bytes` of this GPU's memory.
    pub src: u64,
    pub bytes: u64,
    pub puts: u32,
    /// Signals only grow: rank 1's [`DATA`] total once this launch's puts arrived, and rank
    /// 0's [`ACK`] total once its ack did (the launch's number).
    pub data_total: u64,
    pub acks: u64,
}

kernel!(
    /// The puts and the ack; one CTA.
    pub PING = ping(Ping);
);

/// # Safety
/// The argument's memory lives until the stream passed the kernel; ranks 0 and 1 launch it
/// alike, with one CTA, with the same totals.
unsafe fn ping(a: &Ping) {
    let c = &a.comm;
    let src = a.src as *const u8;
    let done = match c.rank {
        0 => (|| {
            for _ in 0..a.puts {
                c.put(a.win.at(1, 0), src, a.bytes as usize, Some(DATA), None)?;
            }
            c.wait_signal(ACK, a.acks)
        })(),
        1 => (|| {
            c.wait_signal(DATA, a.data_total)?;
            c.put(a.win.at(0, 0), src, 8, Some(ACK), None)
        })(),
        _ => Ok(()),
    };
    if done.is_ok() {
        let _ = c.flush();
    }
}
