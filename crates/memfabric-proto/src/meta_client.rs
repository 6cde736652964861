//! The client's side of the meta protocol: the requests memfabric's TCP client sends
//! (meta commands plus classic `touch`, `flush_all`, `stats`, `version`) and the decoding
//! of their replies, one reply per request, in order. No I/O and no buffers of its own:
//! the client's transport owns the sockets, queues the bytes and hands replies a buffer.
//!
//! | request | encoded as | replies |
//! |---|---|---|
//! | get / gets | `mg <key> v f [c]` | `VA <n> f<flags> [c<cas>]` + data, `EN` |
//! | gat | `mg <key> v f c T<exptime>` | as get |
//! | store | `ms <key> <n> T<exptime> F<flags> c M<S/E/R/A/P> [C<cas>] [K]` + data | `HD c<cas>`, `NS [K<stripe>]`, `EX`, `NF` |
//! | delete | `md <key>` | `HD`, `NF` |
//! | incr/decr | `ma <key> v D<delta> M<I/D>` | `VA <n>` + number, `NF` |
//! | touch | `touch <key> <exptime>` | `TOUCHED`, `NOT_FOUND` |
//! | flush_all | `flush_all [<delay>]` | `OK` |
//! | stats | `stats [<group>]` | `STAT <k> <v>`... `END` |
//! | version | `version` | `VERSION <v>` |
//! | noop | `mn` | `MN` |
//!
//! `K` (a coded fragment's set that keeps a newer write's fragment) is memfabricd's own
//! flag: send it only to a server whose `stats fabric` says `ms_keep_newer_write 1`
//! (memcached refuses it).
//!
//! Any request may instead be answered `ERROR`, `CLIENT_ERROR <msg>` or `SERVER_ERROR
//! <msg>`: that completes the request with an [`ErrorReply`] and keeps the stream in
//! step. Anything else unexpected is a [`DecodeError`]: the stream cannot be trusted.

use std::ops::Range;

use crate::is_text_key;

/// A reply line longer than this (without a newline) means the stream is not memcached's.
pub const MAX_REPLY_LINE: usize = 64 * 1024;

/// The longest value a reply can carry: memcached refuses an item size limit (`-I`)
/// above 1 GiB, so a longer `VA` means the stream is broken (and asking the caller to
/// buffer it would be absurd).
pub const MAX_VALUE_LEN: usize = 1 << 30;

/// What follows a stored value on the wire (and a value in a `VA` reply).
pub const VALUE_TRAILER: &[u8] = b"\r\n";

/// How a store request treats an existing (or missing) item.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreMode {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    /// Set only if the item's CAS value still equals the request's.
    Cas,
    /// Set an erasure-coded fragment unless the key holds a fragment of a newer write
    /// (memfabricd's `K`).
    SetFragment,
}

/// One request, borrowing its key; a store's value is sent by the caller after the line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Request<'a> {
    Get {
        key: &'a [u8],
        cas: bool,
    },
    Gat {
        key: &'a [u8],
        exptime: u32,
    },
    Store {
        mode: StoreMode,
        key: &'a [u8],
        value_len: usize,
        flags: u32,
        exptime: u32,
        /// Sent only with [`StoreMode::Cas`].
        cas: u64,
    },
    Delete {
        key: &'a [u8],
    },
    Arith {
        key: &'a [u8],
        delta: u64,
        incr: bool,
    },
    Touch {
        key: &'a [u8],
        exptime: u32,
    },
    /// How long the item still lives (`mg <key> t`), its value left where it is.
    Ttl {
        key: &'a [u8],
    },
    FlushAll {
        delay: u32,
    },
    Stats {
        group: Option<&'a str>,
    },
    Version,
    Noop,
}

/// How long an item that exists still lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ttl {
    /// It has no expiry time (`t-1`).
    Never,
    /// It expires in this many seconds (memcached answers 0 in its last second).
    Seconds(u32),
}

/// What reply a request waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    Get,
    Store,
    Delete,
    Arith,
    Touch,
    Ttl,
    FlushAll,
    Stats,
    Version,
    Noop,
}

/// Why a request cannot be encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum EncodeError {
    /// Empty, longer than `KEY_MAX_LEN`, or holding whitespace or control characters.
    #[error("invalid key")]
    InvalidKey,
    /// A stats group that would not be one token.
    #[error("bad stats group")]
    BadStatsGroup,
}

