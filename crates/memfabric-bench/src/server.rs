//! Servers the bench starts itself (for `compare`): memcached and memfabricd with the same
//! flags on free loopback ports, killed when dropped.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum ServerError {
    #[error("no free loopback port: {0}")]
    NoPort(std::io::Error),
    #[error("cannot start {path}: {source}")]
    Spawn {
        path: String,
        source: std::io::Error,
    },
    #[error("{name} exited during startup ({status}); see {log}")]
    Exited {
        name: String,
        status: String,
        log: String,
    },
    #[error(
        "memfabricd not found (looked {searched}): build it with \
         `cargo build --release -p memfabric-server`, or pass --memfabricd PATH"
    )]
    NotFound { searched: String },
    #[error("{name} did not answer `version` on {addr} within {secs}s; see {log}")]
    NotReady {
        name: String,
        addr: SocketAddr,
        secs: u64,
        log: String,
    },
}

/// Where [`locate_memfabricd`] found the server binary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// Named on the command line.
    Given,
    /// In the directory of the running `memfabric-bench` (both built by one cargo build).
    NextToBench,
    /// The first `memfabricd` on `PATH`.
    OnPath,
    /// `target/release/memfabricd` under the current directory (the repository root).
    RepositoryBuild,
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Origin::Given => "as given",
            Origin::NextToBench => "next to memfabric-bench",
            Origin::OnPath => "on PATH",
            Origin::RepositoryBuild => "the repository's release build",
        })
    }
}

/// The relative path `compare` used to assume (valid from the repository root).
pub const REPOSITORY_BUILD: &str = "target/release/memfabricd";

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Find memfabricd: `given` if any (it must exist); else next to the running executable,
/// then on `PATH`, then [`REPOSITORY_BUILD`] relative to the current directory.
pub fn locate_memfabricd(given: Option<&Path>) -> Result<(PathBuf, Origin), ServerError> {
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf));
    locate_in(
        given,
        exe_dir.as_deref(),
        std::env::var_os("PATH").as_deref(),
    )
}

/// [`locate_memfabricd`] with its inputs named (testable without touching the process's
/// environment).
pub fn locate_in(
    given: Option<&Path>,
    exe_dir: Option<&Path>,
    path_var: Option<&std::ffi::OsStr>,
) -> Result<(PathBuf, Origin), ServerError> {
    if let Some(p) = given {
        return if is_executable(p) {
            Ok((p.to_path_buf(), Origin::Given))
        } else {
            Err(ServerError::NotFound {
                searched: format!("at {} (--memfabricd)", p.display()),
            })
        };
    }
    let mut searched = Vec::new();
    if let Some(dir) = exe_dir {
        let p = dir.join("memfabricd");
        if is_executable(&p) {
            return Ok((p, Origin::NextToBench));
        }
        searched.push(format!("next to memfabric-bench in {}", dir.display()));
    }
    if let Some(path) = path_var {
        for dir in std::env::split_paths(path) {
            let p = dir.join("memfabricd");
            if is_executable(&p) {
                return Ok((p, Origin::OnPath));
            }
        }
        searched.push("on PATH".into());
    }
    let p = PathBuf::from(REPOSITORY_BUILD);
    if is_executable(&p) {
        // Absolute, so that reports say which binary ran.
        let p = std::fs::canonicalize(&p).unwrap_or(p);
        return Ok((p, Origin::RepositoryBuild));
    }
    searched.push(format!("at {REPOSITORY_BUILD} under {}", cwd_display()));
    Err(ServerError::NotFound {
        searched: searched.join(", "),
    })
}

fn cwd_display() -> String {
    std::env::current_dir().map_or_else(
        |_| "the current directory".into(),
        |d| d.display().to_string(),
    )
}

/// How to start one server.
#[derive(Clone, Debug)]
pub struct ServerSpec {
    /// Label in reports ("memcached", "memfabricd").
    pub name: String,
    pub path: PathBuf,
    /// Worker threads (`-t`).
    pub threads: usize,
    /// Memory limit in MB (`-m`).
    pub memory_mb: usize,
    /// Anything else, appended as given.
    pub extra_args: Vec<String>,
}

