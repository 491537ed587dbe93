//! The node's shared subscriptions: one subscriber connection per server, reference-counted
//! channels, notices fanned out to every follower of a flight.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use flightdeck_distributed::backend::Notice;
use fred::clients::SubscriberClient;
use fred::prelude::*;
use fred::types::Message;
use tokio::sync::broadcast;

/// The node's subscriptions, shared by every follower: one subscriber
/// connection per server (one per primary in a cluster), each channel
/// subscribed on the server that serves it.
pub(crate) struct Subs {
    pub(crate) channels: Mutex<HashMap<String, Channel>>,
    // One lock per channel with a SUBSCRIBE or UNSUBSCRIBE under way: the
    // commands of one channel go out in order (a late UNSUBSCRIBE never
    // undoes a newer SUBSCRIBE), those of different channels concurrently.
    // An entry lives while somebody holds or waits for its lock.
    pub(crate) ops: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    pub(crate) timeout: Duration,
    // Cluster: sharded pub/sub (SSUBSCRIBE/SPUBLISH), so a flight's
    // messages stay on the shard that owns its slot.
    pub(crate) sharded: bool,
    // How many channels are joinable (see `Channel::joinable`): zero spares
    // a flight's first call the lookup.
    joinable: AtomicUsize,
    // Counts resyncs: a SUBSCRIBE confirmed across one may not be in force.
    resyncs: AtomicU64,
}

