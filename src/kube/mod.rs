//! The API server client: kubeconfig, requests, the list+watch state
//! machine. No kube-client (it needs tokio); the types are k8s-openapi's.

pub(crate) mod client;
pub(crate) mod diff;
pub(crate) mod identity;
pub(crate) mod kubeconfig;
pub mod protobuf;
pub(crate) mod watch;

use std::time::Duration;

pub use client::{Api, KubeError, PatchType};
pub use kubeconfig::Kubeconfig;

/// Exponential backoff with full jitter, as client-go's reflector and
/// retry helpers use, so that a fleet reconnecting after an outage does not
/// arrive in one wave.
#[derive(Debug, Clone)]
pub struct RetryBackoff {
    initial: Duration,
    max: Duration,
    attempts: u32,
}

impl RetryBackoff {
    pub fn new(initial: Duration, max: Duration) -> RetryBackoff {
        RetryBackoff {
            initial,
            max,
            attempts: 0,
        }
    }

    /// The next delay: initial·2ⁿ capped at max, times a factor in [1, 2).
    pub fn next_delay(&mut self) -> Duration {
        let base = self
            .initial
            .saturating_mul(1u32 << self.attempts.min(16))
            .min(self.max);
        self.attempts = self.attempts.saturating_add(1);
        base.mul_f64(1.0 + crate::state::random_fraction())
    }

    pub fn reset(&mut self) {
        self.attempts = 0;
    }
}

/// Logs an outage once when it starts and once when it ends, instead of
/// once per failed request: every request goes through it, and callers
/// leave errors that [`KubeError::is_unavailable`] to it.
#[derive(Debug, Default)]
struct OutageLog {
    down_since: Option<std::time::Instant>,
}

impl OutageLog {
    fn failed(&mut self, error: &KubeError) {
        if self.down_since.is_some() {
            log::debug!("{error}");
            return;
        }
        self.down_since = Some(std::time::Instant::now());
        log::warn!("API server unreachable ({error}); pods keep running, retrying");
    }

    fn succeeded(&mut self) {
        if let Some(since) = self.down_since.take() {
            log::info!(
                "API server reachable again after {}s",
                since.elapsed().as_secs()
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_with_jitter_up_to_the_cap() {
        let mut b = RetryBackoff::new(Duration::from_millis(800), Duration::from_secs(30));
        let first = b.next_delay();
        assert!(first >= Duration::from_millis(800) && first < Duration::from_millis(1600));
        for _ in 0..10 {
            b.next_delay();
        }
        let capped = b.next_delay();
        assert!(capped >= Duration::from_secs(30) && capped < Duration::from_secs(60));
        b.reset();
        assert!(b.next_delay() < Duration::from_millis(1600));
    }
}
