//! Communicators on the CPU simulator: creation, split and shrink, finalize and destroy,
//! faults (bootstrap, dead, stopped and cut-off peers, network namespaces), RAS, bad input and
//! the typed API. Tests that need an environment of their own run alone in a child process
//! started with it (`common::procs::isolated`).

#[path = "../common/mod.rs"]
mod common;

mod bad_input;
mod bootstrap_faults;
mod cycles;
mod drop_race;
mod failures;
mod lifecycle;
mod netns_faults;
mod ras;
mod typed_api;
