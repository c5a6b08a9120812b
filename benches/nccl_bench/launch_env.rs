//! What a cluster launcher tells a rank process through its environment: its rank, the number of
//! ranks and its rank on this machine. Pure functions of a variable lookup, so that
//! tests/bench_launch_env.rs checks them without touching the process environment.

/// A variable lookup: the process environment, or a test's table.
pub type Lookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// A rank as a launcher set it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Launched {
    pub rank: usize,
    pub world: usize,
    /// Rank among the processes of this machine (the launcher's own variable, else `rank`).
    pub local: usize,
    /// Which launcher, for messages and the header.
    pub from: &'static str,
}

/// The launchers, innermost first: torchrun sets `RANK`/`WORLD_SIZE` for its workers even when
/// srun or mpirun started it (each of those then describes torchrun's agents, not the workers),
/// and mpirun inside a Slurm allocation leaves the allocation's `SLURM_*` beside its own
/// `OMPI_*`/`PMI_*`. Each entry: rank, size, local rank, name.
const LAUNCHERS: [(&str, &str, &str, &str); 4] = [
    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "RANK/WORLD_SIZE"),
    (
        "OMPI_COMM_WORLD_RANK",
        "OMPI_COMM_WORLD_SIZE",
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "Open MPI",
    ),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "PMI"),
    ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "Slurm"),
];

/// The rank the innermost launcher set, None when no launcher's rank and size are both set.
/// A launcher whose values do not parse, or whose rank is not below its size, is an error
/// naming its variables (not a silent fall-through to another launcher or to one process).
/// The local rank comes from the same launcher.
pub fn launched(get: Lookup<'_>) -> Result<Option<Launched>, String> {
    for (rank_var, size_var, local_var, from) in LAUNCHERS {
        let (Some(rank), Some(world)) = (get(rank_var), get(size_var)) else {
            continue;
        };
        let number = |var: &str, v: &str| {
            v.trim()
                .parse::<usize>()
                .map_err(|_| format!("{from}: {var}={v} is not a number"))
        };
        let (rank, world) = (number(rank_var, &rank)?, number(size_var, &world)?);
        if rank >= world {
            return Err(format!(
                "{from}: {rank_var}={rank} is not below {size_var}={world}"
            ));
        }
        let local = match get(local_var) {
            Some(v) => number(local_var, &v)?,
            None => rank,
        };
        return Ok(Some(Launched {
            rank,
            world,
            local,
            from,
        }));
    }
    Ok(None)
}

/// The baseline library's root address beside ours: `NCCL_COMM_ID`'s port plus one, on the
/// same host (`host:port` or `[v6]:port`).
pub fn next_port(comm_id: &str) -> Result<String, String> {
    let (host, port) = comm_id
        .trim()
        .rsplit_once(':')
        .and_then(|(h, p)| Some((h, p.parse::<u16>().ok()?)))
        .filter(|(h, _)| !h.is_empty())
        .ok_or_else(|| format!("NCCL_COMM_ID={comm_id}: use host:port"))?;
    let next = port
        .checked_add(1)
        .ok_or_else(|| format!("NCCL_COMM_ID={comm_id}: port {port} has no next one"))?;
    Ok(format!("{host}:{next}"))
}
