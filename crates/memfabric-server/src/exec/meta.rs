//! Meta commands: mg ms md ma mn me.
use super::{ExecCtx, Session, Step};

/// Called by `ascii::process_one` when `input` starts with a meta command and holds a
/// complete line. Same contract as `ascii::process_one`.
pub fn process_one(
    ctx: &mut ExecCtx<'_>,
    sess: &mut Session,
    input: &[u8],
    out: &mut Vec<u8>,
) -> Step {
    let _ = (ctx, sess, input, out);
    Step::Close
}
