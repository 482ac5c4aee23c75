//! What a launcher (`torchrun`, `mpirun`, `srun`) tells a process through its environment:
//! its rank, the number of processes, and the address of the process that hosts the
//! server. The command line (`syncopate work`) and the Python package read them here, so
//! both take a worker's id from the same variables in the same order.
//!
//! Rules:
//! - The rank is the first of `RANK` (torchrun), `OMPI_COMM_WORLD_RANK` (Open MPI),
//!   `SLURM_PROCID` (Slurm) and `PMI_RANK` (MPICH, Intel MPI) that is set; never
//!   `LOCAL_RANK`, which is the rank on one machine and repeats across machines.
//! - The world size comes from the same launcher's variable (`WORLD_SIZE`,
//!   `OMPI_COMM_WORLD_SIZE`, `SLURM_NTASKS`, `PMI_SIZE`): it counts the workers, so it must
//!   equal the protocol's worker count, and every rank must be below it.
//! - The server's address defaults to `MASTER_ADDR:MASTER_PORT` when both are set.
//!
//! Every reader takes a lookup function ([`env()`] in production, a table in tests) and
//! refuses a value that is not a whole number, naming the variable and the value.

/// One launcher's variables: its rank, its world size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variables {
    /// The variable holding the process's rank.
    pub rank: &'static str,
    /// The variable holding the number of processes.
    pub world_size: &'static str,
}

/// Every launcher's variables, in the order they are read.
pub const LAUNCHERS: [Variables; 4] = [
    Variables { rank: "RANK", world_size: "WORLD_SIZE" },
    Variables { rank: "OMPI_COMM_WORLD_RANK", world_size: "OMPI_COMM_WORLD_SIZE" },
    Variables { rank: "SLURM_PROCID", world_size: "SLURM_NTASKS" },
    Variables { rank: "PMI_RANK", world_size: "PMI_SIZE" },
];

/// The variables a rank is read from, in order.
pub const RANK_VARIABLES: [&str; 4] = [LAUNCHERS[0].rank, LAUNCHERS[1].rank, LAUNCHERS[2].rank, LAUNCHERS[3].rank];

/// The variables a world size is read from, in order.
pub const WORLD_SIZE_VARIABLES: [&str; 4] =
    [LAUNCHERS[0].world_size, LAUNCHERS[1].world_size, LAUNCHERS[2].world_size, LAUNCHERS[3].world_size];

/// A value read from the environment, with the variable it came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FromEnv<T> {
    /// The value.
    pub value: T,
    /// The variable that held it.
    pub variable: &'static str,
}

/// `variable`'s value as a whole number, if it is set.
fn number(get: &dyn Fn(&str) -> Option<String>, variable: &'static str) -> Result<Option<FromEnv<u32>>, String> {
    let Some(text) = get(variable) else {
        return Ok(None);
    };
    match text.trim().parse::<u32>() {
        Ok(value) => Ok(Some(FromEnv { value, variable })),
        Err(_) => Err(format!("${variable} is '{text}', not a whole number")),
    }
}

/// The launcher whose rank variable is set first, if any.
fn launcher(get: &dyn Fn(&str) -> Option<String>) -> Option<Variables> {
    LAUNCHERS.into_iter().find(|l| get(l.rank).is_some())
}

