//! Messages about one flight, and the subscription that delivers them.

use std::collections::VecDeque;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::broadcast;

/// A message about one flight.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Notice {
    /// A generation committed; small payloads come inline.
    Committed {
        /// The generation that committed.
        generation: u64,
        /// The payload, when it was small enough to travel inline.
        inline: Option<Bytes>,
        /// How long the work that produced it took
        /// ([`CommitArgs::work_time`](crate::backend::CommitArgs::work_time)),
        /// when the backend tells (this workspace's do): a node orders a
        /// result it receives by its work's start.
        work_time: Option<Duration>,
        /// How old the result was when the notice was sent: a commit dated
        /// from its sending ([`CommitArgs::sent`](crate::backend::CommitArgs::sent))
        /// that was held up on its way is that much older than its
        /// notice. Zero when the backend does not tell.
        age: Duration,
    },
    /// A generation was abandoned: race for the flight again.
    Abandoned {
        /// The generation that was abandoned.
        generation: u64,
    },
    /// Messages may have been lost (reconnect, lag): re-check now.
    Resync,
}

/// A subscription to one flight's notices. Dropping it releases the
/// backend's (reference-counted) subscription.
///
/// A backend may hand out a subscription that opens only when it is
/// first read ([`deferred`](Self::deferred)): a flight takes one before
/// its first call, and most flights (owners, hits) never read it.
pub struct Subscription {
    rx: Option<broadcast::Receiver<Notice>>,
    /// Notices delivered before the receiver's (oldest first).
    backlog: VecDeque<Notice>,
    open: Option<Box<dyn FnOnce() -> Subscription + Send + 'static>>,
    _guard: Option<Box<dyn Send + Sync + 'static>>,
}

impl Subscription {
    /// Wraps a receiver and a guard that is dropped with the subscription.
    pub fn new(rx: broadcast::Receiver<Notice>, guard: impl Send + Sync + 'static) -> Self {
        Self::with_backlog(rx, [], guard)
    }

    /// [`new`](Self::new), with notices that arrived before `rx` was
    /// created: [`recv`](Self::recv) gives them first, in order.
    pub fn with_backlog(
        rx: broadcast::Receiver<Notice>,
        backlog: impl IntoIterator<Item = Notice>,
        guard: impl Send + Sync + 'static,
    ) -> Self {
        Self {
            rx: Some(rx),
            backlog: backlog.into_iter().collect(),
            open: None,
            _guard: Some(Box::new(guard)),
        }
    }

    /// A subscription opened by `open` when it is first read (and never,
    /// if it is dropped unread). What it delivers is what `open`'s
    /// subscription delivers: a backend that defers the opening must make
    /// that include every notice sent since this call, or a
    /// [`Notice::Resync`].
    pub fn deferred(open: impl FnOnce() -> Subscription + Send + 'static) -> Self {
        Self {
            rx: None,
            backlog: VecDeque::new(),
            open: Some(Box::new(open)),
            _guard: None,
        }
    }

    /// The next notice; [`Notice::Resync`] if some were lost; `None` once the
    /// backend closed the subscription (fall back to polling).
    pub async fn recv(&mut self) -> Option<Notice> {
        while let Some(open) = self.open.take() {
            *self = open();
        }
        if let Some(n) = self.backlog.pop_front() {
            return Some(n);
        }
        match self.rx.as_mut()?.recv().await {
            Ok(n) => Some(n),
            Err(broadcast::error::RecvError::Lagged(_)) => Some(Notice::Resync),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription")
            .field("open", &self.open.is_none())
            .field("backlog", &self.backlog.len())
            .finish_non_exhaustive()
    }
}
