//! The process-wide UCX state of memfabricd: the UCX context, the store's memory as UCX
//! allocated or registered it (exported to one-sided readers), and the UCX path's counters
//! (`stats fabric`). Worker threads' UCX front ends (`ucx_frontend`) share it.
use std::io;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use memfabric_ucx as mf;

/// A store mapping as remote readers see it: where it is and the key to read it.
pub(crate) struct Exported {
    pub(crate) base: u64,
    pub(crate) len: u64,
    pub(crate) rkey: Vec<u8>,
    /// Our registration of the mapping, when UCX did not allocate it (and so registered
    /// it already).
    registration: Option<mf::MemRegion>,
}

impl Exported {
    /// Export `region` of the store: with the rkey packed when UCX allocated it (see
    /// `store_memory`), or by registering it now.
    fn new(
        ctx: &Arc<mf::Context>,
        region: (*mut u8, usize),
        allocated: &[(u64, Vec<u8>)],
    ) -> Result<Exported, mf::Error> {
        let (base, len) = region;
        if let Some((_, rkey)) = allocated.iter().find(|(b, _)| *b == base as u64) {
            return Ok(Exported {
                base: base as u64,
                len: len as u64,
                rkey: rkey.clone(),
                registration: None,
            });
        }
        let reg = ctx.mem_map(base, len)?;
        Ok(Exported {
            base: base as u64,
            len: len as u64,
            rkey: reg.pack_rkey()?,
            registration: Some(reg),
        })
    }
}

/// Memory for the store that UCX allocates (shared memory on one host, so that one-sided
/// readers there map it instead of paying a system call per read), with each region's
/// base and packed rkey recorded for `FabricShared::new`.
pub struct StoreMemory {
    ctx: Arc<mf::Context>,
    allocated: std::sync::Mutex<Vec<(u64, Vec<u8>)>>,
}

impl StoreMemory {
    pub fn new(ctx: Arc<mf::Context>) -> StoreMemory {
        StoreMemory {
            ctx,
            allocated: std::sync::Mutex::new(Vec::new()),
        }
    }

    /// The allocator `Store::with_memory` calls for the arena and the index.
    pub fn allocate(&self, len: usize) -> io::Result<Box<dyn memfabric_store::Memory>> {
        let region = self.ctx.mem_alloc(len).map_err(io::Error::other)?;
        let rkey = region.pack_rkey().map_err(io::Error::other)?;
        self.allocated
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((region.addr(), rkey));
        Ok(Box::new(region))
    }

    pub fn context(&self) -> &Arc<mf::Context> {
        &self.ctx
    }

    /// Forget what was allocated (the store was built without it after all): a later
    /// mapping at a freed region's address must not be mistaken for it.
    pub fn forget(&self) {
        self.allocated
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clear();
    }
}

/// The hot tier: sessions on the transports chosen for latency (RC, shared memory).
pub const HOT: usize = 0;
/// The cold tier: sessions on the transports chosen for scale (DC/UD, TCP).
pub const COLD: usize = 1;

