//! memcached's meta protocol (plus classic `touch`, `flush_all`, `stats`, `version`) as the TCP
//! transport speaks it: requests are encoded into an [`OutQueue`], replies are parsed
//! incrementally from a read buffer, one reply per request, in order.
//!
//! | op | request | replies |
//! |---|---|---|
//! | get / gets | `mg <key> v f [c]` | `VA <n> f<flags> [c<cas>]` + data, `EN` |
//! | gat | `mg <key> v f c T<exptime>` | as get |
//! | store | `ms <key> <n> T<exptime> F<flags> c M<S/E/R/A/P> [C<cas>]` + data | `HD c<cas>`, `NS`, `EX`, `NF` |
//! | delete | `md <key>` | `HD`, `NF` |
//! | incr/decr | `ma <key> v D<delta> M<I/D>` | `VA <n>` + number, `NF` |
//! | touch | `touch <key> <exptime>` | `TOUCHED`, `NOT_FOUND` |
//! | flush_all | `flush_all [<delay>]` | `OK` |
//! | stats | `stats [<group>]` | `STAT <k> <v>`... `END` |
//! | version | `version` | `VERSION <v>` |
//! | noop | `mn` | `MN` |
//!
//! Any request may instead be answered `ERROR`, `CLIENT_ERROR <msg>` or `SERVER_ERROR <msg>`:
//! these complete that request with an error and keep the stream in step.

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, Bytes, BytesMut};

use crate::error::Error;
use crate::op::{valid_key, Op, Reply, StoreMode, StoreStatus, Value};

/// Values at least this long are queued by reference instead of copied into the send buffer.
const ZERO_COPY_MIN: usize = 16 * 1024;
/// A reply line longer than this (without a newline) means the stream is not memcached's.
pub const MAX_LINE: usize = 64 * 1024;

/// What reply a request waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    Get,
    Store,
    Delete,
    Arith,
    Touch,
    FlushAll,
    Stats,
    Version,
    Noop,
}

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

fn check_key(key: &[u8]) -> Result<(), Error> {
    if valid_key(key) {
        Ok(())
    } else {
        Err(Error::InvalidKey)
    }
}

