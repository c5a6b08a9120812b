//! On real GPUs (ignored elsewhere: run on the GPU host with --include-ignored): every
//! collective, type and reduction, processes and nodes, buffer extents, network plugins with
//! GPU memory, and the cudarc interop (`cudarc` feature).

#[path = "../common/mod.rs"]
mod common;

mod collectives;
#[cfg(feature = "cudarc")]
mod cudarc;
mod extents;
mod net_plugin;
mod onesided;
mod suspend;
mod symmetric;