/// Process-wide UCX state: the contexts and the exported store mappings.
pub struct FabricShared {
    /// The hot tier's context (it also exports the store for one-sided reads).
    pub(crate) ctx: Arc<mf::Context>,
    /// The cold tier's context, when there is one (`--ucx-cold-tls`).
    pub(crate) cold_ctx: Option<Arc<mf::Context>>,
    pub(crate) arena: Exported,
    pub(crate) index: Exported,
    /// What backs the arena (`stats fabric`: `ucx_memory_backing`).
    pub backing: Backing,
    /// Values above this many bytes go by rendezvous.
    pub eager_max: usize,
    pub(crate) next_session: AtomicU32,
    pub curr_sessions: AtomicU64,
    pub total_sessions: AtomicU64,
    /// Sessions whose endpoint has UCX peer-failure handling.
    pub peer_error_sessions: AtomicU64,
    /// Rendezvous receives still in flight when their client went away on an endpoint
    /// without peer-failure handling: UCX 1.13 can neither cancel nor fail them, so their
    /// pending items stay allocated (never linked, never visible) until UCX lets go.
    pub orphaned_receives: AtomicU64,
    /// Sessions ended because a transfer failed on their endpoint (without peer-failure
    /// handling: UCX had destroyed the endpoint), and the rendezvous offers from them
    /// abandoned (their descriptors stay allocated until the worker goes).
    pub failed_sessions: AtomicU64,
    pub abandoned_offers: AtomicU64,
    /// One-sided readers' access hints applied / refused (item gone or changed).
    pub hints_taken: AtomicU64,
    pub hints_stale: AtomicU64,
    /// Items pinned now by rendezvous GET replies in flight, and their value bytes.
    pub pins: AtomicU64,
    pub pinned_bytes: AtomicU64,
    /// Rendezvous receives (large SET values) in flight now, and their bytes.
    pub receives: AtomicU64,
    pub receiving_bytes: AtomicU64,
    /// Rendezvous sends / receives cancelled because their session ended first (client
    /// gone, deadline passed, or hostile).
    pub sends_cancelled: AtomicU64,
    pub receives_cancelled: AtomicU64,
    /// Sessions ended because a transfer outlived `--ucx-transfer-timeout`.
    pub transfer_timeouts: AtomicU64,
    /// Bootstrap connections closed because no HELLO came within `--ucx-hello-timeout`.
    pub hello_timeouts: AtomicU64,
    /// Bootstrap connections closed for what they sent: a frame that is not one, too long,
    /// or bytes where none may come (after HELLO, after the proof, on a lifeline).
    pub bootstrap_rejects: AtomicU64,
    /// Requests that waited for the session's rendezvous bytes in flight to fall under
    /// `--ucx-session-inflight-max`, and sessions closed for piling up more than that.
    pub requests_deferred: AtomicU64,
    pub sessions_overflowed: AtomicU64,
    /// HELLOs refused because `--max-clients` sessions were being served.
    pub sessions_refused: AtomicU64,
    /// HELLOs refused because the client's UCX release is not ours (`WELCOME_UCX_MISMATCH`).
    pub version_mismatches: AtomicU64,
    /// `--max-clients`.
    pub max_clients: u64,
    /// Sessions per tier (a session being moved counts where it goes).
    pub tier_sessions: [AtomicU64; 2],
    /// `--hot-clients`, `--promote-rate`, `--hot-idle`.
    pub hot_clients: u64,
    pub promote_rate: u32,
    pub hot_idle: u32,
    /// Moves to the hot tier and to the cold tier, completed (the client arrived).
    pub promotions: AtomicU64,
    pub demotions: AtomicU64,
    /// Moves the client could not make (it cannot reach the other tier) or we could not
    /// start (no endpoint to the client there).
    pub moves_refused: AtomicU64,
    /// New sessions put on the hot tier over its cap because the cold tier cannot reach
    /// the client (no transport in common).
    pub tier_fallbacks: AtomicU64,
    /// memfabricd's own memory for the sessions now served (UCX's endpoints not included).
    pub session_bytes: AtomicU64,
    /// Hot places wanted by busy cold sessions of workers that had no quiet hot session
    /// of their own to demote: other workers demote one of theirs per unit.
    pub hot_wanted: AtomicU64,
}

/// What backs a mapping of this process, as `/proc/self/maps` names it. It decides when
/// the memory is taken. UCX's POSIX shared-memory allocator writes every page of a
/// segment before mapping it (to learn that its directory has room), so a store it
/// allocates is taken whole at start, twice `-m` for the arena alone (room for
/// `cache_memlimit` to grow). SysV segments and anonymous mappings are taken page by page
/// as items arrive, as memcached's memory is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backing {
    Anonymous,
    SysV,
    PosixShm,
    File,
    Unknown,
}

impl Backing {
    /// The value of `stats fabric`'s `ucx_memory_backing`.
    pub fn name(self) -> &'static str {
        match self {
            Backing::Anonymous => "anonymous",
            Backing::SysV => "sysv",
            Backing::PosixShm => "posix_shm",
            Backing::File => "file",
            Backing::Unknown => "unknown",
        }
    }

    /// Whether all of it was taken when it was allocated (see the type's comment).
    pub fn taken_at_start(self) -> bool {
        self == Backing::PosixShm
    }

    /// The backing of the mapping that holds `addr`, given the text of a
    /// `/proc/<pid>/maps`.
    pub fn of(maps: &str, addr: u64) -> Backing {
        for line in maps.lines() {
            // start-end perms offset device inode [path]
            let mut fields = line.split_ascii_whitespace();
            let Some((lo, hi)) = fields.next().and_then(|r| r.split_once('-')) else {
                continue;
            };
            let (Ok(lo), Ok(hi)) = (u64::from_str_radix(lo, 16), u64::from_str_radix(hi, 16))
            else {
                continue;
            };
            if !(lo..hi).contains(&addr) {
                continue;
            }
            return match fields.nth(4).unwrap_or("") {
                "" | "/anon_hugepage" => Backing::Anonymous,
                p if p.starts_with('[') => Backing::Anonymous,
                p if p.starts_with("/SYSV") => Backing::SysV,
                // UCX names its POSIX segments so, in /dev/shm or in UCX_POSIX_DIR.
                p if p.contains("ucx_shm_posix") => Backing::PosixShm,
                _ => Backing::File,
            };
        }
        Backing::Unknown
    }
}

