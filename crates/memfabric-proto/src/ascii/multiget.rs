//! Multiget key streaming: a retrieval's keys split lazily from its line, and how a
//! `get`/`gets` line too long to buffer is recognised so its keys can be served as they
//! arrive.

use std::fmt;

/// A long line with more leading spaces than this is not treated as a multiget.
const MULTIGET_MAX_LEADING_SPACES: usize = 100;

/// The keys of a retrieval, split lazily (a multiget line can be megabytes long).
#[derive(Clone, Copy)]
pub struct Keys<'a> {
    raw: &'a [u8],
}

impl<'a> Keys<'a> {
    /// Keys separated by spaces in `raw`.
    pub fn new(raw: &'a [u8]) -> Keys<'a> {
        Keys { raw }
    }

    /// The key list's text as it stands in the request line.
    pub fn raw(&self) -> &'a [u8] {
        self.raw
    }

    pub fn iter(&self) -> KeyIter<'a> {
        KeyIter { rest: self.raw }
    }

    pub fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }
}

impl PartialEq for Keys<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.iter().eq(other.iter())
    }
}

impl fmt::Debug for Keys<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list()
            .entries(self.iter().map(String::from_utf8_lossy))
            .finish()
    }
}

/// Iterator over `Keys`. Keys may be longer than `KEY_MAX_LEN`: memcached serves the
/// keys before such a key and then fails the whole command, so the executor checks.
#[derive(Clone)]
pub struct KeyIter<'a> {
    rest: &'a [u8],
}

impl<'a> Iterator for KeyIter<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        let start = self.rest.iter().position(|&b| b != b' ')?;
        let rest = &self.rest[start..];
        let end = rest.iter().position(|&b| b == b' ').unwrap_or(rest.len());
        let (key, tail) = rest.split_at(end);
        self.rest = tail;
        Some(key)
    }
}

/// A `get`/`gets` line too long to buffer whole (see `no_newline`): whether it is `gets`,
/// and how many bytes its leading spaces and verb (with the space after it) take. The
/// key list that follows can be served as it arrives.
pub fn multiget_prefix(input: &[u8]) -> Option<(bool, usize)> {
    let spaces = input.iter().take_while(|&&b| b == b' ').count();
    if spaces > MULTIGET_MAX_LEADING_SPACES {
        return None;
    }
    let rest = &input[spaces..];
    if rest.starts_with(b"get ") {
        Some((false, spaces + 4))
    } else if rest.starts_with(b"gets ") {
        Some((true, spaces + 5))
    } else {
        None
    }
}
