//! Pulls that must not overlap: one per image key, and the blobs a pull in
//! flight wants, which GC must not take.

use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

use smol::lock::Mutex;

/// One holder per key at a time; the map keeps only keys someone holds or
/// waits for.
#[derive(Default)]
pub(super) struct KeyedLocks(RefCell<HashMap<String, Rc<Mutex<()>>>>);

/// Forgets a key once its last holder is done, also when that holder was
/// dropped half way (a pull abandoned with its pod).
pub(super) struct KeyRelease<'a> {
    locks: &'a KeyedLocks,
    key: &'a str,
    lock: Rc<Mutex<()>>,
}

impl Drop for KeyRelease<'_> {
    fn drop(&mut self) {
        // The map's and this one's: nobody else holds or waits.
        if Rc::strong_count(&self.lock) <= 2 {
            self.locks.0.borrow_mut().remove(self.key);
        }
    }
}

impl KeyedLocks {
    /// Runs `work` once nobody else holds `key`, telling it whether it had
    /// to wait for someone.
    pub(super) async fn run<T, F: std::future::Future<Output = T>>(
        &self,
        key: &str,
        work: impl FnOnce(bool) -> F,
    ) -> T {
        let lock = self
            .0
            .borrow_mut()
            .entry(key.to_owned())
            .or_default()
            .clone();
        let release = KeyRelease {
            locks: self,
            key,
            lock,
        };
        let waited = release.lock.try_lock().is_none();
        let _guard = release.lock.lock().await;
        work(waited).await
    }
}

/// Marks digests as wanted by a pull in flight until dropped.
pub(super) struct InFlight<'a> {
    map: &'a RefCell<HashMap<String, usize>>,
    digests: Vec<String>,
}

impl<'a> InFlight<'a> {
    pub(super) fn new(map: &'a RefCell<HashMap<String, usize>>, digests: Vec<String>) -> Self {
        let mut m = map.borrow_mut();
        for d in &digests {
            *m.entry(d.clone()).or_default() += 1;
        }
        drop(m);
        InFlight { map, digests }
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut m = self.map.borrow_mut();
        for d in &self.digests {
            if let Some(n) = m.get_mut(d) {
                *n -= 1;
                if *n == 0 {
                    m.remove(d);
                }
            }
        }
    }
}
