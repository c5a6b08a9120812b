//! One rank per process. Either this program starts the processes itself (`--nodes N
//! --ranks-per-node R`: node k's ranks get `NCCL_HOSTID=nccl-bench-node-k`, so ranks of
//! different nodes meet through the network transport even on one machine), or a cluster
//! launcher did (mpirun, srun, torchrun: the rank and size come from their environment and the
//! bootstrap root from `NCCL_COMM_ID`).
//!
//! Every rank process runs the whole table; rank 0 prints it. A time is the longest of the
//! ranks' (the ranks agree on it through an AllReduce of nccl-rs after each measurement), and a
//! check counts the wrong values of every rank.

use crate::baseline::{Nccl, NcclUniqueId};
use crate::launch_env;
use nccl::cuda::Backend;
use nccl::UniqueId;
use std::ffi::OsString;
use std::process::{Command, ExitCode, Stdio};

const RANK: &str = "NCCL_RS_BENCH_RANK";
const WORLD: &str = "NCCL_RS_BENCH_WORLD";
const LOCAL: &str = "NCCL_RS_BENCH_LOCAL_RANK";
const ID: &str = "NCCL_RS_BENCH_ID";
const NCCL_ID: &str = "NCCL_RS_BENCH_NCCL_ID";

/// This process's rank in a run of one rank per process.
pub struct Member {
    pub rank: usize,
    pub world: usize,
    /// Rank among the processes of this machine: picks the GPU (`local % visible`).
    pub local: usize,
    pub id: UniqueId,
    /// The baseline's id, when one runs.
    pub nccl_id: Option<NcclUniqueId>,
    /// How the rank was learnt, for the header.
    pub from: &'static str,
}

/// How this process takes part in the run.
pub enum Role {
    /// Every rank in this process (`-g`).
    Single,
    /// Start `nodes × per_node` rank processes and wait for them.
    Parent {
        nodes: usize,
        per_node: usize,
    },
    Member(Box<Member>),
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex<const N: usize>(s: &str, what: &str) -> Result<[u8; N], String> {
    let s = s.trim();
    if s.len() != 2 * N {
        return Err(format!("{what}: expected {} hex digits", 2 * N));
    }
    let mut out = [0u8; N];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
            .map_err(|_| format!("{what}: not hexadecimal"))?;
    }
    Ok(out)
}

fn env_usize(name: &str) -> Option<usize> {
    std::env::var(name).ok()?.trim().parse().ok()
}

/// The process environment as a [`launch_env::Lookup`].
fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// The baseline's id under a launcher: NCCL_COMM_ID's port + 1 (ours uses the port itself,
/// and both roots live in rank 0's process).
fn nccl_id_from_comm_id(lib: &Nccl) -> Result<NcclUniqueId, String> {
    let ours = std::env::var("NCCL_COMM_ID").unwrap_or_default();
    let theirs = launch_env::next_port(&ours)?;
    // The process is still single-threaded here, before any communicator exists.
    std::env::set_var("NCCL_COMM_ID", &theirs);
    let id = lib.get_unique_id();
    std::env::set_var("NCCL_COMM_ID", &ours);
    id
}

