//! What the tests inspect of a communicator (its counters, rings, trees and shape as the
//! kernels see them): `pub` with the `internals` feature only, kept apart from the operations.

use super::*;

impl Comm {
    crate::internal! {
        /// Calls this communicator planned on the symmetric path (`comm/window.rs`).
        fn symmetric_launches(&self) -> u64 {
            self.windows.symmetric_launches()
        }
    }

    crate::internal! {
        /// Calls this communicator ran on the copy engines (`comm/copy_engine.rs`).
        fn copy_engine_launches(&self) -> u64 {
            self.windows.copy_engine.load(std::sync::atomic::Ordering::Relaxed)
        }
    }

    crate::internal! {
        /// The longest nap this communicator's proxy thread takes now (None without network
        /// connections): shorter once a launch that needs it was captured into a CUDA graph.
        fn proxy_max_nap(&self) -> Option<std::time::Duration> {
            self.net.as_ref().map(|n| n.proxy.max_nap())
        }
    }

    crate::internal! {
        /// A fence behind every kernel this communicator launched so far (what a peer's
        /// withdrawn mapping waits for); None when it launched none.
        fn launch_fence(&self) -> Result<Option<crate::cuda::Fence>> {
            self.order.fence()
        }
    }

    crate::internal! {
        /// The bootstrap addresses of every rank, as this rank knows them.
        fn bootstrap_addresses(&self) -> Vec<std::net::SocketAddr> {
            self.bootstrap.peer_addresses()
        }
    }
    crate::internal! {
        /// The step counters of the send/recv connections to (`send`) or from `peer`, one per
        /// connection, as the kernels left them; None before the first message made them.
        fn p2p_steps(&self, peer: usize, send: bool) -> Result<Option<Vec<u64>>> {
            let dir = if send { Dir::Send } else { Dir::Recv };
            self.links.steps(peer, dir)
        }
    }
    crate::internal! {
        /// The step counters of the send/recv connections to (`send`) or from `peer` after the
        /// messages so far, as the host predicted them for the profiler's proxy events, one
        /// per connection (None where a connection has no op queue).
        fn p2p_steps_predicted(&self, peer: usize, send: bool) -> Vec<Option<u64>> {
            let dir = if send { Dir::Send } else { Dir::Recv };
            (0..self.links.nconns)
                .map(|c| self.links.op_queue(peer, dir, c).and_then(|q| q.end()))
                .collect()
        }
    }
    crate::internal! {
        /// The double binary tree's network connections that have op queues: per connection,
        /// (channel, peer, send, the step counter the host predicted, the kernels' counter).
        fn dbt_steps_predicted(&self) -> Result<Vec<crate::proxy::ops::StepCount>> {
            let Some(d) = &self.dbt else {
                return Ok(Vec::new());
            };
            let mut out = Vec::new();
            for c in 0..d.ctas {
                for (peer, dir, q) in d.op_queues(c) {
                    let Some(predicted) = q.end() else { continue };
                    let taken = d.link_steps(c, peer, dir)?;
                    out.push(crate::proxy::ops::StepCount {
                        channel: c,
                        peer,
                        send: dir == Dir::Send,
                        predicted,
                        taken,
                    });
                }
            }
            Ok(out)
        }
    }
    crate::internal! {
        /// PAT's network connections that have op queues: per connection, (CTA, peer, send,
        /// the step counter the host predicted, the kernels' counter).
        fn pat_steps_predicted(&self) -> Result<Vec<crate::proxy::ops::StepCount>> {
            self.pat.as_ref().map_or(Ok(Vec::new()), |p| p.steps_predicted())
        }
    }
    crate::internal! {
        /// Per channel, the ring steps whose data the predecessor wrote straight into this
        /// rank's output buffer (zero-copy ring collectives), counted by the kernels since init.
        fn ring_direct_steps(&self) -> Result<Vec<u64>> {
            self.channel_words(std::mem::offset_of!(ChannelDev, direct_steps))
        }
    }
    crate::internal! {
        /// The one-node tree's chain (None across nodes, or where the tree is filtered out):
        /// how many CTAs it serves and the bytes of its up links' FIFO slots.
        fn tree_chain(&self) -> Option<(usize, usize)> {
            self.tree_up.as_ref().map(|t| (t.ctas, t.slot_bytes))
        }
    }
    crate::internal! {
        /// The double binary tree across nodes (None on one node, or where the tree is
        /// filtered out): how many CTAs it serves and the bytes of its links' FIFO slots.
        fn dbt_geometry(&self) -> Option<(usize, usize)> {
            self.dbt.as_ref().map(|d| (d.ctas, d.slot_bytes))
        }
    }
    crate::internal! {
        /// Per channel, the step counter of the ring's send connection as the kernels left it.
        fn ring_send_steps(&self) -> Result<Vec<u64>> {
            self.channel_words(
                std::mem::offset_of!(ChannelDev, send)
                    + std::mem::offset_of!(nccl_device::abi::ConnSend, step),
            )
        }
    }
    crate::internal! {
        /// Per channel, the step counter of the ring's send connection after the launches so
        /// far, as the host predicted it for the profiler's proxy events (None where the
        /// connection has no op queue: no plugin, or not a network connection).
        fn ring_send_steps_predicted(&self) -> Vec<Option<u64>> {
            match &self.ring_ops {
                Some(q) => q.send_ends(),
                None => vec![None; self.shape.nchannels as usize],
            }
        }
    }
    /// Per channel, the u64 at byte `at` of its `ChannelDev` in device memory.
    fn channel_words(&self, at: usize) -> Result<Vec<u64>> {
        let nch = self.shape.nchannels as usize;
        let size = std::mem::size_of::<ChannelDev>();
        let head = std::mem::size_of::<DevComm>().next_multiple_of(16);
        let mut raw = vec![0u8; nch * size];
        self.dev_comm.read(head, &mut raw)?;
        Ok(raw
            .chunks_exact(size)
            .map(|ch| u64::from_le_bytes(ch[at..at + 8].try_into().unwrap_or_default()))
            .collect())
    }
    crate::internal! {
        /// The launch shape every rank agreed on at creation.
        fn shape(&self) -> Shape {
            self.shape
        }
    }

