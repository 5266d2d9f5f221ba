//! The one event loop: a thread-local executor every part of the agent spawns
//! its tasks on, and a lag probe for it.

use std::future::Future;
use std::pin::Pin;
use std::task::Poll;
use std::time::{Duration, Instant};

use smol::{LocalExecutor, Task};

thread_local! {
    static EXECUTOR: LocalExecutor<'static> = const { LocalExecutor::new() };
}

/// Spawns a task on this thread's loop.
pub fn spawn<T: 'static>(future: impl Future<Output = T> + 'static) -> Task<T> {
    EXECUTOR.with(|ex| ex.spawn(future))
}

/// hyper's HTTP/2 runs each connection's work as a task of this loop.
#[derive(Clone, Copy, Debug, Default)]
pub struct LoopExecutor;

impl<F: Future + 'static> hyper::rt::Executor<F> for LoopExecutor {
    fn execute(&self, future: F) {
        spawn(future).detach();
    }
}

/// Runs the loop until `future` completes.
pub fn block_on<T>(future: impl Future<Output = T>) -> T {
    EXECUTOR.with(|ex| smol::block_on(ex.run(future)))
}

/// A future boxed for [`try_join_bounded`].
pub type LocalBoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + 'a>>;

/// Runs `futures` concurrently on this thread, at most `limit` at a time,
/// starting them in order; their results in the same order. The first error
/// ends the others (they are dropped, which cancels them).
pub async fn try_join_bounded<'a, T, E>(
    futures: Vec<LocalBoxFuture<'a, Result<T, E>>>,
    limit: usize,
) -> Result<Vec<T>, E> {
    let mut results: Vec<Option<T>> = futures.iter().map(|_| None).collect();
    let mut waiting = futures.into_iter().enumerate();
    let mut running: Vec<(usize, LocalBoxFuture<'a, Result<T, E>>)> = Vec::new();
    std::future::poll_fn(|cx| {
        loop {
            while running.len() < limit.max(1) {
                match waiting.next() {
                    Some(next) => running.push(next),
                    None => break,
                }
            }
            if running.is_empty() {
                return Poll::Ready(Ok(()));
            }
            let mut finished = false;
            let mut i = 0;
            while i < running.len() {
                match running[i].1.as_mut().poll(cx) {
                    Poll::Ready(Ok(v)) => {
                        results[running[i].0] = Some(v);
                        drop(running.swap_remove(i));
                        finished = true;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                    Poll::Pending => i += 1,
                }
            }
            // A finished one frees a slot: start the next at once.
            if !finished {
                return Poll::Pending;
            }
        }
    })
    .await?;
    Ok(results.into_iter().flatten().collect())
}

/// Runs `work` while sampling the loop's lag every `period`: its result and
/// the worst lag seen. For work that must not stall the loop (pulls): the
/// fine probe runs only as long as the work.
pub async fn with_lag_probe<T>(work: impl Future<Output = T>, period: Duration) -> (T, Duration) {
    let worst = std::cell::Cell::new(Duration::ZERO);
    let probe = async {
        loop {
            let asked = Instant::now();
            smol::Timer::after(period).await;
            let lag = asked.elapsed().saturating_sub(period);
            crate::stats::own::observe_loop_lag(lag);
            worst.set(worst.get().max(lag));
        }
    };
    let mut work = std::pin::pin!(work);
    let mut probe = std::pin::pin!(probe);
    let result = std::future::poll_fn(|cx| {
        if let Poll::Ready(v) = work.as_mut().poll(cx) {
            return Poll::Ready(v);
        }
        let _ = probe.as_mut().poll(cx);
        Poll::Pending
    })
    .await;
    (result, worst.get())
}

/// Samples how late a timer fires: the loop's lag. Cheap enough to run every
/// few seconds; every sample goes to the kubelet API's `/metrics`, and a lag
/// worth a user's attention to the log too.
pub async fn measure_lag(period: Duration) {
    loop {
        let asked = Instant::now();
        smol::Timer::after(period).await;
        let lag = asked.elapsed().saturating_sub(period);
        crate::stats::own::observe_loop_lag(lag);
        if lag > Duration::from_millis(50) {
            log::warn!("event loop lagged {lag:?}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    #[test]
    fn join_bounded_keeps_order_and_the_bound_and_stops_at_an_error() {
        let running = Cell::new(0);
        let most = Cell::new(0);
        let task = |i: u64| -> LocalBoxFuture<'_, Result<u64, u64>> {
            let (running, most) = (&running, &most);
            Box::pin(async move {
                running.set(running.get() + 1);
                most.set(most.get().max(running.get()));
                smol::Timer::after(Duration::from_millis(10 * 5u64.saturating_sub(i))).await;
                running.set(running.get() - 1);
                if i == 99 { Err(i) } else { Ok(i * 2) }
            })
        };
        let ok = block_on(try_join_bounded((0..5).map(task).collect(), 2));
        assert_eq!(ok, Ok(vec![0, 2, 4, 6, 8]));
        assert_eq!(most.get(), 2);
        let err = block_on(try_join_bounded(vec![task(1), task(99), task(2)], 3));
        assert_eq!(err, Err(99));
    }
}
