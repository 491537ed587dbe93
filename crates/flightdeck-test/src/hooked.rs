//! A [`Backend`] wrapper that runs a hook before calls, to force races
//! deterministically (e.g. "the owner commits between the follower's
//! acquire and its subscribe": publish before subscribe) or after them
//! ("the owner commits right after the follower's acquire"), and can lose
//! the replies of acquires that did happen (an ambiguous acquire).
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use flightdeck_distributed::Backend;
//! use flightdeck_test::{conformance, Hooked, MemoryBackend};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let seen = Arc::new(AtomicUsize::new(0));
//! let counter = seen.clone();
//! let backend = Hooked::new(MemoryBackend::new()).before_subscribe(move |_flight| {
//!     let counter = counter.clone();
//!     async move {
//!         counter.fetch_add(1, Ordering::SeqCst);
//!     }
//! });
//! let _sub = backend.subscribe(&conformance::fresh_flight()).await.unwrap();
//! assert_eq!(seen.load(Ordering::SeqCst), 1);
//! # }
//! ```

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use flightdeck_distributed::backend::{
    Acquired, Ask, Backend, BackendError, BackendFuture, FlightId, LeaseTerms, OwnerToken,
    Subscription,
};

type Hook = Arc<dyn Fn(FlightId) -> Pin<Box<dyn Future<Output = ()> + Send>> + Send + Sync>;

/// Wraps a backend and runs hooks before some of its calls.
#[derive(Clone)]
pub struct Hooked<B> {
    inner: B,
    before_subscribe: Option<Hook>,
    after_acquire: Option<Hook>,
    before_commit: Option<Hook>,
    lose_acquire_replies: Arc<AtomicUsize>,
}

impl<B> Hooked<B> {
    /// Wraps `inner` with no hooks.
    pub fn new(inner: B) -> Self {
        Self {
            inner,
            before_subscribe: None,
            after_acquire: None,
            before_commit: None,
            lose_acquire_replies: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The next `n` acquires take effect but answer "outcome unknown", as
    /// when the reply is lost to a timeout or a dropped connection.
    pub fn lose_acquire_replies(self, n: usize) -> Self {
        self.lose_acquire_replies.store(n, Ordering::SeqCst);
        self
    }

    /// Runs `hook(flight)` to completion before every `subscribe`.
    pub fn before_subscribe<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(FlightId) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.before_subscribe = Some(Arc::new(move |f| Box::pin(hook(f))));
        self
    }

    /// Runs `hook(flight)` to completion after every `acquire` (and
    /// re-check) that reached the backend, before its answer is returned.
    pub fn after_acquire<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(FlightId) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.after_acquire = Some(Arc::new(move |f| Box::pin(hook(f))));
        self
    }

    /// Runs `hook(flight)` to completion before every `commit` reaches
    /// the backend (a commit held up on its way: a frozen store).
    pub fn before_commit<F, Fut>(mut self, hook: F) -> Self
    where
        F: Fn(FlightId) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = ()> + Send + 'static,
    {
        self.before_commit = Some(Arc::new(move |f| Box::pin(hook(f))));
        self
    }

    /// The wrapped backend.
    pub fn get_ref(&self) -> &B {
        &self.inner
    }
}

impl<B: fmt::Debug> fmt::Debug for Hooked<B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Hooked")
            .field("inner", &self.inner)
            .field("before_subscribe", &self.before_subscribe.is_some())
            .field("after_acquire", &self.after_acquire.is_some())
            .finish()
    }
}

impl<B: Backend> Hooked<B> {
    /// `answer` (the inner backend's acquire or re-check), with the hooks.
    async fn hooked(
        &self,
        flight: &FlightId,
        answer: BackendFuture<'_, Acquired>,
    ) -> Result<Acquired, BackendError> {
        let answer = answer.await;
        if let Some(hook) = &self.after_acquire {
            hook(*flight).await;
        }
        let answer = answer?;
        let lose = self
            .lose_acquire_replies
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok();
        if lose {
            return Err(BackendError::outcome_unknown(
                "hooked backend: acquire reply lost",
            ));
        }
        Ok(answer)
    }
}

impl<B: Backend> Backend for Hooked<B> {
    /// The hooks run for re-checks as for acquires.
    fn acquire_with<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        ask: Ask,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        Box::pin(self.hooked(flight, self.inner.acquire_with(flight, token, ask, terms)))
    }

    flightdeck_distributed::forward_backend!(inner => heartbeat, abandon, invalidate, release, reject_early, unreachable, shard, sharded, shards, invalidated_since, wait_replicas, call_timeout_hint);

    fn commit<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        args: &'a flightdeck_distributed::backend::CommitArgs,
    ) -> BackendFuture<'a, flightdeck_distributed::backend::Committed> {
        Box::pin(async move {
            if let Some(hook) = &self.before_commit {
                hook(*flight).await;
            }
            self.inner.commit(flight, token, generation, args).await
        })
    }

    fn subscribe<'a>(&'a self, flight: &'a FlightId) -> BackendFuture<'a, Subscription> {
        Box::pin(async move {
            if let Some(hook) = &self.before_subscribe {
                hook(*flight).await;
            }
            self.inner.subscribe(flight).await
        })
    }

    /// Only without a `before_subscribe` hook: a shared subscription would
    /// skip it.
    fn join_subscription(&self, flight: &FlightId) -> Option<Subscription> {
        match self.before_subscribe {
            Some(_) => None,
            None => self.inner.join_subscription(flight),
        }
    }
}
