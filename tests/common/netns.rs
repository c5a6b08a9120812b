//! Nodes with network stacks of their own on one machine: each node is a network namespace
//! (`ip netns`) with one veth interface whose other end sits on a bridge in a hub namespace, so
//! that rank processes of different nodes talk over a real, non-loopback interface that a test
//! can take down. The test binary re-executes itself inside a node's namespace
//! (`ip netns exec NS <test binary> <test name> ...`), told its rank, the rank count and its
//! node through the environment, as `procs` does.
//!
//! Addresses are fixed and private (10.213.<subnet>.<node + 1>/24) and live only inside the
//! namespaces a [`Fabric`] makes; nothing here touches the machine's own interfaces. Names carry
//! the process id and a tag of the test, so tests running side by side (and other runs) never
//! meet. Dropping the fabric deletes its namespaces (and with them every interface in them),
//! whether the test passed or not; namespaces left behind by a test process that died without
//! dropping (SIGKILL) are deleted by the next run.
//!
//! Where namespaces cannot be made (not root, no `ip`, no permission), [`Fabric::new`] says
//! why, and [`fabric_or_skip`] records the test as skipped with the reason (visibly).

use super::{procs, skip};
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Every namespace a fabric makes starts with this, then `<pid>-`.
const NS_PREFIX: &str = "nccl-rs-test-";

const RANK: &str = "NCCL_RS_NETNS_RANK";
const NRANKS: &str = "NCCL_RS_NETNS_NRANKS";
const SIGNALS: &str = "NCCL_RS_NETNS_SIGNALS";
/// The interface of the rank's node, for the child to look at its counters.
const IFNAME: &str = "NCCL_RS_NETNS_IFNAME";

/// Runs `ip` with `args`; Err with its output when it fails.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run `ip {}`: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "`ip {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// Deletes namespaces of earlier test processes that no longer exist (killed before their
/// fabrics were dropped). Only names this module makes are touched.
fn delete_stale() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix(NS_PREFIX) else {
            continue;
        };
        let Some(pid) = rest.split('-').next().and_then(|p| p.parse::<u32>().ok()) else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", name]);
        }
    }
}

/// One node: its namespace, its interface there and that interface's address.
pub struct Node {
    pub ns: String,
    pub ifname: String,
    pub addr: Ipv4Addr,
    /// Every interface of the node, one per rail (`ifname` is the first).
    pub rails: Vec<String>,
}

/// Nodes in namespaces of their own on a bridge; deleted when dropped.
pub struct Fabric {
    pub nodes: Vec<Node>,
    hub: String,
    /// Namespaces made so far (the hub first), deleted in `drop`.
    made: Vec<String>,
    /// Where children leave signal files for the parent.
    signals: PathBuf,
}

impl Fabric {
    /// `nodes` namespaces named after this process and `tag` (at most 3 characters, unique per
    /// test), on the subnet 10.213.`subnet`.0/24. Err(why) when namespaces cannot be made here.
    pub fn new(tag: &str, nodes: usize, subnet: u8) -> Result<Fabric, String> {
        Fabric::with_rails(tag, nodes, subnet, 1)
    }