/// Appends the request line of `req` to `out` and says which reply to expect; for a
/// store the caller sends `value_len` bytes of value and [`VALUE_TRAILER`] after it.
/// Nothing is appended on error.
pub fn encode(req: &Request<'_>, out: &mut Vec<u8>) -> Result<Expect, EncodeError> {
    use std::io::Write as _;
    if let Some(key) = req.key() {
        if !is_text_key(key) {
            return Err(EncodeError::InvalidKey);
        }
    }
    if let Request::Stats { group: Some(g) } = req {
        if !g.is_empty() && !is_text_key(g.as_bytes()) {
            return Err(EncodeError::BadStatsGroup);
        }
    }
    let verb_and_key = |out: &mut Vec<u8>, verb: &[u8], key: &[u8]| {
        out.extend_from_slice(verb);
        out.push(b' ');
        out.extend_from_slice(key);
    };
    // Writing to a Vec cannot fail.
    let expect = match *req {
        Request::Get { key, cas } => {
            verb_and_key(out, b"mg", key);
            out.extend_from_slice(if cas { b" v f c\r\n" } else { b" v f\r\n" });
            Expect::Get
        }
        Request::Gat { key, exptime } => {
            verb_and_key(out, b"mg", key);
            let _ = write!(out, " v f c T{exptime}\r\n");
            Expect::Get
        }
        Request::Store {
            mode,
            key,
            value_len,
            flags,
            exptime,
            cas,
        } => {
            let m = match mode {
                StoreMode::Set | StoreMode::Cas | StoreMode::SetFragment => 'S',
                StoreMode::Add => 'E',
                StoreMode::Replace => 'R',
                StoreMode::Append => 'A',
                StoreMode::Prepend => 'P',
            };
            verb_and_key(out, b"ms", key);
            let _ = write!(out, " {value_len} T{exptime} F{flags} c M{m}");
            if mode == StoreMode::Cas {
                let _ = write!(out, " C{cas}");
            }
            if mode == StoreMode::SetFragment {
                out.extend_from_slice(b" K");
            }
            out.extend_from_slice(b"\r\n");
            Expect::Store
        }
        Request::Delete { key } => {
            verb_and_key(out, b"md", key);
            out.extend_from_slice(b"\r\n");
            Expect::Delete
        }
        Request::Arith { key, delta, incr } => {
            verb_and_key(out, b"ma", key);
            let m = if incr { 'I' } else { 'D' };
            let _ = write!(out, " v D{delta} M{m}\r\n");
            Expect::Arith
        }
        Request::Touch { key, exptime } => {
            verb_and_key(out, b"touch", key);
            let _ = write!(out, " {exptime}\r\n");
            Expect::Touch
        }
        Request::Ttl { key } => {
            verb_and_key(out, b"mg", key);
            out.extend_from_slice(b" t\r\n");
            Expect::Ttl
        }
        Request::FlushAll { delay: 0 } => {
            out.extend_from_slice(b"flush_all\r\n");
            Expect::FlushAll
        }
        Request::FlushAll { delay } => {
            let _ = write!(out, "flush_all {delay}\r\n");
            Expect::FlushAll
        }
        Request::Stats { group } => {
            match group {
                Some(g) if !g.is_empty() => {
                    let _ = write!(out, "stats {g}\r\n");
                }
                _ => out.extend_from_slice(b"stats\r\n"),
            }
            Expect::Stats
        }
        Request::Version => {
            out.extend_from_slice(b"version\r\n");
            Expect::Version
        }
        Request::Noop => {
            out.extend_from_slice(b"mn\r\n");
            Expect::Noop
        }
    };
    Ok(expect)
}

impl Request<'_> {
    /// The key, for requests that have one.
    pub fn key(&self) -> Option<&[u8]> {
        match *self {
            Request::Get { key, .. }
            | Request::Gat { key, .. }
            | Request::Store { key, .. }
            | Request::Delete { key }
            | Request::Arith { key, .. }
            | Request::Touch { key, .. }
            | Request::Ttl { key } => Some(key),
            Request::FlushAll { .. } | Request::Stats { .. } | Request::Version | Request::Noop => {
                None
            }
        }
    }
}

