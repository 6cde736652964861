//! `--transport ucx`: memfabricd's UCX active-message data path, driven through
//! `memfabric-client` (`ucx://host:port`, the server's `--ucx-port` bootstrap port; the UCX
//! transports come from `UCX_TLS`).
//!
//! One [`memfabric_client::Client`] per transport, so one UCX worker per client thread. The
//! bench's "connections" of a UCX transport are request queues over that one client (a UCX
//! worker reaches a server through one endpoint however many requests are in flight): `conns`
//! x `depth` requests are in flight per thread, exactly as over TCP, and replies are handed
//! back in order per queue. A request is a [`Op`] built from the bench [`Request`] (the value
//! is copied once into the request, as the TCP transport copies it into its send buffer); a
//! reply becomes the same [`Reply`] the text protocol parser produces, so the load loop and
//! its value checks do not know which transport ran.

use crate::textproto::{Reply, Request};
use crate::transport::{Connector, Transport, TransportError};
use bytes::Bytes;
use memfabric_client::{Client, Config, Error, GetMode, Handle, Op, StoreMode, StoreStatus};
use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

/// memfabricd over UCX, bootstrapped through `addr` (its `--ucx-port`).
#[derive(Clone, Debug)]
pub struct UcxConnector {
    pub addr: SocketAddr,
    /// Deadline of one request; past it the run fails (the bench's stall limit).
    pub timeout: Duration,
    /// How GETs are served: `TwoSided` is the active-message path (`--transport ucx`),
    /// `OneSided` reads items from the server's memory (`--transport onesided`).
    pub get_mode: GetMode,
}

impl UcxConnector {
    /// The active-message path: every request, GETs included, is served by the server.
    pub fn new(addr: SocketAddr) -> Self {
        UcxConnector {
            addr,
            timeout: Duration::from_secs(10),
            get_mode: GetMode::TwoSided,
        }
    }

    /// GETs read one-sidedly (RMA), everything else as active messages.
    pub fn onesided(addr: SocketAddr) -> Self {
        UcxConnector {
            get_mode: GetMode::OneSided,
            ..UcxConnector::new(addr)
        }
    }
}

impl Connector for UcxConnector {
    fn connect(&self, conns: usize) -> Result<Box<dyn Transport>, TransportError> {
        Ok(Box::new(UcxTransport::connect(
            self.addr,
            conns,
            self.timeout,
            self.get_mode,
        )?))
    }
}

/// The client-library request for a bench request.
pub fn op_of(req: &Request<'_>) -> Op {
    match *req {
        Request::Get { key } => Op::Get {
            key: key.to_vec(),
            cas: false,
        },
        Request::Set { key, value } => Op::Store {
            mode: StoreMode::Set,
            key: key.to_vec(),
            value: Bytes::copy_from_slice(value),
            flags: 0,
            exptime: 0,
            cas: 0,
        },
    }
}

/// A finished request, owning what the text-protocol [`Reply`] borrows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Hit {
        flags: u32,
        data: Bytes,
    },
    Miss,
    Stored,
    NotStored,
    Exists,
    NotFound,
    /// The server refused the request (`SERVER_ERROR ...`, `CLIENT_ERROR ...`): counted as an
    /// error reply, as over TCP.
    Error(String),
}

impl Outcome {
    /// The reply as the text protocol would have carried it; `key` is the request's key
    /// (a UCX reply does not repeat it).
    pub fn as_reply<'a>(&'a self, key: &'a [u8]) -> Reply<'a> {
        match self {
            Outcome::Hit { flags, data } => Reply::Hit {
                key,
                flags: *flags,
                data,
            },
            Outcome::Miss => Reply::Miss,
            Outcome::Stored => Reply::Stored,
            Outcome::NotStored => Reply::NotStored,
            Outcome::Exists => Reply::Exists,
            Outcome::NotFound => Reply::NotFound,
            Outcome::Error(line) => Reply::Error(line.as_bytes()),
        }
    }
}

