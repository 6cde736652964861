//! The store's maintenance thread costs the server a few wake-ups a second, loaded or
//! idle: it does not tick with the requests. Measured from outside, through the thread's
//! context switches in /proc, never timed; the server runs on a free loopback port and is
//! killed by a Drop guard.
mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{free_port, memfabricd, Server};

/// The thread's id, by the name the store gives it. The server's port may answer before
/// the thread has its name (CI once looked too early): looked for again for a while.
fn thread_named(pid: u32, name: &str) -> u32 {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).expect("the server's threads");
        let found = tasks
            .filter_map(|t| t.ok())
            .find(|t| {
                std::fs::read_to_string(t.path().join("comm")).is_ok_and(|comm| comm.trim() == name)
            })
            .and_then(|t| t.file_name().to_str()?.parse().ok());
        match found {
            Some(tid) => return tid,
            None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(10)),
            None => panic!("no thread {name} in {pid}"),
        }
    }
}

/// How often the thread has gone to sleep: its voluntary context switches. (Its
/// involuntary ones are other threads taking the CPU from it.)
fn sleeps(pid: u32, tid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status"))
        .expect("the thread's status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("voluntary_ctxt_switches")
}

/// Sets and gets over one connection until `until` (bounded by an op count too), each
/// request answered before the next; returns the requests made.
fn set_and_get(port: u16, client: usize, until: Instant) -> u64 {
    let mut c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    c.set_read_timeout(Some(common::WAIT)).unwrap();
    let mut buf = [0u8; 4096];
    let mut ops = 0u64;
    while Instant::now() < until && ops < 400_000 {
        let key = format!("c{client}k{}", ops % 1000);
        let (req, end): (String, &[u8]) = if ops.is_multiple_of(2) {
            (format!("set {key} 0 0 5\r\nhello\r\n"), b"STORED\r\n")
        } else {
            (format!("get {key}\r\n"), b"END\r\n")
        };
        c.write_all(req.as_bytes()).unwrap();
        let mut got = Vec::new();
        while !got.ends_with(end) {
            let n = c.read(&mut buf).expect("a reply");
            assert!(n > 0, "the server closed the connection");
            got.extend_from_slice(&buf[..n]);
        }
        ops += 1;
    }
    ops
}

#[test]
fn the_maintenance_thread_wakes_a_few_times_a_second_under_load() {
    let port = free_port();
    let server = Server::spawn(memfabricd(port).args(["-t", "2"]), port);
    let pid = server.child.id();
    let tid = thread_named(pid, "mf-maintenance");

    let before = sleeps(pid, tid);
    let start = Instant::now();
    let until = start + Duration::from_millis(2500);
    let clients: Vec<_> = (0..2)
        .map(|i| std::thread::spawn(move || set_and_get(port, i, until)))
        .collect();
    let ops: u64 = clients.into_iter().map(|c| c.join().unwrap()).sum();
    let woke = sleeps(pid, tid) - before;
    let seconds = start.elapsed().as_secs_f64();

    // It wakes every 250 ms and just after each new second: about 5 times a second. A
    // thread that ticked every millisecond while requests arrive (as memcached's LRU
    // maintainer, and this one until 2026-11-28) would show hundreds a second here.
    assert!(ops > 1000, "only {ops} requests were answered");
    let per_second = woke as f64 / seconds;
    assert!(
        per_second <= 20.0,
        "the maintenance thread slept {woke} times in {seconds:.2} s while {ops} \
         requests were answered: {per_second:.0} a second, {}",
        server.state()
    );
}

/// The thread's scheduling policy and priority, as /proc/PID/task/TID/sched gives them.
fn policy_and_prio(pid: u32, tid: u32) -> (u32, u32) {
    let sched = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/sched"))
        .expect("the thread's scheduling state");
    let field = |name: &str| {
        sched
            .lines()
            .find(|l| l.split(':').next().is_some_and(|k| k.trim() == name))
            .and_then(|l| l.rsplit(':').next()?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {sched}"))
    };
    (field("policy"), field("prio"))
}

/// The thread runs in the normal class at the server's priority: demoted (`SCHED_IDLE`,
/// or nice 19), it got so little of a busy CPU that a killed server stayed a zombie, its
/// ports bound, until the CPUs went idle (docs/benchmarks.md).
#[test]
fn the_maintenance_thread_is_not_demoted_so_a_killed_server_exits_under_load() {
    let port = free_port();
    let server = Server::spawn(memfabricd(port).args(["-t", "2"]), port);
    let pid = server.child.id();
    let maintenance = thread_named(pid, "mf-maintenance");
    let worker = thread_named(pid, "mf-worker-0");
    let (policy, prio) = policy_and_prio(pid, maintenance);
    // SCHED_OTHER is 0 (SCHED_IDLE 5); the worker's priority is the process's.
    assert_eq!(policy, 0, "mf-maintenance's policy, {}", server.state());
    assert_eq!(
        prio,
        policy_and_prio(pid, worker).1,
        "mf-maintenance's priority"
    );
}