/// A fetched value, located in the buffer `decode` was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValueAt {
    /// Where the value's bytes are in the buffer.
    pub data: Range<usize>,
    pub flags: u32,
    /// 0 when the server was not asked for it.
    pub cas: u64,
}

/// The outcome of a store request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreStatus {
    /// `cas` is the new item's CAS value (0 if the server did not say).
    Stored {
        cas: u64,
    },
    NotStored,
    Exists,
    NotFound,
    /// A [`StoreMode::SetFragment`] not stored: the key holds a fragment of a newer
    /// write, whose stripe this is (`NS K<stripe>`).
    Superseded {
        stripe: u64,
    },
}

/// A reply that is not an error line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Get/gat: `None` is a miss.
    Value(Option<ValueAt>),
    Stored(StoreStatus),
    /// `false` = not found.
    Deleted(bool),
    /// incr/decr: the new value, `None` = not found.
    Counter(Option<u64>),
    /// `false` = not found.
    Touched(bool),
    /// `mg <key> t`: `None` = not found.
    Ttl(Option<Ttl>),
    /// flush_all, noop.
    Ok,
    Stats(Vec<(String, String)>),
    Version(String),
}

/// `ERROR`, `CLIENT_ERROR <msg>` or `SERVER_ERROR <msg>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ErrorReply {
    /// `ERROR`: the server does not know the command.
    UnknownCommand,
    Client(String),
    /// `SERVER_ERROR object too large for cache` and its kin.
    TooLarge,
    Server(String),
}

/// What `decode` found at the front of the buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// Not all of the reply is buffered; at least `need` bytes are wanted in total.
    Incomplete { need: usize },
    /// One reply, taking the first `len` bytes of the buffer.
    Done {
        reply: Result<Reply, ErrorReply>,
        len: usize,
    },
}

/// A reply that does not fit the protocol: the connection must be dropped.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    #[error("reply line too long")]
    LineTooLong,
    #[error("bad number {0:?}")]
    BadNumber(String),
    #[error("value of {0} bytes is longer than any server stores")]
    ValueTooLong(usize),
    #[error("value not followed by \\r\\n")]
    BadValueTrailer,
    #[error("unexpected reply {reply:?} to a {expect:?} request")]
    Unexpected { reply: String, expect: Expect },
    #[error("unexpected stats line {0:?}")]
    BadStatsLine(String),
}

/// The first line of `buf` without its line end, and the length with it.
fn line(buf: &[u8]) -> Result<Option<(&[u8], usize)>, DecodeError> {
    match buf.iter().position(|&b| b == b'\n') {
        Some(nl) => {
            let l = &buf[..nl];
            Ok(Some((l.strip_suffix(b"\r").unwrap_or(l), nl + 1)))
        }
        None if buf.len() > MAX_REPLY_LINE => Err(DecodeError::LineTooLong),
        None => Ok(None),
    }
}

/// A number in a reply: servers write plain digits, so nothing lenient is needed here.
fn num<T: std::str::FromStr>(tok: &[u8]) -> Result<T, DecodeError> {
    std::str::from_utf8(tok)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| DecodeError::BadNumber(String::from_utf8_lossy(tok).into_owned()))
}

fn error_line(l: &[u8]) -> Option<ErrorReply> {
    let text = |rest: &[u8]| String::from_utf8_lossy(rest).trim().to_string();
    if l == b"ERROR" || l.starts_with(b"ERROR ") {
        Some(ErrorReply::UnknownCommand)
    } else if let Some(rest) = l.strip_prefix(b"CLIENT_ERROR") {
        Some(ErrorReply::Client(text(rest)))
    } else if let Some(rest) = l.strip_prefix(b"SERVER_ERROR") {
        let msg = text(rest);
        Some(if msg.contains("too large") {
            ErrorReply::TooLarge
        } else {
            ErrorReply::Server(msg)
        })
    } else {
        None
    }
}

