//! The store's own background work: the expiry sweeper and the slab automover, on one
//! thread that wakes every 250 ms and just after each new second of the clock (and every
//! 1 ms while requests arrive and the CPUs have time to spare, as memcached's LRU
//! maintainer; every 100 ms while requests arrive otherwise, to read the machine's idle
//! share again), and refreshes the clock that one-sided readers see each time.
//!
//! Sweeper: every page records when its first linked item may die (smallest exptime, or
//! a flush time; `Slabs::page_due`). Each pass (every 250 ms, when the clock enters a new
//! second, and when woken) the sweeper scans the pages that are due and removes their
//! expired or flushed items, so `curr_items`/`bytes` are right within a pass of a mass
//! expiry or a `flush_all` (memcached's LRU maintainer reclaims them
//! within about a second; measured, see docs/store.md), and memory held by dead items
//! returns without waiting for a reader or for eviction to trip over it.
//!
//! Automover: every second, compares evictions per class. When a class keeps evicting
//! (three windows in a row) while another has not evicted at all in those windows and
//! owns more than one page, one page moves from the second to the first: its items are
//! removed, readers are given a grace period, and the page is re-carved for the new
//! chunk size. A page holding parts of a large item or an item still being written is
//! skipped. This is memcached's `slab_automove=1` idea with a simpler donor choice.
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::index;
use crate::item;
use crate::store::Inner;

/// Pages the sweeper visits per pass at most (a pass every 250 ms at most; 64 pages of
/// the smallest class hold ~760k items).
const SWEEP_PAGES_PER_TICK: usize = 64;
/// The maintenance tick of an idle store, and the longest between sweeper passes.
const IDLE_TICK: Duration = Duration::from_millis(250);
/// Between passes while due pages are left over.
const MORE_TICK: Duration = Duration::from_millis(10);
/// How long after a new second begins the thread wakes for it, on top of the store
/// clock's lag (`clock::coarse_lag`): the wait is timed on the monotonic clock, which may
/// run a little apart from the wall clock's seconds.
const SECOND_SLACK: Duration = Duration::from_micros(500);
/// How long one reading of the machine's idle share stands (`SpareCpu`).
const SPARE_CPU_WINDOW: Duration = Duration::from_millis(100);
/// The idle share of the machine's CPU time over the last window at which the busy tick
/// runs: with one client thread ping-ponging against one worker on two CPUs about half is
/// idle; at two and four client threads about a fifth.
const SPARE_CPU_IDLE: f64 = 0.3;
/// The share of the window in which some runnable thread waited for a CPU below which it
/// counts as spare: 6-9% with one client thread against one worker on two CPUs, polling
/// or not, 30-37% with two and four client threads.
const SPARE_CPU_MAX_STALL: f64 = 0.2;
/// Evicting windows in a row before a class receives a page.
const AUTOMOVE_WINDOWS: u32 = 3;

