//! Structures that host and device both read (rule 1 of docs/architecture.md): defined once here, compiled on
//! both sides. All pointers are device addresses stored as `u64` so the layout is identical on
//! the host (64-bit) and on the GPU; size assertions pin the layout.

/// Slots in every connection FIFO.
pub const NCCL_STEPS: u32 = 8;
/// Most channels a communicator may have.
pub const MAX_CHANNELS: usize = 32;

mod pat;
mod sym;
pub use pat::*;
pub use sym::*;

pub mod gin;

/// Bytes of one FIFO slot line alignment; counters live in their own 128-byte lines.
pub const CTRL_LINE: usize = 128;
/// Bytes of one LL FIFO slot: 16-byte lines of two data words and two flags, so half of it is
/// payload (16 KiB per step).
pub const LL_SLOT_BYTES: u32 = 32 * 1024;
/// Payload bytes one LL step carries at most.
pub const LL_STEP_BYTES: u32 = LL_SLOT_BYTES / 2;

/// Bytes of one LL128 FIFO slot: 128-byte lines, each 120 payload bytes and an 8-byte flag,
/// written by 8 lanes of a warp at once (NVLink delivers such a line whole).
pub const LL128_SLOT_BYTES: u32 = 64 * 1024;
/// Bytes of one LL128 line and the payload it carries.
pub const LL128_LINE_BYTES: u32 = 128;
pub const LL128_LINE_PAYLOAD: u32 = 120;
/// Payload bytes one LL128 step carries at most.
pub const LL128_STEP_BYTES: u32 = LL128_SLOT_BYTES / LL128_LINE_BYTES * LL128_LINE_PAYLOAD;
/// Algorithms, with NCCL's values (its tuner plugins index their cost tables by them): the one
/// definition the kernels (`CollArgs::algo`, through the `ALGO_*` constants), the tuner and the
/// public API (`nccl::Algo`) share.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algo {
    /// Tree (double binary tree across nodes, chain within).
    Tree = 0,
    /// Ring.
    Ring = 1,
    /// CollNet direct (not available here).
    CollNetDirect = 2,
    /// CollNet chain (not available here).
    CollNetChain = 3,
    /// NVLink SHARP (not available here).
    Nvls = 4,
    /// NVLink SHARP with a tree (not available here).
    NvlsTree = 5,
    /// PAT: parallel aggregated trees (AllGather and ReduceScatter, Simple).
    Pat = 6,
}

/// How many algorithms there are.
pub const NUM_ALGOS: usize = 7;

impl Algo {
    /// Every algorithm, in NCCL's order.
    pub const ALL: [Algo; NUM_ALGOS] = [
        Algo::Tree,
        Algo::Ring,
        Algo::CollNetDirect,
        Algo::CollNetChain,
        Algo::Nvls,
        Algo::NvlsTree,
        Algo::Pat,
    ];
    /// Its name as NCCL writes it (`NCCL_ALGO`).
    pub fn as_str(self) -> &'static str {
        match self {
            Algo::Tree => "Tree",
            Algo::Ring => "Ring",
            Algo::CollNetDirect => "CollNetDirect",
            Algo::CollNetChain => "CollNetChain",
            Algo::Nvls => "NVLS",
            Algo::NvlsTree => "NVLSTree",
            Algo::Pat => "PAT",
        }
    }
}

// Host only: the formatting machinery would be an undefined function in the PTX.
#[cfg(not(target_arch = "nvptx64"))]
impl core::fmt::Display for Algo {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Protocols, with NCCL's values (its tuner plugins index their cost tables by them): the one
/// definition the kernels (`CollArgs::proto`, through the `PROTO_*` constants), the tuner and the
/// public API (`nccl::Proto`) share.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Proto {
    /// LL: 8-byte stores with flags.
    Ll = 0,
    /// LL128: 128-byte lines with a flag.
    Ll128 = 1,
    /// Simple: data, fence, counter.
    Simple = 2,
}

/// How many protocols there are.
pub const NUM_PROTOS: usize = 3;

impl Proto {
    /// Every protocol, in NCCL's order.
    pub const ALL: [Proto; NUM_PROTOS] = [Proto::Ll, Proto::Ll128, Proto::Simple];
    /// Its name as NCCL writes it (`NCCL_PROTO`).
    pub fn as_str(self) -> &'static str {
        match self {
            Proto::Ll => "LL",
            Proto::Ll128 => "LL128",
            Proto::Simple => "Simple",
        }
    }
}

