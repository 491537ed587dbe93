//! One SUBSCRIBE at a time per inbox: two followers that find an inbox
//! missing send one (the second finds it in force once the first is
//! done), while other inboxes' commands do not wait.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

/// A lock per inbox with a SUBSCRIBE under way, by its key (its slot; 0
/// on one server). An entry lives while somebody holds or waits for its
/// lock.
#[derive(Default)]
pub(super) struct Serials {
    ops: Mutex<HashMap<u16, Arc<tokio::sync::Mutex<()>>>>,
}

/// The right to send SUBSCRIBE for one inbox; see [`Serials::take`].
pub(super) struct Serial<'a> {
    serials: &'a Serials,
    key: u16,
    lock: Option<Arc<tokio::sync::Mutex<()>>>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Serials {
    /// Waits for the right to send SUBSCRIBE for the inbox `key`.
    pub(super) async fn take(&self, key: u16) -> Serial<'_> {
        let lock = {
            let mut ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
            Arc::clone(ops.entry(key).or_default())
        };
        let mut serial = Serial {
            serials: self,
            key,
            lock: Some(Arc::clone(&lock)),
            guard: None,
        };
        serial.guard = Some(lock.lock_owned().await);
        serial
    }
}

impl Drop for Serial<'_> {
    fn drop(&mut self) {
        self.guard.take();
        let Some(lock) = self.lock.take() else {
            return;
        };
        let mut ops = self.serials.ops.lock().unwrap_or_else(|e| e.into_inner());
        // Ours and the map's: nobody else holds or waits for it.
        if Arc::strong_count(&lock) == 2 {
            ops.remove(&self.key);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn one_inbox_waits_for_its_own_commands_only() {
        let serials = Serials::default();
        let a = serials.take(1).await;
        // Another inbox's SUBSCRIBE goes out meanwhile...
        let b = tokio::time::timeout(Duration::from_secs(1), serials.take(2)).await;
        assert!(b.is_ok(), "inbox b waited for inbox a");
        drop(b);
        // ...the same inbox's waits for the command under way.
        let again = serials.take(1);
        tokio::pin!(again);
        assert!(
            tokio::time::timeout(Duration::from_secs(1), &mut again)
                .await
                .is_err(),
            "a second command of inbox a went out before the first ended"
        );
        drop(a);
        let again = tokio::time::timeout(Duration::from_secs(1), again).await;
        assert!(again.is_ok(), "inbox a is free again");
        drop(again);
        // Nothing is kept once nobody holds or waits.
        assert!(serials.ops.lock().unwrap().is_empty());
    }
}