impl Inner {
    pub(crate) fn maintenance_loop(&self) {
        let mut streak = vec![0u32; self.slabs.classes.len()];
        let mut quiet = vec![0u32; self.slabs.classes.len()];
        let mut last_move_check = Instant::now();
        let mut last_pass = Instant::now();
        let mut passed_second = self.clock.now();
        let mut more = false;
        let mut spare_cpu = SpareCpu::default();
        // The last reading; until the first, as if there were (as `SpareCpu` starts).
        let mut cpu_to_spare = true;
        // The store's clock reads the kernel's coarse clock: wake once that has turned too.
        let clock_lag = crate::clock::coarse_lag();
        while !self.is_shutting_down() {
            self.refresh_remote_clock(self.clock.now());
            // With due pages left over, come back soon (not at once: a workload whose
            // items keep expiring must not turn this thread into a busy loop). Either way
            // wake just after the next second begins, so that one-sided readers, who
            // judge expiry by the control block's clock, see the new second within about
            // a millisecond of it, loaded or idle. While requests arrive and the CPUs have
            // time to spare, tick every `busy_tick` (1 ms), as memcached's LRU maintainer
            // sleeps 1 ms while it has work: on virtual machines whose idle vCPUs halt,
            // a process that wakes this often has its requests' wake-ups served sooner
            // (docs/benchmarks.md: ~12% of one client thread's closed loop, memcached's
            // own maintainer included). On saturated CPUs the tick only takes time from
            // the workers (~10% at four client threads on two CPUs), so it stops there.
            // The idle share is read only while requests arrive.
            let active = self.activity.seen.swap(false, Ordering::Relaxed);
            if active {
                let spins = self.activity.spin_ns.load(Ordering::Relaxed);
                cpu_to_spare = spare_cpu.has_spare(spins);
            }
            let busy = !self.cfg.busy_tick.is_zero() && active && cpu_to_spare;
            // While requests arrive the idle share is read again every window, ticking or
            // not: the busy tick must not wait a whole idle tick for CPU that came back.
            let tick = if busy {
                self.cfg.busy_tick.min(MORE_TICK)
            } else if more {
                MORE_TICK
            } else if active {
                SPARE_CPU_WINDOW
            } else {
                IDLE_TICK
            };
            let woken = self.wait_for_work(tick.min(until_next_second(wall_clock()) + clock_lag));
            if self.is_shutting_down() {
                break;
            }
            self.c.maintainer_juggles.fetch_add(1, Ordering::Relaxed);
            let now = self.clock.now();
            self.refresh_remote_clock(now);
            // The passes below on their own schedule: every idle tick (or sooner with
            // due pages left over), when woken, and when the clock enters a new second
            // (when items with an exptime become due).
            let pass_every = if more { MORE_TICK } else { IDLE_TICK };
            if !(woken || now != passed_second || last_pass.elapsed() >= pass_every) {
                continue;
            }
            last_pass = Instant::now();
            passed_second = now;
            // A mass expiry or a flush can leave more than one budget of due pages.
            more = self.sweeping.load(Ordering::Relaxed) && self.sweep_due(SWEEP_PAGES_PER_TICK).1;
            self.compact_queues(false);
            if self.automove.load(Ordering::Relaxed)
                && last_move_check.elapsed() >= Duration::from_secs(1)
            {
                last_move_check = Instant::now();
                self.automove_tick(&mut streak, &mut quiet);
            }
        }
    }

    /// Wait until woken (`wake_maintenance`: true) or until `timeout` passes (false).
    fn wait_for_work(&self, timeout: Duration) -> bool {
        let (m, cv) = self.wake_pair();
        let mut woken = m.lock().unwrap_or_else(|e| e.into_inner());
        if !*woken {
            woken = cv
                .wait_timeout(woken, timeout)
                .map(|(g, _)| g)
                .unwrap_or_else(|e| e.into_inner().0);
        }
        std::mem::replace(&mut *woken, false)
    }

    /// Reclaim the dead items of pages that are due (`Slabs::page_due`), visiting at
    /// most `max_pages` pages, fairly across calls. Returns the items reclaimed and
    /// whether due pages were left for the next call.
    pub(crate) fn sweep_due(&self, max_pages: usize) -> (usize, bool) {
        let now = self.clock.now();
        let n = self.slabs.page_due.len();
        let start = self.sweep_cursor().load(Ordering::Relaxed) % n.max(1);
        let (mut visited, mut reclaimed) = (0, 0);
        for i in 0..n {
            let p = (start + i) % n;
            if self.slabs.page_due[p].load(Ordering::Acquire) > now {
                continue;
            }
            if visited == max_pages {
                self.sweep_cursor().store(p, Ordering::Relaxed);
                return (reclaimed, true);
            }
            reclaimed += self.sweep_page(p, now);
            visited += 1;
        }
        (reclaimed, false)
    }

    /// Remove every dead item linked in `page` and record when the next one dies.
    /// Reads chunk states without the class lock: a chunk found dead is removed by
    /// `remove_at_location`, which re-checks under the key's bucket locks.
    fn sweep_page(&self, page: usize, now: u32) -> usize {
        let due = &self.slabs.page_due[page];
        due.swap(u32::MAX, Ordering::AcqRel);
        // Pairs with the fence in `Slabs::note_due`: an item whose due time this reset
        // erased is seen by the scan below.
        std::sync::atomic::fence(Ordering::SeqCst);
        let class = self.slabs.page_class[page].load(Ordering::Acquire);
        if class == 0 {
            return 0;
        }
        let ci = self.slabs.classes[class as usize];
        let ft = self.index.flush_time().load(Ordering::Relaxed);
        let mut next = u32::MAX;
        let mut dead = Vec::new();
        for i in 0..ci.per_page {
            let off = self.slabs.chunk_off(&ci, page as u32, i);
            if item::state(&self.arena, off) != item::LINKED {
                continue;
            }
            let h = item::read_header(&self.arena, off);
            if self.is_dead(&h, now) {
                dead.push(off);
                continue;
            }
            if h.exptime != 0 {
                next = next.min(h.exptime);
            }
            if ft > now && h.time <= ft {
                next = next.min(ft);
            }
        }
        if self.slabs.page_class[page].load(Ordering::Acquire) != class {
            // Re-carved while we looked: look again next time.
            next = now;
        }
        if next != u32::MAX {
            due.fetch_min(next, Ordering::AcqRel);
        }
        dead.into_iter()
            .filter(|&off| self.remove_at_location(off, true))
            .count()
    }

