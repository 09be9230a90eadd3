//! Which TCP congestion control each system's sockets actually run (comparison
//! rule 1), sampled with `ss -tinp` while the system is under load.
//!
//! A socket belongs to a system when one of its ends is one of the system's
//! ports (kvtier's gRPC and data-plane ports, Redis's port) or when it is
//! owned by one of the system's processes (Mooncake's transfer engine picks
//! its ports itself). On loopback both ends of every connection are seen, so
//! the client's choice (the sender of writes) and the server's (the sender of
//! reads) are both recorded.

use std::collections::BTreeSet;
use std::process::Command;
use std::thread::JoinHandle;
use std::time::Duration;

/// The sockets of one system.
#[derive(Debug, Clone, Default)]
pub struct Sel {
    /// Local or remote ports.
    pub ports: Vec<u16>,
    /// Owning processes.
    pub pids: Vec<u32>,
}

/// `net.ipv4.tcp_congestion_control` ("" when unreadable).
pub fn system_default() -> String {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn available() -> BTreeSet<String> {
    let mut names: BTreeSet<String> =
        std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_congestion_control")
            .unwrap_or_default()
            .split_whitespace()
            .map(String::from)
            .collect();
    // Names `ss` may print even when the list above is unreadable.
    names.extend(["reno", "cubic", "bbr", "dctcp", "vegas", "htcp"].map(String::from));
    names
}

fn port_of(endpoint: &str) -> Option<u16> {
    endpoint.rsplit_once(':')?.1.parse().ok()
}

/// Congestion-control names of the sockets in `ss -tinpH` output that `sel` selects.
pub fn parse_ss(text: &str, sel: &Sel, known: &BTreeSet<String>) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut selected = false;
    for line in text.lines() {
        if line.starts_with(char::is_whitespace) {
            // The info line of the socket above.
            if selected {
                found.extend(
                    line.split_whitespace()
                        .find(|t| known.contains(*t))
                        .map(String::from),
                );
            }
            continue;
        }
        let f: Vec<&str> = line.split_whitespace().collect();
        // Recv-Q Send-Q Local Peer [users:(...)] (state omitted by `state established`).
        let ports = f.iter().skip(2).take(2).filter_map(|e| port_of(e));
        let by_port = ports.into_iter().any(|p| sel.ports.contains(&p));
        let by_pid = sel
            .pids
            .iter()
            .any(|pid| line.contains(&format!("pid={pid},")));
        selected = by_port || by_pid;
    }
    found
}

/// Samples the congestion control of `sel`'s established sockets now.
pub fn sample(sel: &Sel) -> anyhow::Result<BTreeSet<String>> {
    let out = Command::new("ss")
        .args(["-tinpH", "state", "established"])
        .output()
        .map_err(|e| anyhow::anyhow!("running ss (iproute2) to observe congestion control: {e}"))?;
    anyhow::ensure!(out.status.success(), "ss failed: {}", out.status);
    Ok(parse_ss(
        &String::from_utf8_lossy(&out.stdout),
        sel,
        &available(),
    ))
}

/// One sample of `sel` taken `after` from now, on its own thread, so it
/// lands while the load runs.
pub struct Sampler(JoinHandle<BTreeSet<String>>);

impl Sampler {
    /// Starts the timer.
    pub fn start(sel: Sel, after: Duration) -> Self {
        Sampler(std::thread::spawn(move || {
            std::thread::sleep(after);
            sample(&sel).unwrap_or_default()
        }))
    }

    /// The names seen (empty when `ss` failed or nothing matched).
    pub fn finish(self) -> BTreeSet<String> {
        self.0.join().unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SS: &str =
        "0      0      127.0.0.1:38184 127.0.0.1:45193 users:((\"python3\",pid=29102,fd=4))
\t reno wscale:10,10 rto:200 rtt:0.032/0.016 mss:32741 cwnd:10
0      0      127.0.0.1:45193 127.0.0.1:38184 users:((\"redis-server\",pid=77,fd=5))
\t ts sack bbr wscale:10,10 rto:200 bbr:(bw:0bps,mrtt:0.026) cwnd:10
0      0      [::1]:6000 [::1]:41000 users:((\"mooncake\",pid=9001,fd=7))
\t cubic wscale:7,7
";

    #[test]
    fn sockets_are_selected_by_port_or_owner() {
        let known = available();
        let by_port = Sel {
            ports: vec![45193],
            pids: vec![],
        };
        // Both ends of the connection to port 45193: the client's reno, the server's bbr.
        assert_eq!(
            parse_ss(SS, &by_port, &known),
            BTreeSet::from(["bbr".to_string(), "reno".to_string()])
        );
        let by_pid = Sel {
            ports: vec![],
            pids: vec![9001],
        };
        assert_eq!(
            parse_ss(SS, &by_pid, &known),
            BTreeSet::from(["cubic".to_string()])
        );
        // pid=90 must not match pid=9001.
        let none = Sel {
            ports: vec![1],
            pids: vec![90],
        };
        assert!(parse_ss(SS, &none, &known).is_empty());
    }

    #[test]
    fn a_live_socket_reports_what_was_set_on_it() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        let (_s, _) = l.accept().unwrap();
        socket2::SockRef::from(&c)
            .set_tcp_congestion(b"reno")
            .unwrap();
        let seen = sample(&Sel {
            ports: vec![port],
            pids: vec![],
        })
        .expect("ss runs (iproute2 is installed by scripts/setup.sh)");
        assert!(seen.contains("reno"), "{seen:?}");
    }
}
