//! UDP: one request per datagram, replies framed as memcached frames them.
//!
//! Each datagram carries the 8-byte frame header and one request (ascii or binary).
//! Multi-datagram requests and datagrams without a complete request are dropped without
//! a reply, as memcached drops them. Each request's reply is its own message: split into
//! datagrams of at most 1400 bytes (header included) that carry the client's request id,
//! their sequence number and the message's datagram count.
use std::io;
use std::net::SocketAddr;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use memfabric_proto::{binary, udp};

use crate::conn::{ConnEntry, ConnState};
use crate::counters::ThreadStats;
use crate::exec::{self, ExecCtx, Session, Shared, Transport};
use crate::outqueue::OutQueue;
use crate::shared::{Inbox, Target, Waiter};

/// Datagrams handled per readiness round before other connections get a turn.
const DATAGRAMS_PER_ROUND: usize = 64;

/// Datagrams one socket may keep waiting for a pending command; past that, datagrams run
/// with nothing allowed to wait (their commands complete at once).
const MAX_HELD_DATAGRAMS: usize = 256;

/// A worker's handle on one UDP socket.
pub struct UdpPort {
    sock: mio::net::UdpSocket,
    id: u64,
    entry: Arc<ConnEntry>,
    buf: Vec<u8>,
    out: OutQueue,
    /// Datagrams stopped at a pending command: the rest runs when it completes.
    held: Vec<HeldDatagram>,
}

/// A datagram whose current request waits for a pending command.
struct HeldDatagram {
    /// Its pending commands are `sess.parked`.
    sess: Session,
    /// The current request's reply so far (with the pending command's hole).
    out: OutQueue,
    request_id: u16,
    peer: SocketAddr,
    /// The requests after the current one.
    rest: Vec<u8>,
    /// Whether the current request is the datagram's first and binary (see
    /// `send_empty_frame`).
    first_binary: bool,
}

impl UdpPort {
    /// Wrap a worker's clone of a UDP socket and list it in `stats conns`.
    pub fn new(shared: &Shared, sock: mio::net::UdpSocket, name: String) -> UdpPort {
        let id = sock.as_raw_fd() as u64;
        let entry = Arc::new(ConnEntry::new(name, None, true, ConnState::Read));
        shared.conns.insert(id, Arc::clone(&entry));
        UdpPort {
            sock,
            id,
            entry,
            // The largest UDP payload there is.
            buf: vec![0; 65536],
            out: OutQueue::new(),
            held: Vec::new(),
        }
    }

    pub fn socket_mut(&mut self) -> &mut mio::net::UdpSocket {
        &mut self.sock
    }

    /// Forget the socket in `stats conns` (the worker is exiting).
    pub fn unregister(&self, shared: &Shared) {
        shared.conns.remove(self.id);
    }

