//! Storage headers: a `set`-family line waiting for its data block, the data block's
//! checks, and the header of a value that a server receives straight into item memory.

use super::command::StoreHeader;
use super::command::{parse_line, Line};
use super::line::{command_text, find_newline};
use super::{ErrorReply, Limits, Parse, Request, StoreRequest, Verb};

/// See `pending_store`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PendingStore<'a> {
    /// The request, with an empty `value`.
    pub req: StoreRequest<'a>,
    /// Bytes of the command line, newline included.
    pub line_len: usize,
    /// Bytes of the value (the data block is this plus `\r\n`).
    pub value_len: usize,
}

/// A storage command whose line is complete but whose data block is not: the request
/// (with an empty value) and the length of its line, so that a server can receive the
/// value straight into item memory instead of buffering it. `None` for anything else
/// (including a value `parse` refuses as too large).
pub fn pending_store<'a>(input: &'a [u8], limits: &Limits) -> Option<PendingStore<'a>> {
    let nl = find_newline(input)?;
    let line_len = nl + 1;
    let Line::Storage(h) = parse_line(command_text(&input[..nl])) else {
        return None;
    };
    let data_len = h.vlen + 2;
    if data_len > limits.item_size_max || input.len() >= line_len + data_len {
        return None;
    }
    let req = StoreRequest {
        cmd: h.cmd,
        key: h.key,
        flags: h.flags,
        exptime: h.exptime,
        value: &[],
        cas: h.cas,
        noreply: h.noreply,
    };
    Some(PendingStore {
        req,
        line_len,
        value_len: h.vlen,
    })
}

pub(super) fn storage<'a>(
    input: &'a [u8],
    line_len: usize,
    h: StoreHeader<'a>,
    limits: &Limits,
) -> Parse<'a> {
    let data_len = h.vlen + 2;
    if data_len > limits.item_size_max {
        return Parse::Complete {
            req: Request::StoreTooLarge {
                cmd: h.cmd,
                key: h.key,
                noreply: h.noreply,
                data_len,
            },
            len: line_len,
        };
    }
    let total = line_len + data_len;
    let Some(data) = input.get(line_len..total) else {
        return Parse::Incomplete {
            need: total,
            scanned: 0,
        };
    };
    let req = match data.split_last_chunk::<2>() {
        Some((value, b"\r\n")) => Request::Store(StoreRequest {
            cmd: h.cmd,
            key: h.key,
            flags: h.flags,
            exptime: h.exptime,
            value,
            cas: h.cas,
            noreply: h.noreply,
        }),
        _ => Request::Invalid {
            verb: Verb::Store(h.cmd),
            error: ErrorReply::BadDataChunk,
            noreply: h.noreply,
        },
    };
    Parse::Complete { req, len: total }
}
