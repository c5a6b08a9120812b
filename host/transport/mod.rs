//! Transports: how the FIFOs of a connection are placed and reached. Inside a node: p2p (the
//! peer's memory through peer access in one process, CUDA IPC across processes).

pub mod links;
pub mod net;
pub mod p2p;