/// What a client result means to the bench: a server answer (possibly an error answer), or a
/// failure of the request itself (timeout, lost connection, garbled reply), which ends the run
/// like a broken TCP connection does.
pub fn outcome_of(
    conn: usize,
    r: Result<memfabric_client::Reply, Error>,
) -> Result<Outcome, TransportError> {
    use memfabric_client::Reply as R;
    let fail = |msg: String| TransportError::Request { conn, msg };
    match r {
        Ok(R::Value(Some(v))) => Ok(Outcome::Hit {
            flags: v.flags,
            data: v.data,
        }),
        Ok(R::Value(None)) => Ok(Outcome::Miss),
        Ok(R::Stored(StoreStatus::Stored { .. })) => Ok(Outcome::Stored),
        Ok(R::Stored(StoreStatus::NotStored)) => Ok(Outcome::NotStored),
        Ok(R::Stored(StoreStatus::Exists)) => Ok(Outcome::Exists),
        Ok(R::Stored(StoreStatus::NotFound)) => Ok(Outcome::NotFound),
        Ok(other) => Err(fail(format!("reply of the wrong kind: {other:?}"))),
        Err(e @ (Error::Server(_) | Error::Client(_))) => Ok(Outcome::Error(e.to_string())),
        Err(Error::TooLarge) => Ok(Outcome::Error(
            "SERVER_ERROR object too large for cache".into(),
        )),
        Err(Error::InvalidKey) => Ok(Outcome::Error("CLIENT_ERROR invalid key".into())),
        Err(e) => Err(fail(e.to_string())),
    }
}

struct Outstanding {
    handle: Handle,
    /// The key of a GET (the reply check compares it); empty for a SET.
    key: Vec<u8>,
    seq: u64,
}

/// One client (one UCX worker) and `conns` ordered request queues over it.
pub struct UcxTransport {
    client: Client,
    /// How GETs are served (the transport's name says which).
    get_mode: GetMode,
    queues: Vec<VecDeque<Outstanding>>,
    in_flight: usize,
    next_seq: u64,
    timeout: Duration,
}

impl UcxTransport {
    /// Connect now (the client library connects lazily; the bench wants a bad address or a
    /// server without UCX to fail here, not in the first measured request).
    pub fn connect(
        addr: SocketAddr,
        conns: usize,
        timeout: Duration,
        get_mode: GetMode,
    ) -> Result<Self, TransportError> {
        let cerr = |msg: String| TransportError::Connect {
            addr,
            source: io::Error::other(msg),
        };
        let config = Config {
            timeout,
            connect_timeout: Duration::from_secs(5),
            get_mode,
            ..Config::default()
        };
        let mut client = Client::new(format!("ucx://{addr}").as_str(), config)
            .map_err(|e| cerr(e.to_string()))?;
        for (_, r) in client.version() {
            r.map_err(|e| cerr(e.to_string()))?;
        }
        Ok(UcxTransport {
            client,
            get_mode,
            queues: (0..conns.max(1)).map(|_| VecDeque::new()).collect(),
            in_flight: 0,
            next_seq: 0,
            timeout,
        })
    }

