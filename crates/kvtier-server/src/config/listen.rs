//! Where the fronts listen: the gRPC listeners, the data plane's address and
//! the same-host socket's path, mode and owner, resolved from `[server]`.
use super::{Config, ListenSpec};
use std::net::SocketAddr;

/// `server.local_listen` and how its socket file is made (docs/local.md).
#[derive(Debug, Clone, PartialEq)]
pub struct SameHostSocket {
    /// Path of the socket file.
    pub path: std::path::PathBuf,
    /// Its permission bits.
    pub mode: u32,
    /// Its owner and group, when set (`None`: the server's).
    pub owner: Option<(u32, Option<u32>)>,
    /// Bytes of shared memory (segments and lent segments together).
    pub shared_memory: u64,
}

impl Config {
    /// The data-plane address, resolving "auto"; `None` when disabled.
    pub fn data_listen(&self) -> anyhow::Result<Option<SocketAddr>> {
        match self.server.data_listen.as_str() {
            "" => Ok(None),
            "auto" => {
                let first = self.listeners()?.into_iter().next().map(|l| l.addr);
                let mut a = first.ok_or_else(|| {
                    anyhow::anyhow!("server.data_listen = \"auto\" needs a gRPC listener")
                })?;
                if a.port() != 0 {
                    a.set_port(
                        a.port()
                            .checked_add(1)
                            .ok_or_else(|| anyhow::anyhow!("no port after {a}"))?,
                    );
                }
                Ok(Some(a))
            }
            s => s.parse::<SocketAddr>().map(Some).map_err(|e| {
                anyhow::anyhow!("server.data_listen {s:?}: {e} (an address, \"auto\" or \"\")")
            }),
        }
    }

    /// Parsed gRPC listeners (expanded per NUMA node when `server.numa` is set).
    pub fn listeners(&self) -> anyhow::Result<Vec<ListenSpec>> {
        let list = if self.server.numa {
            crate::numa::listeners_for(&self.server.listen[0])?
        } else {
            self.server.listen.clone()
        };
        list.iter().map(|s| ListenSpec::parse(s)).collect()
    }

    /// The same-host socket, when `server.local_listen` enables it.
    pub fn same_host_socket(&self) -> anyhow::Result<Option<SameHostSocket>> {
        let s = &self.server;
        if s.local_listen.is_empty() {
            return Ok(None);
        }
        let mode = u32::from_str_radix(s.local_mode.trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .ok_or_else(|| {
                anyhow::anyhow!(
                    "server.local_mode {:?}: expected octal permission bits such as \"0600\" \
                     (owner only) or \"0660\" (owner and group)",
                    s.local_mode
                )
            })?;
        let owner = match s.local_owner.as_str() {
            "" => None,
            o => {
                let bad = || {
                    anyhow::anyhow!(
                        "server.local_owner {o:?}: expected a numeric \"UID\" or \"UID:GID\""
                    )
                };
                let (u, g) = o.split_once(':').map_or((o, None), |(u, g)| (u, Some(g)));
                let uid = u.parse().map_err(|_| bad())?;
                let gid = g.map(|g| g.parse().map_err(|_| bad())).transpose()?;
                Some((uid, gid))
            }
        };
        let path = std::path::PathBuf::from(&s.local_listen);
        // sun_path holds 108 bytes with its terminating NUL.
        anyhow::ensure!(
            path.as_os_str().len() < 108,
            "server.local_listen {:?}: a Unix socket path must be under 108 bytes",
            s.local_listen
        );
        // Default: the memory tier and an eighth more, for slots still
        // leased to clients after the tier let go of their blocks.
        let shared_memory = match s.local_shared_memory.bytes() {
            0 => {
                let m = self.engine.memory_capacity.bytes();
                m.saturating_add(m / 8)
            }
            n => n,
        };
        Ok(Some(SameHostSocket {
            path,
            mode,
            owner,
            shared_memory,
        }))
    }
}
