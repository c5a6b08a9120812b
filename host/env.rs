//! Every NCCL_* parameter in one table (rule 6 of docs/architecture.md): name, default, meaning. Values come from
//! the environment, else from `NCCL_CONF_FILE` (or `~/.nccl.conf`, then `/etc/nccl.conf`) lines
//! `NAME=value`; they are read when a communicator is created and logged at NCCL_DEBUG=INFO.

use std::collections::HashMap;
use std::sync::OnceLock;

/// One parameter: its name, its default (as text) and what it does. Each is a constant of this
/// module named as the parameter without its `NCCL_` prefix (`env::BUFFSIZE` is
/// `NCCL_BUFFSIZE`), so a misspelt name does not compile.
#[derive(Clone, Copy, Debug)]
pub struct Param {
    pub name: &'static str,
    pub default: &'static str,
    pub doc: &'static str,
}

/// The table: `NAME = default, doc;` makes the constant `NAME` for `NCCL_NAME`, and [`PARAMS`]
/// lists them all.
macro_rules! params {
    ($($id:ident = $default:literal, $doc:literal;)*) => {
        $(
            #[doc = concat!("`NCCL_", stringify!($id), "`: see its `doc` (and [`PARAMS`]).")]
            pub const $id: Param = Param {
                name: concat!("NCCL_", stringify!($id)),
                default: $default,
                doc: $doc,
            };
        )*
        /// Every parameter, in the table's order.
        pub const PARAMS: &[Param] = &[$($id),*];
    };
}

