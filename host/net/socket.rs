//! The built-in socket network ("Socket"), as NCCL's: one device per chosen IP interface, TCP
//! connections made of one control socket and `NCCL_SOCKET_NTHREADS` × `NCCL_NSOCKS_PERTHREAD`
//! data sockets moved by helper threads, host memory only.
//!
//! - Interfaces: `ifaces` (NCCL_SOCKET_IFNAME, NCCL_SOCKET_FAMILY, NCCL's default order).
//! - Handle, hellos, message headers, how messages are cut: `wire`.
//! - Non-blocking listen / connect / accept: `handshake`.
//! - Helper threads, framing, requests, failures: `comm`.
//!
//! Defaults as NCCL documents them: 1 helper thread with 1 data socket per connection, except
//! on AWS (interface vendor 0x1d0f, ENA: 2 threads × 8 sockets) and Google Cloud gVNIC (vendor
//! 0x1ae0: 4 threads × 1 socket); at most 16 threads and 64 data sockets.

mod comm;
mod handshake;
mod ifaces;
mod wire;

#[cfg(test)]
mod tests;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::net::{
    Connecting, Handle, Listener, Mr, Net, Properties, RecvBuf, RecvComm, Request, SendComm, Waker,
    PTR_HOST,
};
use crate::sockets::Retry;
use comm::Comm;
pub use handshake::{SocketConnecting, SocketListener};
pub use ifaces::Family;

/// How long a connection may take to open before either side gives up.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a connection may hear nothing from its peer's host before it fails
/// (`NCCL_RS_SOCKET_TIMEOUT_MS`'s default; see `comm::keepalive`).
pub const DEFAULT_PEER_TIMEOUT: Duration = Duration::from_secs(60);
/// Speed reported when sysfs does not know it (Mbit/s), as NCCL.
pub const DEFAULT_SPEED_MBPS: u32 = 10_000;
/// The largest `NCCL_RS_SOCKET_INLINE_BYTES` taken (a larger value is this one).
pub const MAX_INLINE_BELOW: usize = 1 << 30;

/// What a [`SocketNet`] is made with. `Default` is NCCL's defaults (and nccl-rs's
/// [`DEFAULT_PEER_TIMEOUT`]) without reading the environment; [`SocketOptions::from_env`] reads
/// the NCCL_* parameters.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SocketOptions {
    /// `NCCL_SOCKET_IFNAME`: None for NCCL's automatic choice.
    pub ifname: Option<String>,
    /// `NCCL_SOCKET_FAMILY`: None for either (IPv4 first).
    pub family: Option<Family>,
    /// `NCCL_SOCKET_NTHREADS`: 0 for automatic.
    pub nthreads: usize,
    /// `NCCL_NSOCKS_PERTHREAD`: 0 for automatic.
    pub nsocks_per_thread: usize,
    pub handshake_timeout: Duration,
    /// `NCCL_SOCKET_RETRY_CNT`: refused connects retried this many times.
    pub retry_count: u32,
    /// `NCCL_SOCKET_RETRY_SLEEP_MSEC`: pause between retries, times the attempt number.
    pub retry_sleep_ms: u64,
    /// `NCCL_RS_SOCKET_TIMEOUT_MS`: a connection whose peer's host answers nothing for this long
    /// (a link down, a host gone) fails instead of waiting forever; None: no keepalive probes
    /// (NCCL's behaviour).
    pub peer_timeout: Option<Duration>,
    /// `NCCL_RS_SOCKET_SEND_TIMEOUT_MS`: a connection whose data in flight its peer's host
    /// leaves unacknowledged for this long (the host vanished mid-transfer) fails; None: TCP's
    /// retransmission limit alone (about 15 minutes; NCCL's behaviour).
    pub send_timeout: Option<Duration>,
    /// `NCCL_RS_SOCKET_INLINE_BYTES`: a sender writes messages shorter than this inline on the
    /// control socket from the caller's thread, longer ones in pieces through its helper
    /// threads.
    pub inline_below: usize,
}

impl Default for SocketOptions {
    fn default() -> Self {
        SocketOptions {
            ifname: None,
            family: None,
            nthreads: 0,
            nsocks_per_thread: 0,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            retry_count: 34,
            retry_sleep_ms: 100,
            peer_timeout: Some(DEFAULT_PEER_TIMEOUT),
            send_timeout: Some(DEFAULT_PEER_TIMEOUT),
            inline_below: wire::DEFAULT_INLINE_BELOW,
        }
    }
}