/// Reads the role from the arguments and the environment.
pub fn role(
    nodes: Option<usize>,
    per_node: Option<usize>,
    baseline: Option<&Nccl>,
) -> Result<Role, String> {
    if let Some(rank) = env_usize(RANK) {
        let world = env_usize(WORLD).ok_or(format!("{RANK} without {WORLD}"))?;
        let id = UniqueId {
            internal: unhex(&std::env::var(ID).unwrap_or_default(), ID)?,
        };
        let nccl_id = match std::env::var(NCCL_ID) {
            Ok(h) => Some(NcclUniqueId(unhex(&h, NCCL_ID)?)),
            Err(_) => None,
        };
        return Ok(Role::Member(Box::new(Member {
            rank,
            world,
            local: env_usize(LOCAL).unwrap_or(rank),
            id,
            nccl_id,
            from: "--nodes",
        })));
    }
    if let Some(nodes) = nodes {
        return Ok(Role::Parent {
            nodes,
            per_node: per_node.unwrap_or(1),
        });
    }
    let Some(launched) = launch_env::launched(&env_var)?.filter(|l| l.world > 1) else {
        return Ok(Role::Single);
    };
    let launch_env::Launched {
        rank,
        world,
        local,
        from,
    } = launched;
    if std::env::var("NCCL_COMM_ID").map_or(true, |v| v.trim().is_empty()) {
        return Err(format!(
            "started by {from} as rank {rank} of {world}: set NCCL_COMM_ID=host:port (rank 0's \
             address, a free port) so that the ranks find each other"
        ));
    }
    let id = nccl::get_unique_id().map_err(|e| format!("unique id from NCCL_COMM_ID: {e}"))?;
    let nccl_id = baseline.map(nccl_id_from_comm_id).transpose()?;
    Ok(Role::Member(Box::new(Member {
        rank,
        world,
        local,
        id,
        nccl_id,
        from,
    })))
}

/// Starts the rank processes (this executable again, with the same arguments less `--nodes`
/// and `--ranks-per-node`, and the backend this process picked) and waits for them. Rank 0's
/// output is the run's; the others' standard output is dropped, their errors shown.
pub fn parent(
    nodes: usize,
    per_node: usize,
    backend: Backend,
    baseline: Option<&Nccl>,
) -> Result<ExitCode, String> {
    let world = nodes * per_node;
    let exe = std::env::current_exe().map_err(|e| format!("this executable's path: {e}"))?;
    let mut args: Vec<OsString> = Vec::new();
    let mut skip = false;
    for a in std::env::args_os().skip(1) {
        if skip {
            skip = false;
            continue;
        }
        let s = a.to_string_lossy();
        if s == "--nodes" || s == "--ranks-per-node" || s == "--backend" {
            skip = true;
            continue;
        }
        if s.starts_with("--nodes=")
            || s.starts_with("--ranks-per-node=")
            || s.starts_with("--backend=")
        {
            continue;
        }
        args.push(a);
    }
    args.push("--backend".into());
    args.push(match backend {
        Backend::Sim => "sim".into(),
        _ => "cuda".into(),
    });
    // Both roots live here, for as long as the ranks run.
    let id = nccl::get_unique_id().map_err(|e| format!("nccl-rs unique id: {e}"))?;
    let nccl_id = baseline.map(|l| l.get_unique_id()).transpose()?;
    let mut children = Vec::with_capacity(world);
    for r in 0..world {
        let mut c = Command::new(&exe);
        c.args(&args)
            .env(RANK, r.to_string())
            .env(WORLD, world.to_string())
            .env(LOCAL, r.to_string())
            .env(ID, hex(&id.internal))
            .env("NCCL_HOSTID", format!("nccl-bench-node-{}", r / per_node));
        if let Some(n) = &nccl_id {
            c.env(NCCL_ID, hex(&n.0));
        }
        if r != 0 {
            c.stdout(Stdio::null());
        }
        children.push(
            c.spawn()
                .map_err(|e| format!("starting rank process {r}: {e}"))?,
        );
    }
    // A rank that fails leaves the others waiting on it: stop them.
    let mut failed = false;
    let mut left = world;
    let mut done = vec![false; world];
    while left > 0 {
        for (r, c) in children.iter_mut().enumerate() {
            if done[r] {
                continue;
            }
            if let Ok(Some(st)) = c.try_wait() {
                done[r] = true;
                left -= 1;
                if !st.success() {
                    eprintln!("nccl_bench: rank process {r} ended with {st}");
                    failed = true;
                }
            }
        }
        if failed {
            for (r, c) in children.iter_mut().enumerate() {
                if !done[r] {
                    let _ = c.kill();
                }
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    Ok(if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
