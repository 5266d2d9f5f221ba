//! The loop's helper threads, for the file and process work that would
//! block it: `unblock` runs a closure on one and awaits its result. The
//! `blocking` crate (what `smol::unblock` uses) keeps every thread it ever
//! started and wakes each twice a second, forever; on an idle node that was
//! most of the agent's wakeups. Here a thread with nothing to do for
//! `IDLE_EXIT` ends, and an idle agent has none.

use std::collections::VecDeque;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::Duration;

/// How long a helper waits for more work before it ends.
const IDLE_EXIT: Duration = Duration::from_secs(10);

/// Helpers at most: a burst (30 pods starting) queues beyond this.
const MAX_THREADS: usize = 8;

type Job = Box<dyn FnOnce() + Send>;

struct Pool {
    state: Mutex<State>,
    work: Condvar,
    idle_exit: Duration,
}

struct State {
    queue: VecDeque<Job>,
    threads: usize,
    idle: usize,
}

static POOL: Pool = Pool::new(IDLE_EXIT);

impl Pool {
    const fn new(idle_exit: Duration) -> Pool {
        Pool {
            state: Mutex::new(State {
                queue: VecDeque::new(),
                threads: 0,
                idle: 0,
            }),
            work: Condvar::new(),
            idle_exit,
        }
    }

    fn submit(&'static self, job: Job) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.queue.push_back(job);
        if state.idle > 0 {
            self.work.notify_one();
            return;
        }
        if state.threads < MAX_THREADS {
            let started = std::thread::Builder::new()
                .name(format!("helper-{}", state.threads + 1))
                .spawn(move || self.serve());
            match started {
                Ok(_) => state.threads += 1,
                // No thread to run it, now or later (the system is out of
                // them): better a blocked loop than a job that never runs.
                Err(_) if state.threads == 0 => {
                    if let Some(job) = state.queue.pop_back() {
                        drop(state);
                        job();
                    }
                }
                // A busy helper takes it when done.
                Err(_) => {}
            }
        }
    }

    fn serve(&'static self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(job) = state.queue.pop_front() {
                drop(state);
                job();
                state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                continue;
            }
            state.idle += 1;
            let (next, timeout) = self
                .work
                .wait_timeout(state, self.idle_exit)
                .unwrap_or_else(PoisonError::into_inner);
            state = next;
            state.idle -= 1;
            if timeout.timed_out() && state.queue.is_empty() {
                state.threads -= 1;
                return;
            }
        }
    }
}

/// Runs `work` on a helper thread; its panic resumes in the awaiting task.
pub async fn unblock<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> T {
    POOL.run(work).await
}

impl Pool {
    async fn run<T: Send + 'static>(&'static self, work: impl FnOnce() -> T + Send + 'static) -> T {
        let (done, result) = smol::channel::bounded(1);
        self.submit(Box::new(move || {
            let outcome = catch_unwind(AssertUnwindSafe(work));
            let _ = done.send_blocking(outcome);
        }));
        match result.recv().await {
            Ok(Ok(value)) => value,
            Ok(Err(panic)) => resume_unwind(panic),
            // The job is dropped only with its sender, after sending.
            Err(_) => unreachable!("a helper job ends by sending its outcome"),
        }
    }

    #[cfg(test)]
    fn threads(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .threads
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(idle_exit: Duration) -> &'static Pool {
        Box::leak(Box::new(Pool::new(idle_exit)))
    }

    #[test]
    fn jobs_run_off_the_calling_thread_and_panics_come_back() {
        let pool = pool(IDLE_EXIT);
        let caller = std::thread::current().id();
        let results = smol::block_on(async {
            let mut out = Vec::new();
            for i in 0..20 {
                out.push(pool.run(move || (i * 2, std::thread::current().id())).await);
            }
            out
        });
        assert_eq!(
            results.iter().map(|r| r.0).collect::<Vec<_>>(),
            (0..20).map(|i| i * 2).collect::<Vec<_>>()
        );
        assert!(results.iter().all(|r| r.1 != caller));
        assert!(pool.threads() <= MAX_THREADS);
        let panicked = catch_unwind(|| smol::block_on(pool.run(|| panic!("helper failed"))));
        assert!(panicked.is_err());
        // The pool still serves.
        assert_eq!(smol::block_on(pool.run(|| 7)), 7);
    }

    #[test]
    fn idle_helpers_end() {
        let pool = pool(Duration::from_millis(50));
        smol::block_on(async {
            for _ in 0..4 {
                pool.run(|| std::thread::sleep(Duration::from_millis(5)))
                    .await;
            }
        });
        assert!(pool.threads() >= 1);
        std::thread::sleep(Duration::from_millis(400));
        assert_eq!(pool.threads(), 0);
    }
}

/// What a `+` stands for: a space in a query, itself in a path.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Plus {
    Space,
    Plus,
}

/// `%XX` escapes decoded; bytes that are not UTF-8 replaced.
pub(crate) fn percent_decode(s: &str, plus: Plus) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b'+', _) if plus == Plus::Space => {
                out.push(b' ');
                i += 1;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}
