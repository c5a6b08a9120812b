//! Protocol primitives: how a CTA moves one FIFO step of data between neighbours.
//! Simple, LL and LL128, chosen per launch at run time over one step model.

pub mod copy;
mod direct;
pub mod fan;
pub mod ll;
pub mod ll128;
mod packet;
pub mod simple;

pub use direct::{Offer, RingDirect};
pub use fan::SimpleFan;
pub use simple::Simple;
