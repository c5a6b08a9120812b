//! Pairwise keys: what rank j shows when it greets rank i, known only to i, j and whoever drew
//! the secret they come from (the bootstrap root, trusted).
//!
//! The root draws a 128-bit secret from the OS when it starts, and hands rank i, with the
//! address table, the key of every pair (i, j): SipHash-2-4 of (min(i, j), max(i, j)) under
//! that secret. The key of a pair is the same from both ends, so j greets i with the key i
//! expects from j; a third member m holds only the keys of pairs (m, *), and SipHash, a
//! pseudo-random function, does not let it work out any other from them.
//!
//! With several roots (`ncclCommInitRankScalable`) a pair in one block gets its key from that
//! block's root, and a pair that root 0 serves (block 0 and the first rank of every block)
//! from root 0. A pair across two other blocks gets one derived from a secret of those two
//! blocks ([`block_pair_secret`]), which rank 0 draws and sends to the blocks through their
//! first ranks: there, rank 0, the two first ranks and the members of both blocks could pass as
//! one another (see docs/faults.md).

use std::io::Read;

use crate::error::{Error, Result};

/// A 128-bit SipHash key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Secret(pub [u64; 2]);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never printed: it would leak every key of the bootstrap into a log.
        f.write_str("Secret(..)")
    }
}

impl Secret {
    /// 128 bits from the OS's random source; an error (no fallback) where there is none:
    /// a guessable secret would make every key guessable.
    pub(crate) fn draw() -> Result<Secret> {
        let mut b = [0u8; 16];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut b))
            .map_err(|e| {
                Error::system(format!(
                    "bootstrap: no random bytes for the pairwise keys' secret (/dev/urandom): {e}"
                ))
            })?;
        let (lo, hi) = b.split_at(8);
        Ok(Secret([le64(lo), le64(hi)]))
    }
}

fn le64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// SipHash-2-4 (Aumasson and Bernstein) of `msg` under the 128-bit key `k`.
pub(crate) fn siphash24(k: Secret, msg: &[u8]) -> u64 {
    let [k0, k1] = k.0;
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    fn round(v: &mut [u64; 4]) {
        v[0] = v[0].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(13) ^ v[0];
        v[0] = v[0].rotate_left(32);
        v[2] = v[2].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(16) ^ v[2];
        v[0] = v[0].wrapping_add(v[3]);
        v[3] = v[3].rotate_left(21) ^ v[0];
        v[2] = v[2].wrapping_add(v[1]);
        v[1] = v[1].rotate_left(17) ^ v[2];
        v[2] = v[2].rotate_left(32);
    }
    let compress = |m: u64, v: &mut [u64; 4]| {
        v[3] ^= m;
        round(v);
        round(v);
        v[0] ^= m;
    };
    let mut words = msg.chunks_exact(8);
    for w in &mut words {
        compress(le64(w), &mut v);
    }
    // The last word: the remaining bytes, and the message length (mod 256) in the top byte.
    let rest = words.remainder();
    let mut last = (msg.len() as u64 & 0xff) << 56;
    for (i, &b) in rest.iter().enumerate() {
        last |= u64::from(b) << (8 * i);
    }
    compress(last, &mut v);
    v[2] ^= 0xff;
    for _ in 0..4 {
        round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// The PRF over a few words (domain, then arguments), little-endian.
fn prf(s: Secret, words: &[u64]) -> u64 {
    let mut m = Vec::with_capacity(words.len() * 8);
    for w in words {
        m.extend_from_slice(&w.to_le_bytes());
    }
    siphash24(s, &m)
}

/// Domains, so that a value computed for one purpose never equals one for another.
const D_PAIR: u64 = 0x7061_6972; // "pair"
const D_BLOCK_LO: u64 = 0x626c_6b30; // "blk0"
const D_BLOCK_HI: u64 = 0x626c_6b31; // "blk1"

/// The key of the pair of ranks (a, b) under `s`; the same for (b, a).
pub(crate) fn pair_key(s: Secret, a: usize, b: usize) -> u64 {
    let (lo, hi) = (a.min(b) as u64, a.max(b) as u64);
    prf(s, &[D_PAIR, lo, hi])
}

/// The secret of the pair of blocks (a, b) under rank 0's secret `s`; the same for (b, a).
pub(crate) fn block_pair_secret(s: Secret, a: usize, b: usize) -> Secret {
    let (lo, hi) = (a.min(b) as u64, a.max(b) as u64);
    Secret([prf(s, &[D_BLOCK_LO, lo, hi]), prf(s, &[D_BLOCK_HI, lo, hi])])
}

/// Whether two keys are equal, in a time that does not depend on where they differ.
pub(crate) fn same_key(a: u64, b: u64) -> bool {
    // One XOR and one comparison of the whole word: no early exit on a matching prefix. The
    // black box keeps the compiler from turning it into anything else.
    std::hint::black_box(a ^ b) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference_key() -> Secret {
        // The key of the SipHash paper's test vectors: bytes 00 01 .. 0f.
        let b: Vec<u8> = (0u8..16).collect();
        Secret([le64(&b[..8]), le64(&b[8..])])
    }

    #[test]
    fn siphash_matches_the_papers_vectors() {
        let k = reference_key();
        let msg: Vec<u8> = (0u8..64).collect();
        // From the paper's appendix and the reference implementation's vectors.h.
        assert_eq!(siphash24(k, &[]), 0x726f_db47_dd0e_0e31);
        assert_eq!(siphash24(k, &msg[..1]), 0x74f8_39c5_93dc_67fd);
        assert_eq!(siphash24(k, &msg[..15]), 0xa129_ca61_49be_45e5);
    }

    #[test]
    #[allow(deprecated)]
    fn siphash_matches_std_siphash_2_4_for_every_length() {
        use std::hash::Hasher;
        let msg: Vec<u8> = (0..100u32).map(|i| (i * 37 + 11) as u8).collect();
        for (n, k) in [
            (0usize, 1u64),
            (7, 2),
            (8, 3),
            (9, 4),
            (16, 5),
            (63, 6),
            (100, 7),
        ] {
            let key = Secret([k.wrapping_mul(0x9e37_79b9_7f4a_7c15), !k]);
            for len in 0..=n {
                // std's deprecated SipHasher is SipHash-2-4; `write` takes the raw bytes.
                let mut h = std::hash::SipHasher::new_with_keys(key.0[0], key.0[1]);
                h.write(&msg[..len]);
                assert_eq!(siphash24(key, &msg[..len]), h.finish(), "length {len}");
            }
        }
    }

    #[test]
    fn pair_keys_are_symmetric_and_differ() {
        let s = Secret([1, 2]);
        let t = Secret([1, 3]);
        assert_eq!(pair_key(s, 3, 7), pair_key(s, 7, 3));
        assert_ne!(pair_key(s, 3, 7), pair_key(s, 3, 8));
        assert_ne!(pair_key(s, 3, 7), pair_key(t, 3, 7));
        assert_eq!(block_pair_secret(s, 1, 4), block_pair_secret(s, 4, 1));
        assert_ne!(block_pair_secret(s, 1, 4), block_pair_secret(s, 1, 5));
        let mut seen = std::collections::HashSet::new();
        for a in 0..40 {
            for b in a + 1..40 {
                assert!(seen.insert(pair_key(s, a, b)), "({a}, {b})");
            }
        }
        assert!(same_key(5, 5) && !same_key(5, 4) && !same_key(1 << 63, 0));
        assert_ne!(
            Secret::draw().expect("urandom"),
            Secret::draw().expect("urandom")
        );
    }
}