    fn automove_tick(&self, streak: &mut [u32], quiet: &mut [u32]) {
        let mut best: Option<(u8, u64)> = None;
        for ci in &self.slabs.classes[1..] {
            let k = &self.slabs.counters[ci.id as usize];
            let now = k.evicted.load(Ordering::Relaxed);
            let delta = now - k.evicted_seen.swap(now, Ordering::Relaxed).min(now);
            let i = ci.id as usize;
            if delta > 0 {
                streak[i] += 1;
                quiet[i] = 0;
                if streak[i] >= AUTOMOVE_WINDOWS && best.is_none_or(|b| delta > b.1) {
                    best = Some((ci.id, delta));
                }
            } else {
                streak[i] = 0;
                quiet[i] = quiet[i].saturating_add(1);
            }
        }
        let Some((to, _)) = best else { return };
        // Donor: a quiet class with the most pages (more than one), preferring free space.
        let mut donor: Option<(u8, usize, usize)> = None;
        for ci in &self.slabs.classes[1..] {
            if ci.id == to || quiet[ci.id as usize] < AUTOMOVE_WINDOWS {
                continue;
            }
            let st = self.slabs.lock(ci.id);
            let (pages, free) = (st.pages.len(), st.free.len());
            drop(st);
            if pages > 1 && donor.is_none_or(|d| (free, pages) > (d.2, d.1)) {
                donor = Some((ci.id, pages, free));
            }
        }
        if let Some((from, _, _)) = donor {
            // The receiving class keeps its streak: while it still evicts, it gets
            // another page next second.
            self.move_page(from, to);
        }
    }

    /// Move one page from class `from` to class `to`. Returns whether it moved.
    pub(crate) fn move_page(&self, from: u8, to: u8) -> bool {
        let src = self.slabs.classes[from as usize];
        let a = &self.arena;
        // 1. Pick a page with no large-item parts and no item being written; take it out
        //    of the class so nothing new is allocated in it.
        let page = {
            let mut st = self.slabs.lock(from);
            let mut chosen = None;
            for (pos, &p) in st.pages.iter().enumerate() {
                let movable = !self.pins.page_pinned(p as usize)
                    && (0..src.per_page).all(|i| {
                        let s = item::state(a, self.slabs.chunk_off(&src, p, i));
                        s == item::FREE || s == item::LINKED
                    });
                if movable {
                    chosen = Some((pos, p));
                    break;
                }
            }
            let Some((pos, p)) = chosen else { return false };
            st.pages.remove(pos);
            self.slabs.page_draining[p as usize].store(true, Ordering::Release);
            let lo = p as usize * self.slabs.page_size;
            let hi = lo + self.slabs.page_size;
            st.free.retain(|&off| off < lo || off >= hi);
            p
        };
        // 2. Remove every item still in it.
        for i in 0..src.per_page {
            let off = self.slabs.chunk_off(&src, page, i);
            if item::state(a, off) == item::LINKED {
                self.remove_at_location(off, false);
            }
        }
        // 3. Wait for chunks being freed by others, then for readers that may still hold
        //    pointers into the page.
        let mut spins = 0u32;
        let deadline = Instant::now() + Duration::from_secs(5);
        while (0..src.per_page)
            .any(|i| item::state(a, self.slabs.chunk_off(&src, page, i)) != item::FREE)
        {
            // An item in the page was pinned after the page was chosen (its memory stays
            // until the pin goes), or something holds a chunk for very long: give the
            // page back as it is; a later move retries.
            if self.pins.page_pinned(page as usize) || Instant::now() > deadline {
                self.return_page(from, page);
                return false;
            }
            index::backoff(&mut spins);
        }
        self.grace.synchronize();
        // 4. Re-carve for the new class (class 0: back to the unassigned pool).
        if to == 0 {
            self.slabs.return_to_pool(page);
            self.count_page_move();
            return true;
        }
        let dst = self.slabs.classes[to as usize];
        let mut st = self.slabs.lock(to);
        self.carve_page(&dst, &mut st, page);
        drop(st);
        self.count_page_move();
        true
    }

