//! The keyed commands of libmemcached's API (storage, get, delete, touch, incr/decr) on a
//! [`Pool`], each as one `prepare` (check the key, place it, build the operation) and one
//! `outcome` (the reply as libmemcached's code, in the pool's protocol mode), shared by
//! the blocking calls (`run`) and memfabric.h's non-blocking requests (`start`, `poll`).

use std::time::Duration;

use bytes::Bytes;
use memfabric_client::{Handle, Op, Reply, StoreMode, StoreStatus, Value};

use crate::abi::{self, Rc};
use crate::pool::Pool;

/// A keyed command and its arguments.
#[derive(Debug, Clone, Copy)]
pub enum Command<'a> {
    Store {
        mode: StoreMode,
        value: &'a [u8],
        exptime: i64,
        flags: u32,
        cas: u64,
    },
    Get,
    /// Get and touch: the item, its expiry time set.
    Gat {
        exptime: i64,
    },
    Delete {
        expiration: i64,
    },
    Touch {
        exptime: i64,
    },
    Arith {
        delta: u64,
        incr: bool,
    },
}

/// What a reply is read as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Store(StoreMode),
    Get,
    Delete,
    Touch,
    Arith,
}

/// A command's result: libmemcached's code, a fetched value, a counter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub rc: Rc,
    pub value: Option<Value>,
    pub number: Option<u64>,
}

impl Outcome {
    pub fn rc(rc: Rc) -> Outcome {
        Outcome {
            rc,
            value: None,
            number: None,
        }
    }
}

/// A code that says the server failed (rather than answered).
pub fn is_server_failure(rc: Rc) -> bool {
    matches!(
        rc,
        abi::CONNECTION_FAILURE
            | abi::TIMEOUT
            | abi::SERVER_TEMPORARILY_DISABLED
            | abi::WRITE_FAILURE
            | abi::UNKNOWN_READ_FAILURE
            | abi::PROTOCOL_ERROR
            | abi::NO_SERVERS
    )
}

impl Pool {
    /// The expiry time as the server would take it from libmemcached, which sends its low
    /// 32 bits, unsigned, in both protocols (`set k 0 4294967295 1` for -1). memcached reads
    /// the text protocol's number as a signed 32-bit one (so that is -1 again: expired at
    /// once) and the binary protocol's as unsigned (an absolute time past 2038). memfabric's
    /// transports carry a time read as signed 32 bits: "past 2038" becomes the latest time
    /// that can say (both mean "not for a long time"), and "expired at once" an absolute
    /// time before any server started.
    fn exptime(&self, t: i64) -> u32 {
        let wire = t as u32;
        if self.behaviors.binary {
            return wire.min(i32::MAX as u32);
        }
        if (wire as i32) < 0 {
            // Absolute (more than 30 days) and long past: expired on arrival.
            return 2_592_001;
        }
        wire
    }

    /// Checks a command as libmemcached does before sending it, and builds it: the server
    /// it goes to, the operation, how to read its reply. A refusal is recorded as the last
    /// error.
    pub fn prepare(
        &mut self,
        group: Option<&[u8]>,
        key: &[u8],
        cmd: Command<'_>,
    ) -> Result<(usize, Op, Kind), Rc> {
        if self.server_count() == 0 {
            return Err(self.fail(abi::NO_SERVERS, ""));
        }
        if matches!(cmd, Command::Get | Command::Gat { .. }) && self.behaviors.use_udp {
            return Err(self.fail(abi::NOT_SUPPORTED, "reads over UDP"));
        }
        let k = self.key(key).map_err(|rc| self.fail(rc, ""))?;
        if let Command::Delete { expiration } = cmd {
            if expiration != 0 {
                return Err(self.fail(abi::INVALID_ARGUMENTS, "delete with an expiration time"));
            }
        }
        let i = self.place(self.placement_key(group, &k).to_vec().as_slice());
        let key = k.full;
        let (op, kind) = match cmd {
            Command::Store {
                mode,
                value,
                exptime,
                flags,
                cas,
            } => (
                Op::Store {
                    mode,
                    key,
                    value: Bytes::copy_from_slice(value),
                    flags,
                    exptime: self.exptime(exptime),
                    cas,
                },
                Kind::Store(mode),
            ),
            Command::Get => (Op::Get { key, cas: true }, Kind::Get),
            Command::Gat { exptime } => (
                Op::Gat {
                    key,
                    exptime: self.exptime(exptime),
                },
                Kind::Get,
            ),
            Command::Delete { .. } => (Op::Delete { key }, Kind::Delete),
            Command::Touch { exptime } => (
                Op::Touch {
                    key,
                    exptime: self.exptime(exptime),
                },
                Kind::Touch,
            ),
            Command::Arith { delta, incr } => (Op::Arith { key, delta, incr }, Kind::Arith),
        };
        Ok((i, op, kind))
    }

