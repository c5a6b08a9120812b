//! Topology detection, the graph search and the tuner (and its plugins), without devices.

#[path = "../common/mod.rs"]
mod common;

mod detect;
mod plugin;
mod search;
