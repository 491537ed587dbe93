//! The node's followers, by flight, and the notices its inboxes hear.
//!
//! Each notice goes to the followers of its flight, and the last
//! [`RECENT`] are kept for followers whose ACQUIRE answer was still on
//! its way when the notice came (the notice may overtake the answer: they
//! travel on two connections). A follower registers with a [`Mark`] taken
//! before its first call and starts with the kept notices since then;
//! when some of those were dropped for room, or notices may have been
//! lost since (a reconnect, a lagging dispatcher, a moved slot), it
//! starts with a resync instead: the follower re-checks.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::Bytes;
use flightdeck_distributed::backend::{Notice, Subscription};
use fred::types::Message;
use tokio::sync::broadcast;

use super::wire::{parse_message, value_bytes};

/// Notices kept for followers that register after them.
pub(super) const RECENT: usize = 256;

/// The node's followers, shared by every flight of the backend.
pub(super) struct Followers {
    board: Mutex<Board>,
    /// Bumped, under the board's lock, whenever notices may have been lost.
    resyncs: AtomicU64,
    /// Notices dispatched so far, bumped under the board's lock.
    seq: AtomicU64,
}

struct Board {
    /// The followers of each flight, by its record's name.
    flights: HashMap<Bytes, Flight>,
    /// The last [`RECENT`] notices: (seq, record, notice).
    recent: VecDeque<(u64, Bytes, Notice)>,
}

struct Flight {
    tx: broadcast::Sender<Notice>,
    refs: usize,
}

/// Where the notices stood when a flight took its subscription, before
/// its first call: see [`Followers::follow`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mark {
    resyncs: u64,
    /// `None`: no kept notice is wanted (the follower re-checks after
    /// registering).
    seq: Option<u64>,
}

impl Followers {
    pub(super) fn new() -> Self {
        Self {
            board: Mutex::new(Board {
                flights: HashMap::new(),
                recent: VecDeque::with_capacity(RECENT),
            }),
            resyncs: AtomicU64::new(0),
            seq: AtomicU64::new(0),
        }
    }

    fn board(&self) -> MutexGuard<'_, Board> {
        self.board.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// How many losses so far (see [`lost`](Self::lost)). Lock-free.
    pub(super) fn resyncs(&self) -> u64 {
        self.resyncs.load(Ordering::Acquire)
    }

    /// A mark for a follower that wants every notice dispatched from now
    /// on, or a resync when a loss came after `resyncs` (read by the
    /// caller before it checked its inbox was in force). Lock-free.
    pub(super) fn mark(&self, resyncs: u64) -> Mark {
        Mark {
            resyncs,
            seq: Some(self.seq.load(Ordering::Acquire)),
        }
    }

    /// A mark for a follower that re-checks once registered: only the
    /// losses from now on count.
    pub(super) fn mark_resyncs(&self) -> Mark {
        Mark {
            resyncs: self.resyncs(),
            seq: None,
        }
    }

    /// A follower of the flight whose record is `record`: what it missed
    /// since `mark`, then what the inboxes hear about the flight.
    pub(super) fn follow(self: &Arc<Self>, record: Bytes, mark: Mark) -> Subscription {
        let (rx, backlog) = self.register(&record, mark);
        let registered = Registered {
            followers: self.clone(),
            record,
        };
        Subscription::with_backlog(rx, backlog, registered)
    }