#[cfg(not(target_arch = "nvptx64"))]
impl core::fmt::Display for Proto {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The protocols as `CollArgs::proto` holds them and the kernels take them (a const parameter).
pub const PROTO_LL: u32 = Proto::Ll as u32;
pub const PROTO_LL128: u32 = Proto::Ll128 as u32;
pub const PROTO_SIMPLE: u32 = Proto::Simple as u32;

/// What a receiving kernel writes to [`ConnRecv::proxy_proto`] before it waits for the steps
/// of a proxied connection up to (not including) `end`: those it is about to read carry
/// protocol `proto` (`PROTO_*`). The step count comes first so that a proxy can tell a word
/// about a step from one about an earlier step.
pub const fn proxy_proto_word(end: u64, proto: u32) -> u64 {
    (end << 2) | (proto as u64 & 3)
}

/// Reads a [`proxy_proto_word`]: `(end, proto)`.
pub const fn proxy_proto_parts(word: u64) -> (u64, u32) {
    (word >> 2, (word & 3) as u32)
}

/// The algorithms a collective launch may use, as `CollArgs::algo` holds them ([`Algo`]).
pub const ALGO_RING: u32 = Algo::Ring as u32;
/// AllReduce as a tree: on one node a chain in ring order (reduce towards ring position 0, then
/// broadcast back); across nodes the double binary tree of [`CollArgs::tree`].
pub const ALGO_TREE: u32 = Algo::Tree as u32;
/// NVLink SHARP: the switch reduces (`multimem.ld_reduce`) and multicasts (`multimem.st`)
/// through a multicast-bound scratch buffer ([`NvlsChannel`]).
pub const ALGO_NVLS: u32 = Algo::Nvls as u32;

/// Bytes at the start of every NVLS channel region that hold its barrier counter (its own
/// 128-byte line; the data halves follow).
pub const NVLS_CTRL_BYTES: u64 = 128;

/// One channel's share of the NVLS scratch: a region of the multicast-bound buffer (this
/// rank's unicast view `uc` and the multicast view `mc` of the same offsets). The region
/// starts with the barrier counter line ([`NVLS_CTRL_BYTES`]), then two halves of `half_bytes`
/// each that successive pieces use in turn.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NvlsChannel {
    pub uc: u64,
    pub mc: u64,
    /// Bytes of each data half (a multiple of 16).
    pub half_bytes: u64,
    /// Barriers this rank passed on this channel; persists across launches (the counter
    /// reaches `barriers * nranks` when every rank passed as many).
    pub barriers: u64,
    /// Pieces moved on this channel; persists across launches (piece `k` uses half `k % 2`).
    pub pieces: u64,
}

/// Most children a rank has in a tree across nodes: the next rank of its node's chain and two
/// child nodes (NCCL's tree arity).
pub const TREE_MAX_CHILDREN: usize = 3;

/// The sending side of one connection: we write into the peer's FIFO.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnSend {
    /// The peer's receive FIFO (NCCL_STEPS slots of `slot_bytes`), addressable from this GPU.
    pub fifo: u64,
    /// The peer's tail counter: we publish `step + 1` there after filling slot `step % NCCL_STEPS`.
    pub tail: u64,
    /// Our head counter: the peer publishes how many slots it has consumed.
    pub head: u64,
    /// Steps sent so far on this connection; persists across kernel launches.
    pub step: u64,
    /// The peer's LL FIFO (NCCL_STEPS slots of [`LL_SLOT_BYTES`]), 0 where there is none. Steps
    /// and `head` are shared with the Simple FIFO: a step is a step whichever protocol carries it.
    pub ll_fifo: u64,
    /// The peer's LL128 FIFO (NCCL_STEPS slots of [`LL128_SLOT_BYTES`]), 0 where there is none;
    /// steps and `head` shared likewise.
    pub ll128_fifo: u64,
    /// 0 for a direct connection. For one a proxy thread carries (network, shm): NCCL_STEPS
    /// `u64` in host-visible memory where the sender writes the bytes it put in each slot before
    /// publishing `tail`, which it then does for every protocol (the proxy sends what the sizes
    /// say).
    pub proxy_sizes: u64,
    /// 0 for a direct connection; for a proxied one, the bytes between two slots, alike for
    /// every protocol (`fifo`, `ll_fifo` and `ll128_fifo` are one region then), so that the
    /// receiving proxy can place a step before it knows which protocol carried it.
    pub proxy_stride: u64,
    /// The last `head` a kernel read (heads only grow), kept across launches like `step`: a
    /// sender reads `head` again only when this value leaves it no free slot, which saves a
    /// round trip to wherever `head` lives (host memory for a proxied connection) on most steps.
    pub head_seen: u64,
}

