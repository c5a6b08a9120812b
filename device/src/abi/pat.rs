//! PAT's device structures: where each CTA finds its connections to the ranks `2^k` away on
//! either side and its scratch (`coll::pat` runs them; `host/comm/pat.rs` makes them).

use super::Algo;

/// PAT (parallel aggregated trees): AllGather and ReduceScatter along binomial trees over
/// ranks `2^k` apart ([`CollArgs::pat`](super::CollArgs::pat)).
pub const ALGO_PAT: u32 = Algo::Pat as u32;

/// Most dimensions PAT connects: ranks up to `2^PAT_MAX_DIMS`.
pub const PAT_MAX_DIMS: usize = 16;

/// Dimensions PAT uses on `nranks` ranks: ceil(log2 nranks) (0 for one rank).
#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub const fn pat_dims(nranks: usize) -> usize {
    match nranks {
        0 | 1 => 0,
        n => (usize::BITS - (n - 1).leading_zeros()) as usize,
    }
}

/// One CTA's PAT connections, as device addresses of `ConnSend` / `ConnRecv` (0 where the
/// dimension is past the communicator's [`pat_dims`]). Dimension `k` joins this rank `r` with
/// ranks `r + 2^k` and `r - 2^k` (mod nranks): ReduceScatter sends up (to `r + 2^k`) and
/// receives from below; AllGather sends down (to `r - 2^k`) and receives from above.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PatDev {
    /// Bytes of one FIFO slot of every connection here.
    pub slot_bytes: u32,
    pub _pad: u32,
    /// ReduceScatter's partial sums for one piece of this CTA's slice: device memory of
    /// `scratch_bytes`, the same size on every rank.
    pub scratch: u64,
    pub scratch_bytes: u64,
    /// To `r + 2^k`, from `r - 2^k` (ReduceScatter).
    pub up_send: [u64; PAT_MAX_DIMS],
    pub up_recv: [u64; PAT_MAX_DIMS],
    /// To `r - 2^k`, from `r + 2^k` (AllGather).
    pub down_send: [u64; PAT_MAX_DIMS],
    pub down_recv: [u64; PAT_MAX_DIMS],
}

const _: () = {
    assert!(core::mem::size_of::<PatDev>() == 24 + 32 * PAT_MAX_DIMS);
    assert!(core::mem::align_of::<PatDev>() == 8);
};

#[cfg(test)]
mod tests {
    use super::pat_dims;

    #[test]
    fn dimensions_reach_every_rank() {
        let got = [1, 2, 3, 4, 5, 8, 9, 64, 65].map(pat_dims);
        assert_eq!(got, [0, 1, 2, 2, 3, 3, 4, 6, 7]);
    }
}