    fn return_page(&self, class: u8, page: u32) {
        let ci = self.slabs.classes[class as usize];
        let mut st = self.slabs.lock(class);
        self.slabs.page_draining[page as usize].store(false, Ordering::Release);
        st.pages.push(page);
        for i in 0..ci.per_page {
            let off = self.slabs.chunk_off(&ci, page, i);
            if item::state(&self.arena, off) == item::FREE {
                st.free.push(off);
            }
        }
    }

    fn is_shutting_down(&self) -> bool {
        self.shutdown_flag().load(Ordering::Relaxed)
    }
}

/// Whether the machine's CPUs have time to spare: idle for at least `SPARE_CPU_IDLE` of
/// the last window, from the first line of `/proc/stat`, and runnable threads kept waiting
/// for a CPU less than `SPARE_CPU_MAX_STALL` of it, from `/proc/pressure/cpu` (read at
/// most once per `SPARE_CPU_WINDOW`, and only while requests arrive). Time the workers
/// spent polling for requests that had not come (`Store::note_spin`) counts as idle: it
/// was, until they took it, and the stall share says whether anyone else wanted it. One
/// window under the threshold does not turn the answer to no, two in a row do: a window
/// is 20 jiffies on two CPUs, and the busy ones are sampled at clock ticks. Where
/// `/proc/stat` cannot be read, the answer is yes: tick as memcached does; where the
/// kernel keeps no pressure figures, the idle share alone decides.
#[derive(Default)]
struct SpareCpu {
    /// When the last reading was taken, and the reading.
    last: Option<(Instant, CpuReading)>,
    spare: bool,
    /// The last window was under the threshold.
    low: bool,
}

/// Counters since boot (or since the server started, for `polled_ns`).
#[derive(Clone, Copy, Debug, Default)]
struct CpuReading {
    /// Idle (idle + iowait) and total jiffies of all CPUs.
    idle: u64,
    total: u64,
    /// The workers' polling total (ns).
    polled_ns: u64,
    /// Microseconds in which some runnable thread waited for a CPU (PSI `some`).
    stalled_us: Option<u64>,
}

/// `/proc/stat` counts in USER_HZ ticks, 100 a second on Linux whatever the kernel's HZ.
const NS_PER_JIFFY: f64 = 1e7;

impl SpareCpu {
    /// `polled_ns`: the workers' polling total so far.
    fn has_spare(&mut self, polled_ns: u64) -> bool {
        let now = Instant::now();
        if matches!(self.last, Some((at, _)) if now.duration_since(at) < SPARE_CPU_WINDOW) {
            return self.spare;
        }
        let reading = read_cpu_jiffies().map(|(idle, total)| CpuReading {
            idle,
            total,
            polled_ns,
            stalled_us: read_cpu_stall_us(),
        });
        self.update(now, reading)
    }

    /// Take a new reading, if there is one.
    fn update(&mut self, now: Instant, reading: Option<CpuReading>) -> bool {
        let Some(r) = reading else {
            self.last = None;
            self.spare = true;
            return true;
        };
        self.spare = match self.last {
            Some((at, r0)) => {
                let idle = r.idle.saturating_sub(r0.idle) as f64;
                let total = r.total.saturating_sub(r0.total) as f64;
                let polled = r.polled_ns.saturating_sub(r0.polled_ns) as f64 / NS_PER_JIFFY;
                let wall_us = now.duration_since(at).as_micros() as f64;
                let stalled = match (r.stalled_us, r0.stalled_us) {
                    (Some(s), Some(s0)) if wall_us > 0.0 => s.saturating_sub(s0) as f64 / wall_us,
                    _ => 0.0,
                };
                // Too short a window for a clock tick to pass: keep the last answer.
                if total == 0.0 {
                    self.spare
                } else if (idle + polled).min(total) >= SPARE_CPU_IDLE * total
                    && stalled < SPARE_CPU_MAX_STALL
                {
                    self.low = false;
                    true
                } else {
                    let twice = self.low;
                    self.low = true;
                    self.spare && !twice
                }
            }
            // The first reading has nothing to compare with: tick until the next.
            None => true,
        };
        self.last = Some((now, r));
        self.spare
    }
}