/// Decodes one reply of kind `expect` from the front of `buf`.
pub fn decode(buf: &[u8], expect: Expect) -> Result<Decoded, DecodeError> {
    if expect == Expect::Stats {
        return decode_stats(buf);
    }
    let Some((l, len)) = line(buf)? else {
        return Ok(Decoded::Incomplete {
            need: buf.len() + 1,
        });
    };
    if let Some(e) = error_line(l) {
        return Ok(Decoded::Done { reply: Err(e), len });
    }
    let mut toks = l.split(|&b| b == b' ').filter(|t| !t.is_empty());
    let head = toks.next().unwrap_or(b"");
    let unexpected = || DecodeError::Unexpected {
        reply: String::from_utf8_lossy(l).into_owned(),
        expect,
    };
    let reply = match (expect, head) {
        (Expect::Get | Expect::Arith, b"VA") => {
            let n: usize = num(toks.next().ok_or_else(unexpected)?)?;
            if n > MAX_VALUE_LEN {
                return Err(DecodeError::ValueTooLong(n));
            }
            let (mut flags, mut cas) = (0u32, 0u64);
            // Tokens are never empty (split on spaces, empty ones dropped).
            for t in toks {
                match t[0] {
                    b'f' => flags = num(&t[1..])?,
                    b'c' => cas = num(&t[1..])?,
                    _ => {}
                }
            }
            let data = len..len + n;
            let total = data.end + VALUE_TRAILER.len();
            if buf.len() < total {
                return Ok(Decoded::Incomplete { need: total });
            }
            if &buf[data.end..total] != VALUE_TRAILER {
                return Err(DecodeError::BadValueTrailer);
            }
            let reply = if expect == Expect::Get {
                Reply::Value(Some(ValueAt { data, flags, cas }))
            } else {
                Reply::Counter(Some(num(&buf[data])?))
            };
            return Ok(Decoded::Done {
                reply: Ok(reply),
                len: total,
            });
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
        (Expect::Store, b"NS") => {
            let kept = toks
                .find(|t| t[0] == b'K')
                .map(|t| num(&t[1..]))
                .transpose()?;
            Reply::Stored(match kept {
                Some(stripe) => StoreStatus::Superseded { stripe },
                None => StoreStatus::NotStored,
            })
        }
        (Expect::Store, b"EX") => Reply::Stored(StoreStatus::Exists),
        (Expect::Store, b"NF") => Reply::Stored(StoreStatus::NotFound),
        (Expect::Delete, b"HD") => Reply::Deleted(true),
        (Expect::Delete, b"NF") => Reply::Deleted(false),
        (Expect::Arith, b"NF") => Reply::Counter(None),
        (Expect::Ttl, b"HD") => {
            let t = toks.find(|t| t[0] == b't').ok_or_else(unexpected)?;
            Reply::Ttl(Some(match &t[1..] {
                b"-1" => Ttl::Never,
                n => Ttl::Seconds(num(n)?),
            }))
        }
        (Expect::Ttl, b"EN") => Reply::Ttl(None),
        (Expect::Touch, b"TOUCHED") => Reply::Touched(true),
        (Expect::Touch, b"NOT_FOUND") => Reply::Touched(false),
        (Expect::FlushAll, b"OK") | (Expect::Noop, b"MN") => Reply::Ok,
        (Expect::Version, b"VERSION") => {
            let v = l.strip_prefix(b"VERSION").unwrap_or(b"");
            Reply::Version(String::from_utf8_lossy(v).trim().to_string())
        }
        _ => return Err(unexpected()),
    };
    Ok(Decoded::Done {
        reply: Ok(reply),
        len,
    })
}

fn decode_stats(buf: &[u8]) -> Result<Decoded, DecodeError> {
    let mut at = 0;
    let mut stats = Vec::new();
    loop {
        let Some((l, len)) = line(&buf[at..])? else {
            return Ok(Decoded::Incomplete {
                need: buf.len() + 1,
            });
        };
        if at == 0 {
            if let Some(e) = error_line(l) {
                return Ok(Decoded::Done { reply: Err(e), len });
            }
        }
        if l == b"END" {
            return Ok(Decoded::Done {
                reply: Ok(Reply::Stats(stats)),
                len: at + len,
            });
        }
        let rest = l
            .strip_prefix(b"STAT ")
            .ok_or_else(|| DecodeError::BadStatsLine(String::from_utf8_lossy(l).into_owned()))?;
        let rest = String::from_utf8_lossy(rest);
        let (k, v) = rest.split_once(' ').unwrap_or((&rest, ""));
        stats.push((k.to_string(), v.to_string()));
        at += len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(req: Request<'_>) -> Vec<u8> {
        let mut out = Vec::new();
        encode(&req, &mut out).unwrap();
        out
    }

    fn decode_all(input: &[u8], expect: Expect) -> Result<Reply, ErrorReply> {
        match decode(input, expect).unwrap() {
            Decoded::Done { reply, len } => {
                assert_eq!(len, input.len());
                reply
            }
            d => panic!("{d:?}"),
        }
    }

    #[test]
    fn encodes_meta_requests() {
        assert_eq!(
            encoded(Request::Get {
                key: b"k",
                cas: true
            }),
            b"mg k v f c\r\n"
        );
        assert_eq!(
            encoded(Request::Get {
                key: b"k",
                cas: false
            }),
            b"mg k v f\r\n"
        );
        assert_eq!(
            encoded(Request::Gat {
                key: b"k",
                exptime: 9
            }),
            b"mg k v f c T9\r\n"
        );
        let store = Request::Store {
            mode: StoreMode::Cas,
            key: b"k",
            value_len: 3,
            flags: 5,
            exptime: 7,
            cas: 42,
        };
        assert_eq!(encoded(store), b"ms k 3 T7 F5 c MS C42\r\n");
        let add = Request::Store {
            mode: StoreMode::Add,
            key: b"k",
            value_len: 0,
            flags: 0,
            exptime: 0,
            cas: 42,
        };
        assert_eq!(encoded(add), b"ms k 0 T0 F0 c ME\r\n");
        let fragment = Request::Store {
            mode: StoreMode::SetFragment,
            key: b"k",
            value_len: 2,
            flags: 1,
            exptime: 0,
            cas: 42,
        };
        assert_eq!(encoded(fragment), b"ms k 2 T0 F1 c MS K\r\n");
        assert_eq!(encoded(Request::Delete { key: b"k" }), b"md k\r\n");
        assert_eq!(
            encoded(Request::Arith {
                key: b"n",
                delta: 3,
                incr: false
            }),
            b"ma n v D3 MD\r\n"
        );
        assert_eq!(
            encoded(Request::Touch {
                key: b"k",
                exptime: 4
            }),
            b"touch k 4\r\n"
        );
        assert_eq!(encoded(Request::FlushAll { delay: 0 }), b"flush_all\r\n");
        assert_eq!(encoded(Request::FlushAll { delay: 5 }), b"flush_all 5\r\n");
        assert_eq!(
            encoded(Request::Stats {
                group: Some("slabs")
            }),
            b"stats slabs\r\n"
        );
        assert_eq!(encoded(Request::Stats { group: Some("") }), b"stats\r\n");
        assert_eq!(encoded(Request::Version), b"version\r\n");
        assert_eq!(encoded(Request::Noop), b"mn\r\n");
    }

    #[test]
    fn a_fragment_set_refused_for_a_newer_write_says_which() {
        assert_eq!(
            decode_all(b"NS K1234\r\n", Expect::Store),
            Ok(Reply::Stored(StoreStatus::Superseded { stripe: 1234 }))
        );
        assert_eq!(
            decode_all(b"NS\r\n", Expect::Store),
            Ok(Reply::Stored(StoreStatus::NotStored))
        );
        assert!(decode(b"NS Kx\r\n", Expect::Store).is_err());
    }

    #[test]
    fn bad_keys_and_groups_encode_nothing() {
        let mut out = Vec::new();
        let long = [b'x'; crate::KEY_MAX_LEN + 1];
        for key in [&b""[..], b"a b", b"a\r\nb", &long] {
            assert_eq!(
                encode(&Request::Delete { key }, &mut out),
                Err(EncodeError::InvalidKey)
            );
        }
        assert_eq!(
            encode(&Request::Stats { group: Some("a b") }, &mut out),
            Err(EncodeError::BadStatsGroup)
        );
        assert!(out.is_empty());
    }

    #[test]
    fn values_split_anywhere_are_incomplete_until_whole() {
        let input = b"VA 5 f3 c9\r\nhello\r\n";
        for cut in 0..input.len() {
            assert!(matches!(
                decode(&input[..cut], Expect::Get).unwrap(),
                Decoded::Incomplete { .. }
            ));
        }
        let Reply::Value(Some(v)) = decode_all(input, Expect::Get).unwrap() else {
            panic!("not a value");
        };
        assert_eq!((&input[v.data], v.flags, v.cas), (&b"hello"[..], 3, 9));
    }

    #[test]
    fn incomplete_value_asks_for_all_of_it() {
        assert_eq!(
            decode(b"VA 5\r\nhe", Expect::Get),
            Ok(Decoded::Incomplete { need: 13 })
        );
    }

    #[test]
    fn decodes_replies() {
        assert_eq!(decode_all(b"EN\r\n", Expect::Get), Ok(Reply::Value(None)));
        assert_eq!(encoded(Request::Ttl { key: b"k" }), b"mg k t\r\n");
        assert_eq!(
            decode_all(b"HD t-1\r\n", Expect::Ttl),
            Ok(Reply::Ttl(Some(Ttl::Never)))
        );
        assert_eq!(
            decode_all(b"HD t86400\r\n", Expect::Ttl),
            Ok(Reply::Ttl(Some(Ttl::Seconds(86400))))
        );
        assert_eq!(decode_all(b"EN\r\n", Expect::Ttl), Ok(Reply::Ttl(None)));
        assert!(decode(b"HD\r\n", Expect::Ttl).is_err());
        assert!(decode(b"HD t-2\r\n", Expect::Ttl).is_err());
        assert_eq!(
            decode_all(b"HD c12\r\n", Expect::Store),
            Ok(Reply::Stored(StoreStatus::Stored { cas: 12 }))
        );
        assert_eq!(
            decode_all(b"EX c0\r\n", Expect::Store),
            Ok(Reply::Stored(StoreStatus::Exists))
        );
        assert_eq!(
            decode_all(b"VA 2\r\n15\r\n", Expect::Arith),
            Ok(Reply::Counter(Some(15)))
        );
        assert_eq!(
            decode_all(b"NF\r\n", Expect::Arith),
            Ok(Reply::Counter(None))
        );
        assert_eq!(
            decode_all(b"NOT_FOUND\r\n", Expect::Touch),
            Ok(Reply::Touched(false))
        );
        assert_eq!(
            decode_all(b"VERSION 1.6.18\r\n", Expect::Version),
            Ok(Reply::Version("1.6.18".into()))
        );
        assert_eq!(
            decode_all(
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
    fn error_lines_complete_the_request() {
        assert_eq!(
            decode_all(
                b"CLIENT_ERROR cannot increment or decrement non-numeric value\r\n",
                Expect::Arith
            ),
            Err(ErrorReply::Client(
                "cannot increment or decrement non-numeric value".into()
            ))
        );
        assert_eq!(
            decode_all(
                b"SERVER_ERROR object too large for cache\r\n",
                Expect::Store
            ),
            Err(ErrorReply::TooLarge)
        );
        assert_eq!(
            decode_all(b"SERVER_ERROR out of memory\r\n", Expect::Store),
            Err(ErrorReply::Server("out of memory".into()))
        );
        assert_eq!(
            decode_all(b"ERROR\r\n", Expect::Stats),
            Err(ErrorReply::UnknownCommand)
        );
    }

    #[test]
    fn broken_streams_are_errors() {
        assert!(matches!(
            decode(b"STORED\r\n", Expect::Get),
            Err(DecodeError::Unexpected { .. })
        ));
        assert_eq!(
            decode(b"VA 1\r\nxyz", Expect::Get),
            Err(DecodeError::BadValueTrailer)
        );
        assert!(matches!(
            decode(b"VA x\r\n", Expect::Get),
            Err(DecodeError::BadNumber(_))
        ));
        assert!(matches!(
            decode(b"VA 2\r\nab\r\n", Expect::Arith),
            Err(DecodeError::BadNumber(_))
        ));
        assert!(matches!(
            decode(b"STAT a 1\r\nbogus\r\n", Expect::Stats),
            Err(DecodeError::BadStatsLine(_))
        ));
        let long = vec![b'x'; MAX_REPLY_LINE + 1];
        assert_eq!(decode(&long, Expect::Get), Err(DecodeError::LineTooLong));
    }

    #[test]
    fn a_value_longer_than_any_server_stores_breaks_the_stream() {
        let line = format!("VA {}\r\n", MAX_VALUE_LEN);
        assert!(matches!(
            decode(line.as_bytes(), Expect::Get),
            Ok(Decoded::Incomplete { .. })
        ));
        let line = format!("VA {}\r\n", usize::MAX);
        assert_eq!(
            decode(line.as_bytes(), Expect::Get),
            Err(DecodeError::ValueTooLong(usize::MAX))
        );
    }
}
