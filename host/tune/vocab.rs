//! The tuner's algorithms and protocols, with NCCL's values (the tuner plugin's cost table
//! uses them as indices).

use std::fmt;

/// Algorithms (values are NCCL's algorithm indices, as the tuner plugin's cost table uses them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Algo {
    /// Tree (double binary tree across nodes, chain within).
    Tree = 0,
    /// Ring.
    Ring = 1,
    /// CollNet direct (not available here).
    CollNetDirect = 2,
    /// CollNet chain (not available here).
    CollNetChain = 3,
    /// NVLink SHARP (not available here).
    Nvls = 4,
    /// NVLink SHARP with a tree (not available here).
    NvlsTree = 5,
    /// PAT (not available here).
    Pat = 6,
}

/// How many algorithms there are.
pub const NUM_ALGOS: usize = 7;

impl Algo {
    /// Every algorithm, in NCCL's order.
    pub const ALL: [Algo; NUM_ALGOS] = [
        Algo::Tree,
        Algo::Ring,
        Algo::CollNetDirect,
        Algo::CollNetChain,
        Algo::Nvls,
        Algo::NvlsTree,
        Algo::Pat,
    ];
    /// Its name as NCCL writes it (`NCCL_ALGO`).
    pub fn as_str(self) -> &'static str {
        match self {
            Algo::Tree => "Tree",
            Algo::Ring => "Ring",
            Algo::CollNetDirect => "CollNetDirect",
            Algo::CollNetChain => "CollNetChain",
            Algo::Nvls => "NVLS",
            Algo::NvlsTree => "NVLSTree",
            Algo::Pat => "PAT",
        }
    }
}

impl fmt::Display for Algo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Protocols (values are NCCL's protocol indices).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum Proto {
    /// LL: 8-byte stores with flags.
    Ll = 0,
    /// LL128: 128-byte lines with a flag.
    Ll128 = 1,
    /// Simple: data, fence, counter.
    Simple = 2,
}

/// How many protocols there are.
pub const NUM_PROTOS: usize = 3;

impl Proto {
    /// Every protocol, in NCCL's order.
    pub const ALL: [Proto; NUM_PROTOS] = [Proto::Ll, Proto::Ll128, Proto::Simple];
    /// Its name as NCCL writes it (`NCCL_PROTO`).
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Ll => "LL",
            Proto::Ll128 => "LL128",
            Proto::Simple => "Simple",
        }
    }
}

impl fmt::Display for Proto {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
