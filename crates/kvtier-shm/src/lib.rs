//! Shared memory between kvtier and the engines on its host (docs/local.md).
//!
//! The server keeps the blocks a same-host client reads in *segments*:
//! `memfd` files it creates, maps read-write, faults in, and seals so that
//! nobody else can ever write, shrink or grow them ([`Segment`]). Each
//! namespace's blocks live in segments of their own ([`Arena`]), so a
//! descriptor handed to a client shows only bytes of namespaces its token
//! may read. Clients receive descriptors over the Unix socket
//! (`SCM_RIGHTS`, [`fdpass`]) and map them read-only ([`Mapping`]), or, for
//! a save, read-write into a segment lent to that one connection.
//!
//! No process's memory is touched by another process's system calls: bytes
//! move through mappings both sides hold (docs/security.md, "Shared
//! memory").
pub mod arena;
pub mod fdpass;
pub mod mapping;
pub mod segment;
mod sys;

pub use arena::{Arena, Budget, SlotMut};
pub use mapping::Mapping;
pub use segment::{Segment, Sharing};