params! {
    BUFFSIZE = "4194304",
        "bytes of each connection FIFO (NCCL_STEPS slots)";
    NTHREADS = "512",
        "threads per CTA of the collective kernels";
    MIN_NCHANNELS = "0",
        "fewest channels a communicator uses (0: automatic)";
    MAX_NCHANNELS = "0",
        "most channels a communicator uses (0: automatic)";
    P2P_DISABLE = "0",
        "1: no peer-to-peer transport between GPUs";
    NVLS_ENABLE = "0",
        "exactly 1: NVLink SHARP (NVLS) where every rank's GPU supports multicast; \
              anything else: no multicast object is ever created (the shared GPU hosts set 0)";
    PAT_ENABLE = "2",
        "0: no PAT (AllGather and ReduceScatter on binomial trees); 1 or 2 (automatic): PAT \
              where every node holds one rank, chosen by the tuner (rank 0's value counts)";
    NVLS_NCHANNELS = "16",
        "most channels (CTAs) of an NVLS collective, each with its own scratch region";
    NVLS_CHUNKSIZE = "131072",
        "bytes of each of a NVLS channel's two scratch halves (one piece of a call each)";
    COMM_ID = "",
        "ip:port of the bootstrap root, instead of the unique id's";
    RS_COMM_SECRET = "",
        "with NCCL_COMM_ID: a private text every rank of the job shares, from which the \
              bootstrap's keys derive (without it anyone who reaches the root can join; \
              nccl-rs's own)";
    BOOTSTRAP_TIMEOUT_MS = "120000",
        "how long init waits for every rank to arrive, and an unused unique id's root for \
              its first rank (nccl-rs's own: NCCL documents no bootstrap timeout)";
    RS_BOOTSTRAP_OP_TIMEOUT_MS = "300000",
        "how long a bootstrap wait after init (allgather, barrier, a message from a peer, \
              a split's agreement) may last before it fails; unset: the larger of 300 s and \
              NCCL_BOOTSTRAP_TIMEOUT_MS (nccl-rs's own: NCCL's bootstrap waits without a \
              deadline)";
    RAS_ENABLE = "1",
        "0: no RAS thread (the job-state queries of `ncclras`)";
    RAS_ADDR = "localhost:28028",
        "host:port where the first process of a host answers RAS clients";
    RAS_TIMEOUT_FACTOR = "1",
        "multiplies RAS's wait for each rank's answer (5 s)";
    RS_BOOTSTRAP_HANDSHAKE_MS = "2000",
        "how long a connection to a bootstrap listener (root or rank) may take to answer its \
              challenge; a listener holds at most 1024 such connections, 256 from one address, \
              dropping the oldest for a newer one (nccl-rs's own)";
    RS_BOOTSTRAP_QUEUE_BYTES = "1073741824",
        "most bytes one peer may have waiting, unread, in a rank's bootstrap mailbox; past \
              it the rank stops reading from that peer until some are taken (nccl-rs's own)";
    SOCKET_IFNAME = "",
        "interfaces the bootstrap may use: prefixes, ^ to exclude, = for exact names";
    SOCKET_FAMILY = "",
        "AF_INET or AF_INET6: the bootstrap's address family (default: IPv4 first)";
    SOCKET_RETRY_CNT = "34",
        "failed connection attempts the bootstrap retries";
    SOCKET_RETRY_SLEEP_MSEC = "100",
        "pause between connection retries, times the attempt number (ms)";
    SOCKET_NTHREADS = "0",
        "helper threads per socket-network connection (1 to 16); 0: automatic, 1 (2 on AWS ENA, 4 on GCP gVNIC)";
    NSOCKS_PERTHREAD = "0",
        "data sockets per socket-network helper thread (threads x sockets at most 64); 0: automatic, 1 (8 on AWS ENA)";
    RS_SOCKET_TIMEOUT_MS = "60000",
        "how long a bootstrap or socket-network connection may hear nothing from its peer's \
              host before it fails (TCP keepalive probes, answered by the peer's kernel however busy its rank \
              is): a link taken down or a host gone without closing becomes an error instead of \
              a hang (nccl-rs's own: NCCL's socket network waits forever); rounded up to whole \
              seconds, at least 2; 0: no probes";
    RS_SOCKET_SEND_TIMEOUT_MS = "60000",
        "how long bytes sent on a bootstrap or socket-network connection may stay \
              unacknowledged by the peer's host (no ACK at all, while data is in flight) before \
              the connection fails, so that a peer whose host vanished mid-transfer (packets \
              dropped, no reset) becomes an error instead of TCP's ~15 minutes of \
              retransmissions; a receiver that merely reads late still acknowledges (zero-window \
              probes) and never trips it (nccl-rs's own; bootstrap: TCP_USER_TIMEOUT, at most \
              NCCL_RS_SOCKET_TIMEOUT_MS, since Linux also ends keepalive's count with it, and \
              its readers always drain up to NCCL_RS_BOOTSTRAP_QUEUE_BYTES; socket network: the \
              time since the last ACK while data is unacknowledged, from TCP_INFO, because \
              TCP_USER_TIMEOUT also counts a zero window); 0: no bound";
    RS_SOCKET_INLINE_BYTES = "65536",
        "a socket-network sender writes messages shorter than this inline on the \
              connection's control socket from the proxy's own thread, longer ones cut across \
              the data sockets by the helper threads (two thread wake-ups a side, but sockets in \
              parallel); each message's header says which, so ranks may differ (nccl-rs's own); \
              0: every non-empty message in pieces; at most 1 GiB";
    RS_PEER_HANG_TIMEOUT_MS = "0",
        "opt-in bound on a rank that hangs without dying (its process stopped: SIGSTOP, a \
              debugger; or wholly stuck): each rank sends a bootstrap heartbeat to its ring \
              successor every quarter of this (at most 5 s), and a rank that has heard none from \
              its predecessor for this long while an operation of the communicator is \
              outstanding (twice this long otherwise: another rank may be the one waiting) \
              raises the async error (ncclRemoteError, \"rank N has not responded \
              for T s\") and the kernels' abort flag, and tells every other rank; every rank \
              must set the same value (nccl-rs's own: NCCL has no such bound); 0: off";
    UID_STAGGER_THRESHOLD = "256",
        "ranks per unique id above which hellos to its root are paced";
    UID_STAGGER_RATE = "7000",
        "hellos per second a root receives when paced";
    COMM_BLOCKING = "1",
        "0: communicators are non-blocking unless their config says otherwise";
    CGA_CLUSTER_SIZE = "4",
        "CTA cluster size (0 to 8) unless the config sets cgaClusterSize";
    MIN_CTAS = "1",
        "fewest CTAs (channels) unless the config sets minCTAs";
    MAX_CTAS = "32",
        "most CTAs (channels) unless the config sets maxCTAs";
    NET = "",
        "network to use (Socket, IB), unless the config sets netName";
    COMM_SPLIT_SHARE_RESOURCES = "0",
        "1: split children share the parent's resources unless the config says otherwise";
    CTA_POLICY = "0",
        "0 default, 1 efficiency, 2 zero (copy-engine collectives on windows) unless the config \
         sets CTAPolicy";
    NCHANNELS_PER_NET_PEER = "0",
        "channels per remote peer of point-to-point calls unless the config sets \
         nChannelsPerNetPeer (1 to 64; 0: automatic); recorded";
    NVLINK_UTIL_CENTRIC_SCHED_ENABLE = "0",
        "1: NVLink-centric CTA scheduling (GPUs of compute capability 10 and newer) unless the \
         config sets nvlinkCentricSched; recorded";
    GRAPH_MIXING_SUPPORT = "1",
        "1: CUDA graphs may mix with each other and with eager calls (graphUsageMode 2), 0: \
         no graphs (mode 0), unless the config sets graphUsageMode";
    NUM_RMA_CTX = "1",
        "contexts of one-sided operations (the ctx of ncclPutSignal, ncclSignal, \
         ncclWaitSignal) unless the config sets numRmaCtx";
    DEBUG = "",
        "VERSION, WARN, INFO, ABORT or TRACE (unset: nothing); see debug.rs";
    DEBUG_SUBSYS = "INIT,BOOTSTRAP,ENV",
        "subsystems NCCL_DEBUG shows (comma list; a leading ^ excludes them)";
    DEBUG_FILE = "",
        "file the log lines go to (%h host, %p pid; unset: stdout)";
    RS_BACKEND = "cuda",
        "cuda: real GPUs; sim: the CPU simulator";
    RS_SIM_DEVICES = "8",
        "how many GPUs the simulator shows";
    RS_PUT_DEPTH = "0",
        "chunks of 512 KiB a rank's one-sided puts across nodes keep in flight (its staging \
              slots in pinned host memory, and its receive buffers per peer and lane while 64 \
              MiB hold them for every lane, 2 per lane beyond), 1 to 64; 0: two per lane";
    RS_PUT_LANES = "0",
        "network connections each way between two ranks that one-sided puts across nodes \
              spread their 512 KiB chunks over, 1 to 16; 0: 32 over the peers, 1 to 8 each";
    RS_SYMMETRIC_MAX_BYTES = "65536",
        "nccl-rs: largest AllReduce, AllGather or ReduceScatter block (bytes per rank) the \
         symmetric path takes once the communicator has a symmetric window (0: never); up to \
         64 KiB it pushes LL lines, above it reads the peers between barriers (slower than the \
         ring on one shared H100)";
    RS_DETERMINISTIC = "0",
        "nccl-rs: 1: AllReduce, ReduceScatter and Reduce of floating-point sums, products, \
         averages and premultiplied sums give the same bits for the same inputs and rank \
         count whatever the algorithm, protocol, channels, node layout or how the call is \
         cut (each element reduced in rank order by its owner; every rank connects to every \
         other at creation); every rank must set it alike";
    RS_DETERMINISTIC_SCRATCH = "33554432",
        "nccl-rs: bytes of device memory a deterministic communicator stages each piece of a \
         call in (at least 4096; larger: fewer, longer pieces)";
    RS_DETERMINISTIC_CHAIN_CTAS = "0",
        "nccl-rs: CTAs (connections to each neighbour) of the deterministic AllReduce's chain \
         in rank order, each with FIFOs of 8 slots both ways; 0: as many as the ring's \
         channels; every rank must set it alike";
    RS_DETERMINISTIC_CHAIN_SLOT = "0",
        "nccl-rs: bytes of one FIFO slot (one step) of the deterministic AllReduce's chain, a \
         multiple of 128 from 4 KiB to 16 MiB; 0: the ring's slot (NCCL_BUFFSIZE / 8); every \
         rank must set it alike";
    RS_SYMMETRIC_TWO_SHOT = "1",
        "nccl-rs: 1: the symmetric path's AllReduces above 64 KiB run two-shot on 3 ranks or \
         more (each rank reduces its block, then gathers the others'); 0: one-shot";
    RS_SIM_NTHREADS = "4",
        "threads per simulated CTA";
    RS_SIM_NVLS = "0",
        "1: allow NVLS multicast objects on the simulator only (its tests use it instead of NCCL_NVLS_ENABLE, which the CUDA backend honours)";
    RS_SIM_BUFFSIZE = "65536",
        "NCCL_BUFFSIZE under the simulator, unless NCCL_BUFFSIZE is set";
    RS_SIM_NO_PEER_ACCESS = "0",
        "1: the simulator's GPUs cannot map each other's memory (cuDeviceCanAccessPeer says no), so ranks of one process on different GPUs take SHM";
    RS_SIM_P2P_CONNS = "1",
        "connections per peer (CTAs of one send/recv or tree AllReduce) under the simulator";
    RS_P2P_CONNS = "0",
        "connections per peer (CTAs of one send/recv) on GPUs; 0: 64 / nranks, up to 16";
    RS_RING_EXCHANGE = "1",
        "1: a two-rank ring AllReduce on LL exchanges (each rank sends its whole input and adds the peer's: one hop where the ring takes two); 0: the ring's reduce-scatter and all-gather. Rank 0's value holds for every rank";
    RS_TREE_EXCHANGE = "1",
        "1: the tree AllReduce across two nodes exchanges at the top (each node's head sends its node's sum to the other head: one network hop where up and down take two) and may use LL; 0: NCCL's double binary tree, Simple only. Rank 0's value holds for every rank";
    RS_REGISTERED_CTAS = "0",
        "CTAs a ring AllReduce, AllGather or Broadcast on one node runs on when every rank registered its output (the kernels agree on it around the ring); 0: as many as unregistered calls (on 4 H100s busbw fell with the CTAs)";
    RS_SIMPLE_PUBLISHER = "0",
        "1: a Simple step's last warp publishes it while the other warps move the next step (NCCL's design; unmeasured over NVLink, so off)";
    RS_SLICE_STEPS = "0",
        "FIFO slots one Simple ring step fills (1, 2 or 4); 0: 2 for AllReduce, AllGather and ReduceScatter, 1 for Broadcast and Reduce, as NCCL";
    RS_SHARED_GPUS = "0",
        "1: ranks on one host may share a GPU (a kernel lab for one-GPU hosts; NCCL refuses duplicate GPUs, and the data then never crosses NVLink)";
    RS_PROXY_STALL_WARN_S = "30",
        "seconds a network send may wait with steps the kernel published before the proxy warns with its counters";
    TOPO_FILE = "",
        "topology XML to use instead of detecting the node";
    TOPO_DUMP_FILE = "",
        "file the detected topology XML is written to";
    P2P_NVL_CHUNKSIZE = "0",
        "bytes of one send/recv step (FIFO slot of a p2p connection); unset: 512 KiB on GPUs";
    LOCAL_REGISTER = "1",
        "0: registered buffers (ncclCommRegister) are recorded but send/recv and the ring collectives (AllGather, Broadcast, AllReduce, ReduceScatter, Reduce) still copy through the FIFOs";
    RS_PRELOAD_KERNELS = "",
        "kernels a communicator's first window registration or device communicator loads (once per GPU and process) besides those whose SASS the build embedded, which it always loads: a comma-separated list of entry-name prefixes (nccl_all_reduce_float_sum, nccl_p2p, ...; 'all' for every one), JIT-compiled from their PTX; 0: none, not even the SASS ones. A kernel loaded later, on first use, makes CUDA wait for the GPU's running kernels: behind a held ncclWaitSignal that can deadlock";
    RS_SASS = "1",
        "0: kernels are JIT-compiled from their PTX even where the build embedded SASS for the device (NCCL_RS_PTXAS at build time)";
    CUMEM_ENABLE = "1",
        "0: the p2p transport's connection blocks come from cuMemAlloc and reach ranks in other processes by CUDA IPC handles, and ncclCommSuspend refuses (nothing can be released at a kept address); 1: blocks of 1 MiB and more come from CUDA's virtual memory API, suspendable";
    RS_VMM_IPC = "1",
        "0: registered buffers of CUDA's virtual memory API (ncclMemAlloc) are not exported to, nor mapped from, ranks in other processes by their POSIX descriptors (passed over a Unix socket, else pidfd_getfd), so messages between such ranks into them copy through the FIFOs";
    GRAPH_REGISTER = "1",
        "0: send/recv and ring collectives captured in a CUDA graph copy through the FIFOs; 1: their buffers count as registered (zero-copy with peers of this process; peers in other processes of the node get the buffers' records at capture, withdrawn when the graph is destroyed)";
    RS_GRAPH_REG_WAIT_MS = "5000",
        "graph registration with ranks in other processes: how long a captured send or collective waits for the peer's records of the buffers it writes into (the peer's capture of the same operation); past it, the graph's replays copy through the FIFOs until a later launch maps them";
    P2P_LEVEL = "",
        "farthest path (LOC, NVL, PIX, PXB, PHB, SYS) P2P is used over (default PXB)";
    HOSTID = "",
        "this process's node identity instead of the host name and boot id (ranks with different values are different nodes)";
    SHM_DISABLE = "0",
        "1: no shared-memory transport between GPUs";
    NET_GDR_LEVEL = "",
        "farthest GPU-NIC path (LOC, PIX, PXB, PHB, SYS) GPUDirect RDMA is used over (default PXB)";
    NET_GDR_READ = "",
        "1: sends read GPU memory directly (GPU Direct RDMA) where NCCL_NET_GDR_LEVEL allows; 0: sends go through host memory; unset: on from compute capability 8.0, before only where GPUs share NVLink (or there is one GPU)";
    NET_FORCE_FLUSH = "0",
        "1: flush every GPU Direct RDMA receive (iflush) even where the GPU needs none (compute capability 9.0 and later)";
    RS_NET_LL_POLL = "1",
        "where a network connection's FIFO is in host memory, LL lines are read by their flags (as NCCL): 1: both ways (a receiver polls its lines; a sender publishes its step without a system-scope release and its proxy checks the lines before sending them); 2: receivers only; 0: neither (receivers wait for the proxy's tail, senders release theirs, as LL128 and Simple do)";
    RS_PROXY_TIMELINE = "",
        "lab tool: a file prefix; each process records its network launches and steps (monotonic ns) and writes them to PREFIX.<pid> when its proxy stops (docs/latency.md)";
    RS_KERNEL_STAMPS = "",
        "lab tool: a file prefix; every collective launch stamps its CTA 0's entry and exit (the GPU's ns timer), written to PREFIX.<pid>-<k>.<rank> (k: the process's communicators in creation order) when the communicator goes (tools/proxy-timeline.py --kernels)";
    NET_SHARED_COMMS = "1",
        "1: the send/recv connections between two ranks on one network device share one network comm where the network groups receives (maxRecvs > 1), each connection's messages tagged, its awaited steps posted together in one irecv; 0: a comm per connection";
    DMABUF_ENABLE = "1",
        "0: never register GPU memory with a network plugin through a dmabuf (regMrDmaBuf); 1: where the plugin and the driver support it";
    CROSS_NIC = "2",
        "0: rings keep one NIC per node (rails); 1: may change NIC; 2: only when it helps";
    ALGO = "",
        "algorithms allowed: list, ^list to exclude, or coll:list;coll:list";
    PROTO = "",
        "protocols allowed (LL, LL128, Simple): list, ^list, or coll:list;coll:list";
    RINGS = "",
        "ring order per channel, rings separated by '|' (\"0 2 1 3|3 1 2 0\"); rank 0's rules";
    NET_PLUGIN = "",
        "network plugins, comma-separated, each tried as given then as libnccl-net-<name>.so; unset: libnccl-net.so; none: no plugin (the socket network stays available after them)";
    COLLNET_ENABLE = "0",
        "1: ask for CollNet; a plugin's ncclCollNetPlugin table is found and reported, but no CollNet algorithm runs here";
    TUNER_PLUGIN = "",
        "tuner plugin library (path, name, or X for libnccl-tuner-X.so)";
    PROFILER_PLUGIN = "",
        "profiler plugin library (path, name, or X for libnccl-profiler-X.so; STATIC_PLUGIN: the program itself); unset: libnccl-profiler.so where it exists; none: no profiler";
}