impl FabricShared {
    /// The store's memory came from UCX (same-host readers map it directly).
    pub fn ucx_allocated(&self) -> bool {
        self.arena.registration.is_none() && self.index.registration.is_none()
    }

    /// Export the store's arena and index for remote reads over `ctx` (the UCX context,
    /// transports from `UCX_*` in the environment): mappings UCX allocated (`memory`)
    /// already are registered; others are registered here.
    pub fn new(
        ctx: Arc<mf::Context>,
        cold_ctx: Option<Arc<mf::Context>>,
        memory: Option<&StoreMemory>,
        store: &memfabric_store::Store,
        settings: &crate::settings::Settings,
    ) -> Result<FabricShared, mf::Error> {
        let allocated = memory
            .map(|m| {
                m.allocated
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone()
            })
            .unwrap_or_default();
        let arena = Exported::new(&ctx, store.arena_region(), &allocated)?;
        let index = Exported::new(&ctx, store.index_region(), &allocated)?;
        // One read of this process's mappings names both regions' backing.
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        let backing = Backing::of(&maps, arena.base);
        let taken: u64 = [&arena, &index]
            .iter()
            .filter(|e| Backing::of(&maps, e.base).taken_at_start())
            .map(|e| e.len)
            .sum();
        if taken > 0 {
            tracing::warn!(
                "UCX allocated {} MiB for the store (the arena, with room for cache_memlimit \
                 to double it, and the index) as POSIX shared memory, and its allocator \
                 wrote every page to learn that there is room: that memory is taken now, not \
                 as items arrive. With sysv in UCX_TLS (e.g. sysv,cma,self or sm,self) UCX \
                 allocates SysV segments instead, taken as they are used; same-host \
                 one-sided readers map either (docs/one-sided.md)",
                taken >> 20
            );
        }
        Ok(FabricShared {
            backing,
            ctx,
            cold_ctx,
            arena,
            index,
            eager_max: settings.ucx_eager_max,
            next_session: AtomicU32::new(1),
            curr_sessions: AtomicU64::new(0),
            total_sessions: AtomicU64::new(0),
            peer_error_sessions: AtomicU64::new(0),
            orphaned_receives: AtomicU64::new(0),
            failed_sessions: AtomicU64::new(0),
            abandoned_offers: AtomicU64::new(0),
            hints_taken: AtomicU64::new(0),
            hints_stale: AtomicU64::new(0),
            pins: AtomicU64::new(0),
            pinned_bytes: AtomicU64::new(0),
            receives: AtomicU64::new(0),
            receiving_bytes: AtomicU64::new(0),
            sends_cancelled: AtomicU64::new(0),
            receives_cancelled: AtomicU64::new(0),
            transfer_timeouts: AtomicU64::new(0),
            hello_timeouts: AtomicU64::new(0),
            bootstrap_rejects: AtomicU64::new(0),
            requests_deferred: AtomicU64::new(0),
            sessions_overflowed: AtomicU64::new(0),
            sessions_refused: AtomicU64::new(0),
            version_mismatches: AtomicU64::new(0),
            max_clients: u64::from(settings.ucx_max_clients),
            tier_sessions: [AtomicU64::new(0), AtomicU64::new(0)],
            hot_clients: u64::from(settings.ucx_hot_clients),
            promote_rate: settings.ucx_promote_rate,
            hot_idle: settings.ucx_hot_idle,
            promotions: AtomicU64::new(0),
            demotions: AtomicU64::new(0),
            moves_refused: AtomicU64::new(0),
            tier_fallbacks: AtomicU64::new(0),
            session_bytes: AtomicU64::new(0),
            hot_wanted: AtomicU64::new(0),
        })
    }

    /// Whether sessions are served on two tiers.
    pub fn tiered(&self) -> bool {
        self.cold_ctx.is_some()
    }

