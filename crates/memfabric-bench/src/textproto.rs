//! memcached's text protocol, client side: encode `get`/`set`, parse replies incrementally.
//!
//! The bench speaks only the wire (it must measure memcached and memfabricd alike), so it
//! has its own small codec rather than the server's parser.

use thiserror::Error;

/// A request the load generator sends.
#[derive(Clone, Copy, Debug)]
pub enum Request<'a> {
    Get { key: &'a [u8] },
    Set { key: &'a [u8], value: &'a [u8] },
}

/// Append the wire form of `req` to `out`.
pub fn encode(req: &Request<'_>, out: &mut Vec<u8>) {
    match req {
        Request::Get { key } => {
            out.extend_from_slice(b"get ");
            out.extend_from_slice(key);
            out.extend_from_slice(b"\r\n");
        }
        Request::Set { key, value } => {
            out.extend_from_slice(b"set ");
            out.extend_from_slice(key);
            out.extend_from_slice(b" 0 0 ");
            out.extend_from_slice(value.len().to_string().as_bytes());
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(value);
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// One complete reply, borrowing from the receive buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reply<'a> {
    /// `VALUE <key> <flags> <bytes>\r\n<data>\r\nEND\r\n`
    Hit {
        key: &'a [u8],
        flags: u32,
        data: &'a [u8],
    },
    /// `END\r\n` alone: the key was not there.
    Miss,
    Stored,
    NotStored,
    Exists,
    NotFound,
    /// `ERROR`, `CLIENT_ERROR ...`, `SERVER_ERROR ...`: the whole line without CRLF.
    Error(&'a [u8]),
}

/// The server sent something that is not a reply to get or set.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ReplyError {
    #[error("unexpected reply line: {0:?}")]
    Unexpected(String),
    #[error("malformed VALUE line: {0:?}")]
    BadValueLine(String),
    #[error("value data not followed by CRLF")]
    BadValueTerminator,
    #[error("VALUE not followed by END (got {0:?})")]
    MissingEnd(String),
    #[error("reply line longer than {0} bytes without CRLF")]
    LineTooLong(usize),
}

/// Longest reply line accepted before the stream is judged broken (memcached's are < 300).
const MAX_LINE: usize = 4096;

fn find_crlf(buf: &[u8]) -> Option<usize> {
    buf.windows(2).position(|w| w == b"\r\n")
}

fn lossy(b: &[u8]) -> String {
    String::from_utf8_lossy(&b[..b.len().min(120)]).into_owned()
}

/// Parse one reply from the front of `buf`. `Ok(None)` means more bytes are needed;
/// `Ok(Some((reply, n)))` means the reply used the first `n` bytes.
pub fn parse_reply(buf: &[u8]) -> Result<Option<(Reply<'_>, usize)>, ReplyError> {
    let Some(eol) = find_crlf(buf) else {
        return if buf.len() > MAX_LINE {
            Err(ReplyError::LineTooLong(MAX_LINE))
        } else {
            Ok(None)
        };
    };
    let line = &buf[..eol];
    let after = eol + 2;
    let simple = |r| Ok(Some((r, after)));
    match line {
        b"END" => simple(Reply::Miss),
        b"STORED" => simple(Reply::Stored),
        b"NOT_STORED" => simple(Reply::NotStored),
        b"EXISTS" => simple(Reply::Exists),
        b"NOT_FOUND" => simple(Reply::NotFound),
        _ if line == b"ERROR"
            || line.starts_with(b"CLIENT_ERROR")
            || line.starts_with(b"SERVER_ERROR") =>
        {
            simple(Reply::Error(line))
        }
        _ if line.starts_with(b"VALUE ") => parse_value(buf, line, after),
        _ => Err(ReplyError::Unexpected(lossy(line))),
    }
}

fn parse_value<'a>(
    buf: &'a [u8],
    line: &'a [u8],
    after: usize,
) -> Result<Option<(Reply<'a>, usize)>, ReplyError> {
    let bad = || ReplyError::BadValueLine(lossy(line));
    let mut parts = line.split(|&b| b == b' ').filter(|p| !p.is_empty());
    let _value = parts.next();
    let key = parts.next().ok_or_else(bad)?;
    let flags: u32 = parse_num(parts.next().ok_or_else(bad)?).ok_or_else(bad)?;
    let len: usize = parse_num(parts.next().ok_or_else(bad)?).ok_or_else(bad)?;
    // An optional CAS (gets) may follow; anything more is malformed.
    let _cas = parts.next();
    if parts.next().is_some() {
        return Err(bad());
    }
    let data_end = after.checked_add(len).ok_or_else(bad)?;
    let end_line = data_end + 2;
    let total = end_line + 5;
    if buf.len() < total {
        return Ok(None);
    }
    if buf.get(data_end..end_line) != Some(&b"\r\n"[..]) {
        return Err(ReplyError::BadValueTerminator);
    }
    if buf.get(end_line..total) != Some(&b"END\r\n"[..]) {
        return Err(ReplyError::MissingEnd(lossy(&buf[end_line..total])));
    }
    Ok(Some((
        Reply::Hit {
            key,
            flags,
            data: &buf[after..data_end],
        },
        total,
    )))
}

fn parse_num<T: std::str::FromStr>(b: &[u8]) -> Option<T> {
    std::str::from_utf8(b).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn set_encodes_length_and_trailing_crlf() {
        let mut out = Vec::new();
        encode(
            &Request::Set {
                key: b"k",
                value: b"abc",
            },
            &mut out,
        );
        assert_eq!(out, b"set k 0 0 3\r\nabc\r\n");
    }

    #[test]
    fn get_encodes_single_key() {
        let mut out = Vec::new();
        encode(&Request::Get { key: b"k1" }, &mut out);
        assert_eq!(out, b"get k1\r\n");
    }

    #[test]
    fn hit_is_parsed_only_once_end_has_arrived() {
        let full = b"VALUE k 5 3\r\nabc\r\nEND\r\nSTORED\r\n";
        for cut in 0..23 {
            assert_eq!(parse_reply(&full[..cut]), Ok(None), "cut {cut}");
        }
        let (r, n) = parse_reply(full).unwrap().unwrap();
        assert_eq!(
            r,
            Reply::Hit {
                key: b"k",
                flags: 5,
                data: b"abc"
            }
        );
        assert_eq!(n, 23);
        assert_eq!(parse_reply(&full[n..]), Ok(Some((Reply::Stored, 8))));
    }

    #[test]
    fn value_data_may_contain_crlf() {
        let full = b"VALUE k 0 4\r\n\r\n\r\n\r\nEND\r\n";
        let (r, _) = parse_reply(full).unwrap().unwrap();
        assert_eq!(
            r,
            Reply::Hit {
                key: b"k",
                flags: 0,
                data: b"\r\n\r\n"
            }
        );
    }

    #[test]
    fn errors_and_misses_are_recognised() {
        assert_eq!(parse_reply(b"END\r\n"), Ok(Some((Reply::Miss, 5))));
        assert_eq!(
            parse_reply(b"SERVER_ERROR out of memory\r\n"),
            Ok(Some((Reply::Error(b"SERVER_ERROR out of memory"), 28)))
        );
        assert!(parse_reply(b"HELLO\r\n").is_err());
    }

    #[test]
    fn value_without_end_is_an_error() {
        assert!(parse_reply(b"VALUE k 0 1\r\na\r\nXXXXX").is_err());
        assert!(parse_reply(b"VALUE k 0 1\r\naXXEND\r\n").is_err());
        assert!(parse_reply(b"VALUE k x 1\r\na\r\nEND\r\n").is_err());
    }
}
