//! Command tokenizing: memcached's `tokenize_command` (spaces only, at most 23 tokens).

use super::MAX_TOKENS;

/// A tokenized command line: up to 23 tokens, and the unsplit rest of a longer line.
#[derive(Clone, Copy, Debug)]
pub struct Tokens<'a> {
    toks: [&'a [u8]; MAX_TOKENS - 1],
    len: usize,
    rest: Option<&'a [u8]>,
}

impl<'a> Tokens<'a> {
    /// Number of tokens split off (memcached's `ntokens` is this plus one).
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Token `i`, or an empty slice past the end (like memcached's terminal token).
    pub fn get(&self, i: usize) -> &'a [u8] {
        if i < self.len {
            self.toks[i]
        } else {
            b""
        }
    }

    /// Text after the 23rd token, if the line had more.
    pub fn rest(&self) -> Option<&'a [u8]> {
        self.rest
    }

    /// memcached's `set_noreply_maybe`: the last token is `noreply`.
    pub(super) fn noreply(&self) -> bool {
        self.len > 0 && self.toks[self.len - 1] == b"noreply"
    }
}

/// memcached's `tokenize_command`: split on spaces, at most 23 tokens.
pub fn tokenize(line: &[u8]) -> Tokens<'_> {
    let mut t = Tokens {
        toks: [b""; MAX_TOKENS - 1],
        len: 0,
        rest: None,
    };
    let mut start = 0;
    let mut i = 0;
    while i < line.len() {
        if line[i] == b' ' {
            if start != i {
                t.toks[t.len] = &line[start..i];
                t.len += 1;
                if t.len == MAX_TOKENS - 1 {
                    let after = &line[i + 1..];
                    t.rest = (!after.is_empty()).then_some(after);
                    return t;
                }
            }
            start = i + 1;
        }
        i += 1;
    }
    if start < line.len() {
        t.toks[t.len] = &line[start..];
        t.len += 1;
    }
    t
}