/// This process's rank: the first rank variable that is set, checked against its
/// launcher's world size when that is set too. `None` outside a launcher.
pub fn rank(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<FromEnv<u32>>, String> {
    let Some(vars) = launcher(get) else {
        return Ok(None);
    };
    let rank = number(get, vars.rank)?;
    if let (Some(r), Some(w)) = (&rank, number(get, vars.world_size)?) {
        if r.value >= w.value {
            return Err(format!(
                "${} is {} but ${} is {}: a rank must be below the world size",
                r.variable, r.value, w.variable, w.value
            ));
        }
    }
    Ok(rank)
}

/// The number of processes the launcher started: the world size of the launcher that set
/// the rank, else the first world size variable that is set. `None` outside a launcher.
pub fn world_size(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<FromEnv<u32>>, String> {
    let vars: Vec<&'static str> = match launcher(get) {
        Some(l) => vec![l.world_size],
        None => WORLD_SIZE_VARIABLES.to_vec(),
    };
    for variable in vars {
        if let Some(size) = number(get, variable)? {
            if size.value == 0 {
                return Err(format!("${variable} is 0: a world size is at least 1"));
            }
            return Ok(Some(size));
        }
    }
    Ok(None)
}

/// Refuses a run of `workers` workers under a launcher that started another number of
/// processes (one per worker), naming the variable and both counts.
pub fn check_world_size(world: Option<&FromEnv<u32>>, workers: u32) -> Result<(), String> {
    match world {
        Some(w) if w.value != workers => Err(format!(
            "${} is {} but the run has {workers} workers: start one process per worker, or give the protocol {} workers",
            w.variable, w.value, w.value
        )),
        _ => Ok(()),
    }
}

/// The server's address `MASTER_ADDR:MASTER_PORT`, when both are set (`None` otherwise).
pub fn server_address(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<String>, String> {
    let (Some(host), Some(port)) = (get("MASTER_ADDR"), get("MASTER_PORT")) else {
        return Ok(None);
    };
    let host = host.trim();
    if host.is_empty() {
        return Err("$MASTER_ADDR is empty: it must name the host of the server".into());
    }
    match port.trim().parse::<u16>() {
        Ok(p) if p > 0 => {}
        _ => return Err(format!("$MASTER_PORT is '{port}', not a port number (1 to 65535)")),
    }
    // An IPv6 literal needs brackets before the port.
    if host.contains(':') && !host.starts_with('[') {
        return Ok(Some(format!("[{host}]:{}", port.trim())));
    }
    Ok(Some(format!("{host}:{}", port.trim())))
}

/// Looks `name` up in the process's environment (a value that is not Unicode counts as set
/// and is refused by the readers as not a number).
pub fn env(name: &str) -> Option<String> {
    std::env::var_os(name).map(|v| v.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
        move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| (*v).to_owned())
    }

    fn value(r: Result<Option<FromEnv<u32>>, String>) -> Option<(u32, &'static str)> {
        r.ok().flatten().map(|f| (f.value, f.variable))
    }

    #[test]
    fn the_rank_comes_from_the_first_launcher_and_never_local_rank() {
        assert_eq!(value(rank(&table(&[("LOCAL_RANK", "3")]))), None);
        assert_eq!(value(rank(&table(&[("LOCAL_RANK", "3"), ("RANK", "5")]))), Some((5, "RANK")));
        assert_eq!(value(rank(&table(&[("PMI_RANK", "4"), ("SLURM_PROCID", "2")]))), Some((2, "SLURM_PROCID")));
        assert_eq!(value(rank(&table(&[("OMPI_COMM_WORLD_RANK", " 7 ")]))), Some((7, "OMPI_COMM_WORLD_RANK")));
        assert_eq!(value(rank(&table(&[("PMI_RANK", "1")]))), Some((1, "PMI_RANK")));
        assert_eq!(rank(&table(&[])), Ok(None));
        let e = rank(&table(&[("RANK", "x")])).unwrap_err();
        assert!(e.contains("$RANK") && e.contains("'x'"), "{e}");
        let e = rank(&table(&[("RANK", "-1")])).unwrap_err();
        assert!(e.contains("'-1'"), "{e}");
    }

    #[test]
    fn a_rank_at_or_above_its_launchers_world_size_is_refused() {
        let e = rank(&table(&[("RANK", "4"), ("WORLD_SIZE", "4")])).unwrap_err();
        assert_eq!(e, "$RANK is 4 but $WORLD_SIZE is 4: a rank must be below the world size");
        assert_eq!(value(rank(&table(&[("RANK", "3"), ("WORLD_SIZE", "4")]))), Some((3, "RANK")));
        // Another launcher's world size says nothing about this rank.
        assert_eq!(value(rank(&table(&[("RANK", "3"), ("SLURM_NTASKS", "2")]))), Some((3, "RANK")));
    }

    #[test]
    fn the_world_size_comes_from_the_launcher_that_set_the_rank() {
        let env = table(&[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "6"), ("WORLD_SIZE", "2")]);
        assert_eq!(value(world_size(&env)), Some((6, "SLURM_NTASKS")));
        assert_eq!(value(world_size(&table(&[("PMI_SIZE", "3")]))), Some((3, "PMI_SIZE")));
        assert_eq!(value(world_size(&table(&[("WORLD_SIZE", "2"), ("PMI_SIZE", "3")]))), Some((2, "WORLD_SIZE")));
        assert_eq!(world_size(&table(&[("LOCAL_WORLD_SIZE", "2")])), Ok(None));
        let e = world_size(&table(&[("WORLD_SIZE", "0")])).unwrap_err();
        assert!(e.contains("$WORLD_SIZE") && e.contains("at least 1"), "{e}");
        let e = world_size(&table(&[("WORLD_SIZE", "two")])).unwrap_err();
        assert!(e.contains("'two'"), "{e}");
    }

    #[test]
    fn a_world_size_that_is_not_the_run_s_worker_count_is_refused() {
        let w = FromEnv { value: 3, variable: "WORLD_SIZE" };
        let e = check_world_size(Some(&w), 4).unwrap_err();
        assert!(e.starts_with("$WORLD_SIZE is 3 but the run has 4 workers"), "{e}");
        assert_eq!(check_world_size(Some(&w), 3), Ok(()));
        assert_eq!(check_world_size(None, 4), Ok(()));
    }

    #[test]
    fn the_server_address_is_master_addr_and_port() {
        let env = table(&[("MASTER_ADDR", "node7"), ("MASTER_PORT", "29500")]);
        assert_eq!(server_address(&env), Ok(Some("node7:29500".into())));
        assert_eq!(
            server_address(&table(&[("MASTER_ADDR", "::1"), ("MASTER_PORT", "80")])),
            Ok(Some("[::1]:80".into()))
        );
        assert_eq!(server_address(&table(&[("MASTER_ADDR", "node7")])), Ok(None));
        let e = server_address(&table(&[("MASTER_ADDR", "h"), ("MASTER_PORT", "0")])).unwrap_err();
        assert!(e.contains("$MASTER_PORT") && e.contains("'0'"), "{e}");
        let e = server_address(&table(&[("MASTER_ADDR", " "), ("MASTER_PORT", "1")])).unwrap_err();
        assert!(e.contains("$MASTER_ADDR is empty"), "{e}");
    }

    #[test]
    fn the_lists_name_every_launcher_in_order() {
        assert_eq!(RANK_VARIABLES, ["RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID", "PMI_RANK"]);
        assert_eq!(WORLD_SIZE_VARIABLES, ["WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS", "PMI_SIZE"]);
    }
}
