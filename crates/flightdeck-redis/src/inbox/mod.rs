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
//! The parts: the inbox names and the messages' format ([`wire`]), one
//! hash tag per cluster slot ([`tags`]), one SUBSCRIBE at a time per
//! inbox ([`serial`]).

mod dispatch;
mod serial;
mod tags;
mod wire;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use flightdeck_distributed::backend::Subscription;
use fred::clients::SubscriberClient;
use fred::prelude::*;
use fred::types::Message;

use crate::args::ScriptArgs;
use crate::cluster::SLOTS;

use dispatch::Followers;
pub(crate) use dispatch::Mark;
use serial::{Serial, Serials};
use wire::Channels;

/// The node's inboxes and followers, shared by every flight of the backend.
pub(crate) struct Inboxes {
    channels: Channels,
    pub(crate) timeout: Duration,
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
    /// may a flight rely on it before its first call ([`Inboxes::mark`]).
    /// Cleared before the followers' resyncs are bumped, set under the
    /// lock of `noted`.
    joinable: Box<[AtomicU64]>,
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
        }
    }

    fn noted(&self) -> MutexGuard<'_, HashMap<u16, Inbox>> {
        self.noted.lock().unwrap_or_else(|e| e.into_inner())
    }

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

    /// Whether `slot`'s inbox is in force (see [`Self::joinable`]).
    pub(crate) fn is_joinable(&self, slot: u16) -> bool {
        let (word, bit) = self.bit(self.key(slot));
        word.load(Ordering::Acquire) & bit != 0
    }

    /// Where the inboxes stand, for a flight of `slot` about to send its
    /// first call, when `slot`'s inbox is in force: a subscription opened
    /// later with it ([`follow`](Self::follow)) gets every message
    /// dispatched from now on, or a resync. `None` otherwise. Lock-free.
    pub(crate) fn mark(&self, slot: u16) -> Option<Mark> {
        // Read before the bit: a loss clears the bits before it bumps
        // `resyncs`, so a mark that saw the bump sees the bit cleared.
        let resyncs = self.followers.resyncs();
        if !self.is_joinable(slot) {
            return None;
        }
        Some(self.followers.mark(resyncs))
    }

    /// A mark for a follower that re-checks once registered: only the
    /// resyncs from now on count.
    pub(crate) fn mark_resyncs(&self) -> Mark {
        self.followers.mark_resyncs()
    }

    /// A follower of the flight whose record is `record`: what it missed
    /// since `mark`, then what the inbox hears about the flight (its
    /// messages name the flight's record).
    pub(crate) fn follow(&self, record: Bytes, mark: Mark) -> Subscription {
        self.followers.follow(record, mark)
    }

    pub(crate) async fn subscribe(
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

    /// The name of `slot`'s inbox, noted as subscribed on `on` (set before
    /// its SUBSCRIBE is sent, so a reconnect of `on` subscribes it again:
    /// see [`resubscribe`](Self::resubscribe)).
    pub(crate) fn subscribing(&self, slot: u16, on: &SubscriberClient) -> String {
        let key = self.key(slot);
        let mut noted = self.noted();
        let inbox = noted.entry(key).or_insert_with(|| Inbox {
            channel: String::from_utf8_lossy(&self.name(slot)).into_owned(),
            on: None,
        });
        inbox.on = Some(on.clone());
        inbox.channel.clone()
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
    pub(crate) async fn resubscribe(&self, subscriber: &SubscriberClient) {
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

    /// The slots of the inboxes this node has (0 on one server).
    pub(crate) fn inbox_slots(&self) -> Vec<u16> {
        self.noted().keys().copied().collect()
    }

    /// (S)SUBSCRIBEs `slot`'s inbox on `on` again (the same connection's
    /// SUBSCRIBE of a channel it has is a no-op), confirmed, and marks it
    /// in force unless a subscription was lost since it was sent. A failure
    /// leaves it out of force: its followers subscribe again, and poll
    /// meanwhile.
    pub(crate) async fn subscribe_again(&self, slot: u16, on: &SubscriberClient) {
        let channel = self.subscribing(slot, on);
        let _serial = self.serial(slot).await;
        let resyncs = self.resyncs();
        let again = self.subscribe(on, channel.clone());
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

    /// How many inboxes this node has subscribed (or is subscribing).
    pub(crate) fn count(&self) -> usize {
        self.noted().len()
    }

    /// How many flights this node's followers wait on (registered ones).
    pub(crate) fn followed(&self) -> usize {
        self.followers.followed()
    }

    /// Waits for the right to send SUBSCRIBE for `slot`'s inbox (other
    /// inboxes' commands do not wait).
    pub(crate) async fn serial(&self, slot: u16) -> Serial<'_> {
        self.serials.take(self.key(slot)).await
    }

    /// Hands a message to the followers of its flight, and keeps it for
    /// those still to register.
    pub(crate) fn dispatch(&self, msg: &Message) {
        self.followers.deliver(msg);
    }

    /// Messages may have been lost (a lagging dispatcher), the
    /// subscriptions are in force: every follower re-checks.
    pub(crate) fn lost_messages(&self) {
        self.followers.lost();
    }

    /// Subscriptions may have been lost (a reconnect): no inbox is in
    /// force until it is subscribed again and confirmed, and every
    /// follower re-checks.
    pub(crate) fn lost_subscriptions(&self) {
        self.lost(None);
    }

    /// The inboxes of `slots` may have been lost (their slots moved): they
    /// are out of force until subscribed again, and every follower
    /// re-checks.
    pub(crate) fn lost_inboxes(&self, slots: &[u16]) {
        self.lost(Some(slots));
    }

    /// One critical section: a confirmation must not set a bit between
    /// their clearing and the bump that makes it stale. `inboxes`: the
    /// slots whose inboxes were lost (`None`: all).
    fn lost(&self, inboxes: Option<&[u16]>) {
        let _noted = self.noted();
        match inboxes {
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

    /// Every registered follower re-checks (after inboxes were subscribed
    /// again: a notice published before that took effect was lost).
    pub(crate) fn resync_followers(&self) {
        self.followers.resync();
    }

    /// Where resyncs are now: pass it to [`confirmed`](Self::confirmed)
    /// once the SUBSCRIBE sent after this is confirmed.
    pub(crate) fn resyncs(&self) -> u64 {
        self.followers.resyncs()
    }

    /// Marks `slot`'s inbox in force, unless a resync came since
    /// `resyncs` (a subscription may have been lost with a connection and
    /// not be in force again yet).
    pub(crate) fn confirmed(&self, slot: u16, resyncs: u64) {
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
        inboxes.confirmed(0, inboxes.resyncs());
        inboxes.dispatch(&message("r1|1|c|before"));
        let mark = inboxes.mark(0).expect("in force");
        inboxes.dispatch(&message("r2|5|a"));
        inboxes.dispatch(&message("r1|2|c|after"));
        let (_rx, backlog) = inboxes.followers.register(&record("r1"), mark);
        assert_eq!(
            backlog,
            [Notice::Committed {
                generation: 2,
                inline: Some(Bytes::from_static(b"after"))
            }]
        );
    }

    /// When the messages since a mark were dropped for room, or a loss
    /// came since, the late follower starts with a resync.
    #[test]
    fn a_late_follower_resyncs_when_its_messages_may_be_gone() {
        let inboxes = inboxes();
        inboxes.confirmed(0, inboxes.resyncs());
        let mark = inboxes.mark(0).expect("in force");
        for i in 0..=RECENT {
            inboxes.dispatch(&message(&format!("other|{i}|a")));
        }
        let (_rx, backlog) = inboxes.followers.register(&record("r1"), mark);
        assert_eq!(backlog, [Notice::Resync]);

        let mark = inboxes.mark(0).expect("in force");
        inboxes.lost_messages();
        let (_rx, backlog) = inboxes.followers.register(&record("r1"), mark);
        assert_eq!(backlog, [Notice::Resync]);
        // Lost messages leave the inbox in force; a lost subscription
        // does not.
        assert!(inboxes.mark(0).is_some());
        inboxes.lost_subscriptions();
        assert!(inboxes.mark(0).is_none());
        // Confirmed again, but with a resync in between: not in force.
        let before = inboxes.resyncs();
        inboxes.lost_subscriptions();
        inboxes.confirmed(0, before);
        assert!(inboxes.mark(0).is_none());
        inboxes.confirmed(0, inboxes.resyncs());
        assert!(inboxes.mark(0).is_some());
    }
}