    /// Registers a follower of the flight whose record is `record`: its
    /// receiver, and what it missed since `mark` (the kept notices about
    /// its flight, or a resync when some may be lost).
    pub(super) fn register(
        &self,
        record: &Bytes,
        mark: Mark,
    ) -> (broadcast::Receiver<Notice>, Vec<Notice>) {
        let mut board = self.board();
        let mut backlog = Vec::new();
        if self.resyncs.load(Ordering::Relaxed) != mark.resyncs {
            backlog.push(Notice::Resync);
        } else if let Some(since) = mark.seq {
            let oldest = board.recent.front().map_or(u64::MAX, |(seq, _, _)| *seq);
            if self.seq.load(Ordering::Relaxed) > since && oldest > since + 1 {
                // Notices since the mark were dropped for room.
                backlog.push(Notice::Resync);
            } else {
                backlog.extend(
                    board
                        .recent
                        .iter()
                        .filter(|(seq, r, _)| *seq > since && r == record)
                        .map(|(_, _, n)| n.clone()),
                );
            }
        }
        let f = board
            .flights
            .entry(record.clone())
            .or_insert_with(|| Flight {
                tx: broadcast::channel(16).0,
                refs: 0,
            });
        f.refs += 1;
        (f.tx.subscribe(), backlog)
    }

    /// A follower of `record` left.
    pub(super) fn unregister(&self, record: &Bytes) {
        let mut board = self.board();
        if let Some(f) = board.flights.get_mut(record) {
            f.refs -= 1;
            if f.refs == 0 {
                board.flights.remove(record);
            }
        }
    }

    /// Hands a message to the followers of its flight, and keeps it for
    /// those still to register. One that does not parse may have been
    /// for anyone: every follower re-checks.
    pub(super) fn deliver(&self, msg: &Message) {
        let Some(payload) = value_bytes(&msg.value) else {
            return;
        };
        let Some((record, notice)) = parse_message(&payload) else {
            tracing::warn!("unparseable completion message; followers re-check");
            self.lost();
            return;
        };
        let mut board = self.board();
        let seq = self.seq.load(Ordering::Relaxed) + 1;
        self.seq.store(seq, Ordering::Release);
        if board.recent.len() == RECENT {
            board.recent.pop_front();
        }
        board
            .recent
            .push_back((seq, record.clone(), notice.clone()));
        if let Some(f) = board.flights.get(&record) {
            let _ = f.tx.send(notice);
        }
    }

    /// Notices may have been lost: every follower re-checks, and so does
    /// every one that registers with a mark taken before.
    pub(super) fn lost(&self) {
        let board = self.board();
        self.resyncs.fetch_add(1, Ordering::Release);
        board.resync();
    }

    /// Every registered follower re-checks (after inboxes were subscribed
    /// again: a notice published before that took effect was lost).
    pub(super) fn resync(&self) {
        self.board().resync();
    }

    /// How many flights the followers wait on (registered ones).
    pub(super) fn followed(&self) -> usize {
        self.board().flights.len()
    }
}

impl Board {
    fn resync(&self) {
        for f in self.flights.values() {
            let _ = f.tx.send(Notice::Resync);
        }
    }
}

/// A follower's registration; dropping it unregisters.
struct Registered {
    followers: Arc<Followers>,
    record: Bytes,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.followers.unregister(&self.record);
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::time::Duration;

    pub(crate) fn message(text: &str) -> Message {
        Message {
            channel: "inbox".into(),
            value: fred::types::Value::Bytes(Bytes::copy_from_slice(text.as_bytes())),
            kind: fred::types::MessageKind::Message,
            server: fred::types::config::Server::new("127.0.0.1", 6379),
        }
    }

    pub(crate) fn record(name: &str) -> Bytes {
        Bytes::copy_from_slice(name.as_bytes())
    }

    #[tokio::test]
    async fn registered_followers_get_their_flights_messages() {
        let followers = Followers::new();
        let (mut rx1, _) = followers.register(&record("r1"), followers.mark_resyncs());
        let (mut rx2, _) = followers.register(&record("r2"), followers.mark_resyncs());
        followers.deliver(&message("r1|9|c"));
        assert_eq!(
            rx1.recv().await.unwrap(),
            Notice::Committed {
                generation: 9,
                inline: None,
                work_time: None,
                age: Duration::ZERO,
            }
        );
        assert!(rx2.try_recv().is_err());
        followers.resync();
        assert_eq!(rx2.recv().await.unwrap(), Notice::Resync);
        followers.unregister(&record("r1"));
        followers.unregister(&record("r2"));
        assert_eq!(followers.followed(), 0);
    }
}