    /// A reply (or failure) as libmemcached reports it in the pool's protocol mode; a
    /// failure is recorded as the last error.
    pub fn outcome(&mut self, kind: Kind, result: Result<Reply, (Rc, String)>) -> Outcome {
        let binary = self.behaviors.binary;
        let rc = match (kind, result) {
            (Kind::Get, Ok(Reply::Value(Some(v)))) => {
                return Outcome {
                    rc: abi::SUCCESS,
                    value: Some(v),
                    number: None,
                }
            }
            (Kind::Get, Ok(Reply::Value(None))) => abi::NOTFOUND,
            (Kind::Store(mode), Ok(Reply::Stored(st))) => match st {
                StoreStatus::Stored { .. } => abi::SUCCESS,
                StoreStatus::Exists => abi::DATA_EXISTS,
                StoreStatus::NotFound => abi::NOTFOUND,
                // The binary protocol's statuses: add finds the key (exists), replace does
                // not (not found); the text protocol says NOT_STORED for all.
                // Only a fragment write (which libmemcached's calls never make) is told so.
                StoreStatus::Superseded { .. } => abi::NOTSTORED,
                StoreStatus::NotStored => match (binary, mode) {
                    (true, StoreMode::Add) => abi::DATA_EXISTS,
                    (true, StoreMode::Replace) => abi::NOTFOUND,
                    _ => abi::NOTSTORED,
                },
            },
            (Kind::Delete, Ok(Reply::Deleted(found)))
            | (Kind::Touch, Ok(Reply::Touched(found))) => {
                if found {
                    abi::SUCCESS
                } else {
                    abi::NOTFOUND
                }
            }
            (Kind::Arith, Ok(Reply::Counter(Some(n)))) => {
                return Outcome {
                    rc: abi::SUCCESS,
                    value: None,
                    number: Some(n),
                }
            }
            (Kind::Arith, Ok(Reply::Counter(None))) => abi::NOTFOUND,
            (_, Ok(_)) => return Outcome::rc(self.fail(abi::PROTOCOL_ERROR, "unexpected reply")),
            // The binary protocol's "non-numeric value" status reaches libmemcached as an
            // unknown read failure.
            (Kind::Arith, Err((abi::CLIENT_ERROR, m))) if binary => {
                return Outcome::rc(self.fail(abi::UNKNOWN_READ_FAILURE, &m))
            }
            (_, Err((rc, m))) => return Outcome::rc(self.fail(rc, &m)),
        };
        if rc != abi::SUCCESS {
            self.fail(rc, "");
        }
        Outcome::rc(rc)
    }

    /// A command, blocking: sent, and answered within the pool's timeout. With NOREPLY,
    /// writes are sent and succeed at once (as libmemcached's do).
    pub fn run(&mut self, group: Option<&[u8]>, key: &[u8], cmd: Command<'_>) -> Outcome {
        let (i, op, kind) = match self.prepare(group, key, cmd) {
            Ok(p) => p,
            Err(rc) => return Outcome::rc(rc),
        };
        let replicas = self.replica_servers(i);
        if matches!(kind, Kind::Store(_) | Kind::Delete) {
            // libmemcached's replication: the write goes to the key's server and, without
            // waiting for their answers, to the next NUMBER_OF_REPLICAS servers.
            for &r in &replicas {
                let _ = self.issue(r, op.clone(), true);
            }
        }
        let fire_and_forget =
            self.behaviors.noreply && matches!(kind, Kind::Store(_) | Kind::Delete | Kind::Arith);
        if fire_and_forget {
            return match self.issue(i, op, true) {
                Ok(_) => Outcome::rc(abi::SUCCESS),
                Err((rc, m)) => Outcome::rc(self.fail(rc, &m)),
            };
        }
        let result = self.call(i, op.clone());
        let server_failed = result.as_ref().is_err_and(|(rc, _)| is_server_failure(*rc));
        let first = self.outcome(kind, result);
        if kind != Kind::Get || !server_failed {
            return first;
        }
        // A read whose server failed (not a miss: libmemcached does the same) is asked of
        // the replicas, in order, until one answers.
        for r in replicas {
            let result = self.call(r, op.clone());
            if result.as_ref().is_err_and(|(rc, _)| is_server_failure(*rc)) {
                continue;
            }
            return self.outcome(kind, result);
        }
        first
    }

