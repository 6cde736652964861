//! Classic ascii commands and ascii line framing (meta commands are handed to `meta`).
use super::{ExecCtx, Session, Step};

/// Per-connection ascii state.
#[derive(Default)]
pub struct AsciiState {}

pub fn process_one(
    ctx: &mut ExecCtx<'_>,
    sess: &mut Session,
    input: &[u8],
    out: &mut Vec<u8>,
) -> Step {
    let _ = (ctx, sess, input, out);
    Step::Close
}