/// The receiving side of one connection: the peer writes into our FIFO.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnRecv {
    /// Our FIFO.
    pub fifo: u64,
    /// Our tail counter, written by the peer.
    pub tail: u64,
    /// The peer's head counter: we publish `step + 1` after consuming a slot.
    pub head: u64,
    /// Steps received so far; persists across kernel launches.
    pub step: u64,
    /// Our LL FIFO, 0 where there is none.
    pub ll_fifo: u64,
    /// Our LL128 FIFO, 0 where there is none.
    pub ll128_fifo: u64,
    /// 0 for a direct connection. Non-zero when a proxy thread fills this FIFO: the bytes
    /// between two slots, alike for every protocol (see [`ConnSend::proxy_stride`]). The proxy
    /// publishes `tail` once a step's bytes landed whole, and the LL and LL128 receivers wait
    /// for that before reading lines (a network's writes carry no 16- or 128-byte atomicity).
    pub proxy_stride: u64,
    /// 0 for a direct connection. For a proxied one, a host-visible `u64` where the kernel,
    /// before it waits for the steps below `end`, writes [`proxy_proto_word`]`(end, proto)`:
    /// the receiving proxy learns which protocol a landed step carries (a GPU-memory FIFO
    /// flushes Simple steps only: LL and LL128 lines carry their own flags).
    pub proxy_proto: u64,
    /// The last `tail` a kernel read (tails only grow), kept across launches like `step`: a
    /// Simple receiver reads `tail` again only when this value does not cover its step.
    pub tail_seen: u64,
}

/// Set in a proxied receive side's `proxy_stride` (whose bytes are a multiple of 128) where its
/// FIFO is in host memory: the network lands a step's bytes there in order, 8 aligned bytes at
/// a time at least (a CPU's copy out of a socket, a NIC's DMA), so each half of an LL line is
/// whole once its flag is. The LL receiver then polls the flags, as NCCL's LL over the network
/// does, instead of waiting for the proxy's `tail` first (a round trip over PCIe on every
/// step). LL128 lines need more than 8 bytes whole, and Simple has no flags: both still wait
/// for `tail`.
pub const STRIDE_LL_POLL: u64 = 1;

/// Set in a proxied send side's `proxy_stride` where its FIFO is in host memory: the proxy reads
/// the lines of an LL step there, so the kernel publishes an LL step's size (with
/// [`SIZE_LL_LINES`]) and `tail` with plain volatile stores, without the system-scope release
/// that waits for every line to reach host memory first (a round trip over PCIe per step), and
/// the proxy sends the step once every line's flags say `step + 1`, as NCCL's LL over the
/// network does.
pub const STRIDE_LL_SEND_POLL: u64 = 2;

/// Set in a step's size word (`ConnSend::proxy_sizes`) by an LL sender on a connection with
/// [`STRIDE_LL_SEND_POLL`]: the size and `tail` were published without a release, so the proxy
/// checks the step's lines before it sends them.
pub const SIZE_LL_LINES: u64 = 1 << 63;

/// The bytes between two slots of a proxied connection, from its `proxy_stride` word.
#[cfg_attr(target_arch = "nvptx64", inline(always))]
pub const fn stride_bytes(proxy_stride: u64) -> u64 {
    proxy_stride & !(STRIDE_LL_POLL | STRIDE_LL_SEND_POLL)
}

impl ConnSend {
    /// The fields in layout order, as the host writes them into device memory.
    pub fn words(&self) -> [u64; 9] {
        [
            self.fifo,
            self.tail,
            self.head,
            self.step,
            self.ll_fifo,
            self.ll128_fifo,
            self.proxy_sizes,
            self.proxy_stride,
            self.head_seen,
        ]
    }
}

impl ConnRecv {
    /// The fields in layout order, as the host writes them into device memory.
    pub fn words(&self) -> [u64; 9] {
        [
            self.fifo,
            self.tail,
            self.head,
            self.step,
            self.ll_fifo,
            self.ll128_fifo,
            self.proxy_stride,
            self.proxy_proto,
            self.tail_seen,
        ]
    }
}

