//! `ncclCommGetUniqueId` and `ncclCommGrow` (NCCL 2.29): a communicator of `n` ranks becomes
//! one of `m > n` (a new communicator; the old one stays as it is, to be destroyed apart).
//!
//! 1. One rank of the old communicator (the root) asks it for a grow id
//!    ([`Comm::grow_unique_id`]): a fresh bootstrap root on this host. The user hands the id
//!    to the new ranks, as for `ncclCommInitRank`.
//! 2. Every old rank calls [`Comm::grow`] (the root with the id, the others with none): over
//!    the old communicator's bootstrap they learn the root's id (exactly one rank must hold
//!    one), then each joins the new communicator with its old rank.
//! 3. Every new rank joins with the id and its rank (`n..m`), as `ncclCommInitRankConfig`
//!    does (in the C ABI, `ncclCommGrow` with a NULL communicator).

use super::turns::Ticket;
use super::{Comm, Config, Launch, PendingComm, ResolvedConfig};
use crate::bootstrap::{new_root_id, AbortFlag, UniqueId, UNIQUE_ID_BYTES};
use crate::error::{Error, Result};
use std::sync::Arc;

impl Comm {
    /// `ncclCommGetUniqueId`: a grow id for this communicator (see the module's text): a new
    /// bootstrap root listening on this host. Called on one rank; not collective. Refused
    /// while NCCL_COMM_ID is set (its fixed address is for the first communicator), as NCCL
    /// does.
    pub fn grow_unique_id(&self) -> Result<UniqueId> {
        self.check_usable()?;
        if crate::env::COMM_ID
            .raw()
            .is_some_and(|v| !v.trim().is_empty())
        {
            return Err(Error::invalid_usage(
                "ncclCommGetUniqueId: NCCL_COMM_ID is set; a grow needs an id of its own (unset \
                 it)",
            ));
        }
        new_root_id().map_err(|e| e.context("ncclCommGetUniqueId"))
    }

    /// `ncclCommGrow` on a rank of this communicator: every rank calls it, the root (the
    /// rank that made the id) with `Some(id)`, the others with None; returns this rank's
    /// communicator of `nranks` ranks (more than this one's), in which it keeps its rank.
    /// `config` None inherits this communicator's options.
    pub fn grow(
        &self,
        nranks: usize,
        id: Option<&UniqueId>,
        config: Option<&Config>,
    ) -> Result<Comm> {
        self.check_grow(nranks)?;
        let prepared = self.grow_config(config);
        let turn = self.split_turns.ticket();
        self.grow_with((nranks, id), prepared, &AbortFlag::new(), turn)
    }

    /// [`Comm::grow`] that honours the new communicator's `blocking` option, as
    /// [`Comm::start_split`].
    pub fn start_grow(
        parent: &Arc<Comm>,
        nranks: usize,
        id: Option<&UniqueId>,
        config: Option<&Config>,
    ) -> Result<PendingComm> {
        parent.check_grow(nranks)?;
        let prepared = parent.grow_config(config);
        let blocking = prepared.as_ref().map_or(true, |c| c.blocking);
        let launch = Launch::for_blocking(blocking);
        // The job may run on another thread, which the library orders itself.
        let p = super::Shared(parent.clone());
        let id = id.copied();
        let turn = parent.split_turns.ticket();
        PendingComm::start(launch, move |abort| {
            p.grow_with((nranks, id.as_ref()), prepared, abort, turn)
        })
    }

    /// The checks a grow fails at once, as NCCL's do, before any rank waits for another: the
    /// parent is usable and the new size larger (every rank that passes the same size fails
    /// alike).
    fn check_grow(&self, nranks: usize) -> Result<()> {
        self.check_usable()?;
        if nranks <= self.nranks {
            return Err(Error::invalid_argument(format!(
                "ncclCommGrow: nRanks {nranks} is not more than the communicator's {} ranks",
                self.nranks
            )));
        }
        Ok(())
    }

    /// The new communicator's options. A failure is told to the other ranks before it is
    /// returned ([`Comm::grow_with`]), so that none waits for this one.
    fn grow_config(&self, config: Option<&Config>) -> Result<ResolvedConfig> {
        config
            .cloned()
            .unwrap_or_default()
            .resolve(Some(&self.config))
    }

    /// In this communicator's order of splits (`turn`), every old rank tells the others
    /// whether its checks passed, the size it asks for and the id it holds (the root's): all
    /// fail alike unless every rank passed, asked the same size and exactly one held the id.
    /// Then this rank joins the new communicator.
    fn grow_with(
        &self,
        (nranks, id): (usize, Option<&UniqueId>),
        prepared: Result<ResolvedConfig>,
        abort: &AbortFlag,
        turn: Ticket,
    ) -> Result<Comm> {
        turn.wait(abort)?;
        let mut mine = vec![prepared.is_ok() as u8];
        mine.extend((nranks as u64).to_le_bytes());
        mine.extend(id.map(|i| i.internal.to_vec()).unwrap_or_default());
        let all = self
            .bootstrap
            .allgather(&mine)
            .map_err(|e| e.context("ncclCommGrow"));
        drop(turn);
        let config = prepared?;
        let all = all?;
        if let Some(r) = (0..all.len()).find(|&r| all[r].first() != Some(&1)) {
            return Err(Error::invalid_usage(format!(
                "ncclCommGrow: rank {r} could not grow (its own call says why)"
            )));
        }
        if let Some(r) = (0..all.len()).find(|&r| all[r].get(1..9) != mine.get(1..9)) {
            return Err(Error::invalid_argument(format!(
                "ncclCommGrow: rank {r} asked for another size than this rank's {nranks}"
            )));
        }
        let held: Vec<usize> = (0..all.len()).filter(|&r| all[r].len() > 9).collect();
        let root = match held[..] {
            [r] => r,
            [] => {
                return Err(Error::invalid_usage(
                    "ncclCommGrow: no rank passed the id of ncclCommGetUniqueId (its caller \
                     must)",
                ))
            }
            _ => {
                return Err(Error::invalid_usage(format!(
                    "ncclCommGrow: ranks {held:?} each passed an id; only the rank that called \
                     ncclCommGetUniqueId passes it"
                )))
            }
        };
        let internal = <[u8; UNIQUE_ID_BYTES]>::try_from(&all[root][9..])
            .map_err(|_| Error::remote(format!("ncclCommGrow: rank {root} sent a malformed id")))?;
        let id = UniqueId { internal };
        Comm::create(
            self.device.clone(),
            nranks,
            std::slice::from_ref(&id),
            self.rank,
            config,
            abort,
        )
    }
}