    /// Handle pending datagrams. Returns true if the socket may hold more (call again).
    pub fn drain(
        &mut self,
        shared: &Shared,
        stats: &ThreadStats,
        inbox: &Arc<Inbox>,
        index: usize,
    ) -> bool {
        for _ in 0..DATAGRAMS_PER_ROUND {
            let (n, peer) = match self.sock.recv_from(&mut self.buf) {
                Ok(x) => x,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return false,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    // ICMP errors from earlier sends surface here; they concern one peer.
                    tracing::debug!("udp recv: {e}");
                    continue;
                }
            };
            stats.bytes_read.add(n as u64);
            self.entry.touch(shared.store.clock().now());
            let Some(dgram) = self.buf.get(..n) else {
                continue;
            };
            let Ok((hdr, payload)) = udp::parse_request(dgram) else {
                continue;
            };
            let payload = payload.to_vec();
            let waiter = (self.held.len() < MAX_HELD_DATAGRAMS).then_some(Waiter {
                inbox,
                target: Target::Udp(index),
            });
            let sess = Session::default();
            self.run(
                shared,
                stats,
                waiter,
                sess,
                hdr.request_id,
                peer,
                &payload,
                true,
            );
        }
        true
    }

    /// Pending command `ticket` is ready: finish its datagram's request, send its reply
    /// and run the datagram's remaining requests.
    pub fn complete(
        &mut self,
        shared: &Shared,
        stats: &ThreadStats,
        inbox: &Arc<Inbox>,
        index: usize,
        ticket: u64,
        done: Option<crate::pending::Completion>,
    ) {
        // Any of a datagram's pending keys may complete first (several read threads).
        let Some(at) = self
            .held
            .iter()
            .position(|h| h.sess.parked.iter().any(|(t, _)| t.0 == ticket))
        else {
            return;
        };
        let mut h = self.held.swap_remove(at);
        let ctx = ExecCtx {
            shared,
            stats,
            transport: Transport::Udp,
            conn_id: self.id,
            waiter: None,
            completion: done.as_ref(),
        };
        exec::resume(&ctx, &mut h.sess, ticket, &mut h.out);
        if !h.sess.parked.is_empty() {
            // Another key of the same request still waits.
            self.held.push(h);
            return;
        }
        if !h.out.is_empty() {
            send_reply(&self.sock, &mut h.out, stats, h.request_id, h.peer);
        } else if h.first_binary {
            send_empty_frame(&self.sock, stats, h.request_id, h.peer);
        }
        let waiter = Some(Waiter {
            inbox,
            target: Target::Udp(index),
        });
        self.run(
            shared,
            stats,
            waiter,
            h.sess,
            h.request_id,
            h.peer,
            &h.rest,
            false,
        );
    }

    /// Run a datagram's requests from `payload`, each reply framed as its own message.
    /// `whole`: `payload` is the datagram's from its first request (not the rest of a
    /// datagram whose earlier request waited).
    #[allow(clippy::too_many_arguments)]
    fn run(
        &mut self,
        shared: &Shared,
        stats: &ThreadStats,
        waiter: Option<Waiter<'_>>,
        mut sess: Session,
        request_id: u16,
        peer: SocketAddr,
        payload: &[u8],
        whole: bool,
    ) {
        let mut ctx = ExecCtx {
            shared,
            stats,
            transport: Transport::Udp,
            conn_id: self.id,
            waiter,
            completion: None,
        };
        let mut pos = 0;
        while pos < payload.len() {
            let first_binary = pos == 0 && whole && payload.first() == Some(&binary::REQUEST_MAGIC);
            // One request at a time: each reply is framed as its own message, so a
            // request that stopped at the output cap runs on to its end first (a
            // datagram holds few keys; large values are queued pinned, not copied).
            let mut consumed = 0;
            let close = loop {
                let rest = &payload[pos + consumed..];
                let p = exec::process(&mut ctx, &mut sess, rest, &mut self.out, 1);
                consumed += p.consumed;
                if p.close || !p.yielded || !sess.in_request() || p.consumed == 0 {
                    break p.close;
                }
            };
            if !sess.parked.is_empty() {
                // Its reply waits for a pending command; so do the requests after it.
                self.held.push(HeldDatagram {
                    sess,
                    out: std::mem::take(&mut self.out),
                    request_id,
                    peer,
                    rest: payload[(pos + consumed).min(payload.len())..].to_vec(),
                    first_binary,
                });
                return;
            }
            if !self.out.is_empty() {
                send_reply(&self.sock, &mut self.out, stats, request_id, peer);
            } else if first_binary && (close || (consumed > 0 && !sess.in_request())) {
                // Only for a request that ran (`quitq` among them): a cut one dies with
                // its datagram, unanswered.
                send_empty_frame(&self.sock, stats, request_id, peer);
            }
            if close || consumed == 0 {
                break;
            }
            pos += consumed;
        }
        // A request left unfinished (a datagram cut mid-request) dies with its datagram.
        self.out.clear();
    }
}

/// A frame header alone (count 0): what memcached 1.6 sends when a datagram's first
/// request is a binary one that answers nothing (a quiet command: `getq` that misses,
/// `setq`, `quitq`), once per datagram. Its ascii `noreply` and meta `q` send nothing.
fn send_empty_frame(
    sock: &mio::net::UdpSocket,
    stats: &ThreadStats,
    request_id: u16,
    peer: SocketAddr,
) {
    let header = udp::FrameHeader {
        request_id,
        ..udp::FrameHeader::default()
    };
    if let Ok(k) = sock.send_to(&header.to_bytes(), peer) {
        stats.bytes_written.add(k as u64);
    }
}

/// Frame and send the queued reply as memcached frames a UDP reply.
fn send_reply(
    sock: &mio::net::UdpSocket,
    out: &mut OutQueue,
    stats: &ThreadStats,
    request_id: u16,
    peer: SocketAddr,
) {
    let total = out.len();
    let framed = udp::frame_reply_from(
        request_id,
        total,
        |payload| out.read_into(payload),
        |d| {
            // A full socket buffer drops the datagram, as UDP may.
            if let Ok(k) = sock.send_to(d, peer) {
                stats.bytes_written.add(k as u64);
            }
        },
    );
    if !framed {
        tracing::debug!("udp reply of {total} bytes too large to frame");
        out.clear();
    }
}
