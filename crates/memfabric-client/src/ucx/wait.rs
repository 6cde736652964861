//! Waiting for completions: progress the UCX worker until it is idle, spin a little while
//! requests are in flight (yielding the core between spins), then arm the worker and sleep
//! on its event fd and the lifelines; how each wait ended is counted.
use std::time::{Duration, Instant};

use super::rma::HINT_MAX_AGE;
use super::{UcxTransport, EFD};
use crate::error::Error;
use crate::transport::{Completion, ConnId};

/// How long a wait spins on the UCX worker before sleeping on its event fd: a shared
/// memory round trip takes microseconds, a wake-up tens of them. Not longer: on a busy
/// host a server queued behind other work waits for a core, and our spin holds one (with
/// 2 ms, replies on a loaded 2-core machine came ~2 ms late: when the spin gave up).
const SPIN: Duration = Duration::from_micros(250);

impl UcxTransport {
    pub(super) fn has_work(&self) -> bool {
        !self.inflight.is_empty()
            || !self.onesided.is_empty()
            || (self.moves_pending > 0 && self.conns.values().any(|c| c.moving.is_some()))
    }

    pub(super) fn wait(
        &mut self,
        timeout: Duration,
        done: &mut Vec<Completion>,
        failed: &mut Vec<ConnId>,
    ) -> Result<(), Error> {
        let start = Instant::now();
        if self.pending_hints > 0 && start.duration_since(self.last_hint_flush) >= HINT_MAX_AGE {
            self.send_all_hints();
        }
        done.append(&mut self.deferred);
        let mut events = std::mem::take(&mut self.events_buf);
        let mut rounds: u32 = 0;
        // The last wait on the event fd ended by its timeout, not by an event.
        let mut woke_by_timer = false;
        let result = loop {
            // Progress until UCX is idle.
            loop {
                let n = self.w.progress();
                self.w.drain_into(&mut events);
                events.extend(self.local_events.drain(..));
                if n == 0 && events.is_empty() {
                    break;
                }
                if std::mem::take(&mut woke_by_timer) {
                    self.waits.by_timer += 1;
                }
                while let Some(e) = events.pop_front() {
                    self.handle(e, done);
                }
                if self.moves_pending > 0 {
                    self.finish_moves(done);
                }
            }
            failed.append(&mut self.failed_conns);
            if !done.is_empty() || !failed.is_empty() {
                break Ok(());
            }
            // Clock reads cost as much as a progress round: look at the clock (deadline,
            // lifelines) only every few rounds while spinning.
            rounds = rounds.wrapping_add(1);
            if !timeout.is_zero() && !rounds.is_multiple_of(32) {
                std::hint::spin_loop();
                continue;
            }
            if self.last_lifeline_check.elapsed() >= Duration::from_millis(1) {
                self.check_lifelines(done, failed);
                if !done.is_empty() || !failed.is_empty() {
                    break Ok(());
                }
            }
            let elapsed = start.elapsed();
            if elapsed >= timeout {
                break Ok(());
            }
            if elapsed < SPIN && self.has_work() {
                // Give the core away between spins: a server on this host (or another
                // thread of ours) that our send woke is often queued on this very core,
                // and would otherwise wait for our spin to end before it can answer
                // (the "slow UCX mode" of docs/benchmarks.md: replies ~2 ms late).
                std::thread::yield_now();
                continue;
            }
            // Idle: the access hints gathered so far go out before we sleep, and UCX is
            // progressed once more (the sends may need it) before it is armed.
            if self.pending_hints > 0 {
                self.send_all_hints();
                continue;
            }
            // Sleep on the UCX event fd and the lifelines.
            if !self.local_events.is_empty() || !matches!(self.w.arm(), Ok(true)) {
                continue;
            }
            let wait = (timeout - elapsed).min(Duration::from_millis(100));
            match self.poll.poll(&mut self.events, Some(wait)) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => break Err(Error::Protocol(format!("poll: {e}"))),
            }
            if self.events.is_empty() {
                woke_by_timer = true;
            } else {
                self.waits.by_event += 1;
            }
            if self.events.iter().any(|ev| ev.token() != EFD) {
                self.check_lifelines(done, failed);
            }
        };
        self.events_buf = events;
        result
    }
}
