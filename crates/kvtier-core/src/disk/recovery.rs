//! Opening a disk-tier directory: format check, lock, and the index rebuild.
//!
//! The rebuild scans every shard directory. Temp files (writes that never
//! committed) are deleted. Each record's header is decoded and checked; a
//! record shorter than its header says is *torn*, one with a bad magic,
//! version, header checksum, length or (with `verify_on_open`) payload
//! checksum is *corrupt*. Both are deleted and counted, never served. When an
//! id has several records (a replaced value whose old file outlived a crash),
//! the highest sequence number wins. Expired records are deleted. Survivors are
//! entered oldest first (so LRU order approximates write order), and if they
//! exceed the capacity (it was lowered) leaves are evicted until they fit.
use super::DiskConfig;
use super::format::{self, HeaderError, RecordHeader};
use super::index::{Entry, Index, Removed};
use super::store::{charge, sync_dir};
use crate::block::BlockId;
use crate::clock::unix_ms;
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Contents of `<dir>/FORMAT`. Format 2 records may carry token ids (record
/// flag bit 2), which a format-1 build would delete as corrupt; it refuses a
/// format-2 directory instead.
pub const FORMAT_LINE: &str = "kvtier-disk-format 2\n";
/// A directory this build opens and upgrades (once it holds the lock): its
/// records are valid format-2 records.
const FORMAT_LINE_V1: &str = "kvtier-disk-format 1\n";

/// Token ids read from the records at open, until the KV events announce
/// them (`DiskTier::observe`).
pub(super) type RecoveredTokens = HashMap<BlockId, std::sync::Arc<[u32]>>;

/// What the index rebuild found when the tier was opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Records recovered and now served.
    pub blocks: u64,
    /// Bytes they are charged (file sizes rounded up to 4 KiB).
    pub bytes: u64,
    /// Records dropped because they were torn (shorter than their header says).
    pub dropped_torn: u64,
    /// Records dropped because they were corrupt (bad header or checksum).
    pub dropped_corrupt: u64,
    /// Records dropped because their TTL had passed.
    pub dropped_expired: u64,
    /// Older records of an id that also has a newer one.
    pub dropped_superseded: u64,
    /// Records evicted because the recovered set exceeded the capacity.
    pub evicted_over_capacity: u64,
    /// Uncommitted temp files deleted.
    pub temp_files_removed: u64,
    /// Wall time of the scan and rebuild.
    pub elapsed: Duration,
}

impl RecoveryReport {
    /// Records dropped as torn or corrupt.
    pub fn dropped(&self) -> u64 {
        self.dropped_torn + self.dropped_corrupt
    }
}

fn dir_error(dir: &Path, what: &str, e: io::Error) -> Error {
    Error::internal(format!(
        "disk tier directory {}: {what}: {e}",
        dir.display()
    ))
    .with_source(e)
}

/// Creates `dir` and its missing ancestors, and `fsync`s the parent of each
/// one it created: a directory's entry is durable only once its parent is
/// synced, and without this a power cut could take the whole tier (a
/// `disk.dir` the server made itself, acknowledged writes and all) with it.
fn create_dir_durable(dir: &Path) -> io::Result<()> {
    let mut created = Vec::new();
    let mut d = Some(dir);
    while let Some(p) = d.filter(|p| !p.as_os_str().is_empty() && fs::metadata(p).is_err()) {
        created.push(p);
        d = p.parent();
    }
    fs::create_dir_all(dir)?;
    for p in created.iter().rev() {
        match p.parent().filter(|q| !q.as_os_str().is_empty()) {
            Some(parent) => sync_dir(parent)?,
            None => sync_dir(Path::new("."))?,
        }
    }
    Ok(())
}

