//! memfabric's burst buffer: files over the cache.
//!
//! A file is a metadata object (an inode: size, chunk size, generation, version, times,
//! mode, the bitmap of chunks written, the sha256 of what was last flushed) plus
//! chunk objects, all ordinary cache items on a pool that replicates or erasure-codes them
//! (`memfabric-client`'s `Config`). Layers, each importing only those before it:
//!
//! 1. [`layout`]: the objects' keys and bytes (no I/O);
//! 2. [`fs`]: the file system one client sees — names, pipelined chunk I/O, close-to-open
//!    publication, read-through (stage-in) from a backing directory;
//! 3. [`flush`]: the journaled, resumable, bandwidth-bounded copy of files to the backing
//!    directory;
//! 4. [`mount`]: the FUSE file system over [`fs`] and [`flush`].
//!
//! docs/burst-buffer.md has the layout, the consistency rules and the flush protocol.

pub mod flush;
pub mod fs;
pub mod layout;
pub mod mount;

pub use fs::{Fs, FsError, Options, SetAttr};
pub use layout::{Inode, Kind};