/// One channel of one rank: its ring neighbours and connections.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelDev {
    /// Our position in this channel's ring (0..nranks); chunk numbers are ring positions.
    pub ring_index: u32,
    pub ring_prev: u32,
    pub ring_next: u32,
    /// 1 when the receive connection (from `ring_prev`) is a p2p one, which takes the
    /// zero-copy handshake of ring collectives on registered buffers when a launch asks
    /// ([`FLAG_RING_DIRECT`]); 0 for SHM, NET and none. Equal to the predecessor's
    /// `send_reach != 0` for the same connection: both come from the pair's agreed transport.
    pub recv_direct: u32,
    /// The ring as ranks: `nranks` u32 in device memory, `ring_ranks[pos]` is the rank at ring
    /// position `pos`.
    pub ring_ranks: u64,
    pub send: ConnSend,
    pub recv: ConnRecv,
    /// How the send connection (to `ring_next`) reaches a buffer the successor offers
    /// ([`P2pItem::direct`]'s values for a send): [`DIRECT_OFF`] where it never takes the
    /// handshake (SHM, NET), [`DIRECT_SAME_SPACE`], [`DIRECT_DECLINE`], or a `*const RegTable`.
    pub send_reach: u64,
    /// Ring steps whose data the predecessor wrote straight into our output buffer
    /// (zero-copy) instead of the FIFO; kept across launches (a statistic the tests read).
    pub direct_steps: u64,
    /// The ring agreement on fewer CTAs ([`CollArgs::reg_ctas`]) on this channel: how many this
    /// CTA took part in (the next one's tag is that plus one), shifted left by one, with the
    /// last one's outcome in bit 0. Written by the CTA's thread 0 only.
    pub agree: u64,
    /// How a send to the predecessor (`ring_prev`) reaches a buffer it offers, with
    /// [`ChannelDev::send_reach`]'s values: the one-node tree's way up (its chain runs against
    /// the ring) writes partial sums into its parent's registered output with it.
    pub prev_reach: u64,
}

/// What a kernel needs of its communicator; lives in device memory, one per rank.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DevComm {
    pub rank: u32,
    pub nranks: u32,
    pub nchannels: u32,
    /// Bytes of one FIFO slot (NCCL_BUFFSIZE / NCCL_STEPS).
    pub slot_bytes: u32,
    /// `nchannels` ChannelDev structures in device memory.
    pub channels: u64,
    /// A u64 in host memory mapped for the device: the host sets it non-zero on
    /// `ncclCommAbort`, and every wait gives up once it sees that (0: no flag).
    pub abort_flag: u64,
    /// `nchannels` [`NvlsChannel`] in device memory when NVLS is set up, else 0.
    pub nvls: u64,
    /// Channels that have an [`NvlsChannel`] (an NVLS launch's grid is at most this).
    pub nvls_nchannels: u32,
    /// Collective launches stamped so far ([`FLAG_LAB_STAMPS`]); the kernels count it.
    pub lab_count: u32,
    /// The kernel-stamps lab (NCCL_RS_KERNEL_STAMPS): [`LAB_STAMPS`] slots of [`LabStamp`] in
    /// host memory mapped for the device; 0 where it is off.
    pub lab_stamps: u64,
    /// The profiler plugin's kernel-channel stamps ([`CollArgs::profile_slot`]):
    /// [`PROFILE_LAUNCHES`] × [`MAX_CHANNELS`] [`ChannelStamp`]s in host memory mapped for the
    /// device; 0 where no profiler plugin is loaded.
    pub profile_stamps: u64,
}

/// Launches the profiler's ring of channel stamps holds ([`DevComm::profile_stamps`]).
pub const PROFILE_LAUNCHES: u32 = 1024;

/// One channel (CTA) of a profiled launch, in the GPU's `%globaltimer` nanoseconds: thread 0
/// stamps `start` first thing, `stop` once the CTA is done, then `seq` (the launch's
/// [`CollArgs::profile_slot`]: the host's count of its profiled launches, so a stamp of an
/// older launch in the same place is told apart).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChannelStamp {
    pub seq: u64,
    pub start: u64,
    pub stop: u64,
    pub _pad: u64,
}

/// [`DevComm::lab_stamps`]: slots in the ring of stamps (launch `n` takes slot `n % LAB_STAMPS`).
pub const LAB_STAMPS: u32 = 4096;

/// One collective launch as its CTA 0 saw it, in the GPU's `%globaltimer` nanoseconds: thread 0
/// stamps `entry` first thing and `exit` after the CTA's last barrier, then `index` (the
/// launch's number on its communicator + 1: 0 means a slot not stamped, or one whose exit is
/// not yet written).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LabStamp {
    pub index: u64,
    pub entry: u64,
    pub exit: u64,
    pub _pad: u64,
}

