//! The store's maintenance thread: idle, or told `-o no_lru_maintainer`, it costs the
//! server a few wake-ups a second; while requests arrive and the machine's CPUs have time
//! to spare it ticks every millisecond, as memcached's LRU maintainer does
//! (docs/threads.md). Measured from outside, through the thread's context switches in
//! /proc and the machine's idle time in /proc/stat, never timed; the server runs on a free
//! loopback port and is killed by a Drop guard.
mod common;

use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::{cpu_jiffies, free_port, memfabricd, request, Server};

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
    let mut ops = 0u64;
    while Instant::now() < until && ops < 400_000 {
        let key = format!("c{client}k{}", ops % 1000);
        let (req, end): (String, &[u8]) = if ops.is_multiple_of(2) {
            (format!("set {key} 0 0 5\r\nhello\r\n"), b"STORED\r\n")
        } else {
            (format!("get {key}\r\n"), b"END\r\n")
        };
        request(&mut c, &req, end);
        ops += 1;
    }
    ops
}

/// What the maintenance thread did while `clients` connections each sent requests one at
/// a time for 2.5 s: its wake-ups a second, the requests answered, and the share of the
/// machine's CPU time that was idle meanwhile.
fn wakeups_under_load(server: &Server, port: u16, clients: usize) -> (f64, u64, f64) {
    let pid = server.child.id();
    let tid = thread_named(pid, "mf-maintenance");
    let before = sleeps(pid, tid);
    let (idle0, total0) = cpu_jiffies();
    let start = Instant::now();
    let until = start + Duration::from_millis(2500);
    let threads: Vec<_> = (0..clients)
        .map(|i| std::thread::spawn(move || set_and_get(port, i, until)))
        .collect();
    let ops: u64 = threads.into_iter().map(|c| c.join().unwrap()).sum();
    let woke = sleeps(pid, tid) - before;
    let seconds = start.elapsed().as_secs_f64();
    let (idle1, total1) = cpu_jiffies();
    let idle_share = (idle1 - idle0) as f64 / (total1 - total0).max(1) as f64;
    (woke as f64 / seconds, ops, idle_share)
}

/// Told `-o no_lru_maintainer`, the thread does not tick under load: it wakes every
/// 100 ms (to read the machine's idle share, which decides the busy tick) and just after each
/// new second, about 11 times a second.
#[test]
fn without_the_lru_maintainer_the_thread_wakes_a_few_times_a_second_under_load() {
    let port = free_port();
    let server = Server::spawn(
        memfabricd(port).args(["-t", "2", "-o", "no_lru_maintainer"]),
        port,
    );
    let (per_second, ops, idle) = wakeups_under_load(&server, port, 2);
    assert!(ops > 1000, "only {ops} requests were answered");
    assert!(
        per_second <= 20.0,
        "the maintenance thread woke {per_second:.0} times a second while {ops} requests \
         were answered ({:.0}% of the CPUs idle), {}",
        idle * 100.0,
        server.state()
    );
}

/// With no requests the thread does not tick, whatever the CPUs do.
#[test]
fn an_idle_server_wakes_a_few_times_a_second() {
    let port = free_port();
    let server = Server::spawn(memfabricd(port).args(["-t", "2"]), port);
    let pid = server.child.id();
    let tid = thread_named(pid, "mf-maintenance");
    let before = sleeps(pid, tid);
    let start = Instant::now();
    // Not a timing: the count of wake-ups over whatever time passes.
    std::thread::sleep(Duration::from_millis(2000));
    let per_second = (sleeps(pid, tid) - before) as f64 / start.elapsed().as_secs_f64();
    assert!(
        per_second <= 20.0,
        "an idle server's maintenance thread woke {per_second:.0} times a second, {}",
        server.state()
    );
}

/// One connection's requests, one at a time, leave CPU to spare (about half of two CPUs
/// here): the thread ticks as memcached's maintainer does, hundreds of times a second.
/// On a machine too busy for that (another job's build) the idle share says so, and the
/// tick is rightly off: then only the count is reported. The workers' own polling for
/// requests is off (`--tcp-poll-us 0`), so that the idle share read here is the one the
/// thread goes by (it counts that polling as idle; tests/tcp_poll.rs).
#[test]
fn with_cpu_to_spare_the_thread_ticks_while_requests_arrive() {
    let port = free_port();
    let server = Server::spawn(
        memfabricd(port).args(["-t", "2", "--tcp-poll-us", "0"]),
        port,
    );
    let (per_second, ops, idle) = wakeups_under_load(&server, port, 1);
    eprintln!(
        "maintenance wake-ups: {per_second:.0} a second, {ops} requests, {:.0}% of the CPUs idle",
        idle * 100.0
    );
    assert!(ops > 1000, "only {ops} requests were answered");
    if idle >= 0.45 {
        assert!(
            per_second >= 50.0,
            "with {:.0}% of the CPUs idle the maintenance thread woke only {per_second:.0} \
             times a second while {ops} requests were answered, {}",
            idle * 100.0,
            server.state()
        );
    }
    // memcached's `stats` and `stats settings` say the maintainer runs.
    let mut c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
    c.set_read_timeout(Some(common::WAIT)).unwrap();
    let stats = |c: &mut TcpStream, cmd: &str| request(c, cmd, b"END\r\n");
    assert!(stats(&mut c, "stats settings\r\n").contains("STAT lru_maintainer_thread yes\r\n"));
    let juggles: u64 = stats(&mut c, "stats\r\n")
        .lines()
        .find_map(|l| l.strip_prefix("STAT lru_maintainer_juggles "))
        .and_then(|n| n.parse().ok())
        .expect("lru_maintainer_juggles");
    assert!(juggles > 0);
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
