//! A pull's progress, in `status.json` for `nanolet images` and in the log.

use super::ImageService;
use super::store::PullProgress;

/// How often pull progress reaches `status.json` and the log.
pub(super) const PROGRESS_FILE_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
pub(super) const PROGRESS_LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);

/// A pull's entry in the progress, removed when the pull ends however it
/// ends.
pub(super) struct Progress<'a> {
    service: &'a ImageService,
    key: String,
    logged: std::cell::Cell<std::time::Instant>,
}

impl<'a> Progress<'a> {
    pub(super) fn start(service: &'a ImageService, key: &str, done: u64, total: u64) -> Self {
        service
            .status
            .borrow_mut()
            .pulls
            .insert(key.to_owned(), PullProgress { done, total });
        service.write_status(true);
        Progress {
            service,
            key: key.to_owned(),
            logged: std::cell::Cell::new(std::time::Instant::now()),
        }
    }

    /// Bytes downloaded again from the start.
    pub(super) fn rewind(&self, bytes: u64) {
        if let Some(p) = self.service.status.borrow_mut().pulls.get_mut(&self.key) {
            p.done = p.done.saturating_sub(bytes);
        }
    }

    pub(super) fn advance(&self, bytes: u64) {
        let (done, total) = {
            let mut status = self.service.status.borrow_mut();
            let Some(p) = status.pulls.get_mut(&self.key) else {
                return;
            };
            p.done = (p.done + bytes).min(p.total);
            (p.done, p.total)
        };
        self.service.write_status(false);
        if self.logged.get().elapsed() >= PROGRESS_LOG_EVERY {
            self.logged.set(std::time::Instant::now());
            log::info!(
                "pulling {}: {:.1} of {:.1} MB",
                self.key,
                done as f64 / 1e6,
                total as f64 / 1e6
            );
        }
    }
}

impl Drop for Progress<'_> {
    fn drop(&mut self) {
        self.service.status.borrow_mut().pulls.remove(&self.key);
        self.service.write_status(true);
    }
}
