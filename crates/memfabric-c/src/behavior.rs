//! libmemcached's behaviours (`memcached_behavior_set/get`), with the answers of
//! libmemcached 1.1.4 for every behaviour and value, coupled settings included (KETAMA sets
//! the distribution, USE_UDP turns on NOREPLY, ...). The differential test sets each
//! behaviour to 0, 1, 7 and 5000 on both libraries and compares all behaviours after.

use crate::abi::{self, Rc};
use crate::hash::Hash;

/// `memcached_server_distribution_t`.
pub const DIST_MODULA: u64 = 0;
pub const DIST_CONSISTENT_KETAMA: u64 = 2;
pub const DIST_RANDOM: u64 = 3;
pub const DIST_CONSISTENT_WEIGHTED: u64 = 5;
pub const DIST_MAX: u64 = 7;

/// Every setting a `memcached_st` carries, with libmemcached's defaults.
#[derive(Debug, Clone)]
pub struct Behaviors {
    pub no_block: bool,
    pub tcp_nodelay: bool,
    pub key_hash: Hash,
    pub distribution_hash: Hash,
    pub send_size: i32,
    pub recv_size: i32,
    pub support_cas: bool,
    /// Milliseconds a reply may take (-1: forever).
    pub poll_timeout: i32,
    pub distribution: u64,
    pub buffer_requests: bool,
    pub sort_hosts: bool,
    pub verify_key: bool,
    /// Milliseconds.
    pub connect_timeout: i32,
    /// Seconds a failed server is left alone.
    pub retry_timeout: i32,
    pub binary: bool,
    pub snd_timeout: i32,
    pub rcv_timeout: i32,
    pub server_failure_limit: u32,
    pub io_msg_watermark: u32,
    pub io_bytes_watermark: u32,
    pub io_key_prefetch: u32,
    pub hash_with_namespace: bool,
    pub noreply: bool,
    pub use_udp: bool,
    pub auto_eject: bool,
    pub replicas: u32,
    pub randomize_replica_read: bool,
    pub tcp_keepalive: bool,
    pub tcp_keepidle: u32,
    pub dead_timeout: i32,
    pub server_timeout_limit: u32,
}

impl Default for Behaviors {
    fn default() -> Self {
        Behaviors {
            no_block: false,
            tcp_nodelay: false,
            key_hash: Hash::Default,
            distribution_hash: Hash::Default,
            send_size: 0,
            recv_size: 0,
            support_cas: false,
            poll_timeout: 5000,
            distribution: DIST_MODULA,
            buffer_requests: false,
            sort_hosts: false,
            verify_key: false,
            connect_timeout: 4000,
            retry_timeout: 2,
            binary: false,
            snd_timeout: 0,
            rcv_timeout: 0,
            server_failure_limit: 5,
            io_msg_watermark: 500,
            io_bytes_watermark: 65 * 1024,
            io_key_prefetch: 0,
            hash_with_namespace: false,
            noreply: false,
            use_udp: false,
            auto_eject: false,
            replicas: 0,
            randomize_replica_read: false,
            tcp_keepalive: false,
            tcp_keepidle: 0,
            dead_timeout: 0,
            server_timeout_limit: 0,
        }
    }
}

/// A hash number `MEMCACHED_BEHAVIOR_HASH` takes: `Ok(Some)` to use, `Ok(None)` for numbers
/// past the enum that libmemcached accepts and ignores, `Err` for the ones it refuses.
fn hash_setting(v: u64) -> Result<Option<Hash>, Rc> {
    match Hash::from_number(v) {
        Some(h) => Ok(Some(h)),
        None if v <= 12 => Err(abi::INVALID_ARGUMENTS),
        None => Ok(None),
    }
}

impl Behaviors {
    pub fn is_ketama(&self) -> bool {
        matches!(self.distribution, 1 | 2 | 4 | 5)
    }

