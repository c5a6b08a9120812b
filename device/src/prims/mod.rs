//! Protocol primitives: how a CTA moves one FIFO step of data between neighbours.
//! Simple and LL (chosen per launch at run time); LL128 arrives over the same step model.

pub mod copy;
pub mod ll;
pub mod simple;

pub use simple::Simple;
