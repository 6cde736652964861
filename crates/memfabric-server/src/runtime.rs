//! Start-up and shutdown: bind, detach, drop privileges, build the store, run the workers
//! and the accept loop, and clean up on SIGINT/SIGTERM or `shutdown`.
use std::io;
use std::sync::Arc;

use memfabric_store::Store;

use crate::exec::Shared;
use crate::net::{self, Listeners, NetError};
use crate::settings::Settings;
use crate::worker;

/// Why the server could not run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Net(#[from] NetError),
    #[error("failed to daemon() in order to daemonize: {0}")]
    Daemonize(nix::Error),
    #[error("cannot set up the store: {0}")]
    Store(io::Error),
    #[error("cannot start the runtime: {0}")]
    Io(#[from] io::Error),
}

/// Raise the open-file limit to fit `-c` connections (as memcached does) and what UCX
/// opens for the UCX sessions among them (up to two sockets each over its TCP transport),
/// and the core size limit for `-r`.
fn adjust_limits(settings: &Settings) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        let conns = settings.max_connections as u64;
        let ucx_sessions = if settings.ucx_port == 0 {
            0
        } else {
            u64::from(settings.ucx_max_clients).min(conns)
        };
        let want = conns.saturating_add(2 * ucx_sessions).saturating_add(64);
        if soft < want {
            let new_soft = want.min(hard);
            if setrlimit(Resource::RLIMIT_NOFILE, new_soft, hard).is_err() || new_soft < want {
                tracing::warn!(
                    "failed to set rlimit for open files to {want}; -c may not be reachable"
                );
            }
        }
    }
    if settings.enable_coredumps {
        if let Ok((_, hard)) = getrlimit(Resource::RLIMIT_CORE) {
            if setrlimit(Resource::RLIMIT_CORE, hard, hard).is_err() {
                tracing::warn!("failed to ensure corefile creation");
            }
        }
    }
}

/// `-u`: started as root, become `user` if it exists; otherwise say so and go on.
fn drop_privileges(settings: &Settings) {
    use nix::unistd::{geteuid, setgid, setgroups, setuid, User};
    if !geteuid().is_root() {
        return;
    }
    let Some(name) = settings.user.as_deref() else {
        tracing::info!("running as root without -u: not dropping privileges");
        return;
    };
    match User::from_name(name) {
        Ok(Some(u)) => {
            let ok = setgroups(&[u.gid]).is_ok() && setgid(u.gid).is_ok() && setuid(u.uid).is_ok();
            if !ok {
                tracing::warn!("failed to assume identity of user {name}");
            }
        }
        _ => tracing::warn!("can't find the user {name} to switch to; staying root"),
    }
}

/// As memcached: the pid goes to `<path>.tmp`, renamed to `path` (a reader never sees a
/// half-written file); a file that cannot be written is said and the server runs on.
fn write_pidfile(path: &str) {
    let tmp = format!("{path}.tmp");
    if let Err(e) = std::fs::write(&tmp, format!("{}\n", std::process::id())) {
        tracing::warn!("Could not open the pid file {tmp} for writing: {e}");
        return;
    }
    if let Err(e) = std::fs::rename(&tmp, path) {
        tracing::warn!("Could not rename the pid file from {tmp} to {path}: {e}");
        let _ = std::fs::remove_file(&tmp);
    }
}

/// Bind the sockets `settings` asks for (done before detaching, so errors reach the
/// terminal). With `MEMCACHED_PORT_FILENAME` set and no unix socket, the bound TCP and UDP
/// ports are written there as memcached writes them (test harnesses start servers with
/// `-p -1 -U -1` and read the ports back); a file that cannot be written is said, not fatal,
/// as in memcached.
pub fn bind(settings: &Settings) -> Result<Listeners, RunError> {
    let listeners = net::bind(settings)?;
    if settings.unix_socket.is_none() {
        if let Some(path) = std::env::var_os("MEMCACHED_PORT_FILENAME") {
            let path = std::path::PathBuf::from(path);
            if let Err(e) = net::write_port_file(&path, &listeners) {
                tracing::error!("Failed to write \"{}.lck\": {e}", path.display());
            }
        }
    }
    Ok(listeners)
}

