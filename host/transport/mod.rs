//! Transports: how the FIFOs of a connection are placed and reached. Inside a node: p2p (the
//! peer's memory through peer access in one process, CUDA IPC across processes), else shm
//! (host shared memory mapped into both GPUs); between nodes (or inside one with both off): net.

pub mod links;
pub(crate) mod net;
pub mod p2p;
pub mod regmap;
pub mod shm;