/// Encodes `op` onto `out` and says which reply to expect. Nothing is queued on error.
pub fn encode(op: Op, out: &mut OutQueue) -> Result<Expect, Error> {
    if let Some(key) = op.key() {
        check_key(key)?;
    }
    let mut line = Vec::with_capacity(64);
    let expect = match op {
        Op::Get { key, cas } => {
            line.extend_from_slice(b"mg ");
            line.extend_from_slice(&key);
            line.extend_from_slice(if cas { b" v f c\r\n" } else { b" v f\r\n" });
            Expect::Get
        }
        Op::Gat { key, exptime } => {
            line.extend_from_slice(b"mg ");
            line.extend_from_slice(&key);
            line.extend_from_slice(format!(" v f c T{exptime}\r\n").as_bytes());
            Expect::Get
        }
        Op::Store {
            mode,
            key,
            value,
            flags,
            exptime,
            cas,
        } => {
            let m = match mode {
                StoreMode::Set | StoreMode::Cas => 'S',
                StoreMode::Add => 'E',
                StoreMode::Replace => 'R',
                StoreMode::Append => 'A',
                StoreMode::Prepend => 'P',
            };
            line.extend_from_slice(b"ms ");
            line.extend_from_slice(&key);
            line.extend_from_slice(
                format!(" {} T{exptime} F{flags} c M{m}", value.len()).as_bytes(),
            );
            if mode == StoreMode::Cas {
                line.extend_from_slice(format!(" C{cas}").as_bytes());
            }
            line.extend_from_slice(b"\r\n");
            out.put(&line);
            out.put_bytes(value);
            out.put(b"\r\n");
            return Ok(Expect::Store);
        }
        Op::Delete { key } => {
            line.extend_from_slice(b"md ");
            line.extend_from_slice(&key);
            line.extend_from_slice(b"\r\n");
            Expect::Delete
        }
        Op::Arith { key, delta, incr } => {
            line.extend_from_slice(b"ma ");
            line.extend_from_slice(&key);
            let m = if incr { 'I' } else { 'D' };
            line.extend_from_slice(format!(" v D{delta} M{m}\r\n").as_bytes());
            Expect::Arith
        }
        Op::Touch { key, exptime } => {
            line.extend_from_slice(b"touch ");
            line.extend_from_slice(&key);
            line.extend_from_slice(format!(" {exptime}\r\n").as_bytes());
            Expect::Touch
        }
        Op::FlushAll { delay } => {
            if delay == 0 {
                line.extend_from_slice(b"flush_all\r\n");
            } else {
                line.extend_from_slice(format!("flush_all {delay}\r\n").as_bytes());
            }
            Expect::FlushAll
        }
        Op::Stats { group } => {
            match group {
                Some(g) if !g.is_empty() => {
                    if !valid_key(g.as_bytes()) {
                        return Err(Error::Client("bad stats group".into()));
                    }
                    line.extend_from_slice(format!("stats {g}\r\n").as_bytes());
                }
                _ => line.extend_from_slice(b"stats\r\n"),
            }
            Expect::Stats
        }
        Op::Version => {
            line.extend_from_slice(b"version\r\n");
            Expect::Version
        }
        Op::Noop => {
            line.extend_from_slice(b"mn\r\n");
            Expect::Noop
        }
    };
    out.put(&line);
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

/// The first line of `buf` without its line end, and the length with it.
fn line(buf: &[u8]) -> Result<Option<(&[u8], usize)>, String> {
    match buf.iter().position(|&b| b == b'\n') {
        Some(nl) => {
            let l = &buf[..nl];
            Ok(Some((l.strip_suffix(b"\r").unwrap_or(l), nl + 1)))
        }
        None if buf.len() > MAX_LINE => Err("reply line too long".into()),
        None => Ok(None),
    }
}

fn num<T: std::str::FromStr>(tok: &[u8]) -> Result<T, String> {
    std::str::from_utf8(tok)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad number {:?}", String::from_utf8_lossy(tok)))
}

/// `ERROR`, `CLIENT_ERROR ...`, `SERVER_ERROR ...` as an error, else `None`.
fn error_line(l: &[u8]) -> Option<Error> {
    let text = |rest: &[u8]| String::from_utf8_lossy(rest).trim().to_string();
    if l == b"ERROR" || l.starts_with(b"ERROR ") {
        Some(Error::Protocol(
            "server answered ERROR (unknown command)".into(),
        ))
    } else if let Some(rest) = l.strip_prefix(b"CLIENT_ERROR") {
        Some(Error::Client(text(rest)))
    } else if let Some(rest) = l.strip_prefix(b"SERVER_ERROR") {
        let msg = text(rest);
        if msg.contains("too large") {
            Some(Error::TooLarge)
        } else {
            Some(Error::Server(msg))
        }
    } else {
        None
    }
}

/// Parses one reply of kind `expect` from the front of `buf`, consuming it when complete.
/// An `Err` means the stream cannot be trusted any more (the connection must be dropped).
pub fn parse(buf: &mut BytesMut, expect: Expect) -> Result<Parsed, String> {
    if expect == Expect::Stats {
        return parse_stats(buf);
    }
    let Some((l, len)) = line(buf)? else {
        return Ok(Parsed::Incomplete {
            need: buf.len() + 1,
        });
    };
    if let Some(e) = error_line(l) {
        buf.advance(len);
        return Ok(Parsed::Done(Err(e)));
    }
    let mut toks = l.split(|&b| b == b' ').filter(|t| !t.is_empty());
    let head = toks.next().unwrap_or(b"");
    let unexpected = || {
        format!(
            "unexpected reply {:?} to a {expect:?} request",
            String::from_utf8_lossy(l)
        )
    };
    let reply = match (expect, head) {
        (Expect::Get | Expect::Arith, b"VA") => {
            let n: usize = num(toks.next().ok_or_else(unexpected)?)?;
            let (mut flags, mut cas) = (0u32, 0u64);
            for t in toks {
                match t[0] {
                    b'f' => flags = num(&t[1..])?,
                    b'c' => cas = num(&t[1..])?,
                    _ => {}
                }
            }
            let total = len + n + 2;
            if buf.len() < total {
                return Ok(Parsed::Incomplete { need: total });
            }
            if &buf[len + n..total] != b"\r\n" {
                return Err("value not followed by \\r\\n".into());
            }
            buf.advance(len);
            let data = buf.split_to(n).freeze();
            buf.advance(2);
            return Ok(Parsed::Done(Ok(if expect == Expect::Get {
                Reply::Value(Some(Value { data, flags, cas }))
            } else {
                Reply::Counter(Some(num(&data)?))
            })));
        }
        (Expect::Get, b"EN") => Reply::Value(None),
        (Expect::Store, b"HD") => {
            let cas = toks
                .find(|t| t[0] == b'c')
                .map(|t| num(&t[1..]))
                .transpose()?;
            Reply::Stored(StoreStatus::Stored {
                cas: cas.unwrap_or(0),
            })
        }
        (Expect::Store, b"NS") => Reply::Stored(StoreStatus::NotStored),
        (Expect::Store, b"EX") => Reply::Stored(StoreStatus::Exists),
        (Expect::Store, b"NF") => Reply::Stored(StoreStatus::NotFound),
        (Expect::Delete, b"HD") => Reply::Deleted(true),
        (Expect::Delete, b"NF") => Reply::Deleted(false),
        (Expect::Arith, b"NF") => Reply::Counter(None),
        (Expect::Touch, b"TOUCHED") => Reply::Touched(true),
        (Expect::Touch, b"NOT_FOUND") => Reply::Touched(false),
        (Expect::FlushAll, b"OK") | (Expect::Noop, b"MN") => Reply::Ok,
        (Expect::Version, b"VERSION") => {
            let v = l.strip_prefix(b"VERSION").unwrap_or(b"");
            Reply::Version(String::from_utf8_lossy(v).trim().to_string())
        }
        _ => return Err(unexpected()),
    };
    buf.advance(len);
    Ok(Parsed::Done(Ok(reply)))
}

fn parse_stats(buf: &mut BytesMut) -> Result<Parsed, String> {
    let mut at = 0;
    let mut stats = Vec::new();
    loop {
        let Some((l, len)) = line(&buf[at..])? else {
            return Ok(Parsed::Incomplete {
                need: buf.len() + 1,
            });
        };
        if at == 0 {
            if let Some(e) = error_line(l) {
                buf.advance(len);
                return Ok(Parsed::Done(Err(e)));
            }
        }
        if l == b"END" {
            buf.advance(at + len);
            return Ok(Parsed::Done(Ok(Reply::Stats(stats))));
        }
        let rest = l
            .strip_prefix(b"STAT ")
            .ok_or_else(|| format!("unexpected stats line {:?}", String::from_utf8_lossy(l)))?;
        let rest = String::from_utf8_lossy(rest);
        let (k, v) = rest.split_once(' ').unwrap_or((&rest, ""));
        stats.push((k.to_string(), v.to_string()));
        at += len;
    }
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
    fn parses_replies() {
        assert_eq!(parse_all(b"EN\r\n", Expect::Get), Ok(Reply::Value(None)));
        assert_eq!(
            parse_all(b"HD c12\r\n", Expect::Store),
            Ok(Reply::Stored(StoreStatus::Stored { cas: 12 }))
        );
        assert_eq!(
            parse_all(b"EX c0\r\n", Expect::Store),
            Ok(Reply::Stored(StoreStatus::Exists))
        );
        assert_eq!(
            parse_all(b"VA 2\r\n15\r\n", Expect::Arith),
            Ok(Reply::Counter(Some(15)))
        );
        assert_eq!(
            parse_all(b"NF\r\n", Expect::Arith),
            Ok(Reply::Counter(None))
        );
        assert_eq!(
            parse_all(b"NOT_FOUND\r\n", Expect::Touch),
            Ok(Reply::Touched(false))
        );
        assert_eq!(
            parse_all(b"VERSION 1.6.18\r\n", Expect::Version),
            Ok(Reply::Version("1.6.18".into()))
        );
        assert_eq!(
            parse_all(
                b"STAT pid 1\r\nSTAT version 1.6 x\r\nEND\r\n",
                Expect::Stats
            ),
            Ok(Reply::Stats(vec![
                ("pid".into(), "1".into()),
                ("version".into(), "1.6 x".into())
            ]))
        );
    }

    #[test]
    fn error_replies_are_typed_and_consumed() {
        assert_eq!(
            parse_all(
                b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
                Expect::Arith
            ),
            Err(Error::Client(
                "cannot increment or decrement non-numeric value".into()
            ))
        );
        assert_eq!(
            parse_all(
                b"SERVER_ERROR object too large for cache\r\n",
                Expect::Store
            ),
            Err(Error::TooLarge)
        );
        assert_eq!(
            parse_all(b"SERVER_ERROR out of memory\r\n", Expect::Store),
            Err(Error::Server("out of memory".into()))
        );
        assert!(matches!(
            parse_all(b"ERROR\r\n", Expect::Stats),
            Err(Error::Protocol(_))
        ));
    }

    #[test]
    fn unexpected_replies_are_fatal() {
        let mut buf = BytesMut::from(&b"STORED\r\n"[..]);
        assert!(parse(&mut buf, Expect::Get).is_err());
    }
}