    fn deliver(
        &mut self,
        conn: usize,
        o: Outstanding,
        r: Result<memfabric_client::Reply, Error>,
        on_reply: &mut dyn FnMut(usize, Reply<'_>),
    ) -> Result<(), TransportError> {
        self.in_flight -= 1;
        let out = outcome_of(conn, r)?;
        on_reply(conn, out.as_reply(&o.key));
        Ok(())
    }

    /// Hand out every reply that is at the front of its queue and finished, without blocking.
    fn drain(
        &mut self,
        on_reply: &mut dyn FnMut(usize, Reply<'_>),
    ) -> Result<usize, TransportError> {
        let mut n = 0;
        for c in 0..self.queues.len() {
            while let Some(h) = self.queues[c].front().map(|o| o.handle) {
                let Some(r) = self.client.test(h) else { break };
                if let Some(o) = self.queues[c].pop_front() {
                    self.deliver(c, o, r, on_reply)?;
                    n += 1;
                }
            }
        }
        Ok(n)
    }
}

impl Transport for UcxTransport {
    fn name(&self) -> &'static str {
        if self.get_mode == GetMode::OneSided {
            "onesided"
        } else {
            "ucx"
        }
    }

    fn connections(&self) -> usize {
        self.queues.len()
    }

    fn submit(&mut self, conn: usize, req: &Request<'_>) -> Result<(), TransportError> {
        if conn >= self.queues.len() {
            return Err(TransportError::NoSuchConnection(conn));
        }
        let key = match req {
            Request::Get { key } => key.to_vec(),
            Request::Set { .. } => Vec::new(),
        };
        let handle = self.client.submit(op_of(req));
        self.queues[conn].push_back(Outstanding {
            handle,
            key,
            seq: self.next_seq,
        });
        self.next_seq += 1;
        self.in_flight += 1;
        Ok(())
    }

    /// Hands out what has finished; when nothing has, blocks on the oldest request (the
    /// client spins on the UCX worker before sleeping, so a fast reply is seen at once) up to
    /// the request deadline rather than `timeout`: giving up a wait abandons the request.
    /// A zero `timeout` never blocks (an open-loop run must be free to send on schedule).
    fn progress(
        &mut self,
        timeout: Duration,
        on_reply: &mut dyn FnMut(usize, Reply<'_>),
    ) -> Result<usize, TransportError> {
        let mut n = self.drain(on_reply)?;
        if n > 0 || self.in_flight == 0 || timeout.is_zero() {
            return Ok(n);
        }
        let oldest = self
            .queues
            .iter()
            .enumerate()
            .filter_map(|(c, q)| q.front().map(|o| (o.seq, c)))
            .min();
        if let Some((_, c)) = oldest {
            if let Some(o) = self.queues[c].pop_front() {
                let r = self.client.wait(o.handle, self.timeout);
                self.deliver(c, o, r, on_reply)?;
                n += 1;
            }
        }
        Ok(n + self.drain(on_reply)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memfabric_client::{Reply as R, Value};

    #[test]
    fn get_becomes_a_plain_get() {
        let op = op_of(&Request::Get { key: b"k1" });
        assert_eq!(
            op,
            Op::Get {
                key: b"k1".to_vec(),
                cas: false
            }
        );
    }

    #[test]
    fn set_becomes_an_unconditional_store_with_the_value() {
        let op = op_of(&Request::Set {
            key: b"k2",
            value: b"hello",
        });
        assert_eq!(
            op,
            Op::Store {
                mode: StoreMode::Set,
                key: b"k2".to_vec(),
                value: Bytes::from_static(b"hello"),
                flags: 0,
                exptime: 0,
                cas: 0
            }
        );
    }

    #[test]
    fn hit_and_miss_map_to_text_protocol_replies() {
        let hit = outcome_of(
            0,
            Ok(R::Value(Some(Value {
                data: Bytes::from_static(b"abc"),
                flags: 7,
                cas: 0,
            }))),
        )
        .unwrap();
        assert_eq!(
            hit.as_reply(b"key"),
            Reply::Hit {
                key: b"key",
                flags: 7,
                data: b"abc"
            }
        );
        let miss = outcome_of(0, Ok(R::Value(None))).unwrap();
        assert_eq!(miss.as_reply(b"key"), Reply::Miss);
    }

    #[test]
    fn store_statuses_map_one_to_one() {
        let cases = [
            (StoreStatus::Stored { cas: 9 }, Reply::Stored),
            (StoreStatus::NotStored, Reply::NotStored),
            (StoreStatus::Exists, Reply::Exists),
            (StoreStatus::NotFound, Reply::NotFound),
        ];
        for (status, want) in cases {
            let o = outcome_of(0, Ok(R::Stored(status))).unwrap();
            assert_eq!(o.as_reply(b""), want, "{status:?}");
        }
    }

    #[test]
    fn server_refusals_are_error_replies() {
        let o = outcome_of(0, Err(Error::Server("out of memory".into()))).unwrap();
        assert_eq!(o.as_reply(b""), Reply::Error(b"SERVER_ERROR out of memory"));
        let o = outcome_of(0, Err(Error::Client("bad".into()))).unwrap();
        assert_eq!(o.as_reply(b""), Reply::Error(b"CLIENT_ERROR bad"));
        let o = outcome_of(0, Err(Error::TooLarge)).unwrap();
        assert!(matches!(o.as_reply(b""), Reply::Error(l) if l.starts_with(b"SERVER_ERROR")));
    }

    #[test]
    fn request_failures_end_the_run() {
        for e in [
            Error::Timeout { server: "s".into() },
            Error::ServerDown { server: "s".into() },
            Error::Closed,
            Error::Protocol("garbled".into()),
        ] {
            let r = outcome_of(3, Err(e.clone()));
            assert!(
                matches!(r, Err(TransportError::Request { conn: 3, .. })),
                "{e:?}: {r:?}"
            );
        }
    }

    #[test]
    fn a_reply_of_another_kind_is_a_failure() {
        let r = outcome_of(1, Ok(R::Deleted(true)));
        assert!(matches!(r, Err(TransportError::Request { conn: 1, .. })));
    }
}