/// The arguments of one collective launch, passed by value as the kernel's only parameter.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CollArgs {
    /// `*mut DevComm` in device memory.
    pub comm: u64,
    pub sendbuff: u64,
    pub recvbuff: u64,
    /// Elements in the user buffer (per rank for AllReduce).
    pub count: u64,
    /// The reduction's scalar as raw bits of the element type (premulsum factor, avg divisor).
    pub redop_arg: u64,
    /// Elements moved per FIFO step (a multiple of the 16-byte pack for the type).
    pub chunk_elems: u32,
    /// Which collective ([`Coll`] as u32).
    pub coll: u32,
    /// The root rank of Broadcast and Reduce.
    pub root: u32,
    /// The protocol ([`Proto`] as u32).
    pub proto: u32,
    /// The algorithm ([`Algo`] as u32): [`ALGO_RING`], [`ALGO_TREE`] or [`ALGO_NVLS`].
    pub algo: u32,
    /// Bytes of one FIFO slot of the tree's up connections.
    pub tree_slot_bytes: u32,
    /// The tree's up connections: CTA `c` uses entry `c` of an array of ConnSend (towards the
    /// ring predecessor) and of ConnRecv (from the ring successor); 0 where there is none (the
    /// root sends up to nobody, the last rank receives from nobody).
    pub tree_up_send: u64,
    pub tree_up_recv: u64,
    /// Device address of the reduction's scalar (one element) when it lives in device memory;
    /// 0 when `redop_arg` holds it.
    pub redop_arg_ptr: u64,
    /// FIFO slots one Simple ring step fills at once (NCCL's slice steps; 0 and 1: one).
    pub slice_steps: u32,
    /// `FLAG_*` bits: how the kernel runs its steps.
    pub flags: u32,
    /// Across nodes, the double binary tree: an array of [`TreeDev`] in device memory, entry
    /// `c` for CTA `c` (its FIFO slots are `tree_slot_bytes`). 0: the tree is the chain in
    /// ring order over `tree_up_send`/`tree_up_recv` and the ring's connections.
    pub tree: u64,
    /// Registered calls on fewer CTAs: when non-zero and below the grid, every CTA of a ring
    /// collective with [`FLAG_RING_DIRECT`] first agrees with the ranks around its ring whether
    /// every rank's output is registered and reaches its successor over p2p
    /// (`Prims::ring_agree`); if so, only CTAs `0..reg_ctas` run the collective, over the
    /// slices `reg_ctas` channels make, and the others exit. Set alike on every rank, from
    /// facts every rank knows (collective, size, the communicator's transports).
    pub reg_ctas: u32,
    /// A launch the profiler plugin times per channel: its number (from 1) among the
    /// communicator's profiled launches, its stamps at `(profile_slot % PROFILE_LAUNCHES)` of
    /// [`DevComm::profile_stamps`]; 0: not timed.
    pub profile_slot: u32,
    /// Names the allocation this rank's offered output lies in (its
    /// [`RegEntry::alloc`] in the tables of peers in other processes; see [`DIRECT_KEY`]),
    /// where [`FLAG_RING_REGISTERED`] is set.
    pub offer_key: u64,
    /// [`ALGO_SYMMETRIC`]: the communicator's [`SymDev`] (device address).
    pub sym: u64,
    /// [`ALGO_SYMMETRIC`]: where this rank's input lies ([`SYM_SRC_STAGED`] or
    /// [`sym_src_window`]), published to the peers at the launch's start.
    pub sym_src: u64,
    /// [`ALGO_SYMMETRIC`], an AllReduce with both buffers in windows that have multicast
    /// objects (NVLS on user buffers): the multicast addresses of this rank's input and
    /// output, and where its output lies ([`sym_src_window`] of the output's window). The
    /// kernel reduces through the switch only where every rank's input and output lie at the
    /// same places (the arrive phase publishes them); else, or where 0, it loads from peers.
    pub mc_src: u64,
    pub mc_dst: u64,
    pub sym_dst: u64,
    /// [`ALGO_PAT`]: an array of [`PatDev`] in device memory, entry `c` for CTA `c`.
    pub pat: u64,
}

/// One CTA's place in a tree across nodes (see [`CollArgs::tree`]): device addresses of the
/// connections to its parent and to each of its children, 0 where there is none.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeDev {
    /// Children in use: `up_recv[..nchildren]` and `down_send[..nchildren]`.
    pub nchildren: u32,
    /// Where a tree spans exactly two nodes and this CTA is a node's head: which peer is the
    /// other node's head ([`TREE_REMOTE_PARENT`], or child `i` as `i + 1`); 0 elsewhere. The
    /// two heads then exchange their nodes' sums ([`FLAG_TREE_EXCHANGE`]).
    pub remote: u32,
    /// `*mut ConnSend` towards the parent (0 at the root): partial sums go up.
    pub up_send: u64,
    /// `*mut ConnRecv` from the parent (0 at the root): the results come down.
    pub down_recv: u64,
    /// Per child, `*mut ConnRecv`: its partial sums.
    pub up_recv: [u64; TREE_MAX_CHILDREN],
    /// Per child, `*mut ConnSend`: the results, passed on.
    pub down_send: [u64; TREE_MAX_CHILDREN],
    /// Zero-copy on the links inside the node ([`FLAG_RING_DIRECT`] on a Simple launch): how
    /// we reach the parent's registered output (as [`ChannelDev::send_reach`]; [`DIRECT_OFF`]
    /// where the parent is not a p2p peer of our node, or there is none). Not OFF also means
    /// the link from the parent takes the handshake: we offer our output for its results.
    pub parent_reach: u64,
    /// The same per child: how we reach its output with the results; not OFF also means its
    /// partial sums may land in our output.
    pub child_reach: [u64; TREE_MAX_CHILDREN],
}

