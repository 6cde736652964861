//! The key of the request at the start of a buffer, found cheaply and without validating
//! anything: a hint for the server to start loading the store memory that request will
//! touch (`Store::prefetch`) while it reads other connections. Never used to execute a
//! request: a wrong or missing answer only costs a wasted prefetch or a cache miss.

use crate::KEY_MAX_LEN;

/// The key of the first request in `input`, if `input` starts with one that names a key
/// where this looks: the second token of an ascii or meta command that takes a key first
/// (`get`, `gets`, `set`, ..., `mg`, `ms`, ...), or the key of a binary request (magic
/// 0x80). Looks at most at the first few hundred bytes.
pub fn first_key(input: &[u8]) -> Option<&[u8]> {
    match input.first()? {
        0x80 => binary_key(input),
        _ => text_key(input),
    }
}

/// Commands whose second token is a key (memcached's classic and meta commands).
const KEYED: &[&[u8]] = &[
    b"get", b"gets", b"set", b"add", b"replace", b"append", b"prepend", b"cas", b"delete", b"incr",
    b"decr", b"touch", b"mg", b"ms", b"md", b"ma",
];

fn text_key(input: &[u8]) -> Option<&[u8]> {
    let head = &input[..input.len().min(KEY_MAX_LEN + 16)];
    let cmd_end = head.iter().position(|&b| b == b' ')?;
    if !KEYED.contains(&&head[..cmd_end]) {
        return None;
    }
    let rest = &head[cmd_end + 1..];
    let end = rest
        .iter()
        .position(|&b| b == b' ' || b == b'\r' || b == b'\n')?;
    let key = &rest[..end];
    (!key.is_empty() && key.len() <= KEY_MAX_LEN).then_some(key)
}

/// The binary header: key length at bytes 2..4 (big-endian), extras length at byte 4, the
/// key after the 24-byte header and the extras.
fn binary_key(input: &[u8]) -> Option<&[u8]> {
    let hdr = input.get(..24)?;
    let key_len = usize::from(u16::from_be_bytes([hdr[2], hdr[3]]));
    let start = 24 + usize::from(hdr[4]);
    if key_len == 0 || key_len > KEY_MAX_LEN {
        return None;
    }
    input.get(start..start + key_len)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_commands_name_their_key() {
        assert_eq!(first_key(b"get foo\r\n"), Some(&b"foo"[..]));
        assert_eq!(first_key(b"get foo bar\r\n"), Some(&b"foo"[..]));
        assert_eq!(first_key(b"set k 0 0 1\r\nx\r\n"), Some(&b"k"[..]));
        assert_eq!(first_key(b"mg key v\r\n"), Some(&b"key"[..]));
        assert_eq!(first_key(b"delete k\n"), Some(&b"k"[..]));
    }

    #[test]
    fn anything_else_gives_no_hint() {
        assert_eq!(first_key(b""), None);
        assert_eq!(first_key(b"get"), None);
        assert_eq!(first_key(b"get foo"), None, "the key may not have ended");
        assert_eq!(first_key(b"gat 10 foo\r\n"), None);
        assert_eq!(first_key(b"stats\r\n"), None);
        assert_eq!(first_key(b"get  foo\r\n"), None);
        let long = [b"get ".as_slice(), &[b'k'; 300], b"\r\n"].concat();
        assert_eq!(first_key(&long), None);
    }

    #[test]
    fn binary_requests_name_their_key() {
        let mut req = vec![0u8; 24];
        req[0] = 0x80;
        req[2..4].copy_from_slice(&3u16.to_be_bytes());
        req[4] = 4;
        req.extend_from_slice(&[0; 4]);
        req.extend_from_slice(b"abc");
        assert_eq!(first_key(&req), Some(&b"abc"[..]));
        assert_eq!(first_key(&req[..30]), None, "the key has not all arrived");
        assert_eq!(first_key(&req[..10]), None);
    }
}
