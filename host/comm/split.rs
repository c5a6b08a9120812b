//! `ncclCommSplit`: the parent's ranks agree over the parent's bootstrap on who goes where,
//! then each child is created with a fresh root started by its rank 0. `ncclCommShrink`
//! (NCCL 2.27) is a split that the excluded ranks take no part in.

use super::group_scope;
use super::turns::Ticket;
use super::{Comm, Config, Launch, PendingComm, ResolvedConfig, SPLIT_NOCOLOR};
use crate::bootstrap::{new_root_id, AbortFlag, UniqueId, UNIQUE_ID_BYTES};
use crate::error::{Error, Result};
use std::sync::Arc;

/// Where one rank lands: its rank and size in the child, and the child's id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Placement {
    rank: usize,
    nranks: usize,
    id: UniqueId,
}

/// The parent ranks of `color`'s child, in child rank order: by key, then by parent rank.
pub(crate) fn members(all: &[(i32, i32)], color: i32) -> Vec<usize> {
    let mut m: Vec<usize> = (0..all.len()).filter(|&r| all[r].0 == color).collect();
    m.sort_by_key(|&r| (all[r].1, r));
    m
}

fn decode_pair(r: usize, b: &[u8]) -> Result<(i32, i32)> {
    let bad = || Error::remote(format!("split: rank {r} sent a malformed color/key record"));
    let color = i32::from_le_bytes(b.get(0..4).ok_or_else(bad)?.try_into().map_err(|_| bad())?);
    let key = i32::from_le_bytes(b.get(4..8).ok_or_else(bad)?.try_into().map_err(|_| bad())?);
    if b.len() != 8 {
        return Err(bad());
    }
    Ok((color, key))
}

impl Comm {
    /// Agrees with the other ranks of `self` on the children: two allgathers on the parent's
    /// bootstrap (color and key, then each child's id from its rank 0). A rank with an invalid
    /// color takes part as NCCL_SPLIT_NOCOLOR, so the others do not wait for it, and then fails.
    fn split_placement(&self, color: i32, key: i32) -> Result<Option<Placement>> {
        self.check_parent()?;
        let invalid = color < 0 && color != SPLIT_NOCOLOR;
        let mine = if invalid { SPLIT_NOCOLOR } else { color };
        let mut rec = mine.to_le_bytes().to_vec();
        rec.extend_from_slice(&key.to_le_bytes());
        let gathered = self
            .bootstrap
            .allgather(&rec)
            .map_err(|e| e.context("split"))?;
        let all: Vec<(i32, i32)> = gathered
            .iter()
            .enumerate()
            .map(|(r, b)| decode_pair(r, b))
            .collect::<Result<_>>()?;
        let any_child = all.iter().any(|&(c, _)| c >= 0);
        let group = if mine >= 0 {
            members(&all, mine)
        } else {
            Vec::new()
        };
        let leader = group.first() == Some(&self.rank);
        let mut made_root: Option<Error> = None;
        let ids = if any_child {
            let contribution = if leader {
                match new_root_id() {
                    Ok(id) => id.internal.to_vec(),
                    Err(e) => {
                        made_root = Some(e);
                        vec![0] // tells the members their child has no root
                    }
                }
            } else {
                Vec::new()
            };
            self.bootstrap
                .allgather(&contribution)
                .map_err(|e| e.context("split"))?
        } else {
            Vec::new()
        };
        if invalid {
            return Err(Error::invalid_argument(format!(
                "split: color {color} is negative and not NCCL_SPLIT_NOCOLOR ({SPLIT_NOCOLOR})"
            )));
        }
        if let Some(e) = made_root {
            return Err(e.context("split: starting the child's root"));
        }
        let Some(&first) = group.first() else {
            return Ok(None);
        };
        let bytes = ids.get(first).map(Vec::as_slice).unwrap_or_default();
        let Ok(internal) = <[u8; UNIQUE_ID_BYTES]>::try_from(bytes) else {
            return Err(Error::remote(format!(
                "split: rank {first}, first of color {color}, could not start the child's root"
            )));
        };
        let rank = group
            .iter()
            .position(|&r| r == self.rank)
            .ok_or_else(|| Error::internal("split: this rank is missing from its own color"))?;
        Ok(Some(Placement {
            rank,
            nranks: group.len(),
            id: UniqueId { internal },
        }))
    }

    /// The child this rank was placed in, on the parent's device, honouring `abort`.
    fn create_child(
        &self,
        p: Placement,
        config: ResolvedConfig,
        abort: &AbortFlag,
    ) -> Result<Comm> {
        let id = std::slice::from_ref(&p.id);
        Comm::create(self.device.clone(), p.nranks, id, p.rank, config, abort)
    }

