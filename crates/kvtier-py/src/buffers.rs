//! Python buffers as Rust byte slices, without copying them: a read's
//! destinations (writable, C-contiguous) and a write's sources (any
//! C-contiguous buffer). The only unsafe code of the crate: a buffer's
//! memory is valid because its exporter says so while the view is held,
//! and these types hold the view (`PyUntypedBuffer`) for as long as the
//! slice is used.
#![allow(unsafe_code)]

use bytes::Bytes;
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// A held view of a Python buffer.
pub struct Held {
    view: PyUntypedBuffer,
}

impl Held {
    /// Takes a view of `obj`; `writable` refuses read-only buffers. Only
    /// C-contiguous buffers are accepted (a strided view has no single range
    /// of bytes to copy into).
    pub fn of(obj: &Bound<'_, PyAny>, writable: bool, what: &str) -> PyResult<Self> {
        let view = PyUntypedBuffer::get(obj)
            .map_err(|e| PyValueError::new_err(format!("{what}: not a buffer ({e})")))?;
        if !view.is_c_contiguous() {
            return Err(PyValueError::new_err(format!(
                "{what}: the buffer is not C-contiguous"
            )));
        }
        if writable && view.readonly() {
            return Err(PyValueError::new_err(format!(
                "{what}: the buffer is read-only"
            )));
        }
        Ok(Self { view })
    }

    /// The buffer's bytes, for writing. The caller keeps `self` alive while
    /// the slice is used and does not hand out two slices of one view.
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        let (ptr, len) = (self.view.buf_ptr().cast::<u8>(), self.view.len_bytes());
        if len == 0 {
            return &mut [];
        }
        // SAFETY: the exporter guarantees `len` bytes at `ptr` while the view
        // is held (we hold it for the slice's lifetime, tied to `&mut self`);
        // the buffer was checked to be writable and contiguous.
        unsafe { std::slice::from_raw_parts_mut(ptr, len) }
    }

    /// The buffer's bytes as `Bytes` that borrow them, for a write that ends
    /// before this view is released.
    pub fn shared(&self) -> Bytes {
        let (ptr, len) = (self.view.buf_ptr().cast::<u8>(), self.view.len_bytes());
        if len == 0 {
            return Bytes::new();
        }
        Bytes::from_owner(Borrowed { ptr, len })
    }
}

/// Bytes of a held Python buffer. Every `Bytes` made of it is dropped by the
/// call that made it (the data-plane client keeps no payload past its
/// call), and the `Held` view outlives that call.
struct Borrowed {
    ptr: *const u8,
    len: usize,
}

// SAFETY: a pointer to memory held valid by the view (see `Held::shared`).
unsafe impl Send for Borrowed {}
// SAFETY: the bytes are only read.
unsafe impl Sync for Borrowed {}

impl AsRef<[u8]> for Borrowed {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: see `Held::shared`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}
