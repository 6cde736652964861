//! `memfabric`: a command-line client for memcached and memfabricd pools.
//!
//! Exit codes: 0 = done (hit, stored, deleted, all servers answered), 1 = miss / not found,
//! 2 = error (including a server that is down, and bad usage), 3 = done, but a server of a
//! replicated pool missed a write or delete and could not be told to drop its old copy
//! before the tool exited (a warning names it): it may serve that copy once it answers
//! again, until the key is written or deleted again through the pool.

use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use memfabric_client::{Client, Config, Distribution, KeyHash};

mod bb;

#[derive(Parser)]
#[command(name = "memfabric", version, about = "memcached / memfabricd client")]
struct Cli {
    /// Servers: `[tcp://]host[:port[:weight]]`, separated by commas (required). Like
    /// every option here, it may come before or after the command
    /// (`memfabric bb mount DIR --servers LIST` as well).
    #[arg(global = true, long, short = 's', env = "MEMFABRIC_SERVERS")]
    servers: Option<String>,
    /// Deadline of each request to a server, in milliseconds (at least 1). A replicated
    /// or coded read that fails over asks the next copies after it, each with its own.
    #[arg(global = true, long, default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,
    /// Key distribution (libmemcached's): weighted ketama, or plain ketama.
    #[arg(global = true, long, value_enum, default_value_t = Dist::Weighted)]
    distribution: Dist,
    /// Hash of plain ketama: md5, or libmemcached's default (one-at-a-time).
    #[arg(global = true, long, value_enum, default_value_t = Hash::Md5)]
    hash: Hash,
    /// How GETs reach ucx:// servers: one-sided RMA reads where the transport reads
    /// natively (auto), always (one-sided), or never (two-sided).
    #[arg(global = true, long, default_value = "auto")]
    get_mode: memfabric_client::GetMode,
    /// After the command, print the client's counters to standard error: how the GETs
    /// were served (one-sided hits, fallbacks) and, for a replicated pool, copies written,
    /// reads failed over, repairs, hints.
    #[arg(global = true, long)]
    counters: bool,
    /// Keep R more copies of every key on the next distinct servers along the ring
    /// (docs/resilience.md).
    #[arg(global = true, long, default_value_t = 0)]
    replicas: u8,
    /// How many copies must acknowledge a write: all, quorum (a majority), or one (the
    /// others finish in the background).
    #[arg(global = true, long, default_value = "quorum")]
    write_policy: memfabric_client::WritePolicy,
    /// Read a replicated key from a random copy instead of the primary first.
    #[arg(global = true, long)]
    randomize_reads: bool,
    /// Erasure-code values of --ec-threshold bytes or more with RS(K, M): K+M fragments
    /// on K+M servers, any K of which give the value back (for example 4+2).
    #[arg(global = true, long)]
    ec: Option<memfabric_client::EcGeometry>,
    /// The smallest value that is erasure coded, in bytes.
    #[arg(global = true, long, default_value_t = 16 * 1024)]
    ec_threshold: usize,
    /// A user of the servers' -Y file (memcached's ascii authentication; the UCX bootstrap
    /// asks for the same credentials).
    #[arg(global = true, long, env = "MEMFABRIC_USERNAME", requires = "password")]
    username: Option<String>,
    /// That user's password (better given in MEMFABRIC_PASSWORD than on the command line).
    #[arg(
        global = true,
        long,
        env = "MEMFABRIC_PASSWORD",
        hide_env_values = true,
        requires = "username"
    )]
    password: Option<String>,
    /// Bytes per second a repair may read and write together (0 = unbounded).
    #[arg(global = true, long, default_value_t = 32 << 20)]
    repair_bandwidth: u64,
    /// Speak TLS to the (tcp) servers: those started with -Z.
    #[arg(global = true, long)]
    tls: bool,
    /// PEM CA certificates that sign the servers' certificates (default: the system's).
    #[arg(global = true, long, value_name = "FILE", requires = "tls")]
    tls_ca: Option<std::path::PathBuf>,
    /// PEM client certificate (for servers with ssl_verify_mode), with --tls-key.
    #[arg(global = true, long, value_name = "FILE", requires_all = ["tls", "tls_key"])]
    tls_cert: Option<std::path::PathBuf>,
    /// PEM key of --tls-cert.
    #[arg(global = true, long, value_name = "FILE", requires_all = ["tls", "tls_cert"])]
    tls_key: Option<std::path::PathBuf>,
    /// The name the servers' certificates carry (default: each server's host).
    #[arg(global = true, long, value_name = "NAME", requires = "tls")]
    tls_server_name: Option<String>,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Clone, Copy, ValueEnum)]