/// Microseconds since boot in which some runnable thread waited for a CPU: the `total` of
/// the `some` line of `/proc/pressure/cpu` (PSI), if the kernel keeps it.
fn read_cpu_stall_us() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/pressure/cpu").ok()?;
    parse_cpu_stall(&text)
}

fn parse_cpu_stall(text: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix("some "))?
        .split_whitespace()
        .find_map(|f| f.strip_prefix("total="))?
        .parse()
        .ok()
}

/// Idle (idle + iowait) and total jiffies of all CPUs since boot, from `/proc/stat`.
fn read_cpu_jiffies() -> Option<(u64, u64)> {
    use std::io::BufRead;
    let mut line = String::new();
    std::io::BufReader::new(std::fs::File::open("/proc/stat").ok()?)
        .read_line(&mut line)
        .ok()?;
    parse_cpu_line(&line)
}

/// The aggregate `cpu` line of `/proc/stat`: user nice system idle iowait irq softirq
/// steal (guest time is already in user). Steal counts as busy: a vCPU the host took is
/// not one that halts.
fn parse_cpu_line(line: &str) -> Option<(u64, u64)> {
    let v: Vec<u64> = line
        .strip_prefix("cpu ")?
        .split_whitespace()
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    if v.len() < 5 {
        return None;
    }
    Some((v[3] + v[4], v.iter().sum()))
}

/// The wall clock, as time since the Unix epoch (zero should it be set before 1970).
fn wall_clock() -> Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

