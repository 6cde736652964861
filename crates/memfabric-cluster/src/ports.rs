//! Loopback ports for tests that start servers.
//!
//! Why not "bind port 0 and close it": the kernel hands the same ephemeral port out again
//! soon after, to another test's probe or as the local port of an outgoing connection, so
//! two servers of concurrent tests could be given one port; the second cannot bind and
//! exits, and its test then talks to the first test's server until that one stops (the
//! "refused after it listened" flakes). The ports here come from below the kernel's
//! ephemeral range, each at most once per process, starting at an offset taken from the
//! process id so that test binaries running side by side start far apart.

use std::net::{TcpListener, UdpSocket};
use std::sync::atomic::{AtomicU32, Ordering};

/// The range handed out: [FIRST, FIRST + SPAN), below Linux's default ephemeral range
/// (32768-60999), so no outgoing connection takes one of these as its local port.
const FIRST: u32 = 20_000;
const SPAN: u32 = 12_000;

/// A port on 127.0.0.1 free for both TCP and UDP right now, never returned before by this
/// process (until the whole range has been handed out once).
pub fn free_loopback_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(u32::MAX);
    let _ = NEXT.compare_exchange(
        u32::MAX,
        start_offset(std::process::id()),
        Ordering::SeqCst,
        Ordering::SeqCst,
    );
    for _ in 0..SPAN {
        let port = (FIRST + NEXT.fetch_add(1, Ordering::SeqCst) % SPAN) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok()
            && UdpSocket::bind(("127.0.0.1", port)).is_ok()
        {
            return port;
        }
    }
    panic!("no free loopback port in {FIRST}..{}", FIRST + SPAN);
}

/// Where in the range a process starts: the pid times the golden ratio, modulo 1, so
/// that binaries started one after another (nearby pids) start thousands of ports apart.
/// (`pid % 500 * 20` started neighbours 20 ports apart, and two replication suites, each
/// taking over 100 ports, were handed the same ones.)
fn start_offset(pid: u32) -> u32 {
    ((f64::from(pid) * 0.618_033_988_749_895).fract() * f64::from(SPAN)) as u32 % SPAN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_with_nearby_pids_start_far_apart() {
        for pid in [1, 300, 4_000, 123_456, 4_194_000] {
            for next in 1..=20 {
                let (a, b) = (start_offset(pid), start_offset(pid + next));
                let apart = a.abs_diff(b).min(SPAN - a.abs_diff(b));
                assert!(apart >= 400, "pids {pid} and {}: {apart}", pid + next);
            }
        }
    }

    #[test]
    fn ports_are_not_handed_out_twice_and_are_free() {
        let ports: Vec<u16> = (0..200).map(|_| free_loopback_port()).collect();
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len());
        for p in ports {
            assert!((FIRST..FIRST + SPAN).contains(&(p as u32)));
        }
        // One of them really can be listened on.
        let p = free_loopback_port();
        TcpListener::bind(("127.0.0.1", p)).expect("the port is free");
    }
}
