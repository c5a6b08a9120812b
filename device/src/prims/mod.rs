//! Protocol primitives: how a CTA moves one FIFO step of data between neighbours.
//! Simple only for now; LL and LL128 arrive over the same step model.

pub mod copy;
pub mod simple;

pub use simple::Simple;
