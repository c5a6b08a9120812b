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
        let resolved = self.prepare_grow(nranks, config)?;
        self.grow_with(nranks, id, resolved, &AbortFlag::new())
    }

    /// [`Comm::grow`] that honours the new communicator's `blocking` option, as
    /// [`Comm::start_split`].
    pub fn start_grow(
        parent: &Arc<Comm>,
        nranks: usize,
        id: Option<&UniqueId>,
        config: Option<&Config>,
    ) -> Result<PendingComm> {
        let resolved = parent.prepare_grow(nranks, config)?;
        let launch = Launch::for_blocking(resolved.blocking);
        // The job may run on another thread, which the library orders itself.
        let p = super::Shared(parent.clone());
        let id = id.copied();
        PendingComm::start(launch, move |abort| {
            p.grow_with(nranks, id.as_ref(), resolved, abort)
        })
    }

    /// The checks of a grow before any rank communicates: the parent is usable and the new
    /// size is larger. Every old rank fails here alike (they share the parent's size).
    fn prepare_grow(&self, nranks: usize, config: Option<&Config>) -> Result<ResolvedConfig> {
        self.check_usable()?;
        if nranks <= self.nranks {
            return Err(Error::invalid_argument(format!(
                "ncclCommGrow: nRanks {nranks} is not more than the communicator's {} ranks",
                self.nranks
            )));
        }
        config
            .cloned()
            .unwrap_or_default()
            .resolve(Some(&self.config))
    }

    /// The root's id, learned by every old rank over this communicator's bootstrap, then this
    /// rank's place in the new communicator.
    fn grow_with(
        &self,
        nranks: usize,
        id: Option<&UniqueId>,
        config: ResolvedConfig,
        abort: &AbortFlag,
    ) -> Result<Comm> {
        let mine = id.map(|i| i.internal.to_vec()).unwrap_or_default();
        let all = self
            .bootstrap
            .allgather(&mine)
            .map_err(|e| e.context("ncclCommGrow"))?;
        let held: Vec<usize> = (0..all.len()).filter(|&r| !all[r].is_empty()).collect();
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
        let internal = <[u8; UNIQUE_ID_BYTES]>::try_from(all[root].as_slice())
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
