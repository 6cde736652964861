//! Line primitives: where a line ends, and the command text memcached sees in it (the
//! lowest layer of the ascii parser, under framing, commands and storage headers).

pub(super) fn find_newline(bytes: &[u8]) -> Option<usize> {
    bytes.iter().position(|&b| b == b'\n')
}

/// The command text of a line (without its `\n`): drop one trailing `\r` if the line has
/// more than one byte, then stop at the first NUL, as memcached does.
pub fn command_text(line: &[u8]) -> &[u8] {
    let line = match line {
        [head @ .., b'\r'] if line.len() > 1 => head,
        _ => line,
    };
    match line.iter().position(|&b| b == 0) {
        Some(nul) => &line[..nul],
        None => line,
    }
}
