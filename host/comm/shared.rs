//! Why a [`Comm`] is `Send` but not `Sync`, and how the library's own threads share one anyway.
//!
//! NCCL's rule (the "Thread Safety" page) is that a communicator may be used by any thread,
//! but not by two at once: calls issued concurrently on one communicator would interleave their
//! work and break the order every rank must see. `Send` without `Sync` is that rule, checked by
//! the compiler: a thread may own a communicator, and it may move to another thread, but a
//! `&Comm` cannot reach a second thread (put it in a `Mutex` to share it).
//!
//! The restriction is about the order of operations, not memory: every field of a `Comm` is
//! itself thread-safe (locks and atomics; checked below), so the library's own threads, which
//! use a communicator in a way the library orders itself (a non-blocking split, the C ABI's
//! background finalize, a C program's handle), share it through [`Shared`].

use super::Comm;
use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::Arc;

/// The field that takes `Sync` away from [`Comm`] (and only that: a `Cell` is `Send`).
#[derive(Default)]
pub(crate) struct NotSync(PhantomData<Cell<()>>);

/// A communicator that the library's own threads share (see the module's documentation).
#[derive(Clone)]
pub(crate) struct Shared(pub(crate) Arc<Comm>);

// SAFETY: `Comm`'s fields other than `NotSync` are `Send + Sync` (asserted below), so sharing
// it between threads is memory-safe; `NotSync` only keeps *users* from issuing on one
// communicator from two threads at once, and the library orders its own threads' work itself.
unsafe impl Send for Shared {}
// SAFETY: as for `Send`.
unsafe impl Sync for Shared {}

impl Shared {
    /// Shares `comm` with the library's threads.
    // An `Arc` of a non-`Sync` type: the `unsafe impl`s above are what make it shareable.
    #[allow(clippy::arc_with_non_send_sync)]
    pub(crate) fn new(comm: Comm) -> Shared {
        Shared(Arc::new(comm))
    }
}

impl std::ops::Deref for Shared {
    type Target = Comm;
    fn deref(&self) -> &Comm {
        &self.0
    }
}

/// Every field of [`Comm`] but the marker is `Send + Sync`: keep this list in step with the
/// struct (a field missing here is caught by the exhaustive pattern below).
#[allow(dead_code)]
fn fields_are_thread_safe(c: &Comm) {
    fn both<T: Send + Sync>(_: &T) {}
    let Comm {
        rank,
        nranks,
        device,
        shape,
        tuner,
        bootstrap,
        links,
        tree_up,
        dbt,
        pat,
        nvls,
        rings,
        order,
        dev_comm,
        ring_resources,
        ring_ops,
        suspendable,
        kernels,
        aborted,
        init_bytes,
        memory,
        user_device,
        config,
        abort_flag,
        finalized,
        revoked,
        async_error,
        registered,
        windows,
        deterministic,
        graph_regs,
        ring_tables,
        tree_tables,
        graph_markers,
        kernel_abort,
        net,
        split_turns,
        ras,
        stamps,
        profiler,
        keep,
        _one_thread: _,
    } = c;
    both(rank);
    both(nranks);
    both(device);
    both(shape);
    both(tuner);
    both(bootstrap);
    both(links);
    both(tree_up);
    both(dbt);
    both(pat);
    both(nvls);
    both(rings);
    both(order);
    both(dev_comm);
    both(ring_resources);
    both(ring_ops);
    both(suspendable);
    both(kernels);
    both(aborted);
    both(init_bytes);
    both(deterministic);
    both(memory);
    both(user_device);
    both(config);
    both(abort_flag);
    both(finalized);
    both(revoked);
    both(async_error);
    both(registered);
    both(windows);
    both(graph_regs);
    both(ring_tables);
    both(tree_tables);
    both(graph_markers);
    both(kernel_abort);
    both(net);
    both(split_turns);
    both(ras);
    both(stamps);
    both(profiler);
    both(keep);
}