impl Subs {
    pub(crate) fn new(timeout: Duration, sharded: bool) -> Self {
        Self {
            channels: Mutex::new(HashMap::new()),
            ops: Mutex::new(HashMap::new()),
            timeout,
            sharded,
            joinable: AtomicUsize::new(0),
            resyncs: AtomicU64::new(0),
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

    /// After `subscriber` reconnected: (S)SUBSCRIBEs again, confirmed,
    /// every channel subscribed on it; the caller then resyncs again, so
    /// that a notice published before this took effect is re-checked.
    /// fred's own resubscription (`manage_subscriptions`) is not used: it
    /// reports the reconnect before its SUBSCRIBE is even sent (a notice
    /// published in between was lost with no resync after it), and with
    /// sharded channels it sends an empty SUBSCRIBE that Redis refuses,
    /// and stops. A channel that fails here stays as it is (its followers
    /// poll); the next reconnect tries again.
    pub(crate) async fn resubscribe(&self, subscriber: &SubscriberClient) {
        let id = subscriber.id();
        let on_it: Vec<String> = self
            .channels()
            .iter()
            .filter(|(_, ch)| ch.on.as_ref().is_some_and(|on| on.id() == id))
            .map(|(name, _)| name.clone())
            .collect();
        for channel in on_it {
            let _serial = self.serial(&channel).await;
            // Left meanwhile (its UNSUBSCRIBE, if any, waited for us).
            if !self.channels().contains_key(&channel) {
                continue;
            }
            let again = self.subscribe(subscriber, channel.clone());
            let error = match tokio::time::timeout(self.timeout, again).await {
                Ok(Ok(())) => continue,
                Ok(Err(e)) => e.to_string(),
                Err(_) => format!("no answer within {:?}", self.timeout),
            };
            tracing::warn!(%channel, %error, "resubscription after a reconnect failed; its followers poll");
        }
    }

    pub(crate) async fn unsubscribe(
        &self,
        subscriber: &SubscriberClient,
        channel: String,
    ) -> Result<(), fred::error::Error> {
        if self.sharded {
            subscriber.sunsubscribe(channel).await
        } else {
            subscriber.unsubscribe(channel).await
        }
    }
}

pub(crate) struct Channel {
    pub(crate) tx: broadcast::Sender<Notice>,
    pub(crate) refs: usize,
    /// The subscriber the channel was subscribed on (its server's), once
    /// it was: where the last follower's UNSUBSCRIBE goes.
    pub(crate) on: Option<SubscriberClient>,
    /// Subscribed on the server (the SUBSCRIBE confirmed) with no resync
    /// since: every message published from now on reaches `tx`, or a
    /// resync does. Only then may a flight share it before its first call
    /// ([`Subs::join`]).
    pub(crate) joinable: bool,
}

/// The right to send SUBSCRIBE / UNSUBSCRIBE for one channel; see
/// [`Subs::serial`].
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
    /// Waits for the right to send SUBSCRIBE / UNSUBSCRIBE for `channel`
    /// (other channels' commands do not wait).
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

    pub(crate) fn channels(&self) -> MutexGuard<'_, HashMap<String, Channel>> {
        self.channels.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn dispatch(&self, msg: &Message) {
        let Some(payload) = msg.value.as_bytes() else {
            return;
        };
        let notice = parse_notice(payload);
        let channels = self.channels();
        if let Some(ch) = channels.get(&*msg.channel) {
            match notice {
                Some(n) => {
                    let _ = ch.tx.send(n);
                }
                None => {
                    tracing::warn!("unparseable completion message; re-checking");
                    let _ = ch.tx.send(Notice::Resync);
                }
            }
        }
    }

    /// Messages may have been lost (a reconnect, a lagging dispatcher, a
    /// moved slot): every follower re-checks, and no channel is joinable
    /// again (a resubscription after a reconnect is not confirmed).
    pub(crate) fn resync_all(&self) {
        let mut channels = self.channels();
        self.resyncs.fetch_add(1, Ordering::Relaxed);
        for ch in channels.values_mut() {
            ch.joinable = false;
            let _ = ch.tx.send(Notice::Resync);
        }
        self.joinable.store(0, Ordering::Relaxed);
    }

    /// Where resyncs are now: pass it to [`confirmed`](Self::confirmed)
    /// once the SUBSCRIBE sent after this is confirmed.
    pub(crate) fn resyncs(&self) -> u64 {
        let _channels = self.channels();
        self.resyncs.load(Ordering::Relaxed)
    }

    /// Marks `channel`'s subscription confirmed on the server, unless a
    /// resync came since `resyncs` (the subscription may have been lost
    /// with a connection and not be in force again yet).
    pub(crate) fn confirmed(&self, channel: &str, resyncs: u64) {
        let mut channels = self.channels();
        if self.resyncs.load(Ordering::Relaxed) != resyncs {
            return;
        }
        if let Some(ch) = channels.get_mut(channel) {
            if !ch.joinable {
                ch.joinable = true;
                self.joinable.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A share of `channel` if it is joinable (`None` otherwise): a
    /// receiver created now gets every message dispatched from now on.
    pub(crate) fn join(
        self: &Arc<Self>,
        channel: impl FnOnce() -> String,
    ) -> Option<(broadcast::Receiver<Notice>, SubGuard)> {
        if self.joinable.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let channel = channel();
        let rx = {
            let mut channels = self.channels();
            // Its subscriber's connection up: a dead one would not say so
            // to a follower that shares it.
            let ch = channels
                .get_mut(&channel)
                .filter(|ch| ch.joinable && ch.on.as_ref().is_some_and(|on| on.is_connected()))?;
            ch.refs += 1;
            ch.tx.subscribe()
        };
        Some((
            rx,
            SubGuard {
                subs: Arc::clone(self),
                channel,
            },
        ))
    }
}

/// Parses `<gen>|c|<payload>`, `<gen>|c`, `<gen>|a`.
fn parse_notice(payload: &[u8]) -> Option<Notice> {
    let bar = payload.iter().position(|b| *b == b'|')?;
    let generation: u64 = std::str::from_utf8(&payload[..bar]).ok()?.parse().ok()?;
    match &payload[bar + 1..] {
        b"a" => Some(Notice::Abandoned { generation }),
        b"c" => Some(Notice::Committed {
            generation,
            inline: None,
        }),
        [b'c', b'|', inline @ ..] => Some(Notice::Committed {
            generation,
            inline: Some(Bytes::copy_from_slice(inline)),
        }),
        _ => None,
    }
}

/// Releases one reference to a channel; the last one unsubscribes.
pub(crate) struct SubGuard {
    pub(crate) subs: Arc<Subs>,
    pub(crate) channel: String,
}

impl Drop for SubGuard {
    fn drop(&mut self) {
        let last = {
            let mut channels = self.subs.channels();
            match channels.get_mut(&self.channel) {
                Some(ch) if ch.refs <= 1 => channels.remove(&self.channel).and_then(|ch| {
                    if ch.joinable {
                        self.subs.joinable.fetch_sub(1, Ordering::Relaxed);
                    }
                    ch.on
                }),
                Some(ch) => {
                    ch.refs -= 1;
                    None
                }
                None => None,
            }
        };
        let Some(subscriber) = last else {
            return;
        };
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let subs = self.subs.clone();
        let channel = std::mem::take(&mut self.channel);
        handle.spawn(async move {
            let _serial = subs.serial(&channel).await;
            if subs.channels().contains_key(&channel) {
                return;
            }
            let unsubscribe = subs.unsubscribe(&subscriber, channel);
            let _ = tokio::time::timeout(subs.timeout, unsubscribe).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subs() -> Subs {
        Subs::new(Duration::from_secs(1), false)
    }

    #[tokio::test(start_paused = true)]
    async fn one_channel_waits_for_its_own_commands_only() {
        let subs = subs();
        let a = subs.serial("a").await;
        // Another channel's SUBSCRIBE goes out meanwhile...
        let b = tokio::time::timeout(Duration::from_secs(1), subs.serial("b")).await;
        assert!(b.is_ok(), "channel b waited for channel a");
        drop(b);
        // ...the same channel's waits for the command under way.
        let again = subs.serial("a");
        tokio::pin!(again);
        assert!(
            tokio::time::timeout(Duration::from_secs(1), &mut again)
                .await
                .is_err(),
            "a second command of channel a went out before the first ended"
        );
        drop(a);
        let again = tokio::time::timeout(Duration::from_secs(1), again).await;
        assert!(again.is_ok(), "channel a is free again");
        drop(again);
        // Nothing is kept once nobody holds or waits.
        assert!(subs.ops.lock().unwrap().is_empty());
    }

    #[test]
    fn notices_parse_and_garbage_does_not() {
        assert_eq!(
            parse_notice(b"7|c|\x00a|b"),
            Some(Notice::Committed {
                generation: 7,
                inline: Some(Bytes::from_static(b"\x00a|b"))
            })
        );
        assert_eq!(
            parse_notice(b"7|c"),
            Some(Notice::Committed {
                generation: 7,
                inline: None
            })
        );
        assert_eq!(
            parse_notice(b"3|a"),
            Some(Notice::Abandoned { generation: 3 })
        );
        for bad in [&b""[..], b"|", b"x|a", b"1|", b"1|z", b"-1|a", b"1|cx"] {
            assert_eq!(parse_notice(bad), None, "{bad:?}");
        }
    }
}