/// [`CollArgs::flags`], [`P2pArgs::flags`]: a Simple step's last warp publishes it while the
/// others move the next step (NCCL_RS_SIMPLE_PUBLISHER).
pub const FLAG_SIMPLE_PUBLISHER: u32 = 1;
/// [`CollArgs::flags`]: the ring's p2p connections ([`ChannelDev::recv_direct`],
/// [`ChannelDev::send_reach`]) start this collective with the zero-copy handshake, on channels
/// whose slice of a block fills a step at least. Set alike on every rank, from facts every rank
/// knows (collective, protocol, algorithm), never from registration. On the one-node tree
/// (a chain in ring order) its way down takes the ring's handshake and its way up, on the
/// tree's up links, the send/recv one ([`ChannelDev::prev_reach`]); on the double binary tree
/// across nodes, its links inside a node take the send/recv one both ways
/// ([`TreeDev::parent_reach`], [`TreeDev::child_reach`]).
pub const FLAG_RING_DIRECT: u32 = 2;
/// [`CollArgs::flags`]: a two-rank ring AllReduce exchanges instead: each rank sends its whole
/// input to the other and adds what arrives to its own, one network hop per piece where the
/// ring's reduce-scatter and all-gather take two in a row. Both ranks compute `a + b` of the same
/// two values, and every reduction NCCL offers is commutative, so their results are equal bit
/// for bit. Set alike on both ranks (from the rank count, collective and protocol).
pub const FLAG_RING_EXCHANGE: u32 = 8;
/// [`TreeDev::remote`]: the other node's head is this CTA's parent.
pub const TREE_REMOTE_PARENT: u32 = u32::MAX;
/// [`CollArgs::flags`]: the tree AllReduce across two nodes exchanges at the top: each node's
/// head sends its node's sum ([`TreeDev::remote`]) to the other head and adds the other's to
/// it, one network hop where going up to the root and back down takes two. Inside a node the
/// tree stays a chain (up, then down), so every CTA has one peer each way and a step of any
/// protocol serves it: LL too. As for [`FLAG_RING_EXCHANGE`], both heads compute `a + b` of the
/// same two sums, equal bit for bit. Set alike on every rank (from rank 0's shape).
pub const FLAG_TREE_EXCHANGE: u32 = 16;
/// [`CollArgs::flags`]: this rank's output buffer is registered (or captured with graph
/// registration): it offers it to its predecessor and takes its successor's offer. A rank
/// without it declines at once and answers "FIFO" once its successor's offer is there, and
/// both sides copy.
pub const FLAG_RING_REGISTERED: u32 = 4;
/// [`CollArgs::flags`]: stamp this launch's entry and exit in [`DevComm::lab_stamps`] (the
/// kernel-stamps lab; off unless NCCL_RS_KERNEL_STAMPS is set).
pub const FLAG_LAB_STAMPS: u32 = 32;
/// [`CollArgs::flags`] of a symmetric AllReduce of the loads form: two-shot (each rank reduces
/// its block from every rank's input and publishes it; then every rank gathers the reduced
/// blocks), instead of one-shot (each rank reads and reduces everything).
pub const FLAG_SYM_TWO_SHOT: u32 = 64;

/// The collectives, with NCCL's `ncclFunc_t` values: the one definition the kernels
/// (`CollArgs::coll`; each has its own entry points), the tuner and the public API
/// (`nccl::Coll`) share.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Coll {
    Broadcast = 0,
    Reduce = 1,
    AllGather = 2,
    ReduceScatter = 3,
    AllReduce = 4,
}

impl Coll {
    /// Every collective, in NCCL's order (its `ncclFunc_t` values, which are the variants').
    pub const ALL: [Coll; 5] = [
        Coll::Broadcast,
        Coll::Reduce,
        Coll::AllGather,
        Coll::ReduceScatter,
        Coll::AllReduce,
    ];

    pub fn from_raw(v: u32) -> Option<Coll> {
        Coll::ALL.get(v as usize).copied()
    }

    pub fn name(self) -> &'static str {
        match self {
            Coll::AllReduce => "AllReduce",
            Coll::Broadcast => "Broadcast",
            Coll::Reduce => "Reduce",
            Coll::AllGather => "AllGather",
            Coll::ReduceScatter => "ReduceScatter",
        }
    }

    /// The collective's part of its kernels' entry-point names (`for_each_kernel!` ([`crate::kernel_set`])):
    /// `nccl_<symbol>` for the copies, `nccl_<symbol>_<type>_<reduction>` for the others.
    pub fn symbol(self) -> &'static str {
        match self {
            Coll::AllReduce => "all_reduce",
            Coll::Broadcast => "broadcast",
            Coll::Reduce => "reduce",
            Coll::AllGather => "all_gather",
            Coll::ReduceScatter => "reduce_scatter",
        }
    }

    /// Whether the collective only moves bytes (one uint8 kernel with no reduction serves it).
    pub fn copies(self) -> bool {
        matches!(self, Coll::Broadcast | Coll::AllGather)
    }
}