/// A running server; killed (and reaped) on drop.
pub struct ServerProcess {
    pub name: String,
    pub addr: SocketAddr,
    /// The UCX bootstrap port it was given ([`ServerSpec::start_with_ucx_port`]).
    pub ucx_port: Option<u16>,
    pub log: PathBuf,
    child: Child,
    /// Answered `version`: startup succeeded.
    started: bool,
}

const STARTUP: Duration = Duration::from_secs(15);

/// A port on 127.0.0.1 that was free a moment ago. Another process could take it before the
/// server binds; startup then fails loudly rather than measuring the wrong server.
pub fn free_port() -> Result<u16, ServerError> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(ServerError::NoPort)?;
    Ok(l.local_addr().map_err(ServerError::NoPort)?.port())
}

fn running_as_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .map(|l| l.split_whitespace().nth(1) == Some("0"))
        })
        .unwrap_or(false)
}

impl ServerSpec {
    /// The command line: memcached's flags, which memfabricd accepts too.
    pub fn args(&self, port: u16) -> Vec<String> {
        let mut a: Vec<String> = vec![
            "-p".into(),
            port.to_string(),
            "-U".into(),
            "0".into(),
            "-l".into(),
            "127.0.0.1".into(),
            "-t".into(),
            self.threads.to_string(),
            "-m".into(),
            self.memory_mb.to_string(),
            "-c".into(),
            "4096".into(),
        ];
        // memcached refuses to run as root unless told which user to be; memfabricd accepts
        // the same flag, and both servers get the same command line.
        if running_as_root() {
            a.push("-u".into());
            a.push("root".into());
        }
        a.extend(self.extra_args.iter().cloned());
        a
    }

    /// The command line as shown in reports (the port is chosen at start).
    pub fn display_args(&self) -> String {
        let mut a = self.args(0);
        if let Some(p) = a.get_mut(1) {
            *p = "<port>".into();
        }
        format!("{} {}", self.path.display(), a.join(" "))
    }

    /// Start on a free port and wait until it answers `version`.
    pub fn start(&self) -> Result<ServerProcess, ServerError> {
        self.start_on_free_ports(false)
    }

    /// [`ServerSpec::start`] with a free `--ucx-port` of its own (memfabricd only), never
    /// the TCP port; [`ServerProcess::ucx_port`] says which. `extra_args` must not name one.
    pub fn start_with_ucx_port(&self) -> Result<ServerProcess, ServerError> {
        self.start_on_free_ports(true)
    }

    fn start_on_free_ports(&self, ucx: bool) -> Result<ServerProcess, ServerError> {
        // A port is free only when chosen: another process may bind it before the server
        // does, which then exits saying so (memfabricd refuses a taken --ucx-port as
        // memcached refuses a taken -p). Other ports are tried then, a few times.
        const ATTEMPTS: usize = 4;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let (port, ucx_port) = if ucx {
                let [tcp, ucx] = free_ports::<2>()?;
                (tcp, Some(ucx))
            } else {
                (free_port()?, None)
            };
            match self.start_on(port, ucx_port) {
                Err(ServerError::Exited { log, .. })
                    if attempt < ATTEMPTS && said_port_in_use(Path::new(&log)) => {}
                started => return started,
            }
        }
    }

    fn start_on(&self, port: u16, ucx_port: Option<u16>) -> Result<ServerProcess, ServerError> {
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let log = std::env::temp_dir().join(format!("memfabric-bench-{}-{port}.log", self.name));
        let spawn_err = |source| ServerError::Spawn {
            path: self.path.display().to_string(),
            source,
        };
        let log_file = std::fs::File::create(&log).map_err(spawn_err)?;
        let log_err = log_file.try_clone().map_err(spawn_err)?;
        let mut args = self.args(port);
        if let Some(p) = ucx_port {
            args.extend(["--ucx-port".to_string(), p.to_string()]);
        }
        let child = Command::new(&self.path)
            .args(args)
            .stdin(Stdio::null())
            .stdout(log_file)
            .stderr(log_err)
            .spawn()
            .map_err(spawn_err)?;
        let mut proc = ServerProcess {
            name: self.name.clone(),
            addr,
            ucx_port,
            log,
            child,
            started: false,
        };
        proc.wait_ready()?;
        proc.started = true;
        Ok(proc)
    }
}

/// Whether a server's log says it could not bind a port (memcached: "failed to listen on
/// TCP port P: Address already in use"; memfabricd names the address and flag).
fn said_port_in_use(log: &Path) -> bool {
    std::fs::read_to_string(log).is_ok_and(|l| l.contains("Address already in use"))
}