/// Creates the directory tree, checks or writes `FORMAT`, takes `LOCK`.
/// Returns the lock file and the `blocks` directory.
pub(super) fn prepare_dir(dir: &Path) -> Result<(File, PathBuf)> {
    create_dir_durable(dir).map_err(|e| dir_error(dir, "cannot create it", e))?;
    let meta = fs::metadata(dir).map_err(|e| dir_error(dir, "cannot stat it", e))?;
    if !meta.is_dir() {
        return Err(Error::internal(format!(
            "disk tier directory {} is not a directory",
            dir.display()
        )));
    }
    let fmt_path = dir.join("FORMAT");
    let mut upgrade = false;
    match fs::read_to_string(&fmt_path) {
        Ok(s) if s == FORMAT_LINE => {}
        Ok(s) if s == FORMAT_LINE_V1 => upgrade = true,
        Ok(s) => {
            return Err(Error::internal(format!(
                "disk tier directory {} has format {:?}; this build reads {:?}",
                dir.display(),
                s.trim(),
                FORMAT_LINE.trim()
            )));
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => write_format(dir)?,
        Err(e) => return Err(dir_error(dir, "cannot read FORMAT", e)),
    }
    let lock_path = dir.join("LOCK");
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|e| dir_error(dir, "cannot open LOCK", e))?;
    lock.try_lock().map_err(|e| {
        Error::unavailable(format!(
            "disk tier directory {} is in use by another process ({}: {e})",
            dir.display(),
            lock_path.display()
        ))
    })?;
    if upgrade {
        // Under the lock: a format-1 process still running there keeps its directory.
        write_format(dir)?;
        tracing::info!(dir = %dir.display(), "disk tier: directory upgraded to format 2");
    }
    let blocks = dir.join("blocks");
    for i in 0..=255u8 {
        let shard = blocks.join(format!("{i:02x}"));
        fs::create_dir_all(&shard).map_err(|e| dir_error(&shard, "cannot create shard", e))?;
    }
    sync_dir(&blocks)
        .and_then(|_| sync_dir(dir))
        .map_err(|e| dir_error(dir, "fsync failed", e))?;
    Ok((lock, blocks))
}

/// Writes `FORMAT` durably (temp file, fsync, rename, directory fsync).
fn write_format(dir: &Path) -> Result<()> {
    let (tmp, path) = (dir.join("FORMAT.tmp"), dir.join("FORMAT"));
    let write = || -> io::Result<()> {
        let mut f = File::create(&tmp)?;
        f.write_all(FORMAT_LINE.as_bytes())?;
        f.sync_all()?;
        fs::rename(&tmp, &path)?;
        sync_dir(dir)
    };
    write().map_err(|e| dir_error(dir, "is not writable (writing FORMAT)", e))
}

enum Scan {
    Ok(RecordHeader, u64),
    Torn(String),
    Corrupt(String),
}

/// Reads and checks one record file.
fn scan_file(path: &Path, verify: bool) -> io::Result<Scan> {
    let mut f = File::open(path)?;
    let file_len = f.metadata()?.len();
    let mut buf = Vec::new();
    if verify {
        f.read_to_end(&mut buf)?;
    } else {
        // The names' longest header first; token ids, when the header says
        // it is longer, after (most records' headers are far shorter).
        (&mut f)
            .take(format::MAX_NAMES_HEADER_LEN as u64)
            .read_to_end(&mut buf)?;
        if buf.len() >= 12 {
            let want = u32::from_le_bytes(buf[8..12].try_into().expect("4 bytes")) as usize;
            if want > buf.len() && want <= format::MAX_HEADER_LEN {
                (&mut f)
                    .take((want - buf.len()) as u64)
                    .read_to_end(&mut buf)?;
            }
        }
    }
    let h = match format::decode_header(&buf) {
        Ok(h) => h,
        Err(HeaderError::Short) => {
            return Ok(Scan::Torn(format!(
                "{file_len}-byte file ends inside the header"
            )));
        }
        Err(HeaderError::Corrupt(why)) => return Ok(Scan::Corrupt(why)),
    };
    let total = h.header_len as u64 + h.payload_len;
    if file_len < total {
        return Ok(Scan::Torn(format!(
            "file is {file_len} bytes, record needs {total}"
        )));
    }
    if file_len > total {
        return Ok(Scan::Corrupt(format!(
            "file is {file_len} bytes, record is {total}"
        )));
    }
    if verify {
        let crc = crc32c::crc32c(&buf[h.header_len..]);
        if crc != h.meta.crc32c {
            return Ok(Scan::Corrupt(format!(
                "payload crc32c {crc:#010x}, header says {:#010x}",
                h.meta.crc32c
            )));
        }
    }
    Ok(Scan::Ok(h, file_len))
}

/// Parses `<32 hex>-<16 hex>.<ext>`.
fn parse_name(name: &str) -> Option<([u8; 16], u64, &str)> {
    let (stem, ext) = name.rsplit_once('.')?;
    let (h, s) = stem.split_once('-')?;
    let mut hash = [0u8; 16];
    hex::decode_to_slice(h, &mut hash).ok()?;
    let seq = u64::from_str_radix(s, 16).ok().filter(|_| s.len() == 16)?;
    Some((hash, seq, ext))
}