/// Most point-to-point work items (one CTA each) in one launch.
pub const MAX_P2P_ITEMS: usize = 64;

/// What a point-to-point work item does.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum P2pKind {
    /// Push `bytes` from `buff` through the ConnSend at `conn`.
    Send = 0,
    /// Pull `bytes` into `buff` through the ConnRecv at `conn`.
    Recv = 1,
    /// A send to ourselves: copy `bytes` from `src` to `buff`.
    Copy = 2,
}

/// One CTA's share of a group's sends and receives.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct P2pItem {
    /// `*mut ConnSend` or `*mut ConnRecv` in device memory (unused by Copy).
    pub conn: u64,
    pub buff: u64,
    /// The source of a Copy.
    pub src: u64,
    pub bytes: u64,
    pub kind: u32,
    /// Bytes of one FIFO slot of this connection.
    pub slot_bytes: u32,
    /// The zero-copy handshake (registered buffers, [`DIRECT_OFF`] and the other `DIRECT_*`):
    /// a Recv item offers the address of its part of the user buffer (or [`DIRECT_DECLINE`]:
    /// nothing to offer); a Send item says how to reach an offered address
    /// ([`DIRECT_DECLINE`], [`DIRECT_SAME_SPACE`], or a `*const RegTable` in device memory).
    /// Both ends of a message set it alike (off, or on with their own value), so both meet.
    pub direct: u64,
    /// A Recv item that offers its buffer: the key of the allocation it lies in
    /// ([`DIRECT_KEY`]).
    pub offer_key: u64,
}

/// [`P2pItem::direct`]: no handshake; the message goes through the FIFO.
pub const DIRECT_OFF: u64 = 0;
/// [`P2pItem::direct`]: the handshake happens, but this side refuses the zero-copy path (an
/// unregistered buffer, or a peer whose memory it cannot map), so the message takes the FIFO.
pub const DIRECT_DECLINE: u64 = 1;
/// [`P2pItem::direct`] of a Send: the receiver shares our address space (same process, peer
/// access on), so an offered address is used as it is.
pub const DIRECT_SAME_SPACE: u64 = 2;

/// The zero-copy handshake lives in the connection's counter lines, beside the counters (each
/// line is [`CTRL_LINE`] bytes and the counter takes its first 8). The receiver writes its offer
/// into the sender's head line: the address at +16, then (release) the tag at +8. The sender
/// answers in the receiver's tail line: the mode (1: the data is in your buffer; 0: it comes
/// through the FIFO) at +16, then (release) the tag at +8. The tag is the connection's step at
/// the start of the message plus one, the same at both ends, so stale words never match.
pub const DIRECT_TAG: usize = 8;
/// See [`DIRECT_TAG`].
pub const DIRECT_WORD: usize = 16;
/// In the sender's head line, a word only the sender writes: thread 0's decision (the address
/// it copies to, or 0), read back by the CTA's other threads after a barrier, so that one thread
/// alone reads the offer and the [`RegTable`] (host memory, a trip over PCIe per read).
pub const DIRECT_DST: usize = 24;

/// The ring collectives' handshake ([`FLAG_RING_DIRECT`]) uses the same words, with messages of
/// one word where it can, so that a rank that did not register sends two plain stores and
/// waits for nothing: a declined offer is the tag word alone, `tag | RING_DECLINED`; an offer of
/// a buffer is its address at [`DIRECT_WORD`], then (release) the tag; an answer is the tag word
/// alone, `tag << 1 | direct`.
pub const RING_DECLINED: u64 = 1 << 63;
/// In a ring offer's tag word (beside the tag): the offering rank also takes partial sums in its
/// output buffer (AllReduce's reduce-scatter half; see `coll::all_reduce::ring`). Set only by a
/// rank whose input and output do not overlap: a partial sum written there in place would land
/// on an input the rank has not added yet.
pub const RING_PARTIALS: u64 = 1 << 62;
/// In the sender's head line, beside [`DIRECT_DST`] and written only by the sender: thread 0's
/// decision to write partial sums into the successor's output (1) or not (0), read back by the
/// CTA's other threads after a barrier.
pub const DIRECT_PARTIALS: usize = 32;
/// The ring agreement (`Prims::ring_agree`): in the receiver's tail line, the sender's word
/// `tag << 32 | known << 1 | ok` (the tag's low 32 bits; the sender knows for `known` ranks ending with itself that
/// all are `ok`; a 0 `ok` is final); in the sender's head line, the receiver's
/// acknowledgement, the last tag it finished reading (the sender's next agreement writes only
/// after it, so no word is overwritten before its reader took it).
pub const AGREE_WORD: usize = 40;
/// In the sender's head line, beside the offer's address and written before its tag: the key
/// of the allocation the offered buffer lies in ([`CollArgs::offer_key`],
/// [`P2pItem::offer_key`]: the owner's id of the allocation). The sender translates the offer
/// only through a [`RegEntry`] of that allocation: a peer that freed a registered buffer and
/// offers a new one at the same address before its records reach us (they travel apart from
/// the handshake) would otherwise be written through our mapping of the freed one.
pub const DIRECT_KEY: usize = 48;

