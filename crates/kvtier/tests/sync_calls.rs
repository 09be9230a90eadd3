//! Durability observed at the libc boundary: the server runs with an
//! LD_PRELOAD interposer (`tests/tools/synclog.c`) that logs every successful
//! fsync / fdatasync (with the path synced) and rename. For each acknowledged
//! write-through write the test finds the record file it created and checks
//! the calls behind it:
//! - `--disk-sync always`: the record's data was fdatasync'ed, then renamed
//!   to its final name, then its directory fsync'ed — all before the
//!   acknowledgement (the log is read right after it);
//! - `--disk-sync batch`: the record and its directory are synced within the
//!   batch interval after the acknowledgement (probed with a deadline);
//! - `--disk-sync never`: the records are renamed into place but never
//!   synced, which shows the log does not invent calls.
//!
//! Remove any of the disk tier's fdatasync / directory fsync calls (per-write
//! or batch) and a test here fails. (python/tests/test_durability.py checks
//! the file syncs' effect in the page cache with cachestat(2).)
use bytes::Bytes;
use kvtier_client::{Client, ClientConfig, WriteBlock};
use kvtier_core::Key;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

mod common;

/// One logged call.
#[derive(Debug, PartialEq)]
enum Call {
    Fsync(PathBuf),
    Fdatasync(PathBuf),
    Rename(PathBuf, PathBuf),
}

fn calls(log: &Path) -> Vec<Call> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let mut w = l.split(' ');
            match (w.next()?, w.next(), w.next()) {
                ("fsync", Some(p), None) => Some(Call::Fsync(p.into())),
                ("fdatasync", Some(p), None) => Some(Call::Fdatasync(p.into())),
                ("rename", Some(a), Some(b)) => Some(Call::Rename(a.into(), b.into())),
                _ => panic!("unreadable log line {l:?}"),
            }
        })
        .collect()
}

fn records(dir: &Path) -> BTreeSet<PathBuf> {
    fn walk(d: &Path, out: &mut BTreeSet<PathBuf>) {
        for e in std::fs::read_dir(d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "kvb") {
                out.insert(p);
            }
        }
    }
    let mut out = BTreeSet::new();
    walk(dir, &mut out);
    out
}

struct Server {
    child: Child,
    grpc: String,
    log: PathBuf,
    disk: PathBuf,
}

impl Server {
    fn start(tmp: &Path, so: &Path, sync: &str) -> Server {
        let disk = tmp.join(format!("disk-{sync}"));
        std::fs::create_dir_all(&disk).unwrap();
        // readlink(/proc/self/fd) gives canonical paths.
        let disk = disk.canonicalize().unwrap();
        let log = tmp.join(format!("sync-{sync}.log"));
        let mut child = common::serve_command()
            .arg("--disk-dir")
            .arg(&disk)
            .args(["--disk-capacity", "256MiB", "--disk-sync", sync])
            .args(["--write-policy", "write-through"])
            .env("LD_PRELOAD", so)
            .env("SYNCLOG_OUT", &log)
            .env("RUST_LOG", "warn")
            .spawn()
            .expect("spawn kvtier serve");
        let ready = common::ready(&mut child).expect("server ready line");
        let grpc = format!("grpc://{}", ready["grpc"][0].as_str().unwrap());
        Server {
            child,
            grpc,
            log,
            disk,
        }
    }

