//! The benchmark's reading of cluster launchers' environments (benches/nccl_bench/launch_env.rs;
//! the bench itself has no test harness): which launcher wins, errors for values that do not
//! make a rank, the local rank from the same launcher, the baseline's root port.

#[path = "../../benches/nccl_bench/launch_env.rs"]
mod launch_env;

use launch_env::{launched, next_port, Launched};
use std::collections::HashMap;

/// Variables as a launcher would set them.
type Vars<'a> = &'a [(&'a str, &'a str)];

fn with(vars: Vars<'_>) -> Result<Option<Launched>, String> {
    let table: HashMap<String, String> = vars
        .iter()
        .map(|&(k, v)| (k.to_string(), v.to_string()))
        .collect();
    launched(&|name: &str| table.get(name).cloned())
}

fn rank(rank: usize, world: usize, local: usize, from: &'static str) -> Option<Launched> {
    Some(Launched {
        rank,
        world,
        local,
        from,
    })
}

#[test]
fn each_launcher_alone() {
    assert_eq!(with(&[]), Ok(None));
    let cases: [(Vars<'_>, Option<Launched>); 5] = [
        (
            &[
                ("OMPI_COMM_WORLD_RANK", "3"),
                ("OMPI_COMM_WORLD_SIZE", "8"),
                ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
            ],
            rank(3, 8, 1, "Open MPI"),
        ),
        (
            &[
                ("PMI_RANK", "2"),
                ("PMI_SIZE", "4"),
                ("MPI_LOCALRANKID", "0"),
            ],
            rank(2, 4, 0, "PMI"),
        ),
        (
            &[
                ("SLURM_PROCID", " 5 "),
                ("SLURM_NTASKS", "6"),
                ("SLURM_LOCALID", "1"),
            ],
            rank(5, 6, 1, "Slurm"),
        ),
        (
            &[("RANK", "1"), ("WORLD_SIZE", "2")],
            rank(1, 2, 1, "RANK/WORLD_SIZE"),
        ),
        // A rank variable without its size is no launcher (RANK alone is a common name).
        (&[("RANK", "1"), ("LOCAL_RANK", "0")], None),
    ];
    for (vars, want) in cases {
        assert_eq!(with(vars), Ok(want), "{vars:?}");
    }
}

#[test]
fn the_innermost_launcher_wins_with_its_own_local_rank() {
    // srun ... torchrun: Slurm describes torchrun's agent (one per node), torchrun its workers.
    let srun_torchrun = [
        ("SLURM_PROCID", "1"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_LOCALID", "0"),
        ("RANK", "7"),
        ("WORLD_SIZE", "8"),
        ("LOCAL_RANK", "3"),
    ];
    assert_eq!(with(&srun_torchrun), Ok(rank(7, 8, 3, "RANK/WORLD_SIZE")));
    // mpirun inside a Slurm allocation: the batch step's SLURM_* stay beside Open MPI's.
    let mpirun_in_slurm = [
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "1"),
        ("SLURM_LOCALID", "0"),
        ("OMPI_COMM_WORLD_RANK", "5"),
        ("OMPI_COMM_WORLD_SIZE", "16"),
        ("OMPI_COMM_WORLD_LOCAL_RANK", "1"),
    ];
    assert_eq!(with(&mpirun_in_slurm), Ok(rank(5, 16, 1, "Open MPI")));
    // No local rank from the winning launcher: its rank, not another launcher's local rank.
    let no_local = [
        ("OMPI_COMM_WORLD_RANK", "5"),
        ("OMPI_COMM_WORLD_SIZE", "16"),
        ("SLURM_LOCALID", "0"),
    ];
    assert_eq!(with(&no_local), Ok(rank(5, 16, 5, "Open MPI")));
}

#[test]
fn values_that_make_no_rank_are_errors_naming_the_variables() {
    let cases: [(Vars<'_>, &str); 4] = [
        (
            &[("OMPI_COMM_WORLD_RANK", "8"), ("OMPI_COMM_WORLD_SIZE", "8")],
            "OMPI_COMM_WORLD_RANK=8 is not below OMPI_COMM_WORLD_SIZE=8",
        ),
        (
            &[("PMI_RANK", "one"), ("PMI_SIZE", "4")],
            "PMI_RANK=one is not a number",
        ),
        (
            &[("RANK", "0"), ("WORLD_SIZE", "")],
            "WORLD_SIZE= is not a number",
        ),
        (
            &[
                ("SLURM_PROCID", "0"),
                ("SLURM_NTASKS", "2"),
                ("SLURM_LOCALID", "-1"),
            ],
            "SLURM_LOCALID=-1 is not a number",
        ),
    ];
    for (vars, want) in cases {
        let err = with(vars).expect_err(want);
        assert!(err.contains(want), "{vars:?}: {err}");
    }
}

#[test]
fn the_baseline_root_takes_the_next_port() {
    assert_eq!(next_port("10.0.0.1:29500"), Ok("10.0.0.1:29501".into()));
    assert_eq!(next_port("[::1]:7000"), Ok("[::1]:7001".into()));
    assert_eq!(next_port(" node-3:1 "), Ok("node-3:2".into()));
    for bad in ["10.0.0.1", "10.0.0.1:", ":29500", "host:port", "host:70000"] {
        let err = next_port(bad).expect_err(bad);
        assert!(err.contains("use host:port"), "{bad}: {err}");
    }
    let err = next_port("host:65535").expect_err("the last port");
    assert!(err.contains("65535 has no next one"), "{err}");
}
