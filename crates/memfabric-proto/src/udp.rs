//! memcached's UDP frame header.
//!
//! Every UDP datagram, in both directions, starts with eight bytes, all big-endian u16:
//! request id (chosen by the client, echoed by the server), sequence number of this
//! datagram within the message (0-based), total datagrams in the message, and a reserved
//! word that must be 0. memcached accepts only single-datagram requests (sequence 0,
//! count 1) and splits a reply into datagrams of at most [`MAX_DATAGRAM`] bytes
//! *including* this header.

/// Length of the frame header.
pub const HEADER_LEN: usize = 8;

/// Largest datagram memcached sends, header included (its `UDP_MAX_PAYLOAD_SIZE`).
pub const MAX_DATAGRAM: usize = 1400;

/// Reply bytes that fit in one datagram after the header.
pub const MAX_PAYLOAD: usize = MAX_DATAGRAM - HEADER_LEN;

/// The eight-byte header.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FrameHeader {
    pub request_id: u16,
    pub sequence: u16,
    pub count: u16,
    pub reserved: u16,
}

/// Why a datagram is not a request memcached would run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UdpError {
    /// Fewer than eight bytes: no header.
    #[error("datagram shorter than the frame header")]
    Short,
    /// Sequence other than 0 or count other than 1: memcached drops these silently.
    #[error("multi-packet request not supported")]
    MultiPacket,
}

impl FrameHeader {
    /// Read the header at the start of `buf`.
    pub fn parse(buf: &[u8]) -> Result<FrameHeader, UdpError> {
        let b = buf.get(..HEADER_LEN).ok_or(UdpError::Short)?;
        let word = |i: usize| u16::from_be_bytes([b[i], b[i + 1]]);
        Ok(FrameHeader {
            request_id: word(0),
            sequence: word(2),
            count: word(4),
            reserved: word(6),
        })
    }

    /// Append the header's eight bytes to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.to_bytes());
    }

    pub fn to_bytes(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..2].copy_from_slice(&self.request_id.to_be_bytes());
        b[2..4].copy_from_slice(&self.sequence.to_be_bytes());
        b[4..6].copy_from_slice(&self.count.to_be_bytes());
        b[6..8].copy_from_slice(&self.reserved.to_be_bytes());
        b
    }
}

/// Split a datagram into its header and the request it carries. Only a single-datagram
/// request passes: memcached looks at the count word alone (it must be 1) and ignores the
/// sequence and reserved words.
pub fn parse_request(datagram: &[u8]) -> Result<(FrameHeader, &[u8]), UdpError> {
    let h = FrameHeader::parse(datagram)?;
    // memcached checks exactly bytes 4 and 5 (the count word) and nothing else.
    if h.count != 1 {
        return Err(UdpError::MultiPacket);
    }
    Ok((h, &datagram[HEADER_LEN..]))
}

/// How many datagrams a reply of `len` bytes takes (at least one, even when empty).
pub fn datagram_count(len: usize) -> usize {
    len.div_ceil(MAX_PAYLOAD).max(1)
}

/// Frame `reply` as memcached does: datagrams of at most [`MAX_DATAGRAM`] bytes, each with
/// the request id, its sequence number and the total count. Calls `emit` once per
/// datagram. Returns `false` (and emits nothing) when the reply would need more than
/// 65535 datagrams, which the header cannot count.
pub fn frame_reply(request_id: u16, reply: &[u8], emit: impl FnMut(&[u8])) -> bool {
    let mut rest = reply;
    frame_reply_from(
        request_id,
        reply.len(),
        |payload| {
            let n = payload.len().min(rest.len());
            payload[..n].copy_from_slice(&rest[..n]);
            rest = &rest[n..];
            n
        },
        emit,
    )
}