    /// The servers holding replicas of keys placed on server `i`: libmemcached's next
    /// NUMBER_OF_REPLICAS servers by index (binary protocol only, as there), in order, or
    /// starting at a random one with RANDOMIZE_REPLICA_READ.
    pub fn replica_servers(&self, i: usize) -> Vec<usize> {
        let n = self.server_count();
        if !self.behaviors.binary || self.behaviors.replicas == 0 || n < 2 {
            return Vec::new();
        }
        let count = (self.behaviors.replicas as usize).min(n - 1);
        let mut list: Vec<usize> = (1..=count).map(|r| (i + r) % n).collect();
        if self.behaviors.randomize_replica_read {
            let start = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos() as usize);
            list.rotate_left(start % count);
        }
        list
    }

    /// A command, non-blocking: issued now, its outcome read later with [`Pool::poll`].
    pub fn start(
        &mut self,
        group: Option<&[u8]>,
        key: &[u8],
        cmd: Command<'_>,
    ) -> Result<(usize, Handle, Kind), Rc> {
        let (i, op, kind) = self.prepare(group, key, cmd)?;
        match self.issue(i, op, false) {
            Ok(Some(h)) => {
                self.hold(i, 1);
                Ok((i, h, kind))
            }
            Ok(None) => unreachable!("issued with a reply"),
            Err((rc, m)) => Err(self.fail(rc, &m)),
        }
    }

    /// The outcome of a started command: `None` while it is in flight (`wait` None), or
    /// after waiting at most `wait` (then a timeout if it has not finished: the request is
    /// abandoned).
    pub fn poll(
        &mut self,
        i: usize,
        h: Handle,
        kind: Kind,
        wait: Option<Duration>,
    ) -> Option<Outcome> {
        let result = self.finish(i, h, wait)?;
        self.hold(i, -1);
        Some(self.outcome(kind, result))
    }

    // ----- libmemcached's calls ------------------------------------------------------------

    #[allow(clippy::too_many_arguments)] // libmemcached's storage call, field by field
    pub fn store(
        &mut self,
        group: Option<&[u8]>,
        key: &[u8],
        value: &[u8],
        exptime: i64,
        flags: u32,
        mode: StoreMode,
        cas: u64,
    ) -> Rc {
        let cmd = Command::Store {
            mode,
            value,
            exptime,
            flags,
            cas,
        };
        self.run(group, key, cmd).rc
    }

    /// `memcached_get_by_key`: the value, or the code.
    pub fn get(&mut self, group: Option<&[u8]>, key: &[u8]) -> Result<Value, Rc> {
        let o = self.run(group, key, Command::Get);
        o.value.ok_or(o.rc)
    }

    pub fn delete(&mut self, group: Option<&[u8]>, key: &[u8], expiration: i64) -> Rc {
        self.run(group, key, Command::Delete { expiration }).rc
    }

    pub fn touch(&mut self, group: Option<&[u8]>, key: &[u8], exptime: i64) -> Rc {
        self.run(group, key, Command::Touch { exptime }).rc
    }

    /// incr/decr: the new value (None when sent with NOREPLY), or the code.
    pub fn arith(
        &mut self,
        group: Option<&[u8]>,
        key: &[u8],
        delta: u64,
        incr: bool,
    ) -> Result<Option<u64>, Rc> {
        let o = self.run(group, key, Command::Arith { delta, incr });
        if o.rc == abi::SUCCESS {
            Ok(o.number)
        } else {
            Err(o.rc)
        }
    }
}

/// Where a non-blocking request (memfabric.h's `memcached_request_st`) is.
#[derive(Debug)]
pub enum RequestState {
    /// Created, or its outcome taken: may be issued.
    Idle,
    InFlight {
        server: usize,
        handle: Handle,
        kind: Kind,
    },
    Done(Outcome),
}

/// A non-blocking request: issued with one pool, completed with the same pool.
#[derive(Debug)]
pub struct Request {
    /// The `memcached_st` that issued it (compared, never dereferenced here).
    pub owner: usize,
    pub state: RequestState,
}
