//! `NCCL_ALGO` / `NCCL_PROTO`: per-collective allow masks and NCCL's syntax for them.

use super::*;

/// Per-collective allow mask over items of one kind (algorithms or protocols).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Filter<const N: usize> {
    /// `allowed[coll][item]`.
    pub allowed: [[bool; N]; 5],
}

/// Which algorithms each collective may use: NCCL's, and the symmetric path in column
/// `SYMMETRIC`.
pub type AlgoFilter = Filter<{ NUM_ALGOS + 1 }>;

/// The [`AlgoFilter`] column of the symmetric path (`comm/window.rs`), named `symmetric` in
/// NCCL_ALGO: not one of NCCL's tuner algorithms (a tuner plugin never sees it).
pub const SYMMETRIC: usize = NUM_ALGOS;

/// Which protocols each collective may use.
pub type ProtoFilter = Filter<NUM_PROTOS>;

impl<const N: usize> Default for Filter<N> {
    fn default() -> Self {
        Filter {
            allowed: [[true; N]; 5],
        }
    }
}

fn coll_by_name(s: &str) -> Option<Coll> {
    let k: String = s
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect::<String>()
        .to_ascii_lowercase();
    Coll::ALL
        .into_iter()
        .find(|c| c.name().eq_ignore_ascii_case(&k))
}

impl<const N: usize> Filter<N> {
    fn parse_with(var: &str, text: &str, names: &dyn Fn(&str) -> Option<usize>) -> Result<Self> {
        let mut f = Filter::default();
        let bad = |what: String| Error::invalid_argument(format!("{var}={text}: {what}"));
        for entry in text.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let (colls, list): (Vec<Coll>, &str) = match entry.split_once(':') {
                Some((c, l)) => {
                    let c = c.trim();
                    let coll =
                        coll_by_name(c).ok_or_else(|| bad(format!("unknown collective '{c}'")))?;
                    (vec![coll], l)
                }
                None => (Coll::ALL.to_vec(), entry),
            };
            let list = list.trim();
            let (exclude, list) = match list.strip_prefix('^') {
                Some(l) => (true, l),
                None => (false, list),
            };
            let mut mask = [exclude; N];
            let mut any = false;
            for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let i = names(name).ok_or_else(|| bad(format!("unknown name '{name}'")))?;
                mask[i] = !exclude;
                any = true;
            }
            if !any {
                return Err(bad("empty list".into()));
            }
            for c in colls {
                f.allowed[c as usize] = mask;
            }
        }
        Ok(f)
    }

    /// Whether `coll` may use item `item`.
    pub fn allows(&self, coll: Coll, item: usize) -> bool {
        self.allowed[coll as usize][item]
    }

    /// The filter as bits (`coll * N + item`), to send to other ranks.
    pub fn to_mask(self) -> u64 {
        let mut m = 0u64;
        for (c, row) in self.allowed.iter().enumerate() {
            for (i, &ok) in row.iter().enumerate() {
                if ok {
                    m |= 1 << (c * N + i);
                }
            }
        }
        m
    }

    /// The inverse of [`Filter::to_mask`].
    pub fn from_mask(m: u64) -> Self {
        let mut f = Filter {
            allowed: [[false; N]; 5],
        };
        for (c, row) in f.allowed.iter_mut().enumerate() {
            for (i, ok) in row.iter_mut().enumerate() {
                *ok = m & (1 << (c * N + i)) != 0;
            }
        }
        f
    }
}

impl AlgoFilter {
    /// NCCL_ALGO's syntax; `symmetric` names the symmetric path.
    pub fn parse(var: &str, text: &str) -> Result<AlgoFilter> {
        Filter::parse_with(var, text, &|n| {
            if n.eq_ignore_ascii_case("symmetric") {
                return Some(SYMMETRIC);
            }
            Algo::ALL
                .into_iter()
                .find(|a| a.as_str().eq_ignore_ascii_case(n))
                .map(|a| a as usize)
        })
    }
}

impl ProtoFilter {
    /// NCCL_PROTO's syntax.
    pub fn parse(var: &str, text: &str) -> Result<ProtoFilter> {
        Filter::parse_with(var, text, &|n| {
            Proto::ALL
                .into_iter()
                .find(|p| p.as_str().eq_ignore_ascii_case(n))
                .map(|p| p as usize)
        })
    }
}
