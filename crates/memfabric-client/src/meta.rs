//! The TCP transport's side of memcached's meta protocol: the send queue requests are
//! encoded into, and the glue between the client's operations and replies and the codec
//! in `memfabric_proto::meta_client` (which owns the wire format; see its table).

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, Bytes, BytesMut};

pub use memfabric_proto::meta_client::Expect;
use memfabric_proto::meta_client::{self as codec, Decoded, ErrorReply};

use crate::error::Error;
use crate::op::{Op, Reply, StoreMode, StoreStatus, Value};

/// Values at least this long are queued by reference instead of copied into the send buffer.
const ZERO_COPY_MIN: usize = 16 * 1024;

/// Bytes waiting to be sent: small pieces are copied into `tail`, large values are kept as
/// shared [`Bytes`] (no copy).
#[derive(Debug, Default)]
pub struct OutQueue {
    segs: VecDeque<Bytes>,
    tail: BytesMut,
    len: usize,
}

impl OutQueue {
    pub fn put(&mut self, b: &[u8]) {
        self.tail.extend_from_slice(b);
        self.len += b.len();
    }

    pub fn put_bytes(&mut self, b: Bytes) {
        if b.len() < ZERO_COPY_MIN {
            self.put(&b);
            return;
        }
        self.seal();
        self.len += b.len();
        self.segs.push_back(b);
    }

