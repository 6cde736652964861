//! Reply encoding: the classic protocol's fixed reply lines and the writers of its
//! variable ones.

use crate::number::push_u64;

// Fixed reply lines.
pub const STORED: &[u8] = b"STORED\r\n";
pub const NOT_STORED: &[u8] = b"NOT_STORED\r\n";
pub const EXISTS: &[u8] = b"EXISTS\r\n";
pub const NOT_FOUND: &[u8] = b"NOT_FOUND\r\n";
pub const DELETED: &[u8] = b"DELETED\r\n";
pub const TOUCHED: &[u8] = b"TOUCHED\r\n";
pub const END: &[u8] = b"END\r\n";
pub const OK: &[u8] = b"OK\r\n";
pub const RESET: &[u8] = b"RESET\r\n";
pub const ERROR: &[u8] = b"ERROR\r\n";
pub const TOO_LARGE: &[u8] = b"SERVER_ERROR object too large for cache\r\n";
pub const OUT_OF_MEMORY_STORING: &[u8] = b"SERVER_ERROR out of memory storing object\r\n";
/// incr/decr that could not allocate the new value.
pub const OUT_OF_MEMORY: &[u8] = b"SERVER_ERROR out of memory\r\n";
pub const NON_NUMERIC: &[u8] = b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n";
pub const SHUTDOWN_DISABLED: &[u8] = b"ERROR: shutdown not enabled\r\n";
pub const SHUTDOWN_BAD_MODE: &[u8] = b"CLIENT_ERROR invalid shutdown mode\r\n";
pub const FLUSH_DISABLED: &[u8] = b"CLIENT_ERROR flush_all not allowed\r\n";
pub const CACHEDUMP_DISABLED: &[u8] = b"CLIENT_ERROR stats cachedump not allowed\r\n";
pub const METADUMP_DISABLED: &[u8] = b"ERROR metadump not allowed\r\n";
pub const WATCH_DISABLED: &[u8] = b"CLIENT_ERROR watch commands not allowed\r\n";
pub const SLAB_REASSIGN_DISABLED: &[u8] = b"CLIENT_ERROR slab reassignment disabled\r\n";
pub const CRAWLER_DISABLED: &[u8] = b"CLIENT_ERROR lru crawler disabled\r\n";
pub const CRAWLER_BADCLASS: &[u8] = b"BADCLASS invalid class id\r\n";
pub const CRAWLER_START_FAILED: &[u8] = b"ERROR failed to start lru crawler thread\r\n";
pub const CRAWLER_STOP_FAILED: &[u8] = b"ERROR failed to stop lru crawler thread\r\n";
pub const MEMLIMIT_TOO_SMALL: &[u8] = b"MEMLIMIT_TOO_SMALL cannot set maxbytes to less than 8m\r\n";
pub const MEMLIMIT_NOT_MEGABYTES: &[u8] =
    b"MEMLIMIT_ADJUST_FAILED input value is megabytes not bytes\r\n";
pub const MEMLIMIT_ADJUST_FAILED: &[u8] =
    b"MEMLIMIT_ADJUST_FAILED out of bounds or unable to adjust\r\n";

/// `VALUE <key> <flags> <bytes>[ <cas>]\r\n`
pub fn write_value_header(out: &mut Vec<u8>, key: &[u8], flags: u32, len: usize, cas: Option<u64>) {
    out.extend_from_slice(b"VALUE ");
    out.extend_from_slice(key);
    out.push(b' ');
    push_u64(out, flags.into());
    out.push(b' ');
    push_u64(out, len as u64);
    if let Some(c) = cas {
        out.push(b' ');
        push_u64(out, c);
    }
    out.extend_from_slice(b"\r\n");
}

/// `STAT <name> <value>\r\n`
pub fn write_stat(out: &mut Vec<u8>, name: &str, value: &str) {
    out.extend_from_slice(b"STAT ");
    out.extend_from_slice(name.as_bytes());
    out.push(b' ');
    out.extend_from_slice(value.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// `VERSION <version>\r\n`
pub fn write_version(out: &mut Vec<u8>, version: &str) {
    out.extend_from_slice(b"VERSION ");
    out.extend_from_slice(version.as_bytes());
    out.extend_from_slice(b"\r\n");
}

/// A number followed by `\r\n` (incr/decr replies).
pub fn write_number_line(out: &mut Vec<u8>, n: u64) {
    push_u64(out, n);
    out.extend_from_slice(b"\r\n");
}
