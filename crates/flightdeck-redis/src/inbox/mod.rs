//! The node's inboxes, and its followers waiting on them.
//!
//! A node hears that a flight it follows ended through an inbox of its own:
//! a pub/sub channel it subscribes to once, and again after every reconnect
//! (one server: one inbox, subscribed as soon as the subscriber connects;
//! a cluster: one per hash slot the node follows flights in, subscribed by
//! its first follower there, on the primary serving the slot). Every
//! ACQUIRE names the inbox, and one that answers FOLLOWER adds it to the
//! flight's record in the same script (see [`scripts`](crate::scripts)),
//! so a grant that ends after that read publishes to it. A follower whose
//! inbox was in force before its ACQUIRE was sent therefore needs no
//! SUBSCRIBE and no second ACQUIRE.
//!
//! Messages name their flight's record. The dispatcher hands each to the
//! node's followers of that flight ([`dispatch`]). A follower's
//! subscription taken before its ACQUIRE opens when it is first read
//! (owners and hits never read theirs), and starts with the kept messages
//! since it was taken, or with a resync when some may be lost.
//!
//! [`Inboxes`] alone decides what is subscribed where and when an inbox
//! may be relied on. The connection and cluster code only tell it what
//! happened (a node's subscriber exists: [`Inboxes::attach`], which then
//! hears its messages and its reconnections; the slot map changed:
//! [`Inboxes::map_changed`]); the backend asks it for what a flight needs
//! (the inbox an ACQUIRE names, a follower's subscription). The parts:
//! the inbox names and the messages' format ([`wire`]), one hash tag per
//! cluster slot ([`tags`]), one SUBSCRIBE at a time per inbox
//! ([`serial`]).
//!
//! Like tower's `Buffer` worker, one owner holds the state and the
//! others send it events; unlike it, no task sits in between: the checks
//! a flight makes before its first call are an atomic load or two, and a
//! channel hop would cost more than the check.

mod dispatch;
mod serial;
mod tags;
mod wire;

use std::collections::HashMap;
use std::future::Future;
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use flightdeck_distributed::backend::{BackendError, Subscription};
use fred::clients::SubscriberClient;
use fred::prelude::*;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::args::ScriptArgs;
use crate::cluster::SLOTS;

use dispatch::Followers;
pub(crate) use dispatch::Mark;
use serial::Serials;
#[cfg(fuzzing)]
pub(crate) use wire::parse_message;
use wire::Channels;

/// The node's inboxes and followers, shared by every flight of the backend.
pub(crate) struct Inboxes {
    channels: Channels,
    /// How long a SUBSCRIBE sent again (after a reconnect, a moved slot)
    /// may take.
    timeout: Duration,
    // Cluster: sharded pub/sub (SSUBSCRIBE/SPUBLISH), so a flight's
    // messages stay on the shard that owns its slot.
    sharded: bool,
    followers: Arc<Followers>,
    /// By slot (0 on one server). Its lock also orders the in-force bits
    /// against losses (see [`lost`](Self::lost)).
    noted: Mutex<HashMap<u16, Inbox>>,
    serials: Serials,
    /// One bit per inbox (its slot; bit 0 on one server): subscribed on
    /// the server, confirmed, and no subscription lost since. Only then
    /// may a flight rely on it before its first call ([`Inboxes::join`]).
    /// Cleared before the followers' resyncs are bumped, set under the
    /// lock of `noted`.
    joinable: Box<[AtomicU64]>,
    /// One server's subscriber, once attached: a dead connection would
    /// not say so to its followers (see [`Inboxes::join`]).
    single: OnceLock<SubscriberClient>,
}

/// Slots whose primary changed in the cluster's slot map: see
/// [`Inboxes::map_changed`].
#[derive(Debug)]
pub(crate) struct Moved {
    pub(crate) slots: RangeInclusive<u16>,
    /// The subscriber of the primary serving them now (`None`: no
    /// primary, or none with a client).
    pub(crate) to: Option<SubscriberClient>,
}

struct Inbox {
    channel: String,
    /// The subscriber it was subscribed on (its server's), once it was.
    on: Option<SubscriberClient>,
}

impl Inboxes {
    pub(crate) fn new(prefix: &str, timeout: Duration, sharded: bool) -> Self {
        let bits = if sharded { usize::from(SLOTS / 64) } else { 1 };
        Self {
            channels: Channels::new(prefix, sharded),
            timeout,
            sharded,
            followers: Arc::new(Followers::new()),
            noted: Mutex::new(HashMap::new()),
            serials: Serials::default(),
            joinable: (0..bits).map(|_| AtomicU64::new(0)).collect(),
            single: OnceLock::new(),
        }
    }

