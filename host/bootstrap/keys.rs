//! The bootstrap's keys, all derived from the secret in the unique id (`id.rs`), which never
//! travels on the wire: whoever holds the id is a member, nobody else can pass as one.
//!
//! - The join key ([`join_key`]) MACs a rank's hello to the root and the root's answer, each
//!   over a fresh challenge from the other side, so neither a stranger who reaches the root
//!   nor a forged root that some rank reaches can take part, and a recorded hello or answer
//!   is worth nothing on another connection.
//! - The key of a pair of ranks ([`pair_key`]) MACs the greeting that opens a connection
//!   between the two, again over both ends' fresh challenges, in both directions.
//!
//! Every member can derive every key: the ranks trust one another (as NCCL's do); the keys
//! keep out processes that only reach the ports. Keys are never sent, so no table of them
//! grows with the job. MACs are SipHash-2-4 (a pseudo-random function) over length-prefixed
//! fields under a 128-bit key.

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
        let mut got = 0;
        while got < b.len() {
            // SAFETY: writes at most the `b.len() - got` bytes left of `b`.
            let n = unsafe { libc::getrandom(b[got..].as_mut_ptr().cast(), b.len() - got, 0) };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(Error::system(format!(
                    "bootstrap: no random bytes for a secret or challenge (getrandom): {e}"
                )));
            }
            got += n as usize;
        }
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
const D_JOIN: [u64; 2] = [0x006a_6f69_6e30, 0x006a_6f69_6e31]; // "join0", "join1"
const D_PAIR: [u64; 2] = [0x0070_6169_7230, 0x0070_6169_7231]; // "pair0", "pair1"

/// The key of the hellos to the root and its answers, under the id's secret `s`.
pub(crate) fn join_key(s: Secret) -> Secret {
    Secret([prf(s, &[D_JOIN[0]]), prf(s, &[D_JOIN[1]])])
}

/// The key of the pair of ranks (a, b) under the id's secret `s`; the same for (b, a).
pub(crate) fn pair_key(s: Secret, a: usize, b: usize) -> Secret {
    let (lo, hi) = (a.min(b) as u64, a.max(b) as u64);
    Secret([prf(s, &[D_PAIR[0], lo, hi]), prf(s, &[D_PAIR[1], lo, hi])])
}

/// What a MAC is about: each kind of message has its own, so that a MAC made for one kind is
/// never valid for another.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub(crate) enum Purpose {
    /// A rank's hello to the root.
    Hello = 0x0068_656c_6c6f,
    /// The root's answer to one rank.
    Answer = 0x616e_7377_6572,
    /// The root's refusal of one rank (it is authenticated too: a forged root's reason is not
    /// believed, the rank's error names the forged root instead).
    Fail = 0x6661_696c,
    /// A rank's greeting to the peer it connects to.
    Greet = 0x0067_7265_6574,
    /// The peer's proof, in return, that it is the rank the greeting was for.
    Proof = 0x0070_726f_6f66,
}

/// The MAC of `fields` (each length-prefixed) for `purpose` under `k`.
pub(crate) fn mac(k: Secret, purpose: Purpose, fields: &[&[u8]]) -> u64 {
    let mut m = Vec::with_capacity(8 + fields.iter().map(|f| f.len() + 4).sum::<usize>());
    m.extend_from_slice(&(purpose as u64).to_le_bytes());
    for f in fields {
        m.extend_from_slice(&(f.len() as u32).to_le_bytes());
        m.extend_from_slice(f);
    }
    siphash24(k, &m)
}

/// 128 bits from the OS's random source: a challenge, or an id's secret. An error (no
/// fallback) where there is none: a guessable challenge could be answered in advance.
pub(crate) fn random_u128() -> Result<u128> {
    let s = Secret::draw()?;
    Ok(u128::from(s.0[0]) | (u128::from(s.0[1]) << 64))
}

/// Whether two MACs are equal, in a time that does not depend on where they differ.
pub(crate) fn same_mac(a: u64, b: u64) -> bool {
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
    fn keys_and_macs_differ_by_pair_purpose_and_field() {
        let s = Secret([1, 2]);
        let t = Secret([1, 3]);
        assert_eq!(pair_key(s, 3, 7), pair_key(s, 7, 3));
        assert_ne!(pair_key(s, 3, 7), pair_key(s, 3, 8));
        assert_ne!(pair_key(s, 3, 7), pair_key(t, 3, 7));
        assert_ne!(join_key(s), join_key(t));
        let mut seen = std::collections::HashSet::new();
        for a in 0..40 {
            for b in a + 1..40 {
                assert!(seen.insert(pair_key(s, a, b).0), "({a}, {b})");
            }
        }
        assert!(seen.insert(join_key(s).0));
        let k = pair_key(s, 1, 2);
        let m = mac(k, Purpose::Greet, &[b"ab", b"c"]);
        assert_eq!(m, mac(k, Purpose::Greet, &[b"ab", b"c"]));
        // Another purpose, another split of the same bytes, another key: another MAC.
        assert_ne!(m, mac(k, Purpose::Proof, &[b"ab", b"c"]));
        assert_ne!(m, mac(k, Purpose::Greet, &[b"a", b"bc"]));
        assert_ne!(m, mac(pair_key(s, 1, 3), Purpose::Greet, &[b"ab", b"c"]));
        assert!(same_mac(5, 5) && !same_mac(5, 4) && !same_mac(1 << 63, 0));
        assert_ne!(
            random_u128().expect("urandom"),
            random_u128().expect("urandom")
        );
    }
}