/// `N` distinct loopback ports that were free a moment ago (all held while choosing, so
/// none is chosen twice).
pub fn free_ports<const N: usize>() -> Result<[u16; N], ServerError> {
    let held = (0..N)
        .map(|_| TcpListener::bind("127.0.0.1:0").map_err(ServerError::NoPort))
        .collect::<Result<Vec<_>, _>>()?;
    let mut ports = [0u16; N];
    for (p, l) in ports.iter_mut().zip(&held) {
        *p = l.local_addr().map_err(ServerError::NoPort)?.port();
    }
    Ok(ports)
}

impl ServerProcess {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn wait_ready(&mut self) -> Result<(), ServerError> {
        let deadline = Instant::now() + STARTUP;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(ServerError::Exited {
                    name: self.name.clone(),
                    status: status.to_string(),
                    log: self.log.display().to_string(),
                });
            }
            if answers_version(self.addr) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Err(ServerError::NotReady {
            name: self.name.clone(),
            addr: self.addr,
            secs: STARTUP.as_secs(),
            log: self.log.display().to_string(),
        })
    }

    /// Stop the server now (also done on drop).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        self.stop();
        // The log only matters when startup failed (the error names it, and then no
        // ServerProcess is kept); after a normal run it is clutter in /tmp.
        if self.started {
            let _ = std::fs::remove_file(&self.log);
        }
    }
}

/// Whether something on `addr` answers `version\r\n` with `VERSION ...\r\n`.
pub fn answers_version(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(500)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(1000)));
    if s.write_all(b"version\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 128];
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                got += n;
                if buf[..got].ends_with(b"\r\n") {
                    break;
                }
            }
        }
    }
    buf[..got].starts_with(b"VERSION ")
}

/// The server's version string (for reports), if it answers.
pub fn version_of(path: &Path) -> Option<String> {
    let out = Command::new(path).arg("-V").output().ok()?;
    let s = String::from_utf8_lossy(&out.stdout).trim().to_string();
    (!s.is_empty()).then_some(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scratch directory with an executable (or not) `memfabricd` in it.
    fn dir_with(name: &str, executable: bool) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let d = std::env::temp_dir().join(format!("mfb-locate-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let bin = d.join("memfabricd");
        std::fs::write(&bin, "#!/bin/sh\n").unwrap();
        let mode = if executable { 0o755 } else { 0o644 };
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(mode)).unwrap();
        d
    }

    #[test]
    fn memfabricd_next_to_the_bench_wins_over_path() {
        let exe = dir_with("exe", true);
        let on_path = dir_with("path", true);
        let path = std::env::join_paths([&on_path]).unwrap();
        let (p, o) = locate_in(None, Some(&exe), Some(&path)).unwrap();
        assert_eq!((p, o), (exe.join("memfabricd"), Origin::NextToBench));
        for d in [exe, on_path] {
            let _ = std::fs::remove_dir_all(d);
        }
    }

    #[test]
    fn memfabricd_on_path_is_used_when_none_is_next_to_the_bench() {
        let empty = std::env::temp_dir().join(format!("mfb-locate-{}-none", std::process::id()));
        std::fs::create_dir_all(&empty).unwrap();
        let not_exec = dir_with("noexec", false);
        let on_path = dir_with("path2", true);
        let path = std::env::join_paths([&not_exec, &on_path]).unwrap();
        let (p, o) = locate_in(None, Some(&empty), Some(&path)).unwrap();
        assert_eq!((p, o), (on_path.join("memfabricd"), Origin::OnPath));
        for d in [empty, not_exec, on_path] {
            let _ = std::fs::remove_dir_all(d);
        }
    }

    #[test]
    fn a_given_memfabricd_must_exist() {
        let missing = Path::new("/nonexistent/memfabricd");
        let e = locate_in(Some(missing), None, None).unwrap_err();
        assert!(e.to_string().contains("/nonexistent/memfabricd"), "{e}");
        let d = dir_with("given", true);
        let (p, o) = locate_in(Some(&d.join("memfabricd")), None, None).unwrap();
        assert_eq!((p, o), (d.join("memfabricd"), Origin::Given));
        let _ = std::fs::remove_dir_all(d);
    }
}
