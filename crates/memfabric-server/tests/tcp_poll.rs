//! The workers' poll for the next TCP request (`--tcp-poll-us`, docs/threads.md): with
//! CPU to spare a closed-loop client's requests are caught by it rather than waking a
//! sleeping worker; told 0 it never runs; and a server whose clients went quiet stops
//! polling and costs no CPU. Measured from outside, through `stats fabric`, the machine's
//! idle time in /proc/stat and the worker's CPU time in /proc, never timed; each server
//! runs on a free loopback port and is killed by a Drop guard.
mod common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{cpu_jiffies, free_port, memfabricd, request, Server};

fn connect(port: u16) -> TcpStream {
    let c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    c.set_read_timeout(Some(common::WAIT)).unwrap();
    c
}

/// Sets and gets over one connection, each answered before the next, until `until` or
/// `max_ops`; returns the requests made.
fn closed_loop(c: &mut TcpStream, until: Instant, max_ops: u64) -> u64 {
    let mut ops = 0u64;
    while Instant::now() < until && ops < max_ops {
        let key = format!("k{}", ops % 1000);
        if ops.is_multiple_of(2) {
            request(c, &format!("set {key} 0 0 5\r\nhello\r\n"), b"STORED\r\n");
        } else {
            request(c, &format!("get {key}\r\n"), b"END\r\n");
        }
        ops += 1;
    }
    ops
}

/// A `stats fabric` counter.
fn fabric(c: &mut TcpStream, name: &str) -> u64 {
    let reply = request(c, "stats fabric\r\n", b"END\r\n");
    reply
        .lines()
        .find_map(|l| l.strip_prefix(&format!("STAT {name} ")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {name} in {reply}"))
}

/// Microseconds since boot in which some runnable thread waited for a CPU (the `some`
/// line of /proc/pressure/cpu), where the kernel keeps it.
fn cpu_stall_us() -> Option<u64> {
    std::fs::read_to_string("/proc/pressure/cpu")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("some "))?
        .split_whitespace()
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}

/// CPU time (user + system, in 1/100 s) of the server's thread named `name`.
fn thread_cpu(pid: u32, name: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        for t in std::fs::read_dir(format!("/proc/{pid}/task"))
            .expect("the server's threads")
            .filter_map(|t| t.ok())
        {
            if !std::fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.trim() == name) {
                continue;
            }
            let stat = std::fs::read_to_string(t.path().join("stat")).expect("the thread's stat");
            // utime and stime are fields 14 and 15: 12 and 13 past the ")" after the name.
            let after = &stat[stat.rfind(')').expect("the name's end") + 2..];
            let f: Vec<u64> = after
                .split_whitespace()
                .skip(11)
                .take(2)
                .map(|n| n.parse().expect("a number"))
                .collect();
            return f[0] + f[1];
        }
        assert!(Instant::now() < deadline, "no thread {name} in {pid}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One client's requests, one at a time, on a machine with CPU to spare: the worker polls
/// after each reply and catches most of the next requests. The spare share is idle time
/// plus what the server's polls took, with few threads kept waiting for a CPU. On a
/// machine too busy for that (other jobs) the client itself may come too late for a
/// window, which then shrinks: only the counts are reported.
#[test]
fn with_cpu_to_spare_the_poll_catches_a_closed_loop_clients_requests() {
    let port = free_port();
    let server = Server::spawn(memfabricd(port).args(["-t", "1"]), port);
    let mut c = connect(port);
    let spins0 = fabric(&mut c, "tcp_poll_spins");
    let caught0 = fabric(&mut c, "tcp_poll_caught");
    let polled0 = fabric(&mut c, "tcp_poll_idle_us");
    let (idle0, total0) = cpu_jiffies();
    let (stall0, start) = (cpu_stall_us(), Instant::now());
    let ops = closed_loop(
        &mut c,
        Instant::now() + Duration::from_millis(2500),
        200_000,
    );
    let (idle1, total1) = cpu_jiffies();
    let stalled = match (cpu_stall_us(), stall0) {
        (Some(s1), Some(s0)) => (s1 - s0) as f64 / start.elapsed().as_micros() as f64,
        _ => 0.0,
    };
    let caught = fabric(&mut c, "tcp_poll_caught") - caught0;
    let spins = fabric(&mut c, "tcp_poll_spins") - spins0;
    let polled_jiffies = (fabric(&mut c, "tcp_poll_idle_us") - polled0) as f64 / 10_000.0;
    let total = (total1 - total0).max(1) as f64;
    let spare = (((idle1 - idle0) as f64 + polled_jiffies) / total).min(1.0);
    eprintln!(
        "{ops} requests, {caught} caught by {spins} polls, {:.0}% of the CPUs spare, \
         threads waiting for a CPU {:.0}% of the time",
        spare * 100.0,
        stalled * 100.0
    );
    assert!(ops > 1000, "only {ops} requests were answered");
    if spare >= 0.40 && stalled < 0.12 {
        assert!(
            caught * 2 >= ops,
            "with {:.0}% of the CPUs spare the poll caught only {caught} of {ops} requests \
             ({spins} polls), {}",
            spare * 100.0,
            server.state()
        );
    }
}

/// `--tcp-poll-us 0`: the worker sleeps after every reply; `stats fabric` says so.
#[test]
fn told_zero_a_worker_never_polls_for_tcp_requests() {
    let port = free_port();
    let server = Server::spawn(
        memfabricd(port).args(["-t", "1", "--tcp-poll-us", "0"]),
        port,
    );
    let mut c = connect(port);
    let ops = closed_loop(&mut c, Instant::now() + Duration::from_secs(30), 4000);
    assert_eq!(ops, 4000);
    assert_eq!(fabric(&mut c, "tcp_poll_us"), 0);
    for counter in ["tcp_poll_spins", "tcp_poll_caught", "tcp_poll_idle_us"] {
        assert_eq!(fabric(&mut c, counter), 0, "{counter}, {}", server.state());
    }
}

/// After a client's burst the poll runs out within its window: a server whose clients went
/// quiet (connections open) costs no CPU, and starts no poll without a request.
#[test]
fn a_server_whose_clients_went_quiet_stops_polling() {
    let port = free_port();
    let server = Server::spawn(memfabricd(port).args(["-t", "1"]), port);
    let pid = server.child.id();
    let mut c = connect(port);
    let mut quiet = connect(port);
    closed_loop(&mut c, Instant::now() + Duration::from_secs(30), 4000);
    let spins0 = fabric(&mut c, "tcp_poll_spins");
    let cpu0 = thread_cpu(pid, "mf-worker-0");
    // Not a timing: the CPU the worker used over whatever time passes.
    std::thread::sleep(Duration::from_secs(1));
    let cpu1 = thread_cpu(pid, "mf-worker-0");
    // One poll at most: after the `stats fabric` request above.
    assert!(
        fabric(&mut c, "tcp_poll_spins") <= spins0 + 2,
        "polls started without requests, {}",
        server.state()
    );
    // A polling worker burns close to 100 of these a second.
    assert!(
        cpu1 - cpu0 <= 10,
        "the worker used {} ticks of CPU in an idle second, {}",
        cpu1 - cpu0,
        server.state()
    );
    // Both connections are still served.
    request(&mut quiet, "get k1\r\n", b"END\r\n");
    request(&mut c, "get k1\r\n", b"END\r\n");
}
