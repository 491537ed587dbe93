//! The node's shared subscriber: one connection, reference-counted
//! channels, notices fanned out to every follower of a flight.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;
use flightdeck_distributed::backend::Notice;
use fred::clients::SubscriberClient;
use fred::prelude::*;
use fred::types::Message;
use tokio::sync::broadcast;

/// The node's one subscriber connection, shared by every follower.
pub(crate) struct Subs {
    pub(crate) subscriber: SubscriberClient,
    pub(crate) channels: Mutex<HashMap<String, Channel>>,
    // Serializes SUBSCRIBE/UNSUBSCRIBE so a late UNSUBSCRIBE never undoes a
    // newer SUBSCRIBE of the same channel.
    pub(crate) commands: tokio::sync::Mutex<()>,
    pub(crate) timeout: Duration,
    // Cluster: sharded pub/sub (SSUBSCRIBE/SPUBLISH), so a flight's
    // messages stay on the shard that owns its slot.
    pub(crate) sharded: bool,
}

impl Subs {
    pub(crate) async fn subscribe(&self, channel: String) -> Result<(), fred::error::Error> {
        if self.sharded {
            // SSUBSCRIBE waits for Redis's reply.
            self.subscriber.ssubscribe(channel).await
        } else {
            self.subscriber.subscribe(channel).await?;
            // fred 10.1 answers SUBSCRIBE as soon as it is written to the
            // socket (`Connection::push_command`: `has_no_responses`), not
            // when Redis applied it; a notice published in between by
            // another connection was lost (15% of subscribe-then-publish
            // rounds under load, tests/pubsub.rs). Redis answers a PING on
            // the same connection only after the SUBSCRIBE before it: the
            // barrier that makes "subscribed" true when this returns.
            self.subscriber.ping::<Value>(None).await.map(drop)
        }
    }

    pub(crate) async fn unsubscribe(&self, channel: String) -> Result<(), fred::error::Error> {
        if self.sharded {
            self.subscriber.sunsubscribe(channel).await
        } else {
            self.subscriber.unsubscribe(channel).await
        }
    }
}

pub(crate) struct Channel {
    pub(crate) tx: broadcast::Sender<Notice>,
    pub(crate) refs: usize,
}

impl Subs {
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

    pub(crate) fn resync_all(&self) {
        for ch in self.channels().values() {
            let _ = ch.tx.send(Notice::Resync);
        }
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
                Some(ch) if ch.refs <= 1 => {
                    channels.remove(&self.channel);
                    true
                }
                Some(ch) => {
                    ch.refs -= 1;
                    false
                }
                None => false,
            }
        };
        if !last {
            return;
        }
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let subs = self.subs.clone();
        let channel = std::mem::take(&mut self.channel);
        handle.spawn(async move {
            let _serial = subs.commands.lock().await;
            if subs.channels().contains_key(&channel) {
                return;
            }
            let _ = tokio::time::timeout(subs.timeout, subs.unsubscribe(channel)).await;
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