fn conf_file() -> &'static HashMap<String, String> {
    static CONF: OnceLock<HashMap<String, String>> = OnceLock::new();
    CONF.get_or_init(|| {
        let mut paths = Vec::new();
        if let Ok(p) = std::env::var("NCCL_CONF_FILE") {
            paths.push(p);
        } else {
            if let Ok(home) = std::env::var("HOME") {
                paths.push(format!("{home}/.nccl.conf"));
            }
            paths.push("/etc/nccl.conf".into());
        }
        let mut map = HashMap::new();
        for p in paths {
            if let Ok(text) = std::fs::read_to_string(&p) {
                map.extend(parse_conf(&text));
            }
        }
        map
    })
}

/// `NAME=value` lines; `#` starts a comment.
pub fn parse_conf(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(|l| l.split('#').next().unwrap_or("").trim())
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .filter(|(k, _)| !k.is_empty())
        .collect()
}

impl Param {
    /// The raw value: environment first, then the configuration file (None: unset or empty).
    pub fn raw(&self) -> Option<String> {
        std::env::var(self.name)
            .ok()
            .or_else(|| conf_file().get(self.name).cloned())
            .filter(|v| !v.is_empty())
    }

    /// As an integer: its value, or the table's default when unset or malformed (malformed
    /// values are reported).
    pub fn int(&self) -> i64 {
        let default = || self.default.parse().unwrap_or(0);
        match self.raw() {
            None => default(),
            Some(v) => parse_int(&v).unwrap_or_else(|| {
                log::warn!("{}={v} is not an integer; using the default", self.name);
                default()
            }),
        }
    }
}

