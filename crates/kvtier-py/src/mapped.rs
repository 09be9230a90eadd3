//! `MappedRead` for Python: a read's blocks left in the server's shared
//! memory, as addresses a GPU engine DMAs from (docs/local.md, "Loads a
//! GPU reads in place"). The addresses are valid until `release()` (or
//! until the object is collected, which releases too).
use crate::convert::error;
use crate::runtime;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::sync::Mutex;

/// The blocks of one read, in place in kvtier's shared memory.
#[pyclass(module = "kvtier._native")]
pub struct MappedRead {
    inner: Mutex<Option<kvtier_client::wire::MappedRead>>,
}

impl MappedRead {
    pub fn new(m: kvtier_client::wire::MappedRead) -> Self {
        Self {
            inner: Mutex::new(Some(m)),
        }
    }

    fn with<T>(&self, f: impl FnOnce(&kvtier_client::wire::MappedRead) -> T) -> PyResult<T> {
        let g = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        g.as_ref()
            .map(f)
            .ok_or_else(|| pyo3::exceptions::PyValueError::new_err("released"))
    }
}

#[pymethods]
impl MappedRead {
    /// Blocks found, each `(index, key, parent, token_count, length, tier)`.
    #[getter]
    fn blocks<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyAny>>> {
        let rows = self.with(|m| {
            m.blocks
                .iter()
                .map(|b| {
                    (
                        b.index,
                        b.key.bytes(),
                        b.parent.as_ref().map(|p| p.bytes()),
                        b.token_count,
                        b.len,
                        b.tier as i32,
                    )
                })
                .collect::<Vec<_>>()
        })?;
        rows.into_iter()
            .map(|(i, k, p, t, l, tier)| {
                (
                    i,
                    PyBytes::new(py, &k),
                    p.map(|p| PyBytes::new(py, &p)),
                    t,
                    l,
                    tier,
                )
                    .into_pyobject(py)
                    .map(Bound::into_any)
            })
            .collect()
    }

    /// `(partial, reason)`.
    #[getter]
    fn outcome(&self) -> PyResult<(bool, String)> {
        self.with(|m| (m.partial, m.reason.clone()))
    }

    /// Each block's `(address, length)` in this process.
    #[getter]
    fn regions(&self) -> PyResult<Vec<(usize, usize)>> {
        self.with(|m| m.regions().to_vec())
    }

    /// Every segment mapped on this read's connection, `(id, address,
    /// length)`: what a GPU engine registers with its driver, once per id.
    #[getter]
    fn segments(&self) -> PyResult<Vec<(u64, usize, usize)>> {
        self.with(|m| m.segments())
    }

    /// Block `i`'s bytes, copied into `buffer` (writable, at least as long).
    fn copy_into(&self, i: usize, buffer: &Bound<'_, PyAny>) -> PyResult<usize> {
        let mut held = crate::buffers::Held::of(buffer, true, "buffer")?;
        self.with(|m| {
            let src = m.bytes(i).ok_or_else(|| {
                pyo3::exceptions::PyIndexError::new_err(format!(
                    "block {i} of a read of {} blocks",
                    m.blocks.len()
                ))
            })?;
            let dst = held.bytes_mut();
            if dst.len() < src.len() {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "buffer holds {} bytes, block {i} {}",
                    dst.len(),
                    src.len()
                )));
            }
            dst[..src.len()].copy_from_slice(src);
            Ok(src.len())
        })?
    }

    /// Gives the blocks back to the server; the addresses are invalid after.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        let m = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        let Some(m) = m else { return Ok(()) };
        let rt = runtime::get()?;
        py.detach(|| rt.block_on(m.release())).map_err(error)
    }
}
