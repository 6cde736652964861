//! The server clock and memcached's exptime rules.
use std::time::{SystemTime, UNIX_EPOCH};

/// Seconds in 30 days: relative exptimes up to this are offsets, larger ones are unix times.
pub const REALTIME_MAXDELTA: i64 = 60 * 60 * 24 * 30;

/// The store's notion of "now", in unix seconds.
///
/// memcached keeps a coarse clock ticking once a second; we read the kernel's coarse
/// clock on demand (`CLOCK_REALTIME_COARSE`: a vDSO read of the time at the last timer
/// tick, a few ms behind at most, which whole seconds do not notice; no TSC read, so it
/// costs a fraction of a precise read on every request) and remember when the process
/// started, because absolute exptimes at or before the start time count as already
/// expired, as in memcached.
#[derive(Debug)]
pub struct Clock {
    started: u32,
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock {
    pub fn new() -> Clock {
        // memcached backdates its start so that "now" is never before process_started.
        Clock {
            started: unix_now().saturating_sub(2),
        }
    }

    /// Current server time, unix seconds.
    pub fn now(&self) -> u32 {
        unix_now()
    }

    /// Unix time the store was created.
    pub fn started(&self) -> u32 {
        self.started
    }

    /// memcached's `realtime()`: turn a protocol exptime into an absolute expiry.
    /// 0 stays 0 (never); negative or an absolute time not after start is "already
    /// expired" (returned as 1, a time in the past); up to 30 days is relative.
    pub fn exptime(&self, exptime: i64) -> u32 {
        if exptime == 0 {
            return 0;
        }
        if exptime < 0 {
            return 1;
        }
        if exptime > REALTIME_MAXDELTA {
            if exptime <= self.started as i64 {
                return 1;
            }
            return exptime.min(u32::MAX as i64) as u32;
        }
        (self.now() as i64 + exptime).min(u32::MAX as i64) as u32
    }
}

/// How far the coarse clock `Clock::now` reads may lag the wall clock: its resolution
/// (the kernel's timer tick), or 10 ms where that cannot be asked.
pub fn coarse_lag() -> std::time::Duration {
    use nix::time::{clock_getres, ClockId};
    clock_getres(ClockId::CLOCK_REALTIME_COARSE)
        .ok()
        .map(std::time::Duration::from)
        .filter(|d| !d.is_zero())
        .unwrap_or(std::time::Duration::from_millis(10))
}

fn unix_now() -> u32 {
    use nix::time::{clock_gettime, ClockId};
    if let Ok(t) = clock_gettime(ClockId::CLOCK_REALTIME_COARSE) {
        return t.tv_sec().clamp(0, u32::MAX as i64) as u32;
    }
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs() as u32)
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_means_never_and_negative_means_expired() {
        let c = Clock::new();
        assert_eq!(c.exptime(0), 0);
        assert!(c.exptime(-1) <= c.now());
    }

    #[test]
    fn small_values_are_relative_large_ones_absolute() {
        let c = Clock::new();
        let rel = c.exptime(100);
        assert!(rel >= c.now() + 99 && rel <= c.now() + 101);
        let abs = c.now() as i64 + 5000;
        assert_eq!(c.exptime(abs), abs as u32);
        // An absolute time before the process started is already expired.
        assert!(c.exptime(REALTIME_MAXDELTA + 1) <= c.now());
    }
}