    /// As [`Fabric::new`], with `rails` interfaces per node, rail k on a bridge of its own and
    /// the subnet 10.213.(`subnet` + k).0/24 (a node with that many NICs).
    pub fn with_rails(tag: &str, nodes: usize, subnet: u8, rails: usize) -> Result<Fabric, String> {
        assert!(
            tag.len() <= 3 && nodes <= 9 && rails <= 9,
            "interface names have 15 bytes"
        );
        Fabric::make(tag, nodes, subnet, rails).map_err(|e| {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                format!("not root (namespaces need CAP_SYS_ADMIN and CAP_NET_ADMIN): {e}")
            } else {
                e
            }
        })
    }

    fn make(tag: &str, nodes: usize, subnet: u8, rails: usize) -> Result<Fabric, String> {
        delete_stale();
        let pid = std::process::id();
        let signals = std::env::temp_dir().join(format!("{NS_PREFIX}{pid}-{tag}"));
        let _ = std::fs::remove_dir_all(&signals);
        std::fs::create_dir_all(&signals)
            .map_err(|e| format!("cannot make {}: {e}", signals.display()))?;
        let mut f = Fabric {
            nodes: Vec::new(),
            hub: format!("{NS_PREFIX}{pid}-{tag}-hub"),
            made: Vec::new(),
            signals,
        };
        // From here on an error drops `f`, which deletes whatever was made.
        ip(&["netns", "add", &f.hub])?;
        f.made.push(f.hub.clone());
        // One rail: the names as they always were; more: the rail's digit appended.
        let rail = |k: usize| match rails {
            1 => String::new(),
            _ => k.to_string(),
        };
        for k in 0..rails {
            let bridge = format!("b{pid}{tag}{}", rail(k));
            ip(&["-n", &f.hub, "link", "add", &bridge, "type", "bridge"])?;
            ip(&["-n", &f.hub, "link", "set", &bridge, "up"])?;
        }
        for i in 0..nodes {
            let ns = format!("{NS_PREFIX}{pid}-{tag}-{i}");
            ip(&["netns", "add", &ns])?;
            f.made.push(ns.clone());
            let mut names = Vec::new();
            for k in 0..rails {
                let ifname = format!("n{pid}{tag}{i}{}", rail(k));
                let port = format!("h{pid}{tag}{i}{}", rail(k));
                let bridge = format!("b{pid}{tag}{}", rail(k));
                // The node's end is made inside the node, its peer inside the hub.
                ip(&[
                    "-n", &ns, "link", "add", &ifname, "type", "veth", "peer", "name", &port,
                    "netns", &f.hub,
                ])?;
                ip(&["-n", &f.hub, "link", "set", &port, "master", &bridge])?;
                ip(&["-n", &f.hub, "link", "set", &port, "up"])?;
                let addr = Ipv4Addr::new(10, 213, subnet + k as u8, i as u8 + 1);
                ip(&[
                    "-n",
                    &ns,
                    "addr",
                    "add",
                    &format!("{addr}/24"),
                    "dev",
                    &ifname,
                ])?;
                ip(&["-n", &ns, "link", "set", &ifname, "up"])?;
                names.push(ifname);
            }
            ip(&["-n", &ns, "link", "set", "lo", "up"])?;
            f.nodes.push(Node {
                ns,
                ifname: names[0].clone(),
                addr: Ipv4Addr::new(10, 213, subnet, i as u8 + 1),
                rails: names,
            });
        }
        Ok(f)
    }

    /// Takes node `i`'s interface down (inside its namespace): the node is cut off.
    pub fn link_down(&self, i: usize) -> Result<(), String> {
        let n = &self.nodes[i];
        ip(&["-n", &n.ns, "link", "set", &n.ifname, "down"])
    }

    /// Starts `nodes.len()` × `per_node` copies of this test binary running the calling test,
    /// rank r on node r / `per_node`, in that node's namespace: `NCCL_HOSTID` names the node,
    /// `NCCL_SOCKET_IFNAME` its interface (exactly), and `NCCL_COMM_ID` puts the bootstrap root
    /// at node 0's address, `port` (rank 0 starts it there). `env` is added for every rank.
    pub fn start(&self, per_node: usize, port: u16, env: &[(&str, &str)]) -> Running {
        let test = procs::current_test();
        let nranks = self.nodes.len() * per_node;
        let comm_id = format!("{}:{port}", self.nodes[0].addr);
        let cmds = (0..nranks)
            .map(|r| {
                let node = &self.nodes[r / per_node];
                let mut cmd =
                    procs::wrapped_test_command(&["ip", "netns", "exec", &node.ns], &test);
                cmd.env(RANK, r.to_string())
                    .env(NRANKS, nranks.to_string())
                    .env(SIGNALS, &self.signals)
                    .env(IFNAME, node.rails.join(","))
                    .env("NCCL_HOSTID", format!("netns-node-{}", r / per_node))
                    .env("NCCL_SOCKET_IFNAME", format!("={}", node.rails.join(",")))
                    .env("NCCL_COMM_ID", &comm_id);
                for (k, v) in env {
                    cmd.env(k, v);
                }
                (format!("rank {r}"), cmd)
            })
            .collect();
        Running {
            procs: procs::Supervisor::start(cmds),
            signals: self.signals.clone(),
        }
    }

    /// Runs the ranks as [`Fabric::start`] does and fails the test (with every rank's output)
    /// unless each of them passed within the supervisor's generous bound.
    pub fn run(&self, per_node: usize, port: u16, env: &[(&str, &str)]) {
        let mut running = self.start(per_node, port, env);
        running.procs.wait(procs::limit(), &[]);
        running.procs.check(&[]);
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        // Deleting a namespace deletes its interfaces; a veth pair goes with either end.
        for ns in self.made.iter().rev() {
            if let Err(e) = ip(&["netns", "del", ns]) {
                eprintln!("netns: {e}");
            }
        }
        let _ = std::fs::remove_dir_all(&self.signals);
    }
}