/// One registered buffer of a peer process as this process maps it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RegEntry {
    /// The buffer's range in the peer's address space: [start, end).
    pub peer_start: u64,
    pub peer_end: u64,
    /// Where `peer_start` lies in ours.
    pub local: u64,
    /// The peer's id of the allocation the range lies in (0 where it cannot tell): an offer
    /// is translated only by an entry of the allocation it names ([`DIRECT_KEY`]).
    pub alloc: u64,
}

/// Most entries a [`RegTable`] holds.
pub const REG_TABLE_ENTRIES: usize = 255;

/// A peer process's registered buffers as this process maps them; a sender translates an
/// offered address through it. The host appends entries and then raises `count` (release), so
/// a kernel reading `count` entries sees them whole.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RegTable {
    pub count: u64,
    pub _pad: [u64; 2],
    pub entries: [RegEntry; REG_TABLE_ENTRIES],
}

impl RegTable {
    /// Where `bytes` at the peer's `addr`, in its allocation `alloc`, lie in our address
    /// space, if one entry of that allocation covers them.
    pub fn translate(entries: &[RegEntry], addr: u64, bytes: u64, alloc: u64) -> Option<u64> {
        let end = addr.checked_add(bytes)?;
        entries
            .iter()
            .find(|e| e.alloc == alloc && e.peer_start <= addr && end <= e.peer_end)
            .map(|e| e.local + (addr - e.peer_start))
    }
}

/// The arguments of a point-to-point launch (grid = `nitems`).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct P2pArgs {
    pub nitems: u32,
    /// `FLAG_*` bits, as [`CollArgs::flags`].
    pub flags: u32,
    /// The communicator's [`DevComm::abort_flag`].
    pub abort_flag: u64,
    pub items: [P2pItem; MAX_P2P_ITEMS],
}

impl Default for P2pArgs {
    fn default() -> Self {
        P2pArgs {
            nitems: 0,
            flags: 0,
            abort_flag: 0,
            items: [P2pItem::default(); MAX_P2P_ITEMS],
        }
    }
}

const _: () = {
    assert!(core::mem::size_of::<P2pItem>() == 56);
    assert!(core::mem::size_of::<P2pArgs>() == 16 + 56 * MAX_P2P_ITEMS);
    assert!(core::mem::size_of::<RegTable>() == 24 + 32 * REG_TABLE_ENTRIES);
    assert!(DIRECT_DST + 8 <= CTRL_LINE);
    assert!(DIRECT_PARTIALS + 8 <= CTRL_LINE && DIRECT_PARTIALS != DIRECT_DST);
    assert!(AGREE_WORD + 8 <= CTRL_LINE && AGREE_WORD > DIRECT_PARTIALS);
    assert!(DIRECT_KEY + 8 <= CTRL_LINE && DIRECT_KEY > AGREE_WORD);
    assert!(core::mem::size_of::<ConnSend>() == 72);
    assert!(core::mem::size_of::<ConnRecv>() == 72);
    assert!(core::mem::size_of::<ChannelDev>() == 200);
    assert!(core::mem::size_of::<DevComm>() == 64);
    assert!(core::mem::size_of::<ChannelStamp>() == 32);
    assert!(core::mem::size_of::<LabStamp>() == 32);
    assert!(core::mem::size_of::<NvlsChannel>() == 40);
    assert!(core::mem::size_of::<CollArgs>() == 168);
    assert!(core::mem::size_of::<SymSlot>() == 32);
    assert!(core::mem::size_of::<SymDev>() == 24 + 8 * SYM_MAX_RANKS + 8 * MAX_CHANNELS);
    assert!(core::mem::size_of::<TreeDev>() == 32 + 24 * TREE_MAX_CHILDREN);
    assert!(core::mem::align_of::<TreeDev>() == 8);
    assert!(core::mem::align_of::<CollArgs>() == 8);
};
