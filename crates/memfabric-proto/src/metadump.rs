//! The lines of `lru_crawler metadump` as a client reads them: one item per line,
//! `key=<uri-encoded key> exp=<unix time, -1 = never> la=<unix time> cas=<n>
//! fetch=<yes|no> cls=<class> size=<bytes>`, ended by `END`. memcached and memfabricd
//! write the same format; memcached ends item lines with a bare `\n` and `END` with
//! `\r\n`, and both are accepted here. A client that walks a server's keys (the pool's
//! background repair) parses every line with [`parse_line`].
use crate::number::safe_strtoull as number;
use crate::KEY_MAX_LEN;

/// Longest line a well-formed dump has: a key of `KEY_MAX_LEN` bytes, every one
/// `%XX`-encoded, and the fields after it.
pub const LINE_MAX: usize = 3 * KEY_MAX_LEN + 160;

/// One item of a dump.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DumpEntry {
    pub key: Vec<u8>,
    /// When the item expires (unix time), `None` when it does not.
    pub exp: Option<u64>,
    /// When it was last accessed (unix time).
    pub last_access: u64,
    pub cas: u64,
    pub fetched: bool,
    pub class: u32,
    /// memcached's item size (header, key, value).
    pub size: u64,
}

/// What a line says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DumpLine {
    Entry(DumpEntry),
    /// `END`: the dump is over.
    End,
    /// The server did not dump: `BUSY ...` (another dump or crawl is running; try again
    /// later), `ERROR ...`, `CLIENT_ERROR ...`, as it said it.
    Refused {
        busy: bool,
        text: String,
    },
}

/// Why a line is not part of a dump.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DumpError {
    #[error("metadump line longer than {LINE_MAX} bytes")]
    TooLong,
    #[error("not a metadump line")]
    NotADumpLine,
    #[error("metadump key is not uri-encoded or not 1..=250 bytes")]
    BadKey,
    #[error("metadump field `{0}` is missing or not a number")]
    BadField(&'static str),
}

/// Parses one line (with or without its `\r\n` / `\n`).
pub fn parse_line(line: &[u8]) -> Result<DumpLine, DumpError> {
    if line.len() > LINE_MAX + 2 {
        return Err(DumpError::TooLong);
    }
    let line = line.strip_suffix(b"\n").unwrap_or(line);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line == b"END" {
        return Ok(DumpLine::End);
    }
    for (prefix, busy) in [
        (&b"BUSY"[..], true),
        (b"ERROR", false),
        (b"CLIENT_ERROR", false),
        (b"SERVER_ERROR", false),
    ] {
        if line.starts_with(prefix) && line.get(prefix.len()).is_none_or(|&b| b == b' ') {
            return Ok(DumpLine::Refused {
                busy,
                text: String::from_utf8_lossy(line).into_owned(),
            });
        }
    }
    let mut fields = line.split(|&b| b == b' ');
    let key = fields
        .next()
        .and_then(|f| f.strip_prefix(b"key="))
        .ok_or(DumpError::NotADumpLine)?;
    let key = uri_decode(key).ok_or(DumpError::BadKey)?;
    if key.is_empty() || key.len() > KEY_MAX_LEN {
        return Err(DumpError::BadKey);
    }
    let mut field = |name: &'static str| -> Result<&[u8], DumpError> {
        fields
            .next()
            .and_then(|f| f.strip_prefix(name.as_bytes()))
            .and_then(|f| f.strip_prefix(b"="))
            .ok_or(DumpError::BadField(name))
    };
    let exp = match field("exp")? {
        b"-1" => None,
        v => Some(number(v).ok_or(DumpError::BadField("exp"))?),
    };
    let last_access = number(field("la")?).ok_or(DumpError::BadField("la"))?;
    let cas = number(field("cas")?).ok_or(DumpError::BadField("cas"))?;
    let fetched = match field("fetch")? {
        b"yes" => true,
        b"no" => false,
        _ => return Err(DumpError::BadField("fetch")),
    };
    let class = number(field("cls")?)
        .and_then(|c| u32::try_from(c).ok())
        .ok_or(DumpError::BadField("cls"))?;
    let size = number(field("size")?).ok_or(DumpError::BadField("size"))?;
    // Later versions may add fields: they are ignored.
    Ok(DumpLine::Entry(DumpEntry {
        key,
        exp,
        last_access,
        cas,
        fetched,
        class,
        size,
    }))
}

/// memcached's `uridecode`: `%XX` is the byte XX (either case), anything else itself.
pub fn uri_decode(s: &[u8]) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'%' {
            let hex = s.get(i + 1..i + 3)?;
            let hi = char::from(hex[0]).to_digit(16)?;
            let lo = char::from(hex[1]).to_digit(16)?;
            out.push((hi * 16 + lo) as u8);
            i += 3;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memcached_lines_parse() {
        let line = b"key=a%20b%2Fc exp=1764045000 la=1764040000 cas=7 fetch=no cls=1 size=66\n";
        assert_eq!(
            parse_line(line),
            Ok(DumpLine::Entry(DumpEntry {
                key: b"a b/c".to_vec(),
                exp: Some(1_764_045_000),
                last_access: 1_764_040_000,
                cas: 7,
                fetched: false,
                class: 1,
                size: 66,
            }))
        );
        let forever = b"key=k exp=-1 la=5 cas=0 fetch=yes cls=12 size=1048576";
        match parse_line(forever) {
            Ok(DumpLine::Entry(e)) => assert_eq!((e.exp, e.fetched, e.class), (None, true, 12)),
            other => panic!("{other:?}"),
        }
        assert_eq!(parse_line(b"END\r\n"), Ok(DumpLine::End));
        assert!(matches!(
            parse_line(b"BUSY currently processing crawler request\r\n"),
            Ok(DumpLine::Refused { busy: true, .. })
        ));
        assert!(matches!(
            parse_line(b"ERROR metadump not allowed\r\n"),
            Ok(DumpLine::Refused { busy: false, .. })
        ));
    }

    #[test]
    fn damaged_lines_are_refused() {
        for bad in [
            &b""[..],
            b"key= exp=-1 la=1 cas=1 fetch=no cls=1 size=1",
            b"key=%4 exp=-1 la=1 cas=1 fetch=no cls=1 size=1",
            b"key=%zz exp=-1 la=1 cas=1 fetch=no cls=1 size=1",
            b"key=k exp=-2 la=1 cas=1 fetch=no cls=1 size=1",
            b"key=k exp=1 la=1 cas=1 fetch=maybe cls=1 size=1",
            b"key=k exp=1 la=1 cas=1 fetch=no cls=99999999999 size=1",
            b"key=k exp=1 la=1 cas=1 fetch=no cls=1",
            b"key=k la=1 exp=1 cas=1 fetch=no cls=1 size=1",
            b"ENDING",
        ] {
            assert!(parse_line(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        let long = [b'a'; KEY_MAX_LEN + 1];
        let mut line = b"key=".to_vec();
        line.extend_from_slice(&long);
        line.extend_from_slice(b" exp=-1 la=1 cas=1 fetch=no cls=1 size=1");
        assert_eq!(parse_line(&line), Err(DumpError::BadKey));
        assert_eq!(parse_line(&[b'x'; LINE_MAX + 3]), Err(DumpError::TooLong));
    }
}