    /// The whole split for one rank, honouring `abort` in the child's creation. The agreement
    /// runs in `turn`'s turn; the child is created after it.
    pub(crate) fn split_with(
        &self,
        color: i32,
        key: i32,
        config: ResolvedConfig,
        abort: &AbortFlag,
        turn: Ticket,
    ) -> Result<Option<Comm>> {
        turn.wait(abort)?;
        let placement = self.split_placement(color, key);
        drop(turn);
        match placement? {
            None => Ok(None),
            Some(p) => self.create_child(p, config, abort).map(Some),
        }
    }

    /// `ncclCommSplit`: every rank of this communicator calls it; ranks with the same `color`
    /// form a new communicator, ordered by `key` then by their rank here, on the same device.
    /// `SPLIT_NOCOLOR` (-1) joins none (Ok(None)). `config` None inherits this communicator's
    /// options; unset fields of a given config inherit too. Blocks until the child is ready.
    pub fn split(&self, color: i32, key: i32, config: Option<&Config>) -> Result<Option<Comm>> {
        let resolved = match config {
            Some(c) => c.resolve(Some(&self.config))?,
            None => Config::default().resolve(Some(&self.config))?,
        };
        let turn = self.split_turns.ticket();
        self.split_with(color, key, resolved, &AbortFlag::new(), turn)
    }
}

impl Comm {
    /// `ncclCommSplit` that honours the child's `blocking` option and groups, as
    /// [`Comm::start_init_rank_config_on`]. A rank that joins no child (NOCOLOR) gets None; its
    /// part of the agreement still runs (now, at the group's end, or in the background).
    pub fn start_split(
        parent: &Arc<Comm>,
        color: i32,
        key: i32,
        config: Option<&Config>,
    ) -> Result<Option<PendingComm>> {
        parent.check_parent()?;
        let resolved = config
            .cloned()
            .unwrap_or_default()
            .resolve(Some(&parent.config))?;
        let launch = Launch::for_blocking(resolved.blocking);
        // The job may run on another thread, which the library orders itself.
        let p = super::Shared(parent.clone());
        let turn = parent.split_turns.ticket();
        if color < 0 {
            let job = move || {
                p.split_with(color, key, resolved, &AbortFlag::new(), turn)
                    .map(|_| ())
            };
            match launch {
                Launch::Blocking if group_scope::depth() > 0 => {
                    group_scope::parallel(Box::new(job))?
                }
                Launch::Blocking => job()?,
                Launch::Background => {
                    std::thread::Builder::new()
                        .name("nccl-comm-split".into())
                        .spawn(move || {
                            if let Err(e) = job() {
                                log::warn!("split without color: {e}");
                            }
                        })
                        .map_err(|e| Error::system(format!("cannot start a split thread: {e}")))?;
                }
            }
            return Ok(None);
        }
        PendingComm::start(launch, move |abort| {
            p.split_with(color, key, resolved, abort, turn)?
                .ok_or_else(|| Error::internal("split: no child for a valid color"))
        })
        .map(Some)
    }
}

/// `NCCL_SHRINK_DEFAULT`: shrink a healthy parent; its operations go on.
pub const SHRINK_DEFAULT: i32 = 0;
/// `NCCL_SHRINK_ABORT`: first stop the parent's operations (a peer may be dead), then shrink.
pub const SHRINK_ABORT: i32 = 1;

/// Bootstrap tag of the child's id, sent by the first survivor of a shrink to the others.
const TAG_SHRINK_ID: u32 = 0x5348_524b;

/// The parent ranks that remain after excluding `exclude` (checked: in range, no repeats, not
/// `me`, who is calling), in parent rank order: the child's ranks.
fn survivors(nranks: usize, me: usize, exclude: &[usize]) -> Result<Vec<usize>> {
    let mut out = vec![true; nranks];
    for &r in exclude {
        if r >= nranks {
            return Err(Error::invalid_argument(format!(
                "shrink: excluded rank {r} is out of range (nranks {nranks})"
            )));
        }
        if !out[r] {
            return Err(Error::invalid_argument(format!(
                "shrink: rank {r} is excluded twice"
            )));
        }
        out[r] = false;
    }
    if !out[me] {
        return Err(Error::invalid_argument(format!(
            "shrink: rank {me} excludes itself (excluded ranks do not call ncclCommShrink)"
        )));
    }
    Ok((0..nranks).filter(|&r| out[r]).collect())
}