/// Rebuilds `idx` from the records under `blocks`. Returns the report and the
/// highest sequence number seen.
pub(super) fn rebuild(
    cfg: &DiskConfig,
    blocks: &Path,
    idx: &mut Index,
) -> Result<(RecoveryReport, u64, RecoveredTokens)> {
    let t0 = Instant::now();
    let mut rep = RecoveryReport::default();
    let mut max_seq = 0u64;
    let mut best: HashMap<BlockId, (RecordHeader, u64, [u8; 16])> = HashMap::new();
    let mut doomed: Vec<PathBuf> = Vec::new();
    let now_ms = unix_ms();
    for i in 0..=255u8 {
        let shard = blocks.join(format!("{i:02x}"));
        let rd = fs::read_dir(&shard).map_err(|e| dir_error(&shard, "cannot list shard", e))?;
        for ent in rd {
            let ent = ent.map_err(|e| dir_error(&shard, "cannot list shard", e))?;
            let path = ent.path();
            let name = ent.file_name();
            let Some((hash, seq, ext)) = name.to_str().and_then(parse_name) else {
                tracing::warn!(path = %path.display(), "disk tier: ignoring unknown file");
                continue;
            };
            max_seq = max_seq.max(seq);
            if ext == format::TEMP_EXT {
                rep.temp_files_removed += 1;
                doomed.push(path);
                continue;
            }
            if ext != format::RECORD_EXT {
                tracing::warn!(path = %path.display(), "disk tier: ignoring unknown file");
                continue;
            }
            let scan = match scan_file(&path, cfg.verify_on_open) {
                Ok(s) => s,
                Err(e) => Scan::Corrupt(format!("read failed: {e}")),
            };
            let (h, file_len) = match scan {
                Scan::Ok(h, n) => (h, n),
                Scan::Torn(why) => {
                    tracing::warn!(path = %path.display(), %why, "disk tier: dropping torn record");
                    rep.dropped_torn += 1;
                    doomed.push(path);
                    continue;
                }
                Scan::Corrupt(why) => {
                    tracing::warn!(path = %path.display(), %why, "disk tier: dropping corrupt record");
                    rep.dropped_corrupt += 1;
                    doomed.push(path);
                    continue;
                }
            };
            if h.seq != seq || format::file_hash(&h.meta.id) != hash || hash[0] != i {
                tracing::warn!(path = %path.display(), "disk tier: record header does not match its file name");
                rep.dropped_corrupt += 1;
                doomed.push(path);
                continue;
            }
            if h.meta.expires_unix_ms.is_some_and(|e| e <= now_ms) {
                rep.dropped_expired += 1;
                doomed.push(path);
                continue;
            }
            let id = h.meta.id.clone();
            match best.get(&id) {
                Some((old, _, _)) if old.seq > h.seq => {
                    rep.dropped_superseded += 1;
                    doomed.push(path);
                }
                prev => {
                    if let Some((old, _, oh)) = prev {
                        rep.dropped_superseded += 1;
                        let old = Removed {
                            hash: *oh,
                            seq: old.seq,
                        };
                        doomed.push(record_path(blocks, &old));
                    }
                    best.insert(id, (h, file_len, hash));
                }
            }
        }
    }
    let mut recs: Vec<_> = best.into_values().collect();
    recs.sort_by_key(|(h, _, _)| h.seq);
    let mut tokens = RecoveredTokens::new();
    for (h, file_len, hash) in recs {
        if cfg.keep_tokens
            && let Some(t) = h.tokens
        {
            tokens.insert(h.meta.id.clone(), t);
        }
        let m = h.meta;
        let e = Entry::new(
            h.seq,
            hash,
            charge(file_len),
            m.crc32c,
            h.payload_len,
            m.parent,
            m.expires_unix_ms,
        );
        idx.insert(m.id, e);
    }
    let capacity = cfg.capacity.bytes();
    let evicted = match idx.evict_for(0, capacity, None, None, tokio::time::Instant::now()) {
        Ok(v) | Err(v) => v,
    };
    rep.evicted_over_capacity = evicted.len() as u64;
    idx.counters_mut().evictions = 0;
    doomed.extend(evicted.iter().map(|r| record_path(blocks, r)));
    for p in &doomed {
        if let Err(e) = fs::remove_file(p)
            && e.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(path = %p.display(), error = %e, "disk tier: cannot delete dropped record");
        }
    }
    rep.blocks = idx.len() as u64;
    rep.bytes = idx.bytes();
    rep.elapsed = t0.elapsed();
    tracing::info!(dir = %cfg.dir.display(), blocks = rep.blocks, bytes = rep.bytes, torn = rep.dropped_torn,
        corrupt = rep.dropped_corrupt, elapsed_ms = rep.elapsed.as_millis() as u64, "disk tier recovered");
    tokens.retain(|id, _| idx.get(id).is_some());
    Ok((rep, max_seq, tokens))
}

fn record_path(blocks: &Path, r: &Removed) -> PathBuf {
    blocks.join(format!("{:02x}", r.hash[0])).join(format!(
        "{}-{:016x}.{}",
        hex::encode(r.hash),
        r.seq,
        format::RECORD_EXT
    ))
}
