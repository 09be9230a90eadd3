//! Disk-tier errors an operator meets: a directory that cannot be created
//! or is a file, a foreign on-disk format version (each refused, naming the
//! path), and a real `ENOSPC` on a small tmpfs (RESOURCE_EXHAUSTED, no
//! partial file, reads continue; docs/durability.md).
mod common;
use common::disk::{cfg, chain_blocks, open, walk};
use common::ns;
use kvtier_core::Tier;
use kvtier_core::disk::{DiskTier, SyncMode};
use kvtier_core::error::ErrorKind;

#[tokio::test]
async fn uncreatable_dir_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"x").unwrap();
    let bad = file.join("disk");
    let err = DiskTier::open(cfg(&bad, 1 << 20, SyncMode::Always)).unwrap_err();
    assert!(
        err.message.contains(&bad.display().to_string()),
        "{}",
        err.message
    );
    // The OS error stays reachable as the source, and survives added context.
    let err = err.context("opening the disk tier");
    let io = std::error::Error::source(&err)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .expect("the io::Error as source");
    assert_eq!(io.kind(), std::io::ErrorKind::NotADirectory, "{io}");
    let err = DiskTier::open(cfg(&file, 1 << 20, SyncMode::Always)).unwrap_err();
    assert!(
        err.message.contains(&file.display().to_string()),
        "{}",
        err.message
    );
}

#[tokio::test]
async fn foreign_format_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("FORMAT"), "kvtier-disk-format 99\n").unwrap();
    let err = DiskTier::open(cfg(dir.path(), 1 << 20, SyncMode::Always)).unwrap_err();
    assert!(
        err.message.contains("99") && err.message.contains(&dir.path().display().to_string()),
        "{}",
        err.message
    );
}

/// A small tmpfs mounted for one test, unmounted when dropped.
struct SmallFs(tempfile::TempDir);

impl SmallFs {
    /// Mounts a tmpfs of `size` (e.g. "2m"). Needs root (CI runs as root);
    /// without it the test fails, saying so, rather than passing unchecked.
    fn mount(size: &str) -> SmallFs {
        let dir = tempfile::tempdir().unwrap();
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir.path())
            .output()
            .expect("the mount command");
        assert!(
            out.status.success(),
            "mounting a {size} tmpfs for a real ENOSPC needs root: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        SmallFs(dir)
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg(self.0.path())
            .status();
    }
}

/// A real `ENOSPC`, on a 2 MiB tmpfs the test mounts: the write that does
/// not fit is RESOURCE_EXHAUSTED, leaves no partial file, and every block
/// stored before it still reads back intact.
#[tokio::test]
async fn enospc_is_resource_exhausted_and_reads_continue() {
    let fs = SmallFs::mount("2m");
    let dir = fs.0.path().join("tier");
    let (tier, _) = open(cfg(&dir, 1 << 40, SyncMode::Always));
    let chain = chain_blocks(&ns("t"), 1, 12, 400_000);
    let mut stored = Vec::new();
    let mut err = None;
    for b in &chain {
        match tier.put(b.clone()).await {
            Ok(_) => stored.push(b.clone()),
            Err(e) => {
                err = Some(e);
                break;
            }
        }
    }
    let err = err.expect("the filesystem must fill up");
    assert_eq!(err.kind, ErrorKind::ResourceExhausted, "{}", err.message);
    assert!(err.message.contains("out of space"), "{}", err.message);
    assert!(!stored.is_empty());
    for b in &stored {
        assert_eq!(tier.get(&b.meta.id).await.unwrap().as_ref(), Some(b));
    }
    assert!(
        walk(&dir.join("blocks"))
            .iter()
            .all(|p| p.extension().unwrap() == "kvb")
    );
    assert_eq!(tier.disk_stats().write_exhausted, 1);
    drop(tier);
    std::fs::remove_dir_all(&dir).unwrap();
}
