//! Listeners pinned to CPU sets, one runtime each: the seed ran one process per
//! NUMA node (ports 8085 and 8086); `--listen ADDR@CPUSET` does it in one
//! process, and `--numa` derives the split from the machine's topology.
//!
//! All listeners share one engine: a block written through one port is served
//! by every other (the seed's clients spread a conversation across ports), and
//! the engine's memory is not partitioned per node. See `docs/numa.md`.
use std::net::SocketAddr;
use std::path::Path;

/// CPU list of every NUMA node, from `/sys/devices/system/node/node*/cpulist`.
/// A machine without NUMA information is one node holding every CPU.
pub fn nodes() -> Vec<Vec<usize>> {
    nodes_from(Path::new("/sys/devices/system/node"))
}

fn nodes_from(root: &Path) -> Vec<Vec<usize>> {
    let mut out: Vec<(usize, Vec<usize>)> = Vec::new();
    if let Ok(rd) = std::fs::read_dir(root) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().to_string();
            let Some(n) = name
                .strip_prefix("node")
                .and_then(|n| n.parse::<usize>().ok())
            else {
                continue;
            };
            let Ok(list) = std::fs::read_to_string(e.path().join("cpulist")) else {
                continue;
            };
            if let Ok(cpus) = parse_cpuset(list.trim()) {
                out.push((n, cpus));
            }
        }
    }
    out.sort();
    if out.is_empty() {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        return vec![(0..n).collect()];
    }
    out.into_iter().map(|(_, c)| c).collect()
}

/// One listener per NUMA node: node `i` gets `port + i`, pinned to its CPUs.
pub fn listeners_for(base: &str) -> anyhow::Result<Vec<String>> {
    let base = base.split('@').next().unwrap_or(base);
    let addr: std::net::SocketAddr = base
        .parse()
        .map_err(|e| anyhow::anyhow!("--numa base address {base:?}: {e}"))?;
    Ok(nodes()
        .iter()
        .enumerate()
        .map(|(i, cpus)| {
            let port = if addr.port() == 0 {
                0
            } else {
                addr.port() + i as u16
            };
            let list: Vec<String> = cpus.iter().map(|c| c.to_string()).collect();
            format!("{}:{}@{}", addr.ip(), port, list.join(","))
        })
        .collect())
}

/// Pins the calling thread to `cpus`.
pub fn pin_current_thread(cpus: &[usize]) -> anyhow::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    for &c in cpus {
        set.set(c).map_err(|e| anyhow::anyhow!("CPU {c}: {e}"))?;
    }
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
        .map_err(|e| anyhow::anyhow!("sched_setaffinity({cpus:?}): {e}"))
}

/// The CPUs the calling thread may run on.
pub fn current_affinity() -> anyhow::Result<Vec<usize>> {
    let set = nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0))?;
    Ok((0..nix::sched::CpuSet::count())
        .filter(|&c| set.is_set(c).unwrap_or(false))
        .collect())
}

/// Refuses CPUs the process may not run on (outside its `sched_getaffinity`
/// set: a container's cpuset, `taskset`, a smaller machine): pinning to them
/// would fail at start-up and the listener run unpinned. Passes when the
/// allowed set cannot be read.
pub fn check_allowed(cpus: &[usize]) -> anyhow::Result<()> {
    let Ok(allowed) = current_affinity() else {
        return Ok(());
    };
    let outside: Vec<usize> = cpus
        .iter()
        .copied()
        .filter(|c| !allowed.contains(c))
        .collect();
    if !outside.is_empty() {
        anyhow::bail!(
            "CPU{} {} {} not available: this process may use CPUs {}",
            if outside.len() == 1 { "" } else { "s" },
            format_cpuset(&outside),
            if outside.len() == 1 { "is" } else { "are" },
            format_cpuset(&allowed)
        );
    }
    Ok(())
}

/// A sorted CPU list in `parse_cpuset`'s syntax (`0-3,8`).
pub fn format_cpuset(cpus: &[usize]) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut i = 0;
    while i < cpus.len() {
        let mut j = i;
        while j + 1 < cpus.len() && cpus[j + 1] == cpus[j] + 1 {
            j += 1;
        }
        parts.push(if i == j {
            cpus[i].to_string()
        } else {
            format!("{}-{}", cpus[i], cpus[j])
        });
        i = j + 1;
    }
    parts.join(",")
}

/// Parses a CPU list like `0-3,8,10-11`.
pub fn parse_cpuset(s: &str) -> anyhow::Result<Vec<usize>> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || anyhow::anyhow!("invalid CPU set {s:?}: expected e.g. 0-3,8");
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if a > b {
                    return Err(bad());
                }
                out.extend(a..=b);
            }
            None => out.push(part.parse().map_err(|_| bad())?),
        }
    }
    if out.is_empty() {
        anyhow::bail!("empty CPU set {s:?}");
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

/// One gRPC listener: an address and an optional CPU set to pin its runtime to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenSpec {
    /// Socket address.
    pub addr: SocketAddr,
    /// CPUs for this listener's runtime (`None`: the shared runtime).
    pub cpus: Option<Vec<usize>>,
}

impl ListenSpec {
    /// Parses `ADDR` or `ADDR@CPUSET` (CPUSET like `0-3,8,10-11`).
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        let (addr, cpus) = match s.split_once('@') {
            Some((a, c)) => (a, Some(parse_cpuset(c)?)),
            None => (s, None),
        };
        let addr = addr.parse().map_err(|e| {
            anyhow::anyhow!("invalid listen address {addr:?}: {e} (expected e.g. 127.0.0.1:50051)")
        })?;
        Ok(Self { addr, cpus })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_topology_and_derives_listeners() {
        let dir = tempfile::tempdir().unwrap();
        for (n, list) in [(0, "0-3"), (1, "4-7")] {
            let d = dir.path().join(format!("node{n}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("cpulist"), format!("{list}\n")).unwrap();
        }
        std::fs::create_dir_all(dir.path().join("power")).unwrap();
        assert_eq!(
            nodes_from(dir.path()),
            vec![vec![0, 1, 2, 3], vec![4, 5, 6, 7]]
        );
        assert!(!nodes().is_empty());
        let l = listeners_for("0.0.0.0:8085").unwrap();
        assert_eq!(l.len(), nodes().len());
        assert!(l[0].starts_with("0.0.0.0:8085@"));
    }

    #[test]
    fn cpuset_round_trips_and_outside_cpus_are_named() {
        assert_eq!(
            format_cpuset(&parse_cpuset("0-3,8,10-11").unwrap()),
            "0-3,8,10-11"
        );
        let allowed = current_affinity().unwrap();
        assert!(check_allowed(&allowed).is_ok());
        let outside = (0..).find(|c| !allowed.contains(c)).unwrap();
        let e = check_allowed(&[allowed[0], outside])
            .unwrap_err()
            .to_string();
        assert!(
            e.starts_with(&format!("CPU {outside} is not available")),
            "{e}"
        );
        assert!(e.ends_with(&format_cpuset(&allowed)), "{e}");
    }

    #[test]
    fn pinning_takes_effect() {
        let cpus = current_affinity().unwrap();
        let first = cpus[0];
        std::thread::spawn(move || {
            pin_current_thread(&[first]).unwrap();
            assert_eq!(current_affinity().unwrap(), vec![first]);
        })
        .join()
        .unwrap();
    }
}
