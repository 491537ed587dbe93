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
//! node's followers of that flight, and keeps the last [`RECENT`] for the
//! followers whose ACQUIRE answer was still on its way when the message
//! came (the message may overtake the answer: they travel on two
//! connections). A follower's subscription taken before its ACQUIRE opens
//! when it is first read (owners and hits never read theirs), and starts
//! with the kept messages since it was taken; when some of those were
//! dropped for room, or notices may have been lost since (a reconnect, a
//! lagging dispatcher, a moved slot), it starts with a resync instead: the
//! follower re-checks.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use flightdeck_distributed::backend::Notice;
use fred::clients::SubscriberClient;
use fred::prelude::*;
use fred::types::Message;
use tokio::sync::broadcast;

use crate::args::ScriptArgs;
use crate::backend::LAYOUT;
use crate::cluster::SLOTS;

/// Messages kept for followers that register after them.
pub(crate) const RECENT: usize = 256;

/// The node's inboxes and followers, shared by every flight of the backend.
pub(crate) struct Subs {
    prefix: String,
    /// This node's name in its inboxes' names (random, one per backend).
    node: String,
    /// One server's inbox (a cluster names one per slot).
    single: Bytes,
    pub(crate) timeout: Duration,
    // Cluster: sharded pub/sub (SSUBSCRIBE/SPUBLISH), so a flight's
    // messages stay on the shard that owns its slot.
    pub(crate) sharded: bool,
    state: Mutex<State>,
    // One lock per inbox with a SUBSCRIBE under way: two followers that
    // find it missing send one. An entry lives while somebody holds or
    // waits for its lock.
    ops: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Bumped, under the state's lock, whenever notices may have been lost.
    resyncs: AtomicU64,
    /// Messages dispatched so far, bumped under the state's lock.
    seq: AtomicU64,
    /// One bit per inbox (its slot; bit 0 on one server): subscribed on
    /// the server, confirmed, and no subscription lost since. Only then
    /// may a flight rely on it before its first call ([`Subs::mark`]).
    /// Cleared before `resyncs` is bumped, set under the state's lock.
    joinable: Box<[AtomicU64]>,
}

struct State {
    /// By slot (0 on one server).
    inboxes: HashMap<u16, Inbox>,
    /// The followers of each flight, by its record's name.
    followers: HashMap<Bytes, Followers>,
    /// The last [`RECENT`] messages: (seq, record, notice).
    recent: VecDeque<(u64, Bytes, Notice)>,
}

struct Inbox {
    channel: String,
    /// The subscriber it was subscribed on (its server's), once it was.
    on: Option<SubscriberClient>,
}

struct Followers {
    tx: broadcast::Sender<Notice>,
    refs: usize,
}

/// Where the inboxes stood when a flight took its subscription, before
/// its first call: see [`Subs::register`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Mark {
    resyncs: u64,
    /// `None`: no kept message is wanted (the follower re-checks after
    /// registering).
    seq: Option<u64>,
}