    fn seal(&mut self) {
        if !self.tail.is_empty() {
            self.segs.push_back(self.tail.split().freeze());
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Up to `max` slices of what is queued, in order.
    pub fn slices(&mut self, max: usize) -> Vec<IoSlice<'_>> {
        self.seal();
        self.segs
            .iter()
            .take(max)
            .map(|s| IoSlice::new(s))
            .collect()
    }

    /// Drops the first `n` queued bytes (they were sent).
    pub fn advance(&mut self, mut n: usize) {
        self.len -= n;
        while n > 0 {
            let front = self.segs.front_mut().expect("advance past the queue");
            if front.len() <= n {
                n -= front.len();
                self.segs.pop_front();
            } else {
                front.advance(n);
                n = 0;
            }
        }
    }
}

/// Encodes `op` onto `out` and says which reply to expect. Nothing is queued on error.
pub fn encode(op: Op, out: &mut OutQueue) -> Result<Expect, Error> {
    let mut line = Vec::with_capacity(64);
    let request = match &op {
        Op::Get { key, cas } => codec::Request::Get { key, cas: *cas },
        Op::Gat { key, exptime } => codec::Request::Gat {
            key,
            exptime: *exptime,
        },
        Op::Store {
            mode,
            key,
            value,
            flags,
            exptime,
            cas,
        } => codec::Request::Store {
            mode: match mode {
                StoreMode::Set => codec::StoreMode::Set,
                // Only to servers that understand it: the pool sends a plain set to the
                // others (`Client::submit_on`).
                StoreMode::SetFragment => codec::StoreMode::SetFragment,
                StoreMode::Add => codec::StoreMode::Add,
                StoreMode::Replace => codec::StoreMode::Replace,
                StoreMode::Append => codec::StoreMode::Append,
                StoreMode::Prepend => codec::StoreMode::Prepend,
                StoreMode::Cas => codec::StoreMode::Cas,
            },
            key,
            value_len: value.len(),
            flags: *flags,
            exptime: *exptime,
            cas: *cas,
        },
        Op::Delete { key } => codec::Request::Delete { key },
        Op::Arith { key, delta, incr } => codec::Request::Arith {
            key,
            delta: *delta,
            incr: *incr,
        },
        Op::Touch { key, exptime } => codec::Request::Touch {
            key,
            exptime: *exptime,
        },
        Op::FlushAll { delay } => codec::Request::FlushAll { delay: *delay },
        Op::Stats { group } => codec::Request::Stats {
            group: group.as_deref(),
        },
        Op::Version => codec::Request::Version,
        Op::Noop => codec::Request::Noop,
        Op::Ttl { key } => codec::Request::Ttl { key },
    };
    let expect = codec::encode(&request, &mut line).map_err(|e| match e {
        codec::EncodeError::InvalidKey => Error::InvalidKey,
        codec::EncodeError::BadStatsGroup => Error::Client("bad stats group".into()),
    })?;
    out.put(&line);
    if let Op::Store { value, .. } = op {
        // Queued by reference when large: the caller's buffer is not copied.
        out.put_bytes(value);
        out.put(codec::VALUE_TRAILER);
    }
    Ok(expect)
}

/// The result of trying to parse one reply.
#[derive(Debug)]
pub enum Parsed {
    /// Not all of the reply is buffered; at least `need` bytes are wanted in total.
    Incomplete { need: usize },
    /// One reply was consumed from the buffer.
    Done(Result<Reply, Error>),
}

/// Parses one reply of kind `expect` from the front of `buf`, consuming it when complete.
/// An `Err` means the stream cannot be trusted any more (the connection must be dropped).
pub fn parse(buf: &mut BytesMut, expect: Expect) -> Result<Parsed, String> {
    let (reply, len) = match codec::decode(buf, expect).map_err(|e| e.to_string())? {
        Decoded::Incomplete { need } => return Ok(Parsed::Incomplete { need }),
        Decoded::Done { reply, len } => (reply, len),
    };
    let result = match reply {
        Err(e) => Err(match e {
            ErrorReply::UnknownCommand => {
                Error::Protocol("server answered ERROR (unknown command)".into())
            }
            ErrorReply::Client(msg) => Error::Client(msg),
            ErrorReply::TooLarge => Error::TooLarge,
            ErrorReply::Server(msg) => Error::Server(msg),
        }),
        Ok(codec::Reply::Value(Some(v))) => {
            // The value's bytes are split off the read buffer, not copied.
            buf.advance(v.data.start);
            let data = buf.split_to(v.data.len()).freeze();
            buf.advance(len - v.data.end);
            return Ok(Parsed::Done(Ok(Reply::Value(Some(Value {
                data,
                flags: v.flags,
                cas: v.cas,
            })))));
        }
        Ok(codec::Reply::Value(None)) => Ok(Reply::Value(None)),
        Ok(codec::Reply::Stored(s)) => Ok(Reply::Stored(match s {
            codec::StoreStatus::Stored { cas } => StoreStatus::Stored { cas },
            codec::StoreStatus::NotStored => StoreStatus::NotStored,
            codec::StoreStatus::Exists => StoreStatus::Exists,
            codec::StoreStatus::NotFound => StoreStatus::NotFound,
            codec::StoreStatus::Superseded { stripe } => StoreStatus::Superseded { stripe },
        })),
        Ok(codec::Reply::Deleted(found)) => Ok(Reply::Deleted(found)),
        Ok(codec::Reply::Counter(n)) => Ok(Reply::Counter(n)),
        Ok(codec::Reply::Touched(found)) => Ok(Reply::Touched(found)),
        Ok(codec::Reply::Ttl(t)) => Ok(Reply::Ttl(t)),
        Ok(codec::Reply::Ok) => Ok(Reply::Ok),
        Ok(codec::Reply::Stats(stats)) => Ok(Reply::Stats(stats)),
        Ok(codec::Reply::Version(v)) => Ok(Reply::Version(v)),
    };
    buf.advance(len);
    Ok(Parsed::Done(result))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(op: Op) -> Vec<u8> {
        let mut q = OutQueue::default();
        encode(op, &mut q).unwrap();
        q.slices(usize::MAX)
            .iter()
            .flat_map(|s| s.to_vec())
            .collect()
    }

    fn parse_all(input: &[u8], expect: Expect) -> Result<Reply, Error> {
        let mut buf = BytesMut::from(input);
        match parse(&mut buf, expect).unwrap() {
            Parsed::Done(r) => {
                assert!(buf.is_empty(), "left {buf:?}");
                r
            }
            p => panic!("{p:?}"),
        }
    }

    #[test]
    fn encodes_meta_requests() {
        assert_eq!(
            encoded(Op::Get {
                key: b"k".to_vec(),
                cas: true
            }),
            b"mg k v f c\r\n"
        );
        assert_eq!(
            encoded(Op::Gat {
                key: b"k".to_vec(),
                exptime: 9
            }),
            b"mg k v f c T9\r\n"
        );
        let store = Op::Store {
            mode: StoreMode::Cas,
            key: b"k".to_vec(),
            value: Bytes::from_static(b"abc"),
            flags: 5,
            exptime: 7,
            cas: 42,
        };
        assert_eq!(encoded(store), b"ms k 3 T7 F5 c MS C42\r\nabc\r\n");
        assert_eq!(
            encoded(Op::Arith {
                key: b"n".to_vec(),
                delta: 3,
                incr: false
            }),
            b"ma n v D3 MD\r\n"
        );
        assert_eq!(encoded(Op::FlushAll { delay: 0 }), b"flush_all\r\n");
        assert_eq!(
            encoded(Op::Stats {
                group: Some("slabs".into())
            }),
            b"stats slabs\r\n"
        );
    }

    #[test]
    fn large_values_are_queued_without_copy() {
        let v = Bytes::from(vec![7u8; ZERO_COPY_MIN]);
        let mut q = OutQueue::default();
        encode(
            Op::Store {
                mode: StoreMode::Set,
                key: b"k".to_vec(),
                value: v.clone(),
                flags: 0,
                exptime: 0,
                cas: 0,
            },
            &mut q,
        )
        .unwrap();
        let slices = q.slices(16);
        assert_eq!(slices.len(), 3);
        assert_eq!(slices[1].as_ptr(), v.as_ptr());
        let total = q.len();
        q.advance(total - 1);
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn bad_keys_are_rejected_before_sending() {
        let mut q = OutQueue::default();
        for key in [&b""[..], b"a b", b"a\r\nb", &[b'x'; 251]] {
            assert_eq!(
                encode(Op::Delete { key: key.to_vec() }, &mut q),
                Err(Error::InvalidKey)
            );
        }
        assert!(q.is_empty());
    }

    #[test]
    fn parses_values_split_anywhere() {
        let input = b"VA 5 f3 c9\r\nhello\r\n";
        for cut in 0..input.len() {
            let mut buf = BytesMut::from(&input[..cut]);
            assert!(matches!(
                parse(&mut buf, Expect::Get).unwrap(),
                Parsed::Incomplete { .. }
            ));
            buf.extend_from_slice(&input[cut..]);
            match parse(&mut buf, Expect::Get).unwrap() {
                Parsed::Done(Ok(Reply::Value(Some(v)))) => {
                    assert_eq!((&v.data[..], v.flags, v.cas), (&b"hello"[..], 3, 9));
                }
                p => panic!("{p:?}"),
            }
        }
    }

    #[test]
    fn decoded_replies_become_the_clients_replies_and_errors() {
        // The decoding itself is proto's (meta_client's tests); this is the mapping.
        assert_eq!(parse_all(b"EN\r\n", Expect::Get), Ok(Reply::Value(None)));
        let err = parse_all(b"SERVER_ERROR out of memory\r\n", Expect::Store);
        assert!(err.is_err(), "{err:?}");
    }

    #[test]
    fn unexpected_replies_are_fatal() {
        let mut buf = BytesMut::from(&b"STORED\r\n"[..]);
        assert!(parse(&mut buf, Expect::Get).is_err());
    }
}