/// `frame_reply` for a reply of `len` bytes that is not in one slice: `fill` copies the
/// next bytes of it into the payload it is given and returns how many.
pub fn frame_reply_from(
    request_id: u16,
    len: usize,
    mut fill: impl FnMut(&mut [u8]) -> usize,
    mut emit: impl FnMut(&[u8]),
) -> bool {
    let Ok(count) = u16::try_from(datagram_count(len)) else {
        return false;
    };
    let mut dgram = [0u8; MAX_DATAGRAM];
    for sequence in 0..count {
        let header = FrameHeader {
            request_id,
            sequence,
            count,
            reserved: 0,
        };
        dgram[..HEADER_LEN].copy_from_slice(&header.to_bytes());
        let n = fill(&mut dgram[HEADER_LEN..]);
        emit(&dgram[..HEADER_LEN + n]);
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_round_trips_big_endian() {
        let h = FrameHeader {
            request_id: 0x1234,
            sequence: 2,
            count: 8,
            reserved: 0,
        };
        let b = h.to_bytes();
        assert_eq!(b, [0x12, 0x34, 0, 2, 0, 8, 0, 0]);
        assert_eq!(FrameHeader::parse(&b), Ok(h));
    }

    #[test]
    fn datagram_shorter_than_header_is_rejected() {
        assert_eq!(FrameHeader::parse(&[0; 7]), Err(UdpError::Short));
        assert_eq!(parse_request(&[]), Err(UdpError::Short));
    }

    #[test]
    fn single_datagram_request_yields_its_payload() {
        let d = b"\x00\x07\x00\x00\x00\x01\x00\x00get a\r\n";
        let (h, p) = parse_request(d).unwrap();
        assert_eq!(h.request_id, 7);
        assert_eq!(p, b"get a\r\n");
    }

    #[test]
    fn multi_datagram_request_is_rejected() {
        let d = b"\x00\x07\x00\x00\x00\x02\x00\x00get a\r\n";
        assert_eq!(parse_request(d), Err(UdpError::MultiPacket));
        let d = b"\x00\x07\x00\x00\x01\x01\x00\x00get a\r\n";
        assert_eq!(parse_request(d), Err(UdpError::MultiPacket));
    }

    #[test]
    fn nonzero_sequence_with_count_one_is_accepted_as_memcached_does() {
        let d = b"\x00\x07\x00\x01\x00\x01\x00\x00get a\r\n";
        assert!(parse_request(d).is_ok());
    }

    #[test]
    fn reply_of_10026_bytes_splits_into_eight_datagrams_of_1400() {
        let reply = vec![b'v'; 10026];
        let mut got = Vec::new();
        assert!(frame_reply(0x1234, &reply, |d| got.push(d.to_vec())));
        assert_eq!(got.len(), 8);
        for (i, d) in got.iter().enumerate() {
            let h = FrameHeader::parse(d).unwrap();
            assert_eq!(h.request_id, 0x1234);
            assert_eq!(h.sequence as usize, i);
            assert_eq!(h.count, 8);
            assert_eq!(h.reserved, 0);
        }
        assert!(got[..7].iter().all(|d| d.len() == MAX_DATAGRAM));
        assert_eq!(got[7].len(), 10026 - 7 * MAX_PAYLOAD + HEADER_LEN);
        let joined: Vec<u8> = got.iter().flat_map(|d| d[HEADER_LEN..].to_vec()).collect();
        assert_eq!(joined, reply);
    }

    #[test]
    fn empty_reply_is_one_header_only_datagram() {
        let mut got = Vec::new();
        assert!(frame_reply(1, b"", |d| got.push(d.to_vec())));
        assert_eq!(got, vec![vec![0, 1, 0, 0, 0, 1, 0, 0]]);
    }

    #[test]
    fn reply_too_large_to_count_is_refused() {
        let reply = vec![0u8; MAX_PAYLOAD * 65536];
        let mut n = 0;
        assert!(!frame_reply(1, &reply, |_| n += 1));
        assert_eq!(n, 0);
    }
}
