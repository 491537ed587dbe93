//! Leases nobody is going to use, released in the background.
//!
//! An acquire that timed out on this node may still run on the backend (a
//! frozen Redis answers after the thaw), and a flight dropped while its
//! acquire was in flight may have been granted. Either way a lease may
//! exist whose holder has walked away: every other node asking for the key
//! would wait for it to expire, then run the work a second time. So every
//! token this node gives up on while it may hold a lease goes into a
//! bounded list, and a background task releases it (by token, whatever its
//! generation) as soon as the backend answers, counting
//! `singleflight_orphan_release_total{result}`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use flightdeck_core::time::Backoff;
use tokio::time::{sleep, Instant};

use crate::backend::{Backend, BackendErrorKind, Released};
use crate::flights::{Cx, State};
use crate::metrics::{Op, Orphan};

/// The most tokens a node keeps to release at once; past it the oldest is
/// given up (counted as dropped: its lease expires on its own).
const MAX_ORPHANS: usize = 4096;

/// A failed release is tried again after twice the last pause (the first
/// after 100 ms), up to 2 s.
const RELEASE_BACKOFF: Backoff = Backoff::doubling(Duration::ZERO, Duration::from_secs(2));

/// Tokens to release, and whether a task is releasing them.
#[derive(Default)]
pub(crate) struct LeaseReleases {
    list: Mutex<VecDeque<Entry>>,
    working: AtomicBool,
}

struct Entry {
    cx: Cx,
    /// When the last release was tried (`None`: never).
    tried: Option<Instant>,
    /// The backend answered "not the owner" once: one more try after a
    /// call's deadline covers an acquire that reached the backend late,
    /// on another connection.
    confirmed: bool,
    pause: Duration,
}

impl LeaseReleases {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Entry>> {
        self.list.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tokens waiting to be released (tests and health checks).
    pub(crate) fn len(&self) -> usize {
        self.lock().len()
    }
}

impl<B, C> State<B, C>
where
    B: Backend,
    C: Send + Sync + 'static,
{
    /// Adds a token that may hold a lease nobody will use.
    fn release_later(self: &Arc<Self>, cx: &Cx) {
        let dropped = {
            let mut list = self.releases.lock();
            list.push_back(Entry {
                cx: cx.clone(),
                tried: None,
                confirmed: false,
                pause: Duration::from_millis(50),
            });
            (list.len() > MAX_ORPHANS)
                .then(|| list.pop_front())
                .flatten()
        };
        if let Some(old) = dropped {
            old.cx.metrics.with(|m| m.orphan(Orphan::Dropped));
            tracing::warn!(stage = %old.cx.stage(), flight = %old.cx.flight, "too many leases to release; the oldest expires on its own");
        }
        tracing::debug!(stage = %cx.stage(), flight = %cx.flight, "releasing a lease this node may hold but will not use");
        if !self.releases.working.swap(true, Ordering::AcqRel) {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(self.tasks.spawn_on(release_all(Arc::clone(self)), &rt)),
                Err(_) => self.releases.working.store(false, Ordering::Release),
            }
        }
    }
}

/// Releases every listed token, retrying each with backoff until the
/// backend answers; ends when the list is empty.
async fn release_all<B, C>(st: Arc<State<B, C>>)
where
    B: Backend,
    C: Send + Sync + 'static,
{
    loop {
        let next = {
            let mut list = st.releases.lock();
            match list.pop_front() {
                Some(e) => e,
                None => {
                    st.releases.working.store(false, Ordering::Release);
                    return;
                }
            }
        };
        let mut entry = next;
        if let Some(at) = entry.tried {
            let due = at + entry.pause;
            if Instant::now() < due {
                tokio::time::sleep_until(due).await;
            }
        }
        entry.tried = Some(Instant::now());
        let cx = &entry.cx;
        let res = st
            .timed(
                cx,
                Op::Release,
                st.backend
                    .release(&cx.flight, &cx.token, cx.terms.state_ttl),
            )
            .await;
        let again = match res {
            Ok(Released::Released) => {
                cx.metrics.with(|m| m.orphan(Orphan::Released));
                tracing::info!(stage = %cx.stage(), flight = %cx.flight, "released a lease this node held but would not use");
                false
            }
            Ok(Released::NotOwner) if entry.confirmed => {
                cx.metrics.with(|m| m.orphan(Orphan::NotOwner));
                false
            }
            Ok(Released::NotOwner) => {
                entry.confirmed = true;
                entry.pause = cx.call_timeout;
                true
            }
            // Protocol: retrying will not help; the lease expires on its own.
            Err(e) if e.kind() == BackendErrorKind::Protocol => {
                cx.metrics.with(|m| m.orphan(Orphan::Dropped));
                false
            }
            Err(_) => {
                entry.pause = RELEASE_BACKOFF.next(entry.pause);
                true
            }
        };
        if again {
            st.releases.lock().push_back(entry);
            // Let a flood of failures back off as a whole, not spin.
            sleep(Duration::from_millis(1)).await;
        }
    }
}

/// A flight's token until it is known to hold no lease, or the owner's
/// lease took it over: dropped while it may hold one (its last call
/// timed out, or was in flight), it is listed for release.
pub(crate) struct TokenGuard<'a, B, C>
where
    B: Backend,
    C: Send + Sync + 'static,
{
    st: &'a Arc<State<B, C>>,
    cx: &'a Cx,
    suspect: bool,
    /// A call of this token had an unknown outcome: it may still reach
    /// the backend and grant a lease, whatever later calls answer, so
    /// only owning the flight settles the token.
    ambiguous: bool,
}

impl<'a, B, C> TokenGuard<'a, B, C>
where
    B: Backend,
    C: Send + Sync + 'static,
{
    pub(crate) fn new(st: &'a Arc<State<B, C>>, cx: &'a Cx) -> Self {
        Self {
            st,
            cx,
            suspect: false,
            ambiguous: false,
        }
    }

    /// A call that may grant a lease is on its way.
    pub(crate) fn suspect(&mut self) {
        self.suspect = true;
    }

    /// A call that may grant a lease answered with an unknown outcome: it
    /// may still run on the backend, late (a frozen server runs what it
    /// queued when it thaws), after any later call's answer.
    pub(crate) fn ambiguous(&mut self) {
        self.suspect = true;
        self.ambiguous = true;
    }

    /// The backend answered: the token holds no lease it does not know of
    /// (unless an earlier call of unknown outcome may still grant one).
    pub(crate) fn settled(&mut self) {
        self.suspect = self.ambiguous;
    }

    /// The token owns the flight: its lease settles it.
    pub(crate) fn owned(&mut self) {
        self.suspect = false;
    }
}

impl<B, C> Drop for TokenGuard<'_, B, C>
where
    B: Backend,
    C: Send + Sync + 'static,
{
    fn drop(&mut self) {
        if self.suspect {
            self.st.release_later(self.cx);
        }
    }
}
