//! Results and errors as Python values, converted in one place: a client
//! error becomes `NativeError(code, message, retry_after_ms)` with the gRPC
//! status code (kvtier.errors turns it into `KvtierError`), and server
//! timings a dict of `kvtier.v1.ServerTiming`'s field names.
use kvtier_client::ClientError;
use kvtier_client::ServerTiming;
use pyo3::prelude::*;
use pyo3::types::PyDict;

pyo3::create_exception!(
    _native,
    NativeError,
    pyo3::exceptions::PyException,
    "A kvtier call failed: args are (grpc status code as int, message, retry hint in ms or 0)."
);

impl NativeError {
    /// INVALID_ARGUMENT with `message`.
    pub fn invalid(message: impl Into<String>) -> PyErr {
        NativeError::new_err((tonic::Code::InvalidArgument as i32, message.into(), 0u64))
    }
}

/// A client error as a `NativeError`.
pub fn error(e: ClientError) -> PyErr {
    match e {
        ClientError::Status(s) => {
            let retry = kvtier_client::pushback(&s).map_or(0, |d| d.as_millis() as u64);
            NativeError::new_err((s.code() as i32, s.message().to_string(), retry))
        }
        ClientError::Invalid(m) => NativeError::invalid(m),
        ClientError::Corrupt(m) => NativeError::new_err((tonic::Code::DataLoss as i32, m, 0u64)),
        ClientError::Transport(t) => {
            NativeError::new_err((tonic::Code::Unavailable as i32, t.to_string(), 0u64))
        }
        e @ ClientError::Unreachable { .. } => {
            NativeError::new_err((tonic::Code::Unavailable as i32, e.to_string(), 0u64))
        }
    }
}

/// Server timing as a dict with `kvtier.v1.ServerTiming`'s field names.
pub fn timing<'py>(py: Python<'py>, t: &ServerTiming) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("queue_us", t.queue_us)?;
    d.set_item("service_us", t.service_us)?;
    d.set_item("storage_memory_us", t.storage_memory_us)?;
    d.set_item("storage_disk_us", t.storage_disk_us)?;
    d.set_item("storage_object_us", t.storage_object_us)?;
    d.set_item("storage_peer_us", t.storage_peer_us)?;
    d.set_item("total_us", t.total_us)?;
    Ok(d)
}