/// Rank processes started by [`Fabric::start`], under the one supervisor (killed if still
/// running when dropped).
pub struct Running {
    pub procs: procs::Supervisor,
    signals: PathBuf,
}

impl Running {
    /// Waits until every rank in `ranks` left the signal `name` (see [`signal`]); false when a
    /// rank exited first, or after `limit` (a generous bound: a hang).
    pub fn wait_signal(&mut self, name: &str, ranks: &[usize], limit: Duration) -> bool {
        let t0 = Instant::now();
        loop {
            if ranks
                .iter()
                .all(|r| self.signals.join(format!("{name}.{r}")).exists())
            {
                return true;
            }
            if t0.elapsed() > limit || self.procs.poll() < self.procs.procs.len() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// In a child: (rank, nranks); None in the parent.
pub fn child() -> Option<(usize, usize)> {
    let rank = std::env::var(RANK).ok()?.parse().ok()?;
    let nranks = std::env::var(NRANKS).ok()?.parse().ok()?;
    Some((rank, nranks))
}

/// In a child: tells the parent that this rank reached `name`.
pub fn signal(name: &str, rank: usize) {
    let dir = std::env::var(SIGNALS).expect("signal directory");
    std::fs::write(Path::new(&dir).join(format!("{name}.{rank}")), b"")
        .expect("write a signal file");
}

/// In a child: bytes sent and received so far through this node's interfaces.
pub fn interface_bytes() -> (u64, u64) {
    rail_bytes()
        .into_iter()
        .fold((0, 0), |(t, r), (tx, rx)| (t + tx, r + rx))
}

/// In a child: bytes sent and received so far through each of this node's interfaces.
pub fn rail_bytes() -> Vec<(u64, u64)> {
    let names = std::env::var(IFNAME).expect("interface names");
    names.split(',').map(one_interface_bytes).collect()
}

fn one_interface_bytes(ifname: &str) -> (u64, u64) {
    // Inside `ip netns exec`, /sys shows the namespace's own interfaces.
    let read = |what: &str| {
        std::fs::read_to_string(format!("/sys/class/net/{ifname}/statistics/{what}"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {what} counter for {ifname}"))
    };
    (read("tx_bytes"), read("rx_bytes"))
}

/// Makes the fabric for the calling test, or records why it cannot (a visible skip: a line on
/// stderr and the count at exit) and returns None.
pub fn fabric_or_skip(tag: &str, nodes: usize, subnet: u8) -> Option<Fabric> {
    match Fabric::new(tag, nodes, subnet) {
        Ok(f) => Some(f),
        Err(why) => {
            skip::record(
                "network namespaces cannot be made here",
                &format!("{}: {why}", procs::current_test()),
            );
            None
        }
    }
}