enum Dist {
    Weighted,
    Ketama,
}

#[derive(Clone, Copy, ValueEnum)]
enum Hash {
    Md5,
    Default,
}

#[derive(Subcommand)]
enum Cmd {
    /// Print the value raw to stdout (exit 1 on a miss).
    Get { key: String },
    /// Store a value (`-` reads it from stdin).
    Set {
        key: String,
        value: String,
        #[arg(long, default_value_t = 0)]
        flags: u32,
        #[arg(long, default_value_t = 0)]
        exptime: u32,
    },
    /// Delete a key (exit 1 if not found).
    Delete { key: String },
    /// `stats [group]` of every server.
    Stats { group: Option<String> },
    /// The version of every server (exit 2 if any is down).
    Ping,
    /// Print the server each key maps to, one `KEY SERVER` line per key (with
    /// `--replicas`, every copy's server, primary first; with `--ec`, a coded value's
    /// k+m servers, fragment 0's first, whose first max(R, M)+1 hold a value under the
    /// threshold).
    Locate {
        #[arg(required = true)]
        keys: Vec<String>,
    },
    /// The burst buffer: files over the pool, a FUSE mount, and flushes to a backing
    /// directory (docs/burst-buffer.md).
    Bb(bb::BbArgs),
    /// Refill SERVER (as written in --servers) from the pool's other servers after it
    /// restarted empty: what a replicated or coded pool does by itself in the background
    /// when it sees a restart (docs/resilience.md). Prints progress to standard error;
    /// exit 0 when done, 1 when another client is repairing it (or just did), 2 when the
    /// repair failed or could not list some other server's keys (it says which).
    Repair {
        server: String,
        /// Repair even if another client holds the claim or finished a repair of this
        /// run of the server in the last ten minutes.
        #[arg(long)]
        force: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // Global (so that it may follow the command), hence not required by clap itself.
    let Some(servers) = cli.servers.clone() else {
        Cli::command()
            .error(
                clap::error::ErrorKind::MissingRequiredArgument,
                "the following required argument was not provided: --servers <SERVERS> (or MEMFABRIC_SERVERS)",
            )
            .exit();
    };
    let timeout = Duration::from_millis(cli.timeout);
    let config = Config {
        timeout,
        connect_timeout: timeout,
        distribution: match (cli.distribution, cli.hash) {
            (Dist::Weighted, _) => Distribution::KetamaWeighted,
            (Dist::Ketama, Hash::Md5) => Distribution::Ketama(KeyHash::Md5),
            (Dist::Ketama, Hash::Default) => Distribution::Ketama(KeyHash::OneAtATime),
        },
        get_mode: cli.get_mode,
        replicas: cli.replicas,
        write_policy: cli.write_policy,
        randomize_reads: cli.randomize_reads,
        ec: cli.ec,
        ec_threshold: cli.ec_threshold,
        repair_bandwidth: cli.repair_bandwidth,
        credentials: cli
            .username
            .zip(cli.password)
            .map(|(username, password)| memfabric_client::Credentials { username, password }),
        tls: cli.tls.then_some(memfabric_client::TlsConfig {
            ca_file: cli.tls_ca,
            cert_file: cli.tls_cert,
            key_file: cli.tls_key,
            server_name: cli.tls_server_name,
        }),
        ..Config::default()
    };
    let counters = cli.counters;
    if let Cmd::Bb(args) = cli.cmd {
        return match bb::run(&servers, config, args) {
            Ok(code) => ExitCode::from(code),
            // A reader that stopped reading (`| head`) is not an error of ours.
            Err(e) if broken_pipe(e.as_ref()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("memfabric: {e}");
                ExitCode::from(2)
            }
        };
    }
    let mut client = match Client::new(servers.as_str(), config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("memfabric: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(g) = client.config().ec {
        let n = client.servers().len();
        if n < usize::from(g.k) + usize::from(g.m) {
            eprintln!(
                "memfabric: warning: --ec {g} spreads a value over {} servers; over {n}, \
                 every value is kept whole on {} (docs/resilience.md)",
                usize::from(g.k) + usize::from(g.m),
                copies_of_plain(client.config()).min(n)
            );
        }
    }
    let result = run(&mut client, cli.cmd);
    // A replicated write answered at its quorum, or a read repair, may still be on its
    // way.
    client.drain(timeout);
    // Deletes of copies that missed a write, owed to servers that could not take them:
    // this process is the only one that knows, and it is about to exit.
    let stale = client.hints_outstanding();
    for (server, keys, flush) in &stale {
        let what = if *flush {
            "a flush (too many of its copies missed writes)".to_string()
        } else {
            format!("deletes of {keys} key(s) whose write or delete it missed")
        };
        eprintln!(
            "memfabric: warning: {server} could not be sent {what} before exit; once it \
             answers again it may serve the old copies, until the keys are written or \
             deleted again through this pool"
        );
    }
    if counters {
        for (name, value) in client.transport_counters() {
            eprintln!("{name} {value}");
        }
        if client.config().replicas > 0 || client.config().ec.is_some() {
            for (name, value) in client.pool_counters().pairs() {
                eprintln!("{name} {value}");
            }
            for (name, value) in client.repair_counters().pairs() {
                eprintln!("{name} {value}");
            }
        }
    }
    match result {
        Ok(0) if !stale.is_empty() => ExitCode::from(3),
        Ok(code) => ExitCode::from(code),
        Err(e) if broken_pipe(e.as_ref()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("memfabric: {e}");
            ExitCode::from(2)
        }
    }
}

fn broken_pipe(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<std::io::Error>()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
}

fn run(client: &mut Client, cmd: Cmd) -> Result<u8, Box<dyn std::error::Error>> {
    let mut out = std::io::stdout().lock();
    match cmd {
        // A pool without --ec or --replicas that meets a fragment of a coded value reads
        // the value whole (the library's get does): never a fragment's bytes.
        Cmd::Get { key } => match client.get(key.as_bytes())? {
            Some(v) => {
                out.write_all(&v.data)?;
                out.flush()?;
                Ok(0)
            }
            None => Ok(1),
        },
        Cmd::Set {
            key,
            value,
            flags,
            exptime,
        } => {
            let data = if value == "-" {
                let mut buf = Vec::new();
                std::io::stdin().read_to_end(&mut buf)?;
                buf
            } else {
                value.into_bytes()
            };
            let acks = client.set_acked(key.as_bytes(), &data, flags, exptime)?;
            if acks.copies > 1 {
                // The policy's copies acknowledged; the rest are given the time of a
                // request to land before the tool exits.
                let timeout = client.config().timeout;
                client.drain(timeout);
                eprintln!(
                    "acknowledged by {} of {} copies before the answer",
                    acks.acked, acks.copies
                );
            }
            Ok(0)
        }
        Cmd::Delete { key } => Ok(if client.delete(key.as_bytes())? { 0 } else { 1 }),
        Cmd::Stats { group } => {
            let mut code = 0;
            for (server, r) in client.stats(group.as_deref()) {
                match r {
                    Ok(stats) => {
                        writeln!(out, "{server}")?;
                        for (k, v) in stats {
                            writeln!(out, "  STAT {k} {v}")?;
                        }
                    }
                    Err(e) => {
                        writeln!(out, "{server}")?;
                        eprintln!("memfabric: {server}: {e}");
                        code = 2;
                    }
                }
            }
            Ok(code)
        }
        Cmd::Ping => {
            let mut code = 0;
            for (server, r) in client.version() {
                match r {
                    Ok(v) => writeln!(out, "{server} VERSION {v}")?,
                    Err(e) => {
                        writeln!(out, "{server} DOWN {e}")?;
                        code = 2;
                    }
                }
            }
            Ok(code)
        }
        Cmd::Locate { keys } => {
            for key in keys {
                // A coded value's k + m servers (the first of them hold a value under the
                // threshold), when the pool has that many; otherwise where it keeps
                // every value whole.
                let cfg = client.config();
                let coded = cfg.ec.map_or(0, |g| usize::from(g.k) + usize::from(g.m));
                let plain = copies_of_plain(cfg);
                let n = if client.servers().len() >= coded {
                    plain.max(coded)
                } else {
                    plain
                };
                let homes = client.locate_successors(key.as_bytes(), n);
                if homes.is_empty() {
                    return Err("no servers".into());
                }
                let names: Vec<String> = homes.iter().map(|a| a.host_port()).collect();
                writeln!(out, "{key} {}", names.join(" "))?;
            }
            Ok(0)
        }
        Cmd::Repair { server, force } => repair(client, &server, force),
        Cmd::Bb(_) => unreachable!("run before the client is made"),
    }
}

/// Servers a value kept whole is on: `replicas + 1`, and with a code at least `m + 1`
/// (as the pool does: small values survive the same m failures).
fn copies_of_plain(cfg: &Config) -> usize {
    usize::from(cfg.replicas.max(cfg.ec.map_or(0, |g| g.m))) + 1
}

/// `repair SERVER`: runs the pool's repair of SERVER in the foreground, a progress line
/// a second.
fn repair(
    client: &mut Client,
    server: &str,
    force: bool,
) -> Result<u8, Box<dyn std::error::Error>> {
    let wanted = memfabric_client::ServerAddr::parse(server)?;
    let index = client
        .servers()
        .iter()
        .position(|a| a.host_port() == wanted.host_port())
        .ok_or_else(|| format!("{server} is not one of --servers"))?;
    client.repair(index, force)?;
    let started = std::time::Instant::now();
    let mut last = started;
    while client.repairs_running() > 0 {
        std::thread::sleep(Duration::from_millis(100));
        if last.elapsed() >= Duration::from_secs(1) {
            last = std::time::Instant::now();
            let c = client.repair_counters();
            eprintln!(
                "repair {server}: {} keys, {} written, {} MiB, {:.0} s",
                c.repair_keys_scanned,
                c.repair_copies_written,
                c.repair_bytes >> 20,
                started.elapsed().as_secs_f64()
            );
        }
    }
    let c = client.repair_counters();
    if let Some(p) = client.repair_problem() {
        eprintln!("memfabric: {p}");
    }
    eprintln!(
        "repair {server}: {} keys, {} written, {} already there, {} skipped, {} undone, \
         {} bytes in {:.1} s",
        c.repair_keys_scanned,
        c.repair_copies_written,
        c.repair_already_present,
        c.repair_skipped,
        c.repair_undone,
        c.repair_bytes,
        started.elapsed().as_secs_f64()
    );
    Ok(if c.repairs_finished > 0 {
        0
    } else if c.repairs_left_to_others > 0 {
        eprintln!("repair {server}: another client holds the repair claim (or finished one)");
        1
    } else {
        2
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        // clap's own checks (names given twice, a global option that a verb also has,
        // ...), which otherwise run only in debug builds.
        Cli::command().debug_assert();
    }

    #[test]
    fn a_zero_timeout_is_refused() {
        // It failed every request at once ("timed out"), each server reported DOWN.
        let zero = Cli::try_parse_from(["memfabric", "-s", "h:1", "--timeout", "0", "ping"]);
        assert!(zero.is_err());
        assert!(Cli::try_parse_from(["memfabric", "-s", "h:1", "--timeout", "1", "ping"]).is_ok());
    }

    #[test]
    fn options_may_come_before_or_after_the_verb() {
        let before = Cli::try_parse_from([
            "memfabric",
            "--servers",
            "h:1",
            "--ec",
            "4+2",
            "bb",
            "--backing",
            "/p",
            "mount",
            "/m",
        ])
        .unwrap();
        let after = Cli::try_parse_from([
            "memfabric",
            "bb",
            "mount",
            "/m",
            "--backing",
            "/p",
            "--servers",
            "h:1",
            "--ec",
            "4+2",
        ])
        .unwrap();
        for cli in [before, after] {
            assert_eq!(cli.servers.as_deref(), Some("h:1"));
            assert!(cli.ec.is_some());
            let Cmd::Bb(args) = cli.cmd else {
                panic!("not bb")
            };
            assert_eq!(args.backing(), Some(std::path::Path::new("/p")));
        }
    }
}
