//! Cancellation safety of reads by memory (docs/local.md, "Cancelled reads").
//!
//! On the same-host socket a ReadInto has the server copy blocks straight
//! into the caller's buffers (`process_vm_writev`) while this process only
//! waits for the reply. A future that holds those buffers borrowed can be
//! dropped at any await (a `tokio::time::timeout`, a `select!`, the pool's
//! own deadline): the borrow ends and the caller may free or reuse the
//! memory while the server is still writing into it. A spawned task that
//! owns the buffers cannot help here, since the caller lends them
//! (`&mut [u8]`, a Python buffer held only for the call); so the
//! connection is not let go of until the server is done with it:
//! [`InFlight`] owns the connection for the length of a ReadInto, and when
//! it is dropped before the reply arrived it closes the connection's
//! sending side, which tells the server to start no further copy, then
//! blocks until the server closes its end. The server holds the connection
//! open until its copy threads have ended (`held_open` in the server's
//! `wire::memory_copy`), so that close means nothing more can land, and the
//! wait is about one block's copy (milliseconds).
//!
//! Reads over TCP need none of this: the bytes are received into the
//! buffers by the future's own polls, so none lands once it is dropped.
use super::Conn;
use kvtier_proto::wire::Kind;
use std::io::{ErrorKind, Read};
use std::net::Shutdown;
use std::ops::{Deref, DerefMut};
use std::time::{Duration, Instant};
use tokio::net::UnixStream;
use tokio::runtime::{Handle, RuntimeFlavor};

/// How often a wait for a server that does not close is logged.
const WARN_EVERY: Duration = Duration::from_secs(5);

/// A connection with a request on it whose reply may still be on its way;
/// for a ReadInto, the caller's buffers are not handed back (this is not
/// dropped) before the server is done writing into them.
pub(super) struct InFlight {
    conn: Option<Conn>,
    /// Whether the server may be copying into this process.
    copying: bool,
}

impl InFlight {
    pub(super) fn new(conn: Conn, kind: Kind) -> Self {
        Self {
            copying: kind == Kind::ReadInto && matches!(conn, Conn::Unix(_)),
            conn: Some(conn),
        }
    }

    /// The connection, once the reply has been read in full: the server
    /// writes its reply after its last copy, so none is in flight.
    pub(super) fn answered(mut self) -> Conn {
        self.conn.take().expect("taken once")
    }
}

impl Deref for InFlight {
    type Target = Conn;
    fn deref(&self) -> &Conn {
        self.conn.as_ref().expect("taken once")
    }
}

impl DerefMut for InFlight {
    fn deref_mut(&mut self) -> &mut Conn {
        self.conn.as_mut().expect("taken once")
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let Some(Conn::Unix(s)) = self.conn.take() else {
            return;
        };
        if !self.copying {
            return;
        }
        // Blocking in a drop: on a multi-threaded runtime the worker's other
        // tasks move to another thread meanwhile.
        match Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(RuntimeFlavor::MultiThread) => {
                tokio::task::block_in_place(|| until_closed(&s));
            }
            _ => until_closed(&s),
        }
    }
}

/// Tells the server to stop (end of stream) and waits for it to close the
/// connection; whatever it still sends (its reply) is dropped.
fn until_closed(s: &UnixStream) {
    let sock = socket2::SockRef::from(s);
    let _ = sock.shutdown(Shutdown::Write);
    if sock.set_nonblocking(false).is_err() || sock.set_read_timeout(Some(WARN_EVERY)).is_err() {
        return;
    }
    let started = Instant::now();
    let mut buf = [0u8; 16 << 10];
    loop {
        match (&*sock).read(&mut buf) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                // Never given back early: the server may still be writing
                // into the caller's buffers.
                tracing::warn!(
                    waited = ?started.elapsed(),
                    "kvtier: a cancelled read waits for the server to stop copying into its buffers"
                );
            }
            // Reset: the server's end is gone, and its copies with it.
            Err(_) => return,
        }
    }
}
