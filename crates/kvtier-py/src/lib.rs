//! `kvtier._native`: the Rust client core (`kvtier-client`) as a Python
//! extension module, so Python moves KV bytes with the same code as Rust:
//! the data plane's framing, striping, size continuation and write
//! splitting, and the same-host socket's shared memory, from which blocks
//! are copied straight into the caller's buffers or left in place for a
//! GPU to read (docs/local.md).
//!
//! `kvtier.Client` (python/kvtier/client.py) uses it for Read and Write;
//! lookups, leases and the rest stay on its gRPC stubs. Every I/O call
//! releases the GIL. Buffers are taken through the buffer protocol and
//! never copied into Python objects (`buffers`). Fork-safe: a child process
//! gets its own runtime and connections (`runtime`, [`DataPlane`]).
//!
//! Layout: `lib.rs` the module and the `DataPlane` class; `mapped.rs` a
//! read left in shared memory; `buffers.rs`
//! Python buffers as byte slices (the crate's only unsafe code);
//! `runtime.rs` the per-process Tokio runtime; `convert.rs` results and
//! errors as Python values.

mod buffers;
mod convert;
mod mapped;
mod runtime;

use buffers::Held;
use convert::{NativeError, error, timing};
use kvtier_client::WriteBlock;
use kvtier_client::wire::{Target, WireClient};
use kvtier_core::Key;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// A block to write, as Python passes it: `(key, parent, token_count,
/// payload buffer, ttl_ms, token_ids)`.
type BlockArg<'py> = (
    Vec<u8>,
    Option<Vec<u8>>,
    u32,
    Bound<'py, PyAny>,
    u64,
    Vec<u32>,
);

/// How a [`DataPlane`] connects, kept to reconnect in a forked child.
#[derive(Clone)]
struct Settings {
    target: Target,
    connections: usize,
    timeout: Duration,
    connect_timeout: Duration,
    token: Option<String>,
    congestion: Option<String>,
    max_stripes: usize,
    max_request: u64,
    tls: Option<kvtier_client::wire::WireTls>,
}

impl Settings {
    async fn connect(&self) -> kvtier_client::Result<WireClient> {
        Ok(WireClient::connect_tls(
            self.target.clone(),
            self.connections,
            self.timeout,
            self.connect_timeout,
            self.congestion.as_deref(),
            self.token.as_deref(),
            self.tls.clone(),
        )
        .await?
        .with_max_stripes(self.max_stripes)
        .with_max_request(self.max_request))
    }
}

/// A pool of data-plane connections to one kvtier server: TCP (`host:port`)
/// or the same-host socket (`unix:///path`).
#[pyclass(module = "kvtier._native")]
struct DataPlane {
    settings: Settings,
    /// The pool and the process that opened it.
    pool: Mutex<Option<(u32, WireClient)>>,
}

fn seconds(s: f64, what: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| pyo3::exceptions::PyValueError::new_err(format!("{what} must be > 0")))
}

/// One block's destination: a writable buffer, or a list or tuple of them
/// filled in order.
fn held_parts(obj: &Bound<'_, PyAny>, i: usize) -> PyResult<Vec<Held>> {
    let parts = if let Ok(l) = obj.cast::<PyList>() {
        l.iter().collect::<Vec<_>>()
    } else if let Ok(t) = obj.cast::<PyTuple>() {
        t.iter().collect::<Vec<_>>()
    } else {
        return Ok(vec![Held::of(obj, true, &format!("buffer {i}"))?]);
    };
    parts
        .iter()
        .enumerate()
        .map(|(j, b)| Held::of(b, true, &format!("buffer {i}, part {j}")))
        .collect()
}

fn keys_of(keys: Vec<Vec<u8>>) -> PyResult<Vec<Key>> {
    keys.into_iter()
        .map(|k| Key::new(bytes::Bytes::from(k)).map_err(|e| NativeError::invalid(e.message)))
        .collect()
}

impl DataPlane {
    /// This process's pool, connected on first use (again in a forked child,
    /// whose inherited pool is abandoned, not closed: see `Conn::abandon`).
    fn pool(&self, py: Python<'_>) -> PyResult<WireClient> {
        let me = std::process::id();
        let mut slot = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        match slot.as_ref() {
            Some((pid, w)) if *pid == me => return Ok(w.clone()),
            Some(_) => std::mem::forget(slot.take()),
            None => {}
        }
        let rt = runtime::get()?;
        let settings = self.settings.clone();
        let w = py
            .detach(|| rt.block_on(settings.connect()))
            .map_err(error)?;
        *slot = Some((me, w.clone()));
        Ok(w)
    }

