//! The systems `kvtier bench` measures next to kvtier, in the same run and
//! with the same steps: Redis ([`redis`], through [`resp`] or the `redis`
//! crate) and Mooncake Store ([`mooncake`], through its own Python API).

pub mod mooncake;
pub mod redis;
pub mod resp;
