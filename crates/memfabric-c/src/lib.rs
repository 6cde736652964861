//! libmemfabric: libmemcached 1.1.4's C ABI on memfabric's client.
//!
//! Loaded in place of `libmemcached.so.11` (`LD_PRELOAD`, or a directory on
//! `LD_LIBRARY_PATH` holding it under that name), it gives unmodified applications
//! (pylibmc, PHP's memcached, libmemcached's tools, ...) memfabric's client: the same key
//! placement as libmemcached (modula, ketama, weighted ketama, every libhashkit hash), TCP
//! to any memcached, and UCX (with one-sided GETs) to a memfabricd that offers it. See
//! docs/c-api.md.
//!
//! Layers: [`abi`] (the C structs and codes), [`hash`], [`behavior`] and [`config`]
//! (pure), [`pool`] (the state behind a `memcached_st`, safe Rust on
//! `memfabric_client::Client`), `exports` (the `extern "C"` functions: pointers in,
//! pool calls, malloc'd values out).

pub mod abi;
pub mod behavior;
pub mod commands;
pub mod config;
pub mod exports;
pub mod hash;
pub mod pool;