    fn run<T: Send>(
        &self,
        py: Python<'_>,
        f: impl AsyncFnOnce(WireClient) -> kvtier_client::Result<T> + Send,
    ) -> PyResult<T> {
        let w = self.pool(py)?;
        let rt = runtime::get()?;
        py.detach(|| rt.block_on(f(w))).map_err(error)
    }
}

#[pymethods]
impl DataPlane {
    /// Connects `connections` connections to `target` (`host:port` or
    /// `unix:///path`), each within `connect_timeout` seconds.
    #[new]
    #[pyo3(signature = (target, connections=4, timeout=10.0, connect_timeout=5.0, token=None,
                        congestion=None, max_stripes=8, max_request=0, tls_ca=None,
                        tls_cert=None, tls_key=None, tls_server_name=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        target: &str,
        connections: usize,
        timeout: f64,
        connect_timeout: f64,
        token: Option<String>,
        congestion: Option<String>,
        max_stripes: usize,
        max_request: u64,
        tls_ca: Option<Vec<u8>>,
        tls_cert: Option<Vec<u8>>,
        tls_key: Option<Vec<u8>>,
        tls_server_name: Option<String>,
    ) -> PyResult<Self> {
        let target = match kvtier_client::transport::local_path(target) {
            Some(p) => Target::Unix(p.into()),
            None => Target::Tcp(target.parse().map_err(|e| {
                NativeError::invalid(format!("data plane address {target:?}: {e}"))
            })?),
        };
        let tls = match tls_ca {
            None => None,
            Some(ca_pem) => {
                let t = kvtier_client::ClientTls {
                    ca_pem,
                    identity: tls_cert.zip(tls_key),
                    domain: tls_server_name,
                };
                Some(t.wire(&format!("https://{target}")).map_err(error)?)
            }
        };
        let dp = Self {
            settings: Settings {
                target,
                connections: connections.max(1),
                timeout: seconds(timeout, "timeout")?,
                connect_timeout: seconds(connect_timeout, "connect_timeout")?,
                token: token.filter(|t| !t.is_empty()),
                congestion: congestion.filter(|c| !c.is_empty()),
                max_stripes: max_stripes.max(1),
                max_request,
                tls,
            },
            pool: Mutex::new(None),
        };
        dp.pool(py)?;
        Ok(dp)
    }

    /// `"unix"` (the same-host socket) or `"tcp"`.
    #[getter]
    fn transport(&self) -> &'static str {
        match self.settings.target {
            Target::Unix(_) => "unix",
            Target::Tcp(_) => "tcp",
        }
    }

    /// Where the pool connects, as given.
    #[getter]
    fn target(&self) -> String {
        self.settings.target.to_string()
    }

    /// Reads `keys` in order and leaves the blocks in kvtier's shared
    /// memory (the same-host socket only): a `MappedRead` whose `regions` a
    /// GPU engine DMAs from, valid until its `release()`.
    #[pyo3(signature = (namespace, keys, lease_id=0, timeout=10.0))]
    fn map_read(
        &self,
        py: Python<'_>,
        namespace: &str,
        keys: Vec<Vec<u8>>,
        lease_id: u64,
        timeout: f64,
    ) -> PyResult<mapped::MappedRead> {
        let keys = keys_of(keys)?;
        let deadline = Instant::now() + seconds(timeout, "timeout")?;
        let m = self.run(py, async |w| {
            w.map_read(namespace, &keys, lease_id, deadline).await
        })?;
        Ok(mapped::MappedRead::new(m))
    }

    /// Whether payloads move through shared memory (the same-host socket,
    /// and the server can share memory with this process).
    #[getter]
    fn copies_by_memory(&self, py: Python<'_>) -> PyResult<bool> {
        Ok(self.pool(py)?.copies_by_memory())
    }

    /// Reads `keys` in order into `buffers` (per key one writable,
    /// C-contiguous buffer, or a list or tuple of them that the block fills
    /// in order), stopping at the first missing block. Returns
    /// `(blocks, partial, reason, timing)`, each block
    /// `(index, key, parent, token_count, length, tier)`.
    #[allow(clippy::type_complexity)]
    fn read_into<'py>(
        &self,
        py: Python<'py>,
        namespace: &str,
        keys: Vec<Vec<u8>>,
        lease_id: u64,
        buffers: Vec<Bound<'py, PyAny>>,
        timeout: f64,
    ) -> PyResult<(Vec<Bound<'py, PyAny>>, bool, String, Bound<'py, PyDict>)> {
        let keys = keys_of(keys)?;
        let mut held = buffers
            .iter()
            .enumerate()
            .map(|(i, b)| held_parts(b, i))
            .collect::<PyResult<Vec<_>>>()?;
        let deadline = Instant::now() + seconds(timeout, "timeout")?;
        let r = {
            let mut dests: Vec<Vec<&mut [u8]>> = held
                .iter_mut()
                .map(|g| g.iter_mut().map(Held::bytes_mut).collect())
                .collect();
            self.run(py, async |w| {
                w.read_parts_by(namespace, &keys, lease_id, &mut dests, deadline)
                    .await
            })?
        };
        drop(held);
        let blocks = r
            .blocks
            .iter()
            .map(|b| {
                (
                    b.index,
                    PyBytes::new(py, &b.key.bytes()),
                    b.parent.as_ref().map(|p| PyBytes::new(py, &p.bytes())),
                    b.token_count,
                    b.len,
                    b.tier as i32,
                )
                    .into_pyobject(py)
                    .map(Bound::into_any)
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok((blocks, r.partial, r.reason, timing(py, &r.timing)?))
    }

    /// Reads `keys` in order into new `bytes`, stopping at the first missing
    /// block; each checksum verified. Returns `(blocks, partial, reason,
    /// timing)`, each block `(index, key, parent, token_count, payload, tier)`.
    #[allow(clippy::type_complexity)]
    fn read<'py>(
        &self,
        py: Python<'py>,
        namespace: &str,
        keys: Vec<Vec<u8>>,
        lease_id: u64,
        timeout: f64,
    ) -> PyResult<(Vec<Bound<'py, PyAny>>, bool, String, Bound<'py, PyDict>)> {
        let keys = keys_of(keys)?;
        let deadline = Instant::now() + seconds(timeout, "timeout")?;
        let r = self.run(py, async |w| {
            w.read_by(namespace, &keys, lease_id, deadline).await
        })?;
        let blocks = r
            .blocks
            .iter()
            .map(|b| {
                (
                    b.index,
                    PyBytes::new(py, &b.key.bytes()),
                    b.parent.as_ref().map(|p| PyBytes::new(py, &p.bytes())),
                    b.token_count,
                    PyBytes::new(py, &b.payload),
                    b.tier as i32,
                )
                    .into_pyobject(py)
                    .map(Bound::into_any)
            })
            .collect::<PyResult<Vec<_>>>()?;
        Ok((blocks, r.partial, r.reason, timing(py, &r.timing)?))
    }

    /// Writes blocks given as `(key, parent or None, token_count, payload,
    /// ttl_ms, token_ids)`, payloads any C-contiguous buffers (not copied; checksums
    /// computed here). Batches larger than the server takes at once are
    /// split. Returns `(stored, existing, deferred, timing)`.
    fn write<'py>(
        &self,
        py: Python<'py>,
        namespace: &str,
        blocks: Vec<BlockArg<'py>>,
        timeout: f64,
    ) -> PyResult<(u32, u32, u32, Bound<'py, PyDict>)> {
        let mut held = Vec::with_capacity(blocks.len());
        let mut wbs = Vec::with_capacity(blocks.len());
        for (i, (key, parent, token_count, payload, ttl_ms, token_ids)) in
            blocks.into_iter().enumerate()
        {
            let h = Held::of(&payload, false, &format!("payload {i}"))?;
            wbs.push(WriteBlock {
                key: Key::new(bytes::Bytes::from(key))
                    .map_err(|e| NativeError::invalid(e.message))?,
                parent: parent
                    .map(|p| Key::new(bytes::Bytes::from(p)))
                    .transpose()
                    .map_err(|e| NativeError::invalid(e.message))?,
                token_count,
                payload: h.shared(),
                ttl_ms,
                token_ids,
            });
            held.push(h);
        }
        let deadline = Instant::now() + seconds(timeout, "timeout")?;
        let r = self.run(py, async |w| w.write_by(namespace, &wbs, deadline).await);
        // The payloads borrow the views: gone before the views are released.
        drop(wbs);
        drop(held);
        let r = r?;
        Ok((r.stored, r.existing, r.deferred, timing(py, &r.timing)?))
    }

    /// Closes the pool's connections (a later call reconnects).
    fn close(&self) {
        let mut slot = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((pid, w)) = slot.take()
            && pid != std::process::id()
        {
            std::mem::forget(w);
        }
    }

    fn __repr__(&self) -> String {
        format!("DataPlane({})", self.settings.target)
    }
}

/// The module.
#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<DataPlane>()?;
    m.add_class::<mapped::MappedRead>()?;
    m.add("NativeError", m.py().get_type::<NativeError>())?;
    m.add("MAX_STRIPES", kvtier_client::wire::MAX_STRIPES)?;
    m.add("STRIPE_MIN_BLOCKS", kvtier_client::wire::STRIPE_MIN_BLOCKS)?;
    Ok(())
}
