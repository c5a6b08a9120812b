//! The Rust API: typed device memory and the calls that use it, checked and safe.
//!
//! - [`DeviceBuffer<T>`] owns device memory of an [`Element`] type; [`DeviceSlice`] and
//!   [`DeviceSliceMut`] are views of it, as `&[T]` and `&mut [T]`.
//! - The collectives and send/recv are methods of [`crate::Comm`] taking views (`&buf`,
//!   `&mut buf`, `buf.slice(..)?`), an [`Op`] and a [`Stream`]; lengths are checked, and a
//!   buffer too short is `ncclInvalidArgument` with a message naming it and both sizes.
//! - [`group`] and [`capture`] are the scopes whose calls run later: their borrows last until
//!   the group ends, or as long as the captured graph lives.
//! - The raw layer ([`crate::Comm::all_reduce_raw`], …) takes device addresses and is
//!   `unsafe`; the C ABI is built on it.

mod buffer;
mod calls;
mod coll;
#[cfg(feature = "cudarc")]
mod cudarc_group;
#[cfg(feature = "cudarc")]
pub mod cudarc_nccl;
mod direct;
mod element;
mod event;
#[cfg(feature = "cudarc")]
mod interop;
mod onesided;
mod op;
mod raw;
mod register;
mod scope;
mod stream;
mod window;

pub use buffer::{DeviceBuffer, DeviceSlice, DeviceSliceMut, IntoDeviceSlice, IntoDeviceSliceMut};
pub use element::{Element, F8E4M3, F8E5M2};
pub use event::Event;
pub use op::Op;
pub use register::Registration;
pub use scope::{capture, group, Capture, CapturedGraph, Group};
pub use stream::Stream;
pub use window::Window;
