//! Which interfaces the socket network uses, as NCCL chooses them: `NCCL_SOCKET_IFNAME` (prefixes,
//! `^` to exclude, `=` for exact names; every interface that matches is used), `NCCL_SOCKET_FAMILY`
//! (AF_INET or AF_INET6), and with neither set the first non-empty of: interfaces named `ib*`,
//! interfaces other than loopback, `docker*` and `virbr*`, then `docker*` / `virbr*`, then loopback.
//!
//! The choice is a pure function over (name, address) pairs so that it can be tested without the
//! host's interfaces; [`host_addresses`] gives the real pairs (getifaddrs, through the
//! reader in `crate::sockets`).

use std::net::IpAddr;

use crate::error::{Error, Result};
use crate::sockets::{describe_interfaces, ifname_matches};

/// At most this many interfaces become devices (NCCL's MAX_IFS).
pub const MAX_IFS: usize = 16;

/// An address family (`NCCL_SOCKET_FAMILY`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    V4,
    V6,
}

impl Family {
    /// `AF_INET` / `AF_INET6` (also `4`/`6`, `inet`/`inet6`, any case); None for anything else.
    pub fn parse(text: &str) -> Option<Family> {
        match text.trim().to_ascii_lowercase().as_str() {
            "af_inet" | "inet" | "4" | "ipv4" => Some(Family::V4),
            "af_inet6" | "inet6" | "6" | "ipv6" => Some(Family::V6),
            _ => None,
        }
    }

    fn holds(self, ip: &IpAddr) -> bool {
        matches!(
            (self, ip),
            (Family::V4, IpAddr::V4(_)) | (Family::V6, IpAddr::V6(_))
        )
    }
}

/// Every address of every interface that is up, in getifaddrs order.
pub fn host_addresses() -> Vec<(String, IpAddr)> {
    crate::sockets::interfaces()
        .into_iter()
        .filter(|i| i.up)
        .map(|i| (i.name, i.ip))
        .collect()
}

/// Can a peer reach this address without more context? IPv6 link-local addresses need a scope
/// (interface index) that the handle does not carry, so they are skipped, as the bootstrap does.
fn routable(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => !v4.is_unspecified(),
        IpAddr::V6(v6) => !v6.is_unspecified() && (v6.segments()[0] & 0xffc0) != 0xfe80,
    }
}

fn is_loopback(name: &str, ip: &IpAddr) -> bool {
    name == "lo" || ip.is_loopback()
}

/// Which interfaces one tier of the default choice accepts.
type Keep<'a> = &'a dyn Fn(&str, &IpAddr) -> bool;

/// One address per interface name, in order of first appearance, for the interfaces `keep`
/// accepts: the first address of `family`, or with no family the first IPv4 address, else the
/// first IPv6 one.
fn pick(
    all: &[(String, IpAddr)],
    family: Option<Family>,
    keep: impl Fn(&str, &IpAddr) -> bool,
) -> Vec<(String, IpAddr)> {
    let mut out: Vec<(String, IpAddr)> = Vec::new();
    for (name, _) in all {
        if out.iter().any(|(n, _)| n == name) {
            continue;
        }
        let addrs = || {
            all.iter()
                .filter(move |(n, ip)| n == name && routable(ip))
                .map(|(_, ip)| *ip)
        };
        let ip = match family {
            Some(f) => addrs().find(|ip| f.holds(ip)),
            None => addrs()
                .find(|ip| ip.is_ipv4())
                .or_else(|| addrs().find(|ip| ip.is_ipv6())),
        };
        if let Some(ip) = ip {
            if keep(name, &ip) {
                out.push((name.clone(), ip));
            }
        }
        if out.len() == MAX_IFS {
            break;
        }
    }
    out
}

/// The interfaces to use among `all` (interfaces that are up, with their addresses), for an
/// `NCCL_SOCKET_IFNAME` value `spec` and an `NCCL_SOCKET_FAMILY` value `family`.
///
/// Errors: a `spec` or `family` that leaves nothing fails with `ncclInvalidUsage` (the user's
/// setting is what is wrong; NCCL itself answers "NET/Socket : no interface found" with
/// ncclInternalError, whose text asks to report a bug, which helps nobody), naming the value and
/// every interface that exists. A host with no usable address at all fails with
/// `ncclSystemError`.
pub fn select(
    all: &[(String, IpAddr)],
    spec: Option<&str>,
    family: Option<Family>,
) -> Result<Vec<(String, IpAddr)>> {
    let spec = spec.map(str::trim).filter(|s| !s.is_empty());
    let family_text = match family {
        Some(Family::V4) => " and NCCL_SOCKET_FAMILY=AF_INET",
        Some(Family::V6) => " and NCCL_SOCKET_FAMILY=AF_INET6",
        None => "",
    };
    if let Some(spec) = spec {
        let found = pick(all, family, |name, _| ifname_matches(spec, name));
        if found.is_empty() {
            return Err(Error::invalid_usage(format!(
                "NET/Socket: NCCL_SOCKET_IFNAME={spec}{family_text} matches no interface that is \
                 up with a usable address; interfaces: {}",
                describe_interfaces(all)
            )));
        }
        return Ok(found);
    }
    let plain =
        |name: &str, ip: &IpAddr| !is_loopback(name, ip) && ifname_matches("^docker,virbr", name);
    let tiers: [Keep<'_>; 4] = [
        &|name, ip| name.starts_with("ib") && !is_loopback(name, ip),
        &plain,
        &|name, ip| !is_loopback(name, ip) && !plain(name, ip),
        &|name, ip| is_loopback(name, ip),
    ];
    for keep in tiers {
        let found = pick(all, family, keep);
        if !found.is_empty() {
            return Ok(found);
        }
    }
    if family.is_some() {
        return Err(Error::invalid_usage(format!(
            "NET/Socket: no interface is up with an address of the family asked for{family_text}; \
             interfaces: {}",
            describe_interfaces(all)
        )));
    }
    Err(Error::system(format!(
        "NET/Socket: no network interface is up with a usable address; interfaces: {}",
        describe_interfaces(all)
    )))
}