    crate::internal! {
        /// Every channel's ring (ranks in ring order), as the kernels read it: from this rank's
        /// channel structures in device memory, checked against what init agreed.
        fn channel_rings(&self) -> Result<Vec<Vec<usize>>> {
            let nch = self.shape.nchannels as usize;
            let size = std::mem::size_of::<ChannelDev>();
            let head = std::mem::size_of::<DevComm>().next_multiple_of(16);
            let mut raw = vec![0u8; nch * size];
            self.dev_comm.read(head, &mut raw)?;
            let u32_at = |b: &[u8], i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
            let mut out = Vec::with_capacity(nch);
            for (c, ch) in raw.chunks_exact(size).enumerate() {
                let index = u32_at(ch, std::mem::offset_of!(ChannelDev, ring_index)) as usize;
                let prev = u32_at(ch, std::mem::offset_of!(ChannelDev, ring_prev)) as usize;
                let next = u32_at(ch, std::mem::offset_of!(ChannelDev, ring_next)) as usize;
                let at = std::mem::offset_of!(ChannelDev, ring_ranks);
                let mut ptr = [0u8; 8];
                ptr.copy_from_slice(&ch[at..at + 8]);
                let mut words = vec![0u8; self.nranks * 4];
                self.device.copy_dtoh(&mut words, u64::from_le_bytes(ptr))?;
                let ring: Vec<usize> = (0..self.nranks)
                    .map(|i| u32_at(&words, 4 * i) as usize)
                    .collect();
                let n = self.nranks;
                let consistent = index < n
                    && ring[index] == self.rank
                    && ring[(index + n - 1) % n] == prev
                    && ring[(index + 1) % n] == next
                    && ring == self.rings.ring(c);
                if !consistent {
                    return Err(Error::internal(format!(
                        "rank {}: channel {c} holds ring {ring:?} at index {index} (prev {prev}, next {next}); init agreed on {:?}",
                        self.rank,
                        self.rings.ring(c)
                    )));
                }
                out.push(ring);
            }
            Ok(out)
        }
    }

    crate::internal! {
        /// Across nodes, this rank's place in every channel's tree (parent, children), as
        /// its kernels read it (the device array checked against what init connected);
        /// None where the communicator has no double binary tree (one node, or NCCL_ALGO
        /// leaves no tree).
        fn tree_places(&self) -> Result<Option<Vec<crate::graph::Place>>> {
            let Some(d) = &self.dbt else {
                return Ok(None);
            };
            let size = std::mem::size_of::<nccl_device::abi::TreeDev>();
            let mut raw = vec![0u8; d.ctas * size];
            self.device.copy_dtoh(&mut raw, d.array.ptr)?;
            for (c, (up, down)) in d.places.iter().enumerate() {
                let b = &raw[c * size..(c + 1) * size];
                let word = |i: usize| u64::from_le_bytes(b[8 * i..8 * i + 8].try_into().unwrap_or_default());
                let n = (word(0) & 0xffff_ffff) as usize;
                let kids = nccl_device::abi::TREE_MAX_CHILDREN;
                let conns_ok = (word(1) != 0) == up.is_some()
                    && (word(2) != 0) == up.is_some()
                    && (0..kids).all(|i| (word(3 + i) != 0) == (i < n))
                    && (0..kids).all(|i| (word(3 + kids + i) != 0) == (i < n));
                if n != down.len() || !conns_ok {
                    return Err(Error::internal(format!(
                        "rank {}: channel {c}'s tree on the device has {n} children and other connections than init made ({up:?}, {down:?})",
                        self.rank
                    )));
                }
            }
            Ok(Some(d.places.clone()))
        }
    }
}
