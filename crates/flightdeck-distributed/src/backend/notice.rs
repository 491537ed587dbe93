//! Messages about one flight, and the subscription that delivers them.

use std::fmt;

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
pub struct Subscription {
    rx: broadcast::Receiver<Notice>,
    _guard: Box<dyn Send + Sync + 'static>,
}

impl Subscription {
    /// Wraps a receiver and a guard that is dropped with the subscription.
    pub fn new(rx: broadcast::Receiver<Notice>, guard: impl Send + Sync + 'static) -> Self {
        Self {
            rx,
            _guard: Box::new(guard),
        }
    }

    /// The next notice; [`Notice::Resync`] if some were lost; `None` once the
    /// backend closed the subscription (fall back to polling).
    pub async fn recv(&mut self) -> Option<Notice> {
        match self.rx.recv().await {
            Ok(n) => Some(n),
            Err(broadcast::error::RecvError::Lagged(_)) => Some(Notice::Resync),
            Err(broadcast::error::RecvError::Closed) => None,
        }
    }
}

impl fmt::Debug for Subscription {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Subscription").finish_non_exhaustive()
    }
}
