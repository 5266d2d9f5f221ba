//! nanolet's own metrics, for the kubelet API's `/metrics`: the event
//! loop's lag, image pulls and image GC. Plain atomics any part of the
//! agent bumps; rendered in the Prometheus text format when scraped.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::config::Signal;

/// A Prometheus histogram of durations, with fixed upper bounds (seconds).
struct Histogram<const N: usize> {
    bounds: [f64; N],
    buckets: [AtomicU64; N],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl<const N: usize> Histogram<N> {
    const fn new(bounds: [f64; N]) -> Self {
        Histogram {
            bounds,
            buckets: [const { AtomicU64::new(0) }; N],
            count: AtomicU64::new(0),
            sum_ns: AtomicU64::new(0),
        }
    }

    fn observe(&self, value: Duration) {
        let seconds = value.as_secs_f64();
        for (bound, bucket) in self.bounds.iter().zip(&self.buckets) {
            if seconds <= *bound {
                bucket.fetch_add(1, Ordering::Relaxed);
            }
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns
            .fetch_add(value.as_nanos() as u64, Ordering::Relaxed);
    }

    fn render(&self, out: &mut String, name: &str, help: &str) {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let _ = writeln!(out, "# HELP {name} {help}");
        let _ = writeln!(out, "# TYPE {name} histogram");
        for (bound, bucket) in self.bounds.iter().zip(&self.buckets) {
            let _ = writeln!(out, "{name}_bucket{{le=\"{bound}\"}} {}", get(bucket));
        }
        let count = get(&self.count);
        let _ = writeln!(out, "{name}_bucket{{le=\"+Inf\"}} {count}");
        let _ = writeln!(out, "{name}_sum {}", get(&self.sum_ns) as f64 / 1e9);
        let _ = writeln!(out, "{name}_count {count}");
    }
}

static LOOP_LAG: Histogram<8> = Histogram::new([0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 1.0]);
/// Upstream's buckets for kubelet_pod_start_duration_seconds.
static POD_START: Histogram<25> = Histogram::new([
    0.5, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 20.0, 30.0, 45.0, 60.0, 120.0, 180.0, 240.0,
    300.0, 360.0, 480.0, 600.0, 900.0, 1200.0, 1800.0, 2700.0, 3600.0,
]);
static PULLS_OK: AtomicU64 = AtomicU64::new(0);
static PULLS_FAILED: AtomicU64 = AtomicU64::new(0);
static GC_RUNS: AtomicU64 = AtomicU64::new(0);
static GC_DELETED: AtomicU64 = AtomicU64::new(0);
/// Evictions by signal, in `Signal::ALL`'s order.
static EVICTIONS: [AtomicU64; Signal::ALL.len()] = [const { AtomicU64::new(0) }; Signal::ALL.len()];
/// Probe runs by (namespace, pod, pod uid, container, probe type, result),
/// for `/metrics/probes`; a pod's go when its worker ends, as upstream's.
static PROBES: Mutex<BTreeMap<[String; 6], u64>> = Mutex::new(BTreeMap::new());
/// Requests to the API server by (method, status code or `<error>`).
static API_REQUESTS: Mutex<BTreeMap<(String, String), u64>> = Mutex::new(BTreeMap::new());

/// One sample of how late a timer fired on the loop.
pub fn observe_loop_lag(lag: Duration) {
    LOOP_LAG.observe(lag);
}

/// A pod ran for the first time, `since` the agent first saw it.
pub fn pod_started(since: Duration) {
    POD_START.observe(since);
}

/// A request to the API server answered with `code` (None: no answer).
pub fn api_request(method: &str, code: Option<u16>) {
    let code = code.map_or_else(|| "<error>".to_owned(), |c| c.to_string());
    if let Ok(mut requests) = API_REQUESTS.lock() {
        *requests.entry((method.to_owned(), code)).or_default() += 1;
    }
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

/// A probe of `container` in pod (namespace, name, uid) ran.
pub fn probe_ran(pod: [&str; 3], container: &str, probe_type: &str, success: bool) {
    let result = if success { "successful" } else { "failed" };
    let [namespace, name, uid] = pod;
    let key = [namespace, name, uid, container, probe_type, result].map(str::to_owned);
    if let Ok(mut probes) = PROBES.lock() {
        *probes.entry(key).or_default() += 1;
    }
}

/// The pod `uid` is gone: its probe series too.
pub fn forget_probes(uid: &str) {
    if let Ok(mut probes) = PROBES.lock() {
        probes.retain(|key, _| key[2] != uid);
    }
}

/// The text of `/metrics/probes`, in upstream's names and labels.
pub fn render_probes() -> String {
    let mut out = String::from(
        "# HELP prober_probe_total [BETA] Cumulative number of a liveness, readiness or startup probe for a container by result.\n# TYPE prober_probe_total counter\n",
    );
    if let Ok(probes) = PROBES.lock() {
        for ([namespace, pod, uid, container, probe_type, result], n) in probes.iter() {
            let _ = writeln!(
                out,
                "prober_probe_total{{container=\"{container}\",namespace=\"{namespace}\",pod=\"{pod}\",pod_uid=\"{uid}\",probe_type=\"{probe_type}\",result=\"{result}\"}} {n}"
            );
        }
    }
    out
}

/// The text of `/metrics`.
pub fn render() -> String {
    let mut out = String::new();
    let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
    LOOP_LAG.render(
        &mut out,
        "nanolet_event_loop_lag_seconds",
        "How late timers fired on the agent's event loop (sampled every 5 s, and every 10 ms during image pulls).",
    );
    // Upstream's names, help and labels (but for rest_client's host).
    POD_START.render(
        &mut out,
        "kubelet_pod_start_duration_seconds",
        "Duration in seconds from kubelet seeing a pod for the first time to the pod starting to run",
    );
    let _ = writeln!(
        out,
        "# HELP rest_client_requests_total Number of HTTP requests, partitioned by status code and method."
    );
    let _ = writeln!(out, "# TYPE rest_client_requests_total counter");
    if let Ok(requests) = API_REQUESTS.lock() {
        for ((method, code), n) in requests.iter() {
            let _ = writeln!(
                out,
                "rest_client_requests_total{{code=\"{code}\",method=\"{method}\"}} {n}"
            );
        }
    }
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
    fn probe_series_count_by_result_and_go_with_their_pod() {
        let pod = ["default", "web", "uid-probes-test"];
        probe_ran(pod, "c", "Readiness", true);
        probe_ran(pod, "c", "Readiness", true);
        probe_ran(pod, "c", "Liveness", false);
        let text = render_probes();
        let series = |probe_type: &str, result: &str| {
            format!(
                "prober_probe_total{{container=\"c\",namespace=\"default\",pod=\"web\",pod_uid=\"uid-probes-test\",probe_type=\"{probe_type}\",result=\"{result}\"}}"
            )
        };
        assert_eq!(value(&text, &series("Readiness", "successful")), 2.0);
        assert_eq!(value(&text, &series("Liveness", "failed")), 1.0);
        forget_probes("uid-probes-test");
        assert!(!render_probes().contains("uid-probes-test"));
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

    #[test]
    fn pod_starts_and_api_requests_are_counted() {
        let before = render();
        pod_started(Duration::from_millis(1500));
        api_request("PATCH", Some(200));
        api_request("PATCH", Some(200));
        api_request("GET", None);
        let after = render();
        let delta = |series: &str| {
            let old = before
                .lines()
                .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0);
            value(&after, series) - old
        };
        assert_eq!(
            delta("kubelet_pod_start_duration_seconds_bucket{le=\"1\"}"),
            0.0
        );
        assert_eq!(
            delta("kubelet_pod_start_duration_seconds_bucket{le=\"2\"}"),
            1.0
        );
        assert_eq!(delta("kubelet_pod_start_duration_seconds_count"), 1.0);
        assert_eq!(
            delta("rest_client_requests_total{code=\"200\",method=\"PATCH\"}"),
            2.0
        );
        assert_eq!(
            delta("rest_client_requests_total{code=\"<error>\",method=\"GET\"}"),
            1.0
        );
    }
}
