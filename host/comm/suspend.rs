//! `ncclCommSuspend` / `ncclCommResume` (NCCL 2.29): an idle communicator gives back the
//! device memory of its connections and takes it again later, every address unchanged (see
//! `transport/suspend.rs` for which memory and how). Both are collective over the
//! communicator, and every step whose outcome may differ between ranks ends in an exchange of
//! outcomes, so that the ranks go on or stop together and none waits for a rank that gave up:
//! suspend waits for this rank's operations, agrees that every rank can go on, releases, and
//! agrees that every rank did; resume restores this rank's blocks and hands the peers in other
//! processes the new exports of those they map (one exchange), maps the peers' (and agrees
//! that every rank did). In between, every operation is `ncclInvalidUsage`; destroy and abort
//! still work. A failure after memory was touched leaves the communicator good only for those.

use super::*;
use crate::transport::suspend;

/// `NCCL_SUSPEND_MEM`: release the connections' device memory.
pub const SUSPEND_MEM: u32 = 0x01;

impl Comm {
    /// `ncclCommSuspend(comm, flags)`: with [`SUSPEND_MEM`] in `flags`, releases the device
    /// memory of this communicator's connections (a copy of it waits in host memory) until
    /// [`Comm::resume`]; without it, does nothing (other bits are ignored, as NCCL does).
    /// Every rank must call it, outside any group. Refused, on every rank alike, where some
    /// rank's `NCCL_CUMEM_ENABLE=0` kept its memory plain or some rank's work failed; refused
    /// on a communicator suspended already, revoked or aborted.
    pub fn suspend(&self, flags: u32) -> Result<()> {
        self.check_usable()?;
        if flags & SUSPEND_MEM == 0 {
            return Ok(());
        }
        self.outside_groups("ncclCommSuspend")?;
        let at = |e: Error| e.context(format!("rank {}: ncclCommSuspend", self.rank));
        let ready = if self.suspendable.enabled() {
            self.flush().and_then(|()| self.raised_error())
        } else {
            Err(Error::invalid_usage(
                "NCCL_CUMEM_ENABLE=0 (or NCCL_RS_VMM_IPC=0) keeps the connections' memory \
                 plain, which cannot be released at a kept address",
            ))
        };
        // No rank releases what a peer's kernel may still be writing into.
        self.agree(ready).map_err(at)?;
        let before = self.suspendable.bytes();
        let released = self.suspendable.suspend(&self.device);
        self.agree(released).map_err(|e| {
            self.suspendable.break_down();
            at(e)
        })?;
        log::info!(
            target: crate::debug::INIT,
            "ncclCommSuspend: rank {} released {} KiB of connection memory",
            self.rank,
            before / 1024
        );
        Ok(())
    }

    /// `ncclCommResume`: takes the memory [`Comm::suspend`] released again, with its contents,
    /// at the same addresses (graphs captured before replay as they did). Every rank must call
    /// it, outside any group; refused where the communicator is not suspended.
    pub fn resume(&self) -> Result<()> {
        match self.suspendable.phase() {
            suspend::Phase::Suspended => {}
            suspend::Phase::Active => {
                return Err(Error::invalid_usage(
                    "ncclCommResume: the communicator is not suspended",
                ))
            }
            suspend::Phase::Broken => return self.check_usable(),
        }
        if self.is_revoked() || self.aborted.load(Ordering::Acquire) {
            return Err(Error::invalid_usage(
                "ncclCommResume: the communicator was revoked or aborted",
            ));
        }
        self.outside_groups("ncclCommResume")?;
        let at = |e: Error| {
            self.suspendable.break_down();
            e.context(format!("rank {}: ncclCommResume", self.rank))
        };
        // One exchange carries each rank's outcome and, where it restored, its new exports.
        let restored = self.suspendable.restore_own(&self.device);
        let mine = match &restored {
            Ok(list) => [&[0u8][..], &suspend::encode(list)].concat(),
            Err(e) => [&[1u8][..], e.message.as_bytes()].concat(),
        };
        let all = self.bootstrap.allgather(&mine).map_err(at)?;
        restored.map_err(at)?;
        let by_rank = all
            .iter()
            .enumerate()
            .map(|(r, b)| match b.split_first() {
                Some((0, list)) => suspend::decode(list),
                _ => Err(peer_failed(r, b)),
            })
            .collect::<Result<Vec<_>>>()
            .map_err(at)?;
        let remapped = self.suspendable.remap_peers(&self.device, &by_rank);
        // Every rank maps its peers' memory again before any launches into it.
        self.agree(remapped).map_err(at)
    }

    /// Whether [`Comm::suspend`] released this communicator's memory (not resumed since).
    pub fn is_suspended(&self) -> bool {
        self.suspendable.phase() == suspend::Phase::Suspended
    }

    /// Bytes of device memory [`Comm::suspend`] releases (`ncclStatGpuMemSuspend`); the rest
    /// of [`Comm::device_memory`] stays while suspended.
    pub fn suspendable_memory(&self) -> usize {
        self.suspendable.bytes()
    }

    /// Refuses `what` inside a group: the operations queued in it would be launched at its
    /// end, after the memory they use was released.
    fn outside_groups(&self, what: &str) -> Result<()> {
        match group_scope::depth() {
            0 => Ok(()),
            _ => Err(Error::invalid_usage(format!(
                "{what} inside ncclGroupStart/ncclGroupEnd: call it outside any group"
            ))),
        }
    }

    /// Every rank's outcome of a step: this rank's error, else the first other rank's (as a
    /// remote error), else success, alike on every rank.
    fn agree(&self, mine: Result<()>) -> Result<()> {
        let word = match &mine {
            Ok(()) => vec![0u8],
            Err(e) => [&[1u8][..], e.message.as_bytes()].concat(),
        };
        let all = self.bootstrap.allgather(&word)?;
        mine?;
        match all.iter().enumerate().find(|(_, b)| b.first() != Some(&0)) {
            Some((r, b)) => Err(peer_failed(r, b)),
            None => Ok(()),
        }
    }
}

/// Rank `r` reported a failure (`b`: a 1 byte, then its message).
fn peer_failed(r: usize, b: &[u8]) -> Error {
    let why = String::from_utf8_lossy(b.get(1..).unwrap_or_default());
    Error::remote(format!("rank {r} could not go on: {why}"))
}