impl Subs {
    pub(crate) fn new(prefix: &str, timeout: Duration, sharded: bool) -> Self {
        let node = flightdeck_distributed::OwnerToken::random()
            .as_str()
            .to_owned();
        let single = Bytes::from(inbox_parts(prefix, "", &node).concat());
        let bits = if sharded { usize::from(SLOTS / 64) } else { 1 };
        Self {
            prefix: prefix.to_owned(),
            node,
            single,
            timeout,
            sharded,
            state: Mutex::new(State {
                inboxes: HashMap::new(),
                followers: HashMap::new(),
                recent: VecDeque::with_capacity(RECENT),
            }),
            ops: Mutex::new(HashMap::new()),
            resyncs: AtomicU64::new(0),
            seq: AtomicU64::new(0),
            joinable: (0..bits).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The inbox a flight of `slot` names: the one server's, or in a
    /// cluster the slot's (its hash tag hashes to `slot`, so the scripts'
    /// `SPUBLISH` stays in the flight's slot).
    pub(crate) fn inbox(&self, slot: u16) -> Bytes {
        if !self.sharded {
            return self.single.clone();
        }
        Bytes::from(inbox_parts(&self.prefix, slot_tag(slot), &self.node).concat())
    }

    /// `args` with the inbox a flight of `slot` names as their next
    /// argument, written into their buffer (an ACQUIRE's: no string of its
    /// own per call).
    pub(crate) fn name_inbox(&self, slot: u16, args: ScriptArgs) -> ScriptArgs {
        if !self.sharded {
            return args.value(Value::Bytes(self.single.clone()));
        }
        let [parts @ .., last] = inbox_parts(&self.prefix, slot_tag(slot), &self.node);
        parts
            .iter()
            .fold(args, |args, part| args.part(part))
            .text(last)
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
    /// later with it ([`register`](Self::register)) gets every message
    /// dispatched from now on, or a resync. `None` otherwise. Lock-free.
    pub(crate) fn mark(&self, slot: u16) -> Option<Mark> {
        // Read before the bit: a loss clears the bits before it bumps
        // `resyncs`, so a mark that saw the bump sees the bit cleared.
        let resyncs = self.resyncs.load(Ordering::Acquire);
        if !self.is_joinable(slot) {
            return None;
        }
        Some(Mark {
            resyncs,
            seq: Some(self.seq.load(Ordering::Acquire)),
        })
    }

    /// A mark for a follower that re-checks once registered: only the
    /// resyncs from now on count.
    pub(crate) fn mark_resyncs(&self) -> Mark {
        Mark {
            resyncs: self.resyncs.load(Ordering::Acquire),
            seq: None,
        }
    }

    /// Registers a follower of the flight whose record is `record`: its
    /// receiver, and what it missed since `mark` (the kept messages about
    /// its flight, or a resync when some may be lost).
    pub(crate) fn register(
        &self,
        record: &Bytes,
        mark: Mark,
    ) -> (broadcast::Receiver<Notice>, Vec<Notice>) {
        let mut state = self.state();
        let mut backlog = Vec::new();
        if self.resyncs.load(Ordering::Relaxed) != mark.resyncs {
            backlog.push(Notice::Resync);
        } else if let Some(since) = mark.seq {
            let oldest = state.recent.front().map_or(u64::MAX, |(seq, _, _)| *seq);
            if self.seq.load(Ordering::Relaxed) > since && oldest > since + 1 {
                // Messages since the mark were dropped for room.
                backlog.push(Notice::Resync);
            } else {
                backlog.extend(
                    state
                        .recent
                        .iter()
                        .filter(|(seq, r, _)| *seq > since && r == record)
                        .map(|(_, _, n)| n.clone()),
                );
            }
        }
        let f = state
            .followers
            .entry(record.clone())
            .or_insert_with(|| Followers {
                tx: broadcast::channel(16).0,
                refs: 0,
            });
        f.refs += 1;
        (f.tx.subscribe(), backlog)
    }

    /// A follower of `record` left.
    pub(crate) fn unregister(&self, record: &Bytes) {
        let mut state = self.state();
        if let Some(f) = state.followers.get_mut(record) {
            f.refs -= 1;
            if f.refs == 0 {
                state.followers.remove(record);
            }
        }
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
        let mut state = self.state();
        let inbox = state.inboxes.entry(key).or_insert_with(|| Inbox {
            channel: String::from_utf8_lossy(&self.inbox(slot)).into_owned(),
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
            .state()
            .inboxes
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
        self.state().inboxes.keys().copied().collect()
    }

    /// (S)SUBSCRIBEs `slot`'s inbox on `on` again (the same connection's
    /// SUBSCRIBE of a channel it has is a no-op), confirmed, and marks it
    /// in force unless a subscription was lost since it was sent. A failure
    /// leaves it out of force: its followers subscribe again, and poll
    /// meanwhile.
    pub(crate) async fn subscribe_again(&self, slot: u16, on: &SubscriberClient) {
        let channel = self.subscribing(slot, on);
        let _serial = self.serial(&channel).await;
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
    pub(crate) fn inboxes(&self) -> usize {
        self.state().inboxes.len()
    }

    /// How many flights this node's followers wait on (registered ones).
    pub(crate) fn followed(&self) -> usize {
        self.state().followers.len()
    }
}

/// The right to send SUBSCRIBE for one inbox; see [`Subs::serial`].
pub(crate) struct Serial<'a> {
    subs: &'a Subs,
    channel: String,
    lock: Option<Arc<tokio::sync::Mutex<()>>>,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for Serial<'_> {
    fn drop(&mut self) {
        self.guard.take();
        let Some(lock) = self.lock.take() else {
            return;
        };
        let mut ops = self.subs.ops.lock().unwrap_or_else(|e| e.into_inner());
        // Ours and the map's: nobody else holds or waits for it.
        if Arc::strong_count(&lock) == 2 {
            ops.remove(&self.channel);
        }
    }
}

impl Subs {
    /// Waits for the right to send SUBSCRIBE for `channel` (other
    /// inboxes' commands do not wait).
    pub(crate) async fn serial(&self, channel: &str) -> Serial<'_> {
        let lock = {
            let mut ops = self.ops.lock().unwrap_or_else(|e| e.into_inner());
            Arc::clone(ops.entry(channel.to_owned()).or_default())
        };
        let mut serial = Serial {
            subs: self,
            channel: channel.to_owned(),
            lock: Some(Arc::clone(&lock)),
            guard: None,
        };
        serial.guard = Some(lock.lock_owned().await);
        serial
    }

    /// Hands a message to the followers of its flight, and keeps it for
    /// those still to register.
    pub(crate) fn dispatch(&self, msg: &Message) {
        let Some(payload) = value_bytes(&msg.value) else {
            return;
        };
        let Some((record, notice)) = parse_message(&payload) else {
            tracing::warn!("unparseable completion message; followers re-check");
            self.lost_messages();
            return;
        };
        let mut state = self.state();
        let seq = self.seq.load(Ordering::Relaxed) + 1;
        self.seq.store(seq, Ordering::Release);
        if state.recent.len() == RECENT {
            state.recent.pop_front();
        }
        state
            .recent
            .push_back((seq, record.clone(), notice.clone()));
        if let Some(f) = state.followers.get(&record) {
            let _ = f.tx.send(notice);
        }
    }

    /// Messages may have been lost (a lagging dispatcher, a message that
    /// did not parse), the subscriptions are in force: every follower
    /// re-checks.
    pub(crate) fn lost_messages(&self) {
        self.lost(Some(&[]));
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
    /// slots whose inboxes were lost (`Some(&[])`: none; `None`: all).
    fn lost(&self, inboxes: Option<&[u16]>) {
        let state = self.state();
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
        self.resyncs.fetch_add(1, Ordering::Release);
        for f in state.followers.values() {
            let _ = f.tx.send(Notice::Resync);
        }
    }

    /// Every registered follower re-checks (after inboxes were subscribed
    /// again: a notice published before that took effect was lost).
    pub(crate) fn resync_followers(&self) {
        let state = self.state();
        for f in state.followers.values() {
            let _ = f.tx.send(Notice::Resync);
        }
    }

    /// Where resyncs are now: pass it to [`confirmed`](Self::confirmed)
    /// once the SUBSCRIBE sent after this is confirmed.
    pub(crate) fn resyncs(&self) -> u64 {
        let _state = self.state();
        self.resyncs.load(Ordering::Relaxed)
    }

    /// Marks `slot`'s inbox in force, unless a resync came since
    /// `resyncs` (a subscription may have been lost with a connection and
    /// not be in force again yet).
    pub(crate) fn confirmed(&self, slot: u16, resyncs: u64) {
        let _state = self.state();
        if self.resyncs.load(Ordering::Relaxed) != resyncs {
            return;
        }
        let (word, bit) = self.bit(self.key(slot));
        word.fetch_or(bit, Ordering::Release);
    }
}

/// A message's bytes (a payload that is valid UTF-8 comes as a string).
fn value_bytes(v: &Value) -> Option<Bytes> {
    match v {
        Value::Bytes(b) => Some(b.clone()),
        Value::String(s) => Some(s.inner().clone()),
        _ => None,
    }
}

/// Parses `<record>|<gen>|c|<payload>`, `<record>|<gen>|c`,
/// `<record>|<gen>|a`.
fn parse_message(msg: &Bytes) -> Option<(Bytes, Notice)> {
    let bar = msg.iter().position(|b| *b == b'|')?;
    if bar == 0 {
        return None;
    }
    let notice = parse_notice(&msg.slice(bar + 1..))?;
    Some((msg.slice(..bar), notice))
}

/// Parses `<gen>|c|<payload>`, `<gen>|c`, `<gen>|a`.
fn parse_notice(payload: &Bytes) -> Option<Notice> {
    let bar = payload.iter().position(|b| *b == b'|')?;
    let generation: u64 = std::str::from_utf8(&payload[..bar]).ok()?.parse().ok()?;
    match &payload[bar + 1..] {
        b"a" => Some(Notice::Abandoned { generation }),
        b"c" => Some(Notice::Committed {
            generation,
            inline: None,
        }),
        [b'c', b'|', ..] => Some(Notice::Committed {
            generation,
            inline: Some(payload.slice(bar + 3..)),
        }),
        _ => None,
    }
}

/// An inbox's name, in the pieces it is written from:
/// `{prefix}:{LAYOUT}:n:{node}` on one server, `{prefix}:{tag}:{LAYOUT}:n:{node}`
/// with `tag` a slot's ([`slot_tag`]) in a cluster.
fn inbox_parts<'a>(prefix: &'a str, tag: &'a str, node: &'a str) -> [&'a str; 6] {
    [prefix, ":", tag, LAYOUT, ":n:", node]
}

/// `{t}:`, with `t` the shortest hex number that hashes to `slot`: the
/// hash tag of `slot`'s inbox (found once for every slot).
fn slot_tag(slot: u16) -> &'static str {
    static TAGS: OnceLock<Vec<String>> = OnceLock::new();
    let tags = TAGS.get_or_init(|| {
        let slots = usize::from(SLOTS);
        let mut tags = vec![String::new(); slots];
        let mut left = slots;
        let mut n: u64 = 0;
        while left > 0 {
            let tag = format!("{{{n:x}}}:");
            let slot = usize::from(fred::util::redis_keyslot(tag.as_bytes()));
            if tags[slot].is_empty() {
                tags[slot] = tag;
                left -= 1;
            }
            n += 1;
        }
        tags
    });
    &tags[usize::from(slot % SLOTS)]
}

/// A follower's registration; dropping it unregisters.
pub(crate) struct Registered {
    pub(crate) subs: Arc<Subs>,
    pub(crate) record: Bytes,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.subs.unregister(&self.record);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subs() -> Subs {
        Subs::new("p", Duration::from_secs(1), false)
    }

    fn message(text: &str) -> Message {
        Message {
            channel: "inbox".into(),
            value: Value::Bytes(Bytes::copy_from_slice(text.as_bytes())),
            kind: fred::types::MessageKind::Message,
            server: fred::types::config::Server::new("127.0.0.1", 6379),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn one_inbox_waits_for_its_own_commands_only() {
        let subs = subs();
        let a = subs.serial("a").await;
        // Another inbox's SUBSCRIBE goes out meanwhile...
        let b = tokio::time::timeout(Duration::from_secs(1), subs.serial("b")).await;
        assert!(b.is_ok(), "inbox b waited for inbox a");
        drop(b);
        // ...the same inbox's waits for the command under way.
        let again = subs.serial("a");
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
        assert!(subs.ops.lock().unwrap().is_empty());
    }

    #[test]
    fn messages_parse_and_garbage_does_not() {
        let m = |s: &'static [u8]| parse_message(&Bytes::from_static(s));
        assert_eq!(
            m(b"p:{ab}:f3|7|c|\x00a|b"),
            Some((
                Bytes::from_static(b"p:{ab}:f3"),
                Notice::Committed {
                    generation: 7,
                    inline: Some(Bytes::from_static(b"\x00a|b"))
                }
            ))
        );
        assert_eq!(
            m(b"r|7|c"),
            Some((
                Bytes::from_static(b"r"),
                Notice::Committed {
                    generation: 7,
                    inline: None
                }
            ))
        );
        assert_eq!(
            m(b"r|3|a"),
            Some((
                Bytes::from_static(b"r"),
                Notice::Abandoned { generation: 3 }
            ))
        );
        for bad in [
            &b""[..],
            b"|",
            b"r",
            b"|1|a",
            b"r|x|a",
            b"r|1|",
            b"r|1|z",
            b"r|-1|a",
            b"r|1|cx",
        ] {
            assert_eq!(parse_message(&Bytes::from_static(bad)), None, "{bad:?}");
        }
    }

    #[test]
    fn every_slot_has_a_tag_of_its_own() {
        for slot in 0..SLOTS {
            assert_eq!(fred::util::redis_keyslot(slot_tag(slot).as_bytes()), slot);
        }
        let subs = Subs::new("fd", Duration::from_secs(1), true);
        for slot in [0, 1, 5000, 16383] {
            let inbox = subs.inbox(slot);
            assert_eq!(fred::util::redis_keyslot(&inbox), slot);
        }
    }

    /// An ACQUIRE names the inbox that the node subscribes to.
    #[test]
    fn the_inbox_an_acquire_names_is_the_one_subscribed() {
        let flight = flightdeck_distributed::FlightId::of(&flightdeck_core::FlightKey::from_bytes(
            flightdeck_core::StageName::new("inbox").unwrap(),
            "q",
        ));
        for sharded in [false, true] {
            let subs = Subs::new("fd", Duration::from_secs(1), sharded);
            for slot in [0, 7, 16383] {
                let args = ScriptArgs::new("fd", &flight, crate::args::Names::Record, 1);
                let argv = subs.name_inbox(slot, args).into_argv();
                assert_eq!(
                    argv.last().and_then(Value::as_bytes),
                    Some(&subs.inbox(slot)[..])
                );
            }
        }
    }

    fn record(name: &str) -> Bytes {
        Bytes::copy_from_slice(name.as_bytes())
    }

    /// A follower that registers after its flight's message came (the
    /// message overtook its ACQUIRE's answer) still gets it, and only its
    /// own flight's.
    #[test]
    fn a_follower_registering_late_gets_the_messages_since_its_mark() {
        let subs = subs();
        subs.confirmed(0, subs.resyncs());
        subs.dispatch(&message("r1|1|c|before"));
        let mark = subs.mark(0).expect("in force");
        subs.dispatch(&message("r2|5|a"));
        subs.dispatch(&message("r1|2|c|after"));
        let (_rx, backlog) = subs.register(&record("r1"), mark);
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
        let subs = subs();
        subs.confirmed(0, subs.resyncs());
        let mark = subs.mark(0).expect("in force");
        for i in 0..=RECENT {
            subs.dispatch(&message(&format!("other|{i}|a")));
        }
        let (_rx, backlog) = subs.register(&record("r1"), mark);
        assert_eq!(backlog, [Notice::Resync]);

        let mark = subs.mark(0).expect("in force");
        subs.lost_messages();
        let (_rx, backlog) = subs.register(&record("r1"), mark);
        assert_eq!(backlog, [Notice::Resync]);
        // Lost messages leave the inbox in force; a lost subscription
        // does not.
        assert!(subs.mark(0).is_some());
        subs.lost_subscriptions();
        assert!(subs.mark(0).is_none());
        // Confirmed again, but with a resync in between: not in force.
        let before = subs.resyncs();
        subs.lost_subscriptions();
        subs.confirmed(0, before);
        assert!(subs.mark(0).is_none());
        subs.confirmed(0, subs.resyncs());
        assert!(subs.mark(0).is_some());
    }

    #[tokio::test]
    async fn registered_followers_get_their_flights_messages() {
        let subs = subs();
        let (mut rx1, _) = subs.register(&record("r1"), subs.mark_resyncs());
        let (mut rx2, _) = subs.register(&record("r2"), subs.mark_resyncs());
        subs.dispatch(&message("r1|9|c"));
        assert_eq!(
            rx1.recv().await.unwrap(),
            Notice::Committed {
                generation: 9,
                inline: None
            }
        );
        assert!(rx2.try_recv().is_err());
        subs.resync_followers();
        assert_eq!(rx2.recv().await.unwrap(), Notice::Resync);
        subs.unregister(&record("r1"));
        subs.unregister(&record("r2"));
        assert_eq!(subs.followed(), 0);
    }
}