    pub fn get(&self, b: u32) -> u64 {
        let t = |x: bool| u64::from(x);
        match b {
            0 => t(self.no_block),
            1 => t(self.tcp_nodelay),
            2 => self.key_hash as u64,
            3 => t(self.is_ketama()),
            4 => self.send_size as u64,
            5 => self.recv_size as u64,
            6 => 1, // CACHE_LOOKUPS: always on
            7 => t(self.support_cas),
            8 => self.poll_timeout as u64,
            9 => self.distribution,
            10 => t(self.buffer_requests),
            12 => t(self.sort_hosts),
            13 => t(self.verify_key),
            14 => self.connect_timeout as u64,
            15 => self.retry_timeout as u64,
            16 => t(self.distribution == DIST_CONSISTENT_WEIGHTED),
            17 => self.distribution_hash as u64,
            18 => t(self.binary),
            19 => self.snd_timeout as u64,
            20 => self.rcv_timeout as u64,
            21 => self.server_failure_limit.into(),
            22 => self.io_msg_watermark.into(),
            23 => self.io_bytes_watermark.into(),
            24 => self.io_key_prefetch.into(),
            25 => t(self.hash_with_namespace),
            26 => t(self.noreply),
            27 => t(self.use_udp),
            28 | 35 => t(self.auto_eject),
            29 => self.replicas.into(),
            30 => t(self.randomize_replica_read),
            31 => 1, // CORK: deprecated, reads as on
            32 => t(self.tcp_keepalive),
            33 => self.tcp_keepidle.into(),
            36 => self.dead_timeout as u64,
            37 => self.server_timeout_limit.into(),
            _ => 0,
        }
    }

    /// Sets behaviour `b` to `v`; the return code libmemcached gives.
    pub fn set(&mut self, b: u32, v: u64) -> Rc {
        let on = v != 0;
        let int = v as i32;
        match b {
            0 => self.no_block = on,
            1 => self.tcp_nodelay = on,
            2 => match hash_setting(v) {
                Ok(Some(h)) => self.key_hash = h,
                Ok(None) => {}
                Err(rc) => return rc,
            },
            3 => {
                self.distribution = if on {
                    DIST_CONSISTENT_KETAMA
                } else {
                    DIST_MODULA
                }
            }
            4 => self.send_size = int,
            5 => self.recv_size = int,
            6 | 11 | 31 => return abi::DEPRECATED,
            7 => self.support_cas = on,
            8 => self.poll_timeout = int,
            9 => {
                if v >= DIST_MAX {
                    return abi::INVALID_ARGUMENTS;
                }
                self.distribution = v;
            }
            10 => self.buffer_requests = on,
            12 => self.sort_hosts = on,
            13 => {
                if self.binary {
                    return abi::INVALID_ARGUMENTS;
                }
                self.verify_key = on;
            }
            14 => self.connect_timeout = int,
            15 => self.retry_timeout = int,
            16 => {
                if on {
                    self.key_hash = Hash::Md5;
                    self.distribution_hash = Hash::Md5;
                    self.distribution = DIST_CONSISTENT_WEIGHTED;
                } else {
                    self.distribution = DIST_CONSISTENT_KETAMA;
                }
            }
            17 => match hash_setting(v) {
                Ok(Some(h)) => self.distribution_hash = h,
                Ok(None) => {}
                Err(rc) => return rc,
            },
            18 => self.binary = on,
            19 => self.snd_timeout = int,
            20 => self.rcv_timeout = int,
            21 => {
                if v == 0 {
                    return abi::INVALID_ARGUMENTS;
                }
                self.server_failure_limit = v as u32;
            }
            22 => self.io_msg_watermark = v as u32,
            23 => self.io_bytes_watermark = v as u32,
            24 => self.io_key_prefetch = v as u32,
            25 => self.hash_with_namespace = on,
            26 => self.noreply = on,
            27 => {
                self.use_udp = on;
                if on {
                    self.noreply = true;
                }
            }
            28 | 35 => self.auto_eject = on,
            29 => self.replicas = v as u32,
            30 => self.randomize_replica_read = on,
            32 => self.tcp_keepalive = on,
            33 => self.tcp_keepidle = v as u32,
            36 => self.dead_timeout = int,
            37 => self.server_timeout_limit = v as u32,
            // LOAD_FROM_FILE is set through a configuration string; past the enum,
            // libmemcached asserts: refusing is kinder.
            _ => return abi::INVALID_ARGUMENTS,
        }
        abi::SUCCESS
    }
}