    fn noted(&self) -> MutexGuard<'_, HashMap<u16, Inbox>> {
        self.noted.lock().unwrap_or_else(|e| e.into_inner())
    }

    // What the backend asks for.

    /// The inbox a flight of `slot` names: the one server's, or in a
    /// cluster the slot's (its hash tag hashes to `slot`, so the scripts'
    /// `SPUBLISH` stays in the flight's slot).
    pub(crate) fn name(&self, slot: u16) -> Bytes {
        self.channels.name(slot)
    }

    /// `args` with the inbox a flight of `slot` names as their next
    /// argument, written into their buffer (an ACQUIRE's: no string of its
    /// own per call).
    pub(crate) fn name_in(&self, slot: u16, args: ScriptArgs) -> ScriptArgs {
        self.channels.write(slot, args)
    }

    /// Whether `slot`'s inbox is in force (see [`Self::joinable`]).
    pub(crate) fn in_force(&self, slot: u16) -> bool {
        let (word, bit) = self.bit(self.key(slot));
        word.load(Ordering::Acquire) & bit != 0
    }

    /// For a flight of `slot` about to send its first call: when `slot`'s
    /// inbox is in force (and on one server its subscriber connected), the
    /// mark a subscription opened later with it ([`follow`](Self::follow))
    /// starts from: it gets every message dispatched from now on, or a
    /// resync. `None` otherwise. Lock-free.
    pub(crate) fn join(&self, slot: u16) -> Option<Mark> {
        // Read before the bit: a loss clears the bits before it bumps
        // `resyncs`, so a mark that saw the bump sees the bit cleared.
        let resyncs = self.followers.resyncs();
        if !self.in_force(slot) {
            return None;
        }
        if self.single.get().is_some_and(|on| !on.is_connected()) {
            return None;
        }
        Some(self.followers.mark(resyncs))
    }

    /// A follower of the flight whose record is `record`, registered with
    /// `mark` ([`join`](Self::join)'s): what it missed since, then what the
    /// inbox hears about the flight (its messages name the record).
    pub(crate) fn follow(&self, record: Bytes, mark: Mark) -> Subscription {
        self.followers.follow(record, mark)
    }

    /// A follower of the flight whose record is `record`, of `slot`, that
    /// re-checks once this returns. Unless `slot`'s inbox is in force it is
    /// subscribed first, by one follower at a time: `subscribe` (the
    /// backend's, which finds the subscriber serving the slot and calls
    /// [`subscribe_on`](Self::subscribe_on)), then marked in force unless
    /// a subscription was lost meanwhile.
    pub(crate) async fn subscribe<F>(
        &self,
        slot: u16,
        record: Bytes,
        subscribe: impl FnOnce() -> F,
    ) -> Result<Subscription, BackendError>
    where
        F: Future<Output = Result<(), BackendError>>,
    {
        let mark = self.followers.mark_resyncs();
        if !self.in_force(slot) {
            let _serial = self.serials.take(self.key(slot)).await;
            // Another follower subscribed it while we waited.
            if !self.in_force(slot) {
                let resyncs = self.followers.resyncs();
                subscribe().await?;
                self.confirmed(slot, resyncs);
            }
        }
        Ok(self.follow(record, mark))
    }

    /// (S)SUBSCRIBEs `slot`'s inbox on `on`, noted there before it is sent
    /// (so a reconnect of `on` subscribes it again); `Ok` once Redis
    /// applied it.
    pub(crate) async fn subscribe_on(
        &self,
        slot: u16,
        on: &SubscriberClient,
    ) -> Result<(), fred::error::Error> {
        let channel = self.note(slot, on);
        self.send(on, channel).await
    }

    /// How many inboxes this node has subscribed (or is subscribing).
    pub(crate) fn count(&self) -> usize {
        self.noted().len()
    }

    /// How many flights this node's followers wait on (registered ones).
    pub(crate) fn followed(&self) -> usize {
        self.followers.followed()
    }

    // What the connection and cluster code tell.

    /// Event: a node's subscriber, before it connects. The inboxes hear
    /// its messages from now on. Messages sent while it is disconnected
    /// are lost, so on every (re)connection (fred announces the first
    /// one too) every follower re-checks, the inboxes noted on it are
    /// subscribed again, confirmed ([`resubscribe`](Self::resubscribe)),
    /// and every follower re-checks once more. One server's inbox is
    /// noted on it at once, so that it is subscribed from the first
    /// connection on and even a node's first follower needs one ACQUIRE.
    pub(crate) fn attach(
        self: &Arc<Self>,
        subscriber: &SubscriberClient,
        tasks: &mut Vec<JoinHandle<()>>,
    ) {
        let mut messages = subscriber.message_rx();
        let followers = self.followers.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                match messages.recv().await {
                    Ok(msg) => followers.deliver(&msg),
                    // Messages may have been lost; the subscriptions
                    // are in force.
                    Err(broadcast::error::RecvError::Lagged(_)) => followers.lost(),
                    Err(broadcast::error::RecvError::Closed) => break,
                }
            }
        }));
        if !self.sharded {
            self.note(0, subscriber);
            let _ = self.single.set(subscriber.clone());
        }
        let mut reconnects = subscriber.reconnect_rx();
        let (inboxes, on) = (self.clone(), subscriber.clone());
        tasks.push(tokio::spawn(async move {
            while let Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) = reconnects.recv().await
            {
                inboxes.lost(None);
                inboxes.resubscribe(&on).await;
                inboxes.followers.resync();
            }
        }));
    }

    /// Event: the cluster's slot map changed, and `moved` are the slots
    /// whose primary is another now (or none). Redis dropped a moved
    /// slot's shard channels, or its primary went: each inbox of those
    /// slots is out of force and its followers re-check now rather than
    /// at their next poll; each is noted on its slot's new primary at once
    /// (so that a new primary's first connection subscribes it too) and
    /// subscribed again there, waiting up to `within` for a subscriber
    /// still connecting; then every follower re-checks once more. The
    /// other inboxes stay where they are.
    pub(crate) fn map_changed(self: &Arc<Self>, moved: &[Moved], within: Duration) {
        let lost: Vec<(u16, Option<SubscriberClient>)> = self
            .noted()
            .keys()
            .filter_map(|slot| {
                let m = moved.iter().find(|m| m.slots.contains(slot))?;
                Some((*slot, m.to.clone()))
            })
            .collect();
        if lost.is_empty() {
            return;
        }
        let slots: Vec<u16> = lost.iter().map(|(slot, _)| *slot).collect();
        self.lost(Some(&slots));
        let again: Vec<(u16, SubscriberClient)> = lost
            .into_iter()
            .filter_map(|(slot, to)| {
                let to = to?;
                self.note(slot, &to);
                Some((slot, to))
            })
            .collect();
        tokio::spawn(self.clone().subscribe_moved(again, within));
    }

    // The decisions.

    /// The key of `slot`'s inbox (0 on one server).
    fn key(&self, slot: u16) -> u16 {
        if self.sharded {
            slot
        } else {
            0
        }
    }

    fn bit(&self, key: u16) -> (&AtomicU64, u64) {
        let key = usize::from(key);
        (&self.joinable[key / 64], 1 << (key % 64))
    }

    /// The name of `slot`'s inbox, noted as subscribed on `on` (set before
    /// its SUBSCRIBE is sent, so a reconnect of `on` subscribes it again:
    /// see [`resubscribe`](Self::resubscribe)).
    fn note(&self, slot: u16, on: &SubscriberClient) -> String {
        let key = self.key(slot);
        let mut noted = self.noted();
        let inbox = noted.entry(key).or_insert_with(|| Inbox {
            channel: String::from_utf8_lossy(&self.name(slot)).into_owned(),
            on: None,
        });
        inbox.on = Some(on.clone());
        inbox.channel.clone()
    }

    /// (S)SUBSCRIBEs `channel` on `subscriber`: `Ok` once Redis applied it.
    async fn send(
        &self,
        subscriber: &SubscriberClient,
        channel: String,
    ) -> Result<(), fred::error::Error> {
        if self.sharded {
            // SSUBSCRIBE waits for Redis's reply.
            subscriber.ssubscribe(channel).await
        } else {
            subscriber.subscribe(channel).await?;
            // fred 10.1 answers SUBSCRIBE as soon as it is written to the
            // socket (`Connection::push_command`: `has_no_responses`), not
            // when Redis applied it; a notice published in between by
            // another connection was lost (15% of subscribe-then-publish
            // rounds under load, tests/pubsub.rs). Redis answers a PING on
            // the same connection only after the SUBSCRIBE before it: the
            // barrier that makes "subscribed" true when this returns.
            subscriber.ping::<Value>(None).await.map(drop)
        }
    }

    /// After `subscriber` (re)connected: (S)SUBSCRIBEs again, confirmed,
    /// every inbox subscribed on it, and marks each in force unless a
    /// subscription was lost since. fred's own resubscription
    /// (`manage_subscriptions`) is not used: it reports the reconnect
    /// before its SUBSCRIBE is even sent (a notice published in between
    /// was lost with no resync after it), and with sharded channels it
    /// sends an empty SUBSCRIBE that Redis refuses, and stops. An inbox
    /// that fails here stays out of force (its followers subscribe again,
    /// and poll meanwhile); the next reconnect tries again.
    async fn resubscribe(&self, subscriber: &SubscriberClient) {
        let id = subscriber.id();
        let on_it: Vec<u16> = self
            .noted()
            .iter()
            .filter(|(_, inbox)| inbox.on.as_ref().is_some_and(|on| on.id() == id))
            .map(|(key, _)| *key)
            .collect();
        for key in on_it {
            self.subscribe_again(key, subscriber).await;
        }
    }

    /// Subscribes each inbox of `moved` again on its slot's new primary
    /// (after [`map_changed`](Self::map_changed)), waiting up to `within`
    /// for a subscriber still connecting (a primary new to this node),
    /// then makes every follower re-check: a notice published before its
    /// inbox was back was lost. An inbox whose subscriber does not connect
    /// in time is subscribed by that subscriber's first connection (it
    /// was noted there), or by its next follower.
    async fn subscribe_moved(
        self: Arc<Self>,
        moved: Vec<(u16, SubscriberClient)>,
        within: Duration,
    ) {
        let until = tokio::time::Instant::now() + within;
        for (slot, on) in moved {
            let connected = tokio::time::timeout_at(until, on.wait_for_connect());
            if matches!(connected.await, Ok(Ok(()))) {
                self.subscribe_again(slot, &on).await;
            }
        }
        self.followers.resync();
    }

    /// (S)SUBSCRIBEs `slot`'s inbox on `on` again (the same connection's
    /// SUBSCRIBE of a channel it has is a no-op), confirmed, and marks it
    /// in force unless a subscription was lost since it was sent. A failure
    /// leaves it out of force: its followers subscribe again, and poll
    /// meanwhile.
    async fn subscribe_again(&self, slot: u16, on: &SubscriberClient) {
        let channel = self.note(slot, on);
        let _serial = self.serials.take(self.key(slot)).await;
        let resyncs = self.followers.resyncs();
        let again = self.send(on, channel.clone());
        let error = match tokio::time::timeout(self.timeout, again).await {
            Ok(Ok(())) => {
                self.confirmed(slot, resyncs);
                return;
            }
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {:?}", self.timeout),
        };
        tracing::warn!(%channel, %error, "inbox not subscribed again; its followers poll");
    }

    /// Subscriptions may have been lost: the inboxes of `slots` (`None`:
    /// all, after a reconnect) are out of force until subscribed again
    /// and confirmed, and every follower re-checks. One critical section:
    /// a confirmation must not set a bit between their clearing and the
    /// bump that makes it stale.
    fn lost(&self, slots: Option<&[u16]>) {
        let _noted = self.noted();
        match slots {
            None => {
                for word in self.joinable.iter() {
                    word.store(0, Ordering::Release);
                }
            }
            Some(slots) => {
                for slot in slots {
                    let (word, bit) = self.bit(self.key(*slot));
                    word.fetch_and(!bit, Ordering::Release);
                }
            }
        }
        self.followers.lost();
    }

    /// Marks `slot`'s inbox in force, unless a loss came since `resyncs`
    /// (read before its SUBSCRIBE was sent: a subscription may have been
    /// lost with a connection and not be in force again yet).
    fn confirmed(&self, slot: u16, resyncs: u64) {
        let _noted = self.noted();
        if self.followers.resyncs() != resyncs {
            return;
        }
        let (word, bit) = self.bit(self.key(slot));
        word.fetch_or(bit, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use flightdeck_distributed::backend::Notice;

    use super::dispatch::tests::{message, record};
    use super::dispatch::RECENT;
    use super::*;

    fn inboxes() -> Inboxes {
        Inboxes::new("p", Duration::from_secs(1), false)
    }

    /// A follower that registers after its flight's message came (the
    /// message overtook its ACQUIRE's answer) still gets it, and only its
    /// own flight's.
    #[test]
    fn a_follower_registering_late_gets_the_messages_since_its_mark() {
        let inboxes = inboxes();
        inboxes.confirmed(0, inboxes.followers.resyncs());
        inboxes.followers.deliver(&message("r1|1|c|before"));
        let mark = inboxes.join(0).expect("in force");
        inboxes.followers.deliver(&message("r2|5|a"));
        inboxes.followers.deliver(&message("r1|2|c|after"));
        let (_rx, backlog) = inboxes.followers.register(&record("r1"), mark);
        assert_eq!(
            backlog,
            [Notice::Committed {
                generation: 2,
                inline: Some(Bytes::from_static(b"after")),
                work_time: None,
                age: Duration::ZERO,
            }]
        );
    }

    /// When the messages since a mark were dropped for room, or a loss
    /// came since, the late follower starts with a resync.
    #[test]
    fn a_late_follower_resyncs_when_its_messages_may_be_gone() {
        let inboxes = inboxes();
        inboxes.confirmed(0, inboxes.followers.resyncs());
        let mark = inboxes.join(0).expect("in force");
        for i in 0..=RECENT {
            inboxes.followers.deliver(&message(&format!("other|{i}|a")));
        }
        let (_rx, backlog) = inboxes.followers.register(&record("r1"), mark);
        assert_eq!(backlog, [Notice::Resync]);

        let mark = inboxes.join(0).expect("in force");
        inboxes.followers.lost();
        let (_rx, backlog) = inboxes.followers.register(&record("r1"), mark);
        assert_eq!(backlog, [Notice::Resync]);
        // Lost messages leave the inbox in force; a lost subscription
        // does not.
        assert!(inboxes.join(0).is_some());
        inboxes.lost(None);
        assert!(inboxes.join(0).is_none());
        // Confirmed again, but with a resync in between: not in force.
        let before = inboxes.followers.resyncs();
        inboxes.lost(None);
        inboxes.confirmed(0, before);
        assert!(inboxes.join(0).is_none());
        inboxes.confirmed(0, inboxes.followers.resyncs());
        assert!(inboxes.join(0).is_some());
    }

    /// A subscriber that never connects (nothing is sent on it).
    fn idle_subscriber() -> SubscriberClient {
        Builder::default_centralized()
            .build_subscriber_client()
            .unwrap()
    }

    /// A slot-map change takes the inboxes of the moved slots out of force
    /// (their followers re-check) and leaves the others in force.
    #[tokio::test]
    async fn a_moved_slot_takes_its_inbox_out_of_force_and_no_other() {
        let inboxes = Arc::new(Inboxes::new("p", Duration::from_secs(1), true));
        let on = idle_subscriber();
        for slot in [5, 9000] {
            inboxes.note(slot, &on);
            inboxes.confirmed(slot, inboxes.followers.resyncs());
        }
        let (mut rx, _) = inboxes
            .followers
            .register(&record("r"), inboxes.followers.mark_resyncs());
        let moved = Moved {
            slots: 0..=100,
            to: None,
        };
        inboxes.map_changed(&[moved], Duration::from_secs(1));
        assert!(inboxes.join(5).is_none(), "moved: out of force");
        assert!(inboxes.join(9000).is_some(), "not moved: in force");
        assert_eq!(rx.recv().await.unwrap(), Notice::Resync);
        // A change that moves no slot of an inbox changes nothing.
        let mark = inboxes.join(9000).expect("in force");
        let elsewhere = Moved {
            slots: 200..=300,
            to: None,
        };
        inboxes.map_changed(&[elsewhere], Duration::from_secs(1));
        let (_rx, backlog) = inboxes.followers.register(&record("r"), mark);
        assert_eq!(backlog, [], "no resync");
    }

    /// On one server the inbox is not relied on while its subscriber is
    /// not connected, even when it is marked in force: a dead connection
    /// would not say so to its followers.
    #[tokio::test]
    async fn one_server_inbox_needs_its_subscriber_connected() {
        let inboxes = Arc::new(inboxes());
        inboxes.confirmed(0, inboxes.followers.resyncs());
        assert!(inboxes.join(0).is_some(), "no subscriber attached yet");
        let mut tasks = Vec::new();
        inboxes.attach(&idle_subscriber(), &mut tasks);
        assert!(inboxes.in_force(0));
        assert!(inboxes.join(0).is_none(), "its subscriber is not connected");
        assert_eq!(inboxes.count(), 1, "one server's inbox is noted at once");
        tasks.iter().for_each(JoinHandle::abort);
    }
}
