//! The one event loop: a thread-local executor every part of the agent spawns
//! its tasks on, and a lag probe for it.

use std::future::Future;
use std::time::{Duration, Instant};

use smol::{LocalExecutor, Task};

thread_local! {
    static EXECUTOR: LocalExecutor<'static> = const { LocalExecutor::new() };
}

/// Spawns a task on this thread's loop.
pub fn spawn<T: 'static>(future: impl Future<Output = T> + 'static) -> Task<T> {
    EXECUTOR.with(|ex| ex.spawn(future))
}

/// Runs the loop until `future` completes.
pub fn block_on<T>(future: impl Future<Output = T>) -> T {
    EXECUTOR.with(|ex| smol::block_on(ex.run(future)))
}

/// Samples how late a timer fires: the loop's lag. Cheap enough to run every
/// few seconds; a lag worth a user's attention is logged (exporting it as a
/// metric comes with the kubelet API).
pub async fn measure_lag(period: Duration) {
    loop {
        let asked = Instant::now();
        smol::Timer::after(period).await;
        let lag = asked.elapsed().saturating_sub(period);
        if lag > Duration::from_millis(50) {
            log::warn!("event loop lagged {lag:?}");
        }
    }
}
