//! The binary protocol.
use super::{ExecCtx, Session, Step};

/// First byte of every binary request.
pub const REQUEST_MAGIC: u8 = 0x80;

/// Per-connection binary state.
#[derive(Default)]
pub struct BinaryState {}

pub fn process_one(
    ctx: &mut ExecCtx<'_>,
    sess: &mut Session,
    input: &[u8],
    out: &mut Vec<u8>,
) -> Step {
    let _ = (ctx, sess, input, out);
    Step::Close
}
