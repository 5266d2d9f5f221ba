//! Restart backoff as the upstream kubelet computes it (CrashLoopBackOff and
//! image pull backoff): 10 s doubling to 300 s; an entry untouched for twice
//! the maximum (10 min) starts over.

use std::time::{Duration, Instant};

pub const INITIAL: Duration = Duration::from_secs(10);
pub const MAX: Duration = Duration::from_secs(300);

#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entry: Option<Entry>,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    delay: Duration,
    last_update: Instant,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff::new(INITIAL, MAX)
    }
}

impl Backoff {
    pub fn new(initial: Duration, max: Duration) -> Self {
        Backoff {
            initial,
            max,
            entry: None,
        }
    }

    fn live_entry(&self, now: Instant) -> Option<Entry> {
        self.entry
            .filter(|e| now.saturating_duration_since(e.last_update) <= 2 * self.max)
    }

    /// When the next attempt may start, given the time the last one ended;
    /// `None` means now.
    pub fn wait_until(&self, last_end: Instant, now: Instant) -> Option<Instant> {
        let entry = self.live_entry(now)?;
        let until = last_end + entry.delay;
        (until > now).then_some(until)
    }

    /// Records an attempt at `now` and lengthens the next delay.
    pub fn record_attempt(&mut self, now: Instant) {
        let delay = match self.live_entry(now) {
            Some(e) => (e.delay * 2).min(self.max),
            None => self.initial,
        };
        self.entry = Some(Entry {
            delay,
            last_update: now,
        });
    }

    /// The current delay, for messages like "back-off 20s".
    pub fn delay(&self, now: Instant) -> Option<Duration> {
        self.live_entry(now).map(|e| e.delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_sequence() {
        let t0 = Instant::now();
        let mut b = Backoff::default();
        // First exit: restart at once.
        assert_eq!(b.wait_until(t0, t0), None);
        b.record_attempt(t0);
        // Second exit right away: 10 s.
        let t1 = t0 + Duration::from_secs(1);
        assert_eq!(b.wait_until(t1, t1), Some(t1 + Duration::from_secs(10)));
        let mut now = t1 + Duration::from_secs(10);
        assert_eq!(b.wait_until(t1, now), None);
        let mut seen = Vec::new();
        for _ in 0..7 {
            b.record_attempt(now);
            seen.push(b.delay(now).unwrap().as_secs());
            now += Duration::from_secs(1);
        }
        assert_eq!(seen, vec![20, 40, 80, 160, 300, 300, 300]);
        // Ten minutes quiet: back to the start.
        let later = now + Duration::from_secs(601);
        assert_eq!(b.wait_until(now, later), None);
        b.record_attempt(later);
        assert_eq!(b.delay(later), Some(INITIAL));
    }
}