    /// Take a place on `tier` for a session (the hot tier has `--hot-clients` of them;
    /// the cold tier is bounded by `--max-clients` already). `false`: the tier is full.
    pub fn reserve(&self, tier: usize) -> bool {
        let n = self.tier_sessions[tier].fetch_add(1, Ordering::Relaxed);
        if tier == HOT && self.tiered() && n >= self.hot_clients {
            self.tier_sessions[tier].fetch_sub(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Give a session's place on `tier` back.
    pub fn release(&self, tier: usize) {
        self.tier_sessions[tier].fetch_sub(1, Ordering::Relaxed);
    }
}

/// `stats fabric`.
pub fn fabric_stats(fabric: Option<&FabricShared>) -> Vec<(String, String)> {
    let mut v = Vec::new();
    if let Some(fs) = fabric {
        let counters = [
            ("ucx_curr_sessions", &fs.curr_sessions),
            ("ucx_total_sessions", &fs.total_sessions),
            ("ucx_peer_error_sessions", &fs.peer_error_sessions),
            ("ucx_orphaned_receives", &fs.orphaned_receives),
            ("ucx_failed_sessions", &fs.failed_sessions),
            ("ucx_abandoned_offers", &fs.abandoned_offers),
            ("ucx_onesided_hints", &fs.hints_taken),
            ("ucx_onesided_hints_stale", &fs.hints_stale),
            ("ucx_pins", &fs.pins),
            ("ucx_pinned_bytes", &fs.pinned_bytes),
            ("ucx_receives", &fs.receives),
            ("ucx_receiving_bytes", &fs.receiving_bytes),
            ("ucx_sends_cancelled", &fs.sends_cancelled),
            ("ucx_receives_cancelled", &fs.receives_cancelled),
            ("ucx_transfer_timeouts", &fs.transfer_timeouts),
            ("ucx_hello_timeouts", &fs.hello_timeouts),
            ("ucx_bootstrap_rejects", &fs.bootstrap_rejects),
            ("ucx_requests_deferred", &fs.requests_deferred),
            ("ucx_sessions_overflowed", &fs.sessions_overflowed),
            ("ucx_sessions_refused", &fs.sessions_refused),
            ("ucx_version_mismatches", &fs.version_mismatches),
            ("ucx_hot_sessions", &fs.tier_sessions[HOT]),
            ("ucx_cold_sessions", &fs.tier_sessions[COLD]),
            ("ucx_promotions", &fs.promotions),
            ("ucx_demotions", &fs.demotions),
            ("ucx_moves_refused", &fs.moves_refused),
            ("ucx_tier_fallbacks", &fs.tier_fallbacks),
            ("ucx_session_bytes", &fs.session_bytes),
        ];
        for (name, c) in counters {
            v.push((name.into(), c.load(Ordering::Relaxed).to_string()));
        }
        v.push(("ucx_max_clients".into(), fs.max_clients.to_string()));
        v.push((
            "ucx_hot_clients".into(),
            if fs.tiered() {
                fs.hot_clients.to_string()
            } else {
                fs.max_clients.to_string()
            },
        ));
        v.push((
            "ucx_tiers".into(),
            if fs.tiered() { "2" } else { "1" }.into(),
        ));
        v.push(("ucx_version".into(), memfabric_ucx::version()));
        v.push(("ucx_eager_max".into(), fs.eager_max.to_string()));
        v.push(("ucx_arena_registered".into(), fs.arena.len.to_string()));
        v.push((
            "ucx_memory".into(),
            if fs.ucx_allocated() {
                "ucx"
            } else {
                "registered"
            }
            .into(),
        ));
        v.push(("ucx_memory_backing".into(), fs.backing.name().into()));
    }
    v
}

#[cfg(test)]
mod tests {
    use super::Backing;

    const MAPS: &str = "\
55d0c0a00000-55d0c0a21000 rw-p 00000000 00:00 0                          [heap]
7f0000000000-7f0008000000 rw-s 00000000 00:01 4242                       /dev/shm/ucx_shm_posix_3e669445 (deleted)
7f1000000000-7f1002000000 rw-s 00000000 00:01 16285699                   /SYSV00000000 (deleted)
7f2000000000-7f2000100000 rw-p 00000000 00:00 0 
7f3000000000-7f3000001000 r--p 00000000 08:01 1234                       /usr/lib/x86_64-linux-gnu/libc.so.6
7f4000000000-7f4000200000 rw-s 00000000 00:01 99                         /tmp/ucx_shm_posix_12 (deleted)
";

    #[test]
    fn a_mapping_is_named_by_the_line_whose_range_holds_the_address() {
        assert_eq!(Backing::of(MAPS, 0x7f00_0000_0000), Backing::PosixShm);
        assert_eq!(Backing::of(MAPS, 0x7f00_07ff_ffff), Backing::PosixShm);
        assert_eq!(Backing::of(MAPS, 0x7f10_0000_1000), Backing::SysV);
        assert_eq!(Backing::of(MAPS, 0x7f20_0000_0000), Backing::Anonymous);
        assert_eq!(Backing::of(MAPS, 0x55d0_c0a0_0010), Backing::Anonymous);
        assert_eq!(Backing::of(MAPS, 0x7f30_0000_0000), Backing::File);
        // UCX_POSIX_DIR elsewhere than /dev/shm: the same allocator, the same cost.
        assert_eq!(Backing::of(MAPS, 0x7f40_0000_0000), Backing::PosixShm);
        // The end of a range is outside it; no line holds the address.
        assert_eq!(Backing::of(MAPS, 0x7f00_0800_0000), Backing::Unknown);
        assert_eq!(Backing::of("garbage\n\n", 1), Backing::Unknown);
        assert!(Backing::PosixShm.taken_at_start() && !Backing::SysV.taken_at_start());
    }
}