/// From `since_epoch` until just after the wall clock's next whole second.
fn until_next_second(since_epoch: Duration) -> Duration {
    Duration::from_secs(1) - Duration::from_nanos(u64::from(since_epoch.subsec_nanos()))
        + SECOND_SLACK
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cpu_line_of_proc_stat_gives_idle_and_total_jiffies() {
        let line = "cpu  4705 150 1120 16250 520 0 30 25 0 0\n";
        // idle + iowait; user .. steal (guest time is inside user already).
        assert_eq!(
            parse_cpu_line(line),
            Some((16250 + 520, 4705 + 150 + 1120 + 16250 + 520 + 30 + 25))
        );
        // Old kernels give fewer columns; four is too few to know iowait.
        assert_eq!(parse_cpu_line("cpu  1 2 3 4 5\n"), Some((9, 15)));
        assert_eq!(parse_cpu_line("cpu  1 2 3 4\n"), None);
        // A per-CPU line, or garbage, is not the aggregate.
        assert_eq!(parse_cpu_line("cpu0 1 2 3 4 5 6 7 8\n"), None);
        assert_eq!(parse_cpu_line("cpu  1 x 3 4 5\n"), None);
        assert_eq!(parse_cpu_line(""), None);
        // This machine's own file parses.
        if let Some((idle, total)) = read_cpu_jiffies() {
            assert!(idle <= total);
        }
    }

    fn reading(
        idle: u64,
        total: u64,
        polled_ns: u64,
        stalled_us: Option<u64>,
    ) -> Option<CpuReading> {
        Some(CpuReading {
            idle,
            total,
            polled_ns,
            stalled_us,
        })
    }

    #[test]
    fn the_pressure_line_gives_the_stalled_microseconds() {
        let text = "some avg10=18.99 avg60=26.19 avg300=15.21 total=3524705545\n\
                    full avg10=0.00 avg60=0.00 avg300=0.00 total=0\n";
        assert_eq!(parse_cpu_stall(text), Some(3_524_705_545));
        assert_eq!(parse_cpu_stall("full avg10=0.00 total=5\n"), None);
        assert_eq!(parse_cpu_stall("some avg10=1.00\n"), None);
        assert_eq!(parse_cpu_stall("some total=x\n"), None);
        assert_eq!(parse_cpu_stall(""), None);
        // This machine's own file, if its kernel keeps one, parses.
        if let Ok(text) = std::fs::read_to_string("/proc/pressure/cpu") {
            assert!(parse_cpu_stall(&text).is_some(), "{text}");
        }
    }

    #[test]
    fn threads_waiting_for_a_cpu_mean_there_is_none_to_spare() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut spare = SpareCpu::default();
        assert!(spare.update(at(0), reading(1000, 2000, 0, Some(0))));
        // Half idle, threads waiting 5 ms of the 100: spare.
        assert!(spare.update(at(100), reading(1010, 2020, 0, Some(5_000))));
        // Half idle (the workers' polling) but threads waiting 30 ms of 100, twice: no.
        let ms = |n: u64| n * 1_000_000;
        assert!(spare.update(at(200), reading(1010, 2040, ms(100), Some(35_000))));
        assert!(!spare.update(at(300), reading(1010, 2060, ms(200), Some(65_000))));
        // No pressure figures (older kernels): the idle share decides.
        assert!(spare.update(at(400), reading(1020, 2080, ms(200), None)));
    }

    #[test]
    fn the_busy_tick_runs_only_while_the_cpus_have_time_to_spare() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut spare = SpareCpu::default();
        // The first reading has no window: tick.
        assert!(spare.update(at(0), reading(1000, 2000, 0, None)));
        // Half idle over the window (one client thread on two CPUs): tick.
        assert!(spare.update(at(100), reading(1010, 2020, 0, None)));
        // A fifth idle (two and four client threads): one such window may be a sampling
        // accident; the second in a row stops the tick.
        assert!(spare.update(at(200), reading(1014, 2040, 0, None)));
        assert!(!spare.update(at(300), reading(1018, 2060, 0, None)));
        assert!(!spare.update(at(400), reading(1022, 2080, 0, None)));
        // Exactly the threshold: tick again at once.
        assert!(spare.update(at(500), reading(1028, 2100, 0, None)));
        // A single low window between good ones changes nothing.
        assert!(spare.update(at(600), reading(1030, 2120, 0, None)));
        assert!(spare.update(at(700), reading(1040, 2140, 0, None)));
        // No clock tick within the window: the last answer stands.
        assert!(spare.update(at(800), reading(1040, 2140, 0, None)));
        assert!(spare.update(at(900), reading(1040, 2180, 0, None)));
        assert!(!spare.update(at(1000), reading(1040, 2200, 0, None)));
        assert!(!spare.update(at(1100), reading(1040, 2200, 0, None)));
        // /proc/stat unreadable: tick, as memcached does, and start over.
        assert!(spare.update(at(1200), None));
        assert!(spare.update(at(1300), reading(1050, 2300, 0, None)));
        // Counters that went backwards (never on Linux) count as an empty window.
        assert!(spare.update(at(1400), reading(0, 0, 0, None)));
    }

    #[test]
    fn time_the_workers_spent_polling_counts_as_idle() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut spare = SpareCpu::default();
        let ms = |n: u64| n * 1_000_000;
        assert!(spare.update(at(0), reading(1000, 2000, 0, None)));
        // A tenth idle, but a worker polled for 60 ms of the 200 ms of CPU time: 40%.
        assert!(spare.update(at(100), reading(1002, 2020, ms(60), None)));
        // A tenth idle and 20 ms polled: 20%, twice: no.
        assert!(spare.update(at(200), reading(1004, 2040, ms(80), None)));
        assert!(!spare.update(at(300), reading(1006, 2060, ms(100), None)));
        // Polling never counts for more than the window's CPU time.
        assert!(spare.update(at(400), reading(1006, 2080, ms(10_100), None)));
        // The polling total is a running sum: only what was added since counts.
        assert!(spare.update(at(500), reading(1008, 2100, ms(10_100), None)));
        assert!(!spare.update(at(600), reading(1010, 2120, ms(10_100), None)));
    }

    #[test]
    fn the_thread_wakes_just_after_the_next_second_begins() {
        let at = |secs: u64, nanos: u32| Duration::new(secs, nanos);
        assert_eq!(
            until_next_second(at(1_800_000_000, 0)),
            Duration::from_secs(1) + SECOND_SLACK
        );
        assert_eq!(
            until_next_second(at(1_800_000_000, 999_999_999)),
            Duration::from_nanos(1) + SECOND_SLACK
        );
        assert_eq!(
            until_next_second(at(7, 250_000_000)),
            Duration::from_millis(750) + SECOND_SLACK
        );
        // Whatever the fraction, the wait ends after the second turns and within one
        // second and the slack of now.
        for nanos in (0..1_000_000_000).step_by(9_999_991) {
            let now = at(1_800_000_000, nanos);
            let woken = now + until_next_second(now);
            assert_eq!(woken.as_secs(), 1_800_000_001, "{nanos}");
            assert!(woken - now <= Duration::from_secs(1) + SECOND_SLACK);
        }
    }
}