/// Run the server until a signal or `shutdown`.
pub fn run(settings: Settings, mut listeners: Listeners) -> Result<(), RunError> {
    adjust_limits(&settings);
    if settings.daemonize {
        // Before any thread exists: fork keeps only the calling thread.
        nix::unistd::daemon(false, false).map_err(RunError::Daemonize)?;
    }
    if let Some(p) = &settings.pidfile {
        write_pidfile(p);
    }
    drop_privileges(&settings);
    if settings.lock_memory {
        use nix::sys::mman::{mlockall, MlockAllFlags};
        if let Err(e) = mlockall(MlockAllFlags::MCL_CURRENT | MlockAllFlags::MCL_FUTURE) {
            tracing::warn!("failed to lock down memory (mlockall): {e}; proceeding without");
        }
    }

    // Signals: handlers only write to a pipe; the accept loop reads it. SIGHUP is taken
    // so that it does not kill the server; as memcached's, it reads the `-Y` file again.
    let (sig_read, sig_write) = std::os::unix::net::UnixStream::pair()?;
    sig_read.set_nonblocking(true)?;
    sig_write.set_nonblocking(true)?;
    let sig_write2 = sig_write.try_clone()?;
    let sig_write3 = sig_write.try_clone()?;
    // SIGUSR1 is memcached 1.6's graceful stop: the same stop here (it used to kill the
    // server, as an unhandled SIGUSR1 does).
    let mut sig_ids = vec![
        signal_hook::low_level::pipe::register(signal_hook::consts::SIGINT, sig_write)?,
        signal_hook::low_level::pipe::register(signal_hook::consts::SIGTERM, sig_write2)?,
        signal_hook::low_level::pipe::register(signal_hook::consts::SIGUSR1, sig_write3)?,
    ];
    let hup = Arc::new(std::sync::atomic::AtomicBool::new(false));
    sig_ids.push(signal_hook::flag::register(
        signal_hook::consts::SIGHUP,
        Arc::clone(&hup),
    )?);

    // With a UCX listener, the store's memory comes from UCX where it can (shared memory
    // that same-host one-sided readers map directly); otherwise, or if that fails, it is
    // the store's own mapping, registered with UCX afterwards.
    let ucx_memory = if listeners.ucx.is_empty() {
        None
    } else {
        // Before UCX allocates anything: what thousands of clients' endpoints take must be
        // returnable when they go (acceptance 5 of the scaling work, docs/scaling.md).
        if !memfabric_ucx::keep_heap_returnable() {
            tracing::debug!("malloc's mmap threshold left as the environment sets it");
        }
        // With a cold tier, the hot context holds at most --hot-clients endpoints: UCX
        // picks its transports for that many (RC on InfiniBand), the cold context's for
        // --max-clients (DC/UD there).
        let hot_eps = if settings.ucx_cold_tls.is_some() {
            settings.ucx_hot_clients.min(settings.ucx_max_clients)
        } else {
            settings.ucx_max_clients
        };
        match memfabric_ucx::Context::new_server(
            "memfabricd",
            hot_eps.max(1) as usize,
            settings.ucx_hot_tls.as_deref(),
            true,
            true,
        ) {
            Ok(ctx) => Some(crate::ucx_context::StoreMemory::new(ctx)),
            Err(e) if settings.ucx_hot_tls.is_some() => {
                return Err(RunError::Io(io::Error::other(format!(
                    "--ucx-hot-tls {}: UCX cannot use these transports: {e}",
                    settings.ucx_hot_tls.as_deref().unwrap_or_default()
                ))));
            }
            Err(e) => {
                tracing::warn!("UCX unavailable ({e}): serving TCP/UDP/unix only");
                listeners.ucx.clear();
                None
            }
        }
    };
    let store = match &ucx_memory {
        Some(m) => {
            Store::with_memory(settings.store.clone(), &|len| m.allocate(len)).or_else(|e| {
                tracing::warn!("UCX could not allocate the store's memory ({e}): using our own");
                m.forget();
                Store::new(settings.store.clone())
            })
        }
        None => Store::new(settings.store.clone()),
    }
    .map_err(RunError::Store)?;
    let unix_path = settings.unix_socket.clone();
    let pidfile = settings.pidfile.clone();
    let threads = settings.threads;
    let holds = settings.debug_hold_keys.clone();
    let mut shared = Shared::new(settings, store);
    shared.holds = holds.map(crate::pending::Holds::new);
    if let Some(f) = shared.store.flash_stats() {
        // The index is sized for what RAM can hold; flash items take slots of it too.
        let st = shared.store.stats();
        let slots = (1u64 << st.hash_power_level) * 7;
        let flash_items = f.limit_bytes / (shared.settings.ext.item_size.max(64) as u64);
        if flash_items > slots / 2 {
            tracing::warn!(
                "the index has {slots} slots; a flash tier of {} bytes full of {}-byte items \
                 would need more than half of them (flash items then lose their slots to RAM \
                 items: see flash_index_drops); -o hashpower={} doubles it",
                f.limit_bytes,
                shared.settings.ext.item_size,
                st.hash_power_level + 1
            );
        }
        tracing::info!(
            "flash tier: {} bytes, {} I/O",
            f.limit_bytes,
            if f.direct_io { "direct" } else { "buffered" },
        );
    }
    if shared.store.has_flash() {
        let reader = shared.store.flash_reader();
        shared.flash_reads = Some(
            crate::flash_reads::FlashReads::start(
                reader,
                shared.settings.ext.threads,
                shared.settings.ext.engine,
            )
            .map_err(RunError::Store)?,
        );
        match shared.flash_reads.as_ref().map(|r| r.engine_name()) {
            Some("io_uring") => tracing::info!(
                "flash reads: io_uring, {} in flight",
                crate::flash_reads::URING_DEPTH
            ),
            _ => tracing::info!(
                "flash reads: {} threads (pread)",
                shared.settings.ext.threads
            ),
        }
    }
    if let Some(m) = ucx_memory.as_ref().filter(|_| !listeners.ucx.is_empty()) {
        let ctx = Arc::clone(m.context());
        let cold = match shared.settings.ucx_cold_tls.as_deref() {
            None => None,
            Some(list) => match memfabric_ucx::Context::new_server(
                "memfabricd-cold",
                shared.settings.ucx_max_clients as usize,
                Some(list),
                !shared.settings.ucx_cold_tls_default,
                // Served two-sided: no one-sided reader, no RMA lanes.
                false,
            ) {
                Ok(c) => Some(c),
                Err(e) if shared.settings.ucx_cold_tls_default => {
                    tracing::warn!("UCX cold tier ({list}) unavailable ({e}): one tier");
                    None
                }
                Err(e) => {
                    return Err(RunError::Io(io::Error::other(format!(
                        "--ucx-cold-tls {list}: UCX cannot use these transports: {e}"
                    ))))
                }
            },
        };
        match crate::ucx_context::FabricShared::new(
            ctx,
            cold,
            Some(m),
            &shared.store,
            &shared.settings,
        ) {
            Ok(f) => shared.fabric = Some(f),
            Err(e) => {
                tracing::warn!("UCX unavailable ({e}): serving TCP/UDP/unix only");
                listeners.ucx.clear();
            }
        }
    }
    let shared = Arc::new(shared);

    let mut workers = Vec::with_capacity(threads);
    for n in 0..threads {
        let mut udp = Vec::new();
        for (s, name) in &listeners.udp {
            udp.push((s.try_clone()?, name.clone()));
        }
        workers.push(worker::spawn(n, Arc::clone(&shared), udp)?);
    }
    if !listeners.ucx.is_empty() && shared.settings.tls.is_some() {
        tracing::warn!(
            "-Z encrypts the TCP listeners; the UCX path (port {}) is not encrypted",
            shared.settings.ucx_port
        );
    }
    if !listeners.ucx.is_empty() && !shared.settings.authenticates() {
        tracing::warn!(
            "the UCX port ({}) serves anyone who can reach it (no -Y or -S): keep it on a \
             trusted network",
            shared.settings.ucx_port
        );
    }
    // The checksum engine is chosen by measuring both (about a millisecond): here, before
    // any client, rather than inside the first large SET.
    let checksum = memfabric_checksum::large_engine();
    tracing::info!(
        "memfabricd ready: {} tcp, {} udp, {} unix, {} ucx listener(s), {threads} worker(s), \
         crc32c by {}",
        listeners.tcp.len(),
        listeners.udp.len(),
        usize::from(listeners.unix.is_some()),
        listeners.ucx.len(),
        checksum.name()
    );
    let result = net::accept_loop(
        &shared,
        &mut listeners,
        &workers,
        mio::net::UnixStream::from_std(sig_read),
        &hup,
    );
    shared.request_shutdown();
    drop(listeners);
    for w in workers {
        w.stop();
    }
    for id in sig_ids {
        signal_hook::low_level::unregister(id);
    }
    if let Some(p) = unix_path {
        let _ = std::fs::remove_file(p);
    }
    if let Some(p) = pidfile {
        let _ = std::fs::remove_file(p);
    }
    result.map_err(RunError::Io)
}
