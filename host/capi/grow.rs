//! `ncclCommGetUniqueId` and `ncclCommGrow` (NCCL 2.29) in the C ABI (`comm/grow.rs`).

use super::*;

export! {
    /// `ncclCommGetUniqueId`: a grow id for `comm`, made by one rank (the root), which hands
    /// it to the new ranks.
    fn ncclCommGetUniqueId / pncclCommGetUniqueId(comm: NcclComm, unique_id: *mut UniqueId) {
        let out = unique_id.as_mut().ok_or_else(|| null("uniqueId"))?;
        *out = handle(comm)?.ready()?.0.grow_unique_id()?;
        Ok(NcclResult::Success)
    }
}

export! {
    /// `ncclCommGrow`: with `comm`, a rank of the communicator that grows (`rank` -1; the
    /// root passes its id, the others NULL) keeps its rank in `*newcomm`; with `comm` NULL, a
    /// new rank joins with the id and its `rank` (from the old size up). Every rank calls it.
    /// `config` NULL: the old communicator's options (a new rank: the defaults).
    fn ncclCommGrow / pncclCommGrow(
        comm: NcclComm,
        n_ranks: c_int,
        unique_id: *const UniqueId,
        rank: c_int,
        newcomm: *mut NcclComm,
        config: *const NcclConfig,
    ) {
        let slot = newcomm.as_mut().ok_or_else(|| null("newcomm"))?;
        *slot = std::ptr::null_mut();
        if n_ranks <= 0 {
            return Err(Error::invalid_argument(format!(
                "ncclCommGrow: nRanks {n_ranks} is not positive"
            )));
        }
        let id = unique_id.as_ref().copied();
        if comm.is_null() {
            let id = id.ok_or_else(|| null("uniqueId (a new rank needs the grow id)"))?;
            if !(0..n_ranks).contains(&rank) {
                return Err(Error::invalid_argument(format!(
                    "ncclCommGrow: a new rank's rank {rank} is not in 0..{n_ranks}"
                )));
            }
            return init_scalable(newcomm, n_ranks, rank, vec![id], config);
        }
        if rank != -1 {
            return Err(Error::invalid_argument(format!(
                "ncclCommGrow: rank {rank} from a rank of the growing communicator (it keeps \
                 its own: pass -1)"
            )));
        }
        let parent = handle(comm)?.ready()?;
        let (cfg, blocking) = child_config(config, &parent)?;
        let n = count_of("nRanks", n_ranks)?;
        let pending = Comm::start_grow(&parent.0, n, id.as_ref(), cfg.as_ref())?;
        hand_out(newcomm, pending, blocking)
    }
}