impl Comm {
    /// Where this rank lands in the shrunk child. Only the survivors take part: the first
    /// starts the child's root and sends its id to each other one over the parent's
    /// bootstrap, so nothing waits on an excluded (perhaps dead) rank.
    fn shrink_placement(&self, group: &[usize]) -> Result<Placement> {
        let leader = group[0];
        let internal = if leader == self.rank {
            let made = new_root_id();
            // An empty message tells the others that their child has no root.
            let msg = made
                .as_ref()
                .map(|id| id.internal.to_vec())
                .unwrap_or_default();
            for &r in &group[1..] {
                self.bootstrap
                    .send(r, TAG_SHRINK_ID, &msg)
                    .map_err(|e| e.context("shrink"))?;
            }
            made.map_err(|e| e.context("shrink: starting the child's root"))?
                .internal
        } else {
            let msg = self
                .bootstrap
                .recv(leader, TAG_SHRINK_ID)
                .map_err(|e| e.context("shrink"))?;
            <[u8; UNIQUE_ID_BYTES]>::try_from(msg.as_slice()).map_err(|_| {
                Error::remote(format!(
                    "shrink: rank {leader}, the first remaining rank, could not start the child's root"
                ))
            })?
        };
        let rank = group
            .iter()
            .position(|&r| r == self.rank)
            .ok_or_else(|| Error::internal("shrink: this rank is missing from the survivors"))?;
        Ok(Placement {
            rank,
            nranks: group.len(),
            id: UniqueId { internal },
        })
    }

    /// The whole shrink for one rank, honouring `abort` in the child's creation.
    fn shrink_with(
        &self,
        group: &[usize],
        config: ResolvedConfig,
        abort: &AbortFlag,
        turn: Ticket,
    ) -> Result<Comm> {
        turn.wait(abort)?;
        let placement = self.shrink_placement(group);
        drop(turn);
        self.create_child(placement?, config, abort)
    }

    /// The checks and the parent's part of a shrink, before the child is made: the flags and
    /// the exclude list are valid, the parent's operations are stopped (`SHRINK_ABORT`) or it
    /// is usable (`SHRINK_DEFAULT`); returns the child's ranks (as parent ranks) and options.
    fn prepare_shrink(
        &self,
        exclude: &[usize],
        config: Option<&Config>,
        flags: i32,
    ) -> Result<(Vec<usize>, ResolvedConfig)> {
        if flags != SHRINK_DEFAULT && flags != SHRINK_ABORT {
            return Err(Error::invalid_argument(format!(
                "shrink: flags {flags:#x} are neither NCCL_SHRINK_DEFAULT (0) nor NCCL_SHRINK_ABORT (1)"
            )));
        }
        let group = survivors(self.nranks, self.rank, exclude)?;
        if flags == SHRINK_ABORT {
            self.stop_operations();
        } else {
            self.check_parent()?;
        }
        let resolved = config
            .cloned()
            .unwrap_or_default()
            .resolve(Some(&self.config))?;
        Ok((group, resolved))
    }

    /// `ncclCommShrink`: every rank of this communicator but those in `exclude` calls it; they
    /// form a new communicator, ranked in their order here, on the same device. `flags`
    /// [`SHRINK_ABORT`] first stops this communicator's operations in flight (kernels waiting
    /// on an excluded peer return) and leaves it usable only for destroy or abort;
    /// [`SHRINK_DEFAULT`] leaves it as it was. `config` None inherits this communicator's
    /// options. Blocks until the child is ready.
    pub fn shrink(&self, exclude: &[usize], config: Option<&Config>, flags: i32) -> Result<Comm> {
        let (group, resolved) = self.prepare_shrink(exclude, config, flags)?;
        let turn = self.split_turns.ticket();
        self.shrink_with(&group, resolved, &AbortFlag::new(), turn)
    }

    /// [`Comm::shrink`] that honours the child's `blocking` option and groups, as
    /// [`Comm::start_split`].
    pub fn start_shrink(
        parent: &Arc<Comm>,
        exclude: &[usize],
        config: Option<&Config>,
        flags: i32,
    ) -> Result<PendingComm> {
        let (group, resolved) = parent.prepare_shrink(exclude, config, flags)?;
        let launch = Launch::for_blocking(resolved.blocking);
        // The job may run on another thread, which the library orders itself.
        let p = super::Shared(parent.clone());
        let turn = parent.split_turns.ticket();
        PendingComm::start(launch, move |abort| {
            p.shrink_with(&group, resolved, abort, turn)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_sort_by_key_then_rank() {
        let all = [(0, 5), (1, 0), (0, 1), (0, 5), (-1, 0), (1, -3)];
        assert_eq!(members(&all, 0), vec![2, 0, 3]);
        assert_eq!(members(&all, 1), vec![5, 1]);
        assert!(members(&all, 2).is_empty());
        assert!(decode_pair(0, &[0; 7]).is_err());
        assert_eq!(decode_pair(0, &[1, 0, 0, 0, 2, 0, 0, 0]).unwrap(), (1, 2));
    }
}