impl SocketOptions {
    /// The options the NCCL_* parameters (environment, then NCCL_CONF_FILE) ask for.
    pub fn from_env() -> Self {
        let family = crate::env::SOCKET_FAMILY.raw().and_then(|v| {
            let f = Family::parse(&v);
            if f.is_none() {
                log::warn!("NCCL_SOCKET_FAMILY={v} is neither AF_INET nor AF_INET6; ignored");
            }
            f
        });
        let retry = Retry::from_env();
        SocketOptions {
            ifname: crate::env::SOCKET_IFNAME.raw(),
            family,
            nthreads: crate::env::SOCKET_NTHREADS.int().max(0) as usize,
            nsocks_per_thread: crate::env::NSOCKS_PERTHREAD.int().max(0) as usize,
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            retry_count: retry.count,
            retry_sleep_ms: retry.sleep_ms,
            peer_timeout: match crate::env::RS_SOCKET_TIMEOUT_MS.int() {
                ms if ms <= 0 => None,
                ms => Some(Duration::from_millis(ms as u64)),
            },
            send_timeout: match crate::env::RS_SOCKET_SEND_TIMEOUT_MS.int() {
                ms if ms <= 0 => None,
                ms => Some(Duration::from_millis(ms as u64)),
            },
            inline_below: crate::env::RS_SOCKET_INLINE_BYTES
                .int()
                .clamp(0, MAX_INLINE_BELOW as i64) as usize,
        }
    }
}

/// Threads × sockets per thread for a connection over interface `name`: the options' values,
/// else the interface vendor's defaults; clamped to NCCL's limits.
fn geometry(opts: &SocketOptions, name: &str) -> (usize, usize) {
    let vendor =
        std::fs::read_to_string(format!("/sys/class/net/{name}/device/vendor")).unwrap_or_default();
    let (auto_threads, auto_socks) = match vendor.trim() {
        "0x1d0f" => (2, 8),
        "0x1ae0" => (4, 1),
        _ => (1, 1),
    };
    let threads = match opts.nthreads {
        0 => auto_threads,
        n if n > wire::MAX_THREADS => {
            log::warn!(
                "NET/Socket: NCCL_SOCKET_NTHREADS={n} is above {}; using {}",
                wire::MAX_THREADS,
                wire::MAX_THREADS
            );
            wire::MAX_THREADS
        }
        n => n,
    };
    let mut socks = match opts.nsocks_per_thread {
        0 => auto_socks,
        n => n,
    };
    if threads * socks > wire::MAX_SOCKETS {
        let fit = (wire::MAX_SOCKETS / threads).max(1);
        log::warn!(
            "NET/Socket: {threads} threads x {socks} sockets is above {} sockets; using {fit} \
             sockets per thread",
            wire::MAX_SOCKETS
        );
        socks = fit;
    }
    (threads, socks)
}

/// sysfs facts about interface `name`: its PCI path ("" when it has no device) and its speed in
/// Mbit/s ([`DEFAULT_SPEED_MBPS`] when unknown).
fn sysfs_facts(name: &str) -> (String, u32) {
    let pci_path = std::fs::canonicalize(format!("/sys/class/net/{name}/device"))
        .map(|p| p.to_string_lossy().into_owned())
        .unwrap_or_default();
    let speed = std::fs::read_to_string(format!("/sys/class/net/{name}/speed"))
        .ok()
        .and_then(|s| s.trim().parse::<i64>().ok())
        .filter(|&s| s > 0)
        .and_then(|s| u32::try_from(s).ok())
        .unwrap_or(DEFAULT_SPEED_MBPS);
    (pci_path, speed)
}

struct Device {
    ip: IpAddr,
    props: Properties,
    nthreads: usize,
    nsocks: usize,
}

/// The socket network: its devices and options.
pub struct SocketNet {
    devs: Vec<Device>,
    opts: SocketOptions,
}

impl SocketNet {
    /// The network as the NCCL_* parameters configure it.
    pub fn new() -> Result<SocketNet> {
        SocketNet::with_options(SocketOptions::from_env())
    }

    /// The network on the interfaces `spec` selects (NCCL_SOCKET_IFNAME syntax), NCCL's default
    /// geometry, the environment not read.
    pub fn with_ifname(spec: &str) -> Result<SocketNet> {
        SocketNet::with_options(SocketOptions {
            ifname: Some(spec.to_string()),
            ..SocketOptions::default()
        })
    }

    pub fn with_options(opts: SocketOptions) -> Result<SocketNet> {
        let all = ifaces::host_addresses();
        let chosen = ifaces::select(&all, opts.ifname.as_deref(), opts.family)?;
        let devs: Vec<Device> = chosen
            .into_iter()
            .enumerate()
            .map(|(i, (name, ip))| {
                let (pci_path, speed_mbps) = sysfs_facts(&name);
                let (nthreads, nsocks) = geometry(&opts, &name);
                Device {
                    ip,
                    props: Properties {
                        name,
                        pci_path,
                        guid: i as u64,
                        ptr_support: PTR_HOST,
                        speed_mbps,
                        latency_us: 0.0,
                        port: 0,
                        max_comms: 65536,
                        max_recvs: 1,
                        force_flush: false,
                    },
                    nthreads,
                    nsocks,
                }
            })
            .collect();
        let line: Vec<String> = devs
            .iter()
            .enumerate()
            .map(|(i, d)| format!("[{i}]{}:{}", d.props.name, d.ip))
            .collect();
        log::info!("NET/Socket : Using {}", line.join(" "));
        Ok(SocketNet { devs, opts })
    }

