//! Line framing: where a request line ends, what a buffer without a newline means
//! (wait, or close), and the command text memcached sees in a line.

use super::command::{parse_line, Line};
use super::line::{command_text, find_newline};
use super::storage::storage;
use super::{multiget_prefix, CloseReason, Limits, Parse};

// ---------------------------------------------------------------------------------------
// Framing

/// Parse the request at the start of `input`. `scan_from` is the `scanned` of the last
/// `Incomplete` on this same input (0 otherwise).
pub fn parse<'a>(input: &'a [u8], limits: &Limits, scan_from: usize) -> Parse<'a> {
    let from = scan_from.min(input.len());
    let nl = match find_newline(&input[from..]) {
        Some(i) => from + i,
        None => return no_newline(input, limits),
    };
    let line_len = nl + 1;
    let line = command_text(&input[..nl]);
    match parse_line(line) {
        Line::Http => Parse::Close(CloseReason::Http),
        Line::Done(req) => Parse::Complete { req, len: line_len },
        Line::Storage(h) => storage(input, line_len, h, limits),
    }
}

/// What memcached does with a buffer holding no newline.
fn no_newline<'a>(input: &'a [u8], limits: &Limits) -> Parse<'a> {
    let incomplete = Parse::Incomplete {
        need: 0,
        scanned: input.len(),
    };
    if input.len() <= limits.max_line {
        return incomplete;
    }
    // Only a large multiget may have a line this long.
    if multiget_prefix(input).is_none() {
        return Parse::Close(CloseReason::LineTooLong);
    }
    if input.len() > limits.max_multiget_line.max(limits.max_line) {
        return Parse::Close(CloseReason::MultigetTooLong);
    }
    incomplete
}
