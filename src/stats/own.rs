//! nanolet's own metrics, for the kubelet API's `/metrics`: the event
//! loop's lag, image pulls and image GC. Plain atomics any part of the
//! agent bumps; rendered in the Prometheus text format when scraped.

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::config::Signal;

/// Upper bounds (seconds) of the loop-lag histogram's buckets.
const LAG_BUCKETS: [f64; 8] = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 1.0];

static LAG_COUNTS: [AtomicU64; LAG_BUCKETS.len()] =
    [const { AtomicU64::new(0) }; LAG_BUCKETS.len()];
static LAG_COUNT: AtomicU64 = AtomicU64::new(0);
static LAG_SUM_NS: AtomicU64 = AtomicU64::new(0);
static PULLS_OK: AtomicU64 = AtomicU64::new(0);
static PULLS_FAILED: AtomicU64 = AtomicU64::new(0);
static GC_RUNS: AtomicU64 = AtomicU64::new(0);
static GC_DELETED: AtomicU64 = AtomicU64::new(0);
/// Evictions by signal, in `Signal::ALL`'s order.
static EVICTIONS: [AtomicU64; Signal::ALL.len()] = [const { AtomicU64::new(0) }; Signal::ALL.len()];

/// One sample of how late a timer fired on the loop.
pub fn observe_loop_lag(lag: Duration) {
    let seconds = lag.as_secs_f64();
    for (bound, count) in LAG_BUCKETS.iter().zip(&LAG_COUNTS) {
        if seconds <= *bound {
            count.fetch_add(1, Ordering::Relaxed);
        }
    }
    LAG_COUNT.fetch_add(1, Ordering::Relaxed);
    LAG_SUM_NS.fetch_add(lag.as_nanos() as u64, Ordering::Relaxed);
}

pub fn pull_finished(ok: bool) {
    let counter = if ok { &PULLS_OK } else { &PULLS_FAILED };
    counter.fetch_add(1, Ordering::Relaxed);
}

pub fn image_gc_ran(deleted: usize) {
    GC_RUNS.fetch_add(1, Ordering::Relaxed);
    GC_DELETED.fetch_add(deleted as u64, Ordering::Relaxed);
}

/// A pod evicted for `signal`.
pub fn evicted(signal: Signal) {
    if let Some(i) = Signal::ALL.iter().position(|s| *s == signal) {
        EVICTIONS[i].fetch_add(1, Ordering::Relaxed);
    }
}

/// The text of `/metrics`.
pub fn render() -> String {
    let mut out = String::new();
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    let _ = writeln!(
        out,
        "# HELP nanolet_event_loop_lag_seconds How late timers fired on the agent's event loop (sampled every 5 s, and every 10 ms during image pulls)."
    );
    let _ = writeln!(out, "# TYPE nanolet_event_loop_lag_seconds histogram");
    for (bound, count) in LAG_BUCKETS.iter().zip(&LAG_COUNTS) {
        let _ = writeln!(
            out,
            "nanolet_event_loop_lag_seconds_bucket{{le=\"{bound}\"}} {}",
            get(count)
        );
    }
    let count = get(&LAG_COUNT);
    let _ = writeln!(
        out,
        "nanolet_event_loop_lag_seconds_bucket{{le=\"+Inf\"}} {count}"
    );
    let _ = writeln!(
        out,
        "nanolet_event_loop_lag_seconds_sum {}",
        get(&LAG_SUM_NS) as f64 / 1e9
    );
    let _ = writeln!(out, "nanolet_event_loop_lag_seconds_count {count}");
    let _ = writeln!(
        out,
        "# HELP nanolet_image_pulls_total Image pulls by result."
    );
    let _ = writeln!(out, "# TYPE nanolet_image_pulls_total counter");
    let _ = writeln!(
        out,
        "nanolet_image_pulls_total{{result=\"success\"}} {}",
        get(&PULLS_OK)
    );
    let _ = writeln!(
        out,
        "nanolet_image_pulls_total{{result=\"failure\"}} {}",
        get(&PULLS_FAILED)
    );
    let _ = writeln!(
        out,
        "# HELP nanolet_image_gc_runs_total Image garbage collection passes."
    );
    let _ = writeln!(out, "# TYPE nanolet_image_gc_runs_total counter");
    let _ = writeln!(out, "nanolet_image_gc_runs_total {}", get(&GC_RUNS));
    let _ = writeln!(
        out,
        "# HELP nanolet_image_gc_deleted_total Images image garbage collection deleted."
    );
    let _ = writeln!(out, "# TYPE nanolet_image_gc_deleted_total counter");
    let _ = writeln!(out, "nanolet_image_gc_deleted_total {}", get(&GC_DELETED));
    // Upstream's name and label.
    let _ = writeln!(
        out,
        "# HELP kubelet_evictions Cumulative number of pod evictions by eviction signal"
    );
    let _ = writeln!(out, "# TYPE kubelet_evictions counter");
    for (signal, count) in Signal::ALL.iter().zip(&EVICTIONS) {
        let _ = writeln!(
            out,
            "kubelet_evictions{{eviction_signal=\"{}\"}} {}",
            signal.name(),
            get(count)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {series} in\n{text}"))
    }

    #[test]
    fn lag_histogram_buckets_are_cumulative() {
        // Other tests may observe too: compare before and after.
        let before = render();
        observe_loop_lag(Duration::from_micros(2000));
        observe_loop_lag(Duration::from_millis(30));
        let after = render();
        let delta = |series: &str| value(&after, series) - value(&before, series);
        assert_eq!(
            delta("nanolet_event_loop_lag_seconds_bucket{le=\"0.001\"}"),
            0.0
        );
        assert_eq!(
            delta("nanolet_event_loop_lag_seconds_bucket{le=\"0.0025\"}"),
            1.0
        );
        assert_eq!(
            delta("nanolet_event_loop_lag_seconds_bucket{le=\"0.05\"}"),
            2.0
        );
        assert_eq!(
            delta("nanolet_event_loop_lag_seconds_bucket{le=\"+Inf\"}"),
            2.0
        );
        assert_eq!(delta("nanolet_event_loop_lag_seconds_count"), 2.0);
        assert!((delta("nanolet_event_loop_lag_seconds_sum") - 0.032).abs() < 1e-9);
    }
}