    /// Writes `n` 256 KiB blocks one at a time; after each acknowledgement
    /// calls `check(record file it created, log so far)`.
    fn write_each(&self, n: usize, mut check: impl FnMut(&Path)) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let client = rt
            .block_on(Client::connect(ClientConfig::new(self.grpc.clone())))
            .expect("connect");
        for i in 0..n {
            let before = records(&self.disk);
            let payload: Vec<u8> = (0..256 << 10).map(|j| (i * 31 + j) as u8).collect();
            let block = WriteBlock {
                token_ids: Vec::new(),
                key: Key::new(format!("sync-{i:04}").into_bytes()).unwrap(),
                parent: None,
                token_count: 16,
                payload: Bytes::from(payload),
                ttl_ms: 0,
            };
            let w = rt.block_on(client.write("sync", &[block])).expect("write");
            assert_eq!(w.stored, 1, "write {i} stored");
            let new: Vec<_> = records(&self.disk).difference(&before).cloned().collect();
            assert_eq!(
                new.len(),
                1,
                "one record file per acknowledged write: {new:?}"
            );
            check(&new[0]);
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn position(calls: &[Call], from: usize, want: impl Fn(&Call) -> bool) -> Option<usize> {
    calls.iter().skip(from).position(want).map(|i| i + from)
}

/// `(rename, data sync, directory sync)` positions for `record` in `calls`:
/// the rename that put it in place, an fdatasync of its file (under its
/// temporary or final name) and an fsync of its directory after the rename.
fn syncs_of(calls: &[Call], record: &Path) -> (Option<usize>, Option<usize>, Option<usize>) {
    let dir = record.parent().unwrap();
    let rename = position(
        calls,
        0,
        |c| matches!(c, Call::Rename(_, to) if to == record),
    );
    let tmp = match rename {
        Some(i) => match &calls[i] {
            Call::Rename(from, _) => Some(from.clone()),
            _ => unreachable!(),
        },
        None => None,
    };
    let data = position(
        calls,
        0,
        |c| matches!(c, Call::Fdatasync(p) if p == record || Some(p) == tmp.as_ref()),
    );
    let dir_sync =
        rename.and_then(|r| position(calls, r, |c| matches!(c, Call::Fsync(p) if p == dir)));
    (rename, data, dir_sync)
}

#[test]
fn sync_always_syncs_each_record_and_its_directory_before_the_acknowledgement() {
    let tmp = tempfile::tempdir().unwrap();
    let so = common::interposer("synclog", tmp.path());
    let s = Server::start(tmp.path(), &so, "always");
    s.write_each(5, |record| {
        let log = calls(&s.log);
        let (rename, data, dir) = syncs_of(&log, record);
        let rename = rename.unwrap_or_else(|| panic!("no rename into {record:?} in {log:#?}"));
        let data = data
            .unwrap_or_else(|| panic!("{record:?} acknowledged before its fdatasync: {log:#?}"));
        assert!(
            data < rename,
            "{record:?}: data synced after it was renamed into place"
        );
        assert!(
            dir.is_some(),
            "{record:?} acknowledged before its directory was fsync'ed: {log:#?}"
        );
    });
}

#[test]
fn sync_batch_syncs_each_record_and_its_directory_soon_after() {
    let tmp = tempfile::tempdir().unwrap();
    let so = common::interposer("synclog", tmp.path());
    let s = Server::start(tmp.path(), &so, "batch");
    s.write_each(5, |record| {
        // disk.batch_interval defaults to 10 ms; allow for a loaded machine.
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let log = calls(&s.log);
            if let (Some(_), Some(_), Some(_)) = syncs_of(&log, record) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{record:?} (or its directory) not synced 20 s after its acknowledgement: {log:#?}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    });
}

#[test]
fn sync_never_renames_records_without_syncing_them() {
    let tmp = tempfile::tempdir().unwrap();
    let so = common::interposer("synclog", tmp.path());
    let s = Server::start(tmp.path(), &so, "never");
    let mut seen = Vec::new();
    s.write_each(5, |record| seen.push(record.to_path_buf()));
    let log = calls(&s.log);
    for record in &seen {
        let (rename, data, dir) = syncs_of(&log, record);
        assert!(
            rename.is_some(),
            "the log shows the rename into {record:?}: {log:#?}"
        );
        assert_eq!(
            (data, dir),
            (None, None),
            "{record:?} synced under --disk-sync never: {log:#?}"
        );
    }
}