    fn dev(&self, dev: usize) -> Result<&Device> {
        self.devs.get(dev).ok_or_else(|| {
            Error::invalid_argument(format!(
                "NET/Socket: device {dev} does not exist ({} devices)",
                self.devs.len()
            ))
        })
    }

    /// The address device `dev` listens on.
    pub fn address(&self, dev: usize) -> Result<IpAddr> {
        Ok(self.dev(dev)?.ip)
    }

    /// Helper threads × data sockets per thread of the connections `dev` opens.
    pub fn geometry(&self, dev: usize) -> Result<(usize, usize)> {
        let d = self.dev(dev)?;
        Ok((d.nthreads, d.nsocks))
    }
}

impl Net for SocketNet {
    fn name(&self) -> &str {
        "Socket"
    }

    fn handoff_from(&self) -> Option<usize> {
        Some(self.opts.inline_below)
    }

    fn ndevs(&self) -> usize {
        self.devs.len()
    }

    fn properties(&self, dev: usize) -> Result<Properties> {
        Ok(self.dev(dev)?.props.clone())
    }

    fn listen(&self, dev: usize) -> Result<(Handle, Box<dyn Listener>)> {
        let d = self.dev(dev)?;
        let sock = crate::sockets::listen(SocketAddr::new(d.ip, 0), false).map_err(|e| {
            Error::system(format!(
                "NET/Socket: listening on {} ({}): {e}",
                d.ip, d.props.name
            ))
        })?;
        let tag = handshake::next_tag();
        let l = SocketListener::new(sock, tag, d.props.name.clone(), self.opts.handshake_timeout)?
            .with_timeouts(self.opts.peer_timeout, self.opts.send_timeout);
        let handle = wire::encode_handle(&wire::HandleInfo {
            addr: l.addr(),
            tag,
        });
        Ok((handle, Box::new(l)))
    }

    fn connect(&self, dev: usize, handle: &Handle) -> Result<Box<dyn Connecting>> {
        let d = self.dev(dev)?;
        let h = wire::decode_handle(handle)?;
        let c = SocketConnecting::new(
            h.addr,
            h.tag,
            d.props.name.clone(),
            d.nthreads,
            d.nsocks,
            self.opts.handshake_timeout,
            Retry {
                count: self.opts.retry_count,
                sleep_ms: self.opts.retry_sleep_ms,
            },
        )?
        .with_timeouts(self.opts.peer_timeout, self.opts.send_timeout)
        .with_inline_below(self.opts.inline_below);
        Ok(Box::new(c))
    }
}

/// The sending end of a socket connection.
pub struct SocketSendComm(Comm);

/// The receiving end of a socket connection.
pub struct SocketRecvComm(Comm);

impl SocketSendComm {
    /// The peer's address.
    pub fn peer(&self) -> SocketAddr {
        self.0.peer()
    }
}

impl SocketRecvComm {
    /// The peer's address.
    pub fn peer(&self) -> SocketAddr {
        self.0.peer()
    }
}

impl SendComm for SocketSendComm {
    unsafe fn reg_mr(&mut self, ptr: *mut u8, len: usize, kind: u32) -> Result<Mr> {
        self.0.reg_mr(ptr, len, kind)
    }
    fn dereg_mr(&mut self, mr: Mr) -> Result<()> {
        self.0.dereg_mr(mr)
    }
    fn isend(&mut self, mr: Mr, offset: usize, len: usize, tag: u32) -> Result<Option<Request>> {
        self.0.isend(mr, offset, len, tag)
    }
    fn test(&mut self, req: Request) -> Result<Option<usize>> {
        self.0.test(req)
    }
    fn set_waker(&mut self, waker: Waker) {
        self.0.set_waker(waker)
    }
}

impl RecvComm for SocketRecvComm {
    unsafe fn reg_mr(&mut self, ptr: *mut u8, len: usize, kind: u32) -> Result<Mr> {
        self.0.reg_mr(ptr, len, kind)
    }
    fn dereg_mr(&mut self, mr: Mr) -> Result<()> {
        self.0.dereg_mr(mr)
    }
    /// One buffer per call (max_recvs is 1). Tags are not matched: messages go to receives in
    /// order, as in NCCL's socket network.
    fn irecv(&mut self, bufs: &[RecvBuf]) -> Result<Option<Request>> {
        match bufs {
            [buf] => self.0.irecv(buf),
            _ => Err(Error::invalid_argument(format!(
                "NET/Socket: irecv takes exactly one buffer (max_recvs is 1), not {}",
                bufs.len()
            ))),
        }
    }
    fn test(&mut self, req: Request) -> Result<Option<Vec<usize>>> {
        Ok(self.0.test(req)?.map(|n| vec![n]))
    }
    fn set_waker(&mut self, waker: Waker) {
        self.0.set_waker(waker)
    }
}
