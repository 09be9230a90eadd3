//! A `kvtier serve` the CLI tests (`cli_*.rs`) drive: started on ephemeral
//! loopback ports (its stderr dropped or logged to a file), CLI verbs run
//! against it, stopped by SIGTERM with a clean exit.
use super::BIN;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `kvtier serve` and its gRPC address.
pub struct Served {
    pub child: Child,
    pub grpc: String,
}

impl Served {
    pub fn start(extra: &[&str]) -> Self {
        Self::start_with_stderr(extra, Stdio::null())
    }

    /// `serve` on ephemeral loopback ports, its stderr sent to `stderr`.
    pub fn start_with_stderr(extra: &[&str], stderr: Stdio) -> Self {
        let mut child = super::serve_command()
            .args(extra)
            .env_remove("RUST_LOG")
            .stderr(stderr)
            .spawn()
            .expect("spawn kvtier serve");
        // Readiness: the server prints its bound addresses once listening.
        let v = super::ready(&mut child).expect("ready json");
        Self {
            child,
            grpc: format!("http://{}", v["grpc"][0].as_str().unwrap()),
        }
    }

    pub fn cli(&self, args: &[&str]) -> std::process::Output {
        Command::new(BIN)
            .args(args)
            .args(["--server", &self.grpc])
            .output()
            .expect("run cli")
    }

    /// SIGTERM and wait (bounded) for a clean exit.
    pub fn stop(mut self) -> std::process::ExitStatus {
        Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                return st;
            }
            assert!(Instant::now() < deadline, "server did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Starts `serve` with stderr captured to a file; returns the server and the file.
pub fn serve_logged(extra: &[&str]) -> (Served, tempfile::TempPath) {
    let log = tempfile::NamedTempFile::new().unwrap().into_temp_path();
    let err = std::fs::File::create(&log).unwrap();
    (Served::start_with_stderr(extra, err.into()), log)
}