/// Decimal or 0x-hexadecimal.
pub fn parse_int(v: &str) -> Option<i64> {
    let v = v.trim();
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => i64::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

/// Logs every parameter that is set (NCCL_DEBUG=INFO).
pub fn log_params() {
    for p in PARAMS {
        if let Some(v) = p.raw() {
            log::info!("{} set to {v} ({})", p.name, p.doc);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_integers_and_conf_lines() {
        assert_eq!(parse_int("4194304"), Some(4194304));
        assert_eq!(parse_int("0x400000"), Some(4194304));
        assert_eq!(parse_int("four"), None);
        let kv =
            parse_conf("# comment\nNCCL_BUFFSIZE = 1024 # trailing\n\nbad line\nNCCL_DEBUG=INFO\n");
        assert_eq!(
            kv,
            vec![
                ("NCCL_BUFFSIZE".into(), "1024".into()),
                ("NCCL_DEBUG".into(), "INFO".into())
            ]
        );
        let mut names: Vec<_> = PARAMS.iter().map(|p| p.name).collect();
        names.sort();
        names.dedup();
        assert_eq!(
            names.len(),
            PARAMS.len(),
            "a parameter is in the table twice"
        );
        assert_eq!(BUFFSIZE.name, "NCCL_BUFFSIZE");
    }
}
