//! The Tokio runtime the extension's I/O runs on: one per process, made on
//! first use. Engines fork workers after importing kvtier; a forked child
//! has the parent's runtime in memory but none of its threads, so the child
//! makes its own and never touches the parent's (it is leaked, not dropped:
//! dropping it would wait for threads that do not exist here).
use std::sync::{Arc, Mutex};

static RUNTIME: Mutex<Option<(u32, Arc<tokio::runtime::Runtime>)>> = Mutex::new(None);

/// This process's runtime.
pub fn get() -> std::io::Result<Arc<tokio::runtime::Runtime>> {
    let me = std::process::id();
    let mut slot = RUNTIME.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((pid, rt)) = slot.as_ref() {
        if *pid == me {
            return Ok(rt.clone());
        }
        // A forked child: the parent's runtime has no threads here.
        std::mem::forget(slot.take());
    }
    let rt = Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            // Striped reads and concurrent callers share these; the copies
            // themselves run on the server (same-host socket) or in the kernel.
            .worker_threads(2)
            .thread_name("kvtier-native")
            .enable_all()
            .build()?,
    );
    *slot = Some((me, rt.clone()));
    Ok(rt)
}
