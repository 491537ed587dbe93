use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use flightdeck_distributed::backend::{
    AbandonArgs, Acquired, Backend, BackendError, BackendFuture, CommitArgs, Committed, FlightId,
    LeaseTerms, OwnerToken, Released, Renewal, Subscription,
};
use fred::prelude::*;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

use crate::classify::classify;
use crate::connect::{timed_out, Link};
use crate::eval::{ABANDON, ACQUIRE, COMMIT, HEARTBEAT, INVALIDATE, RELEASE, SCRIPTS};
use crate::reply::{answer, bad_reply, bytes, gen, ms, parse_acquire, released, text};
use crate::subs::{Channel, SubGuard, Subs};

/// The Redis coordination backend (see the crate docs). Cheap to clone:
/// clones share the clients and the subscriber.
#[derive(Clone)]
pub struct RedisBackend {
    pub(crate) inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) client: Client,
    pub(crate) opts: Options,
    pub(crate) prefix: String,
    pub(crate) timeout: Duration,
    pub(crate) sources: [String; SCRIPTS],
    pub(crate) shas: [String; SCRIPTS],
    pub(crate) subs: Arc<Subs>,
    pub(crate) link: Arc<Link>,
    pub(crate) tasks: Vec<JoinHandle<()>>,
}

impl RedisBackend {
    /// The Redis names of a flight: its record (the one key it stores)
    /// and its completion channel. Both carry the layout's version
    /// ([`LAYOUT`]), so nodes of another layout never read them.
    pub fn keys(&self, flight: &FlightId) -> [String; 2] {
        let p = &self.inner.prefix;
        let h = flight.to_hex();
        [
            format!("{p}:{{{h}}}:{LAYOUT}"),
            format!("{p}:{{{h}}}:{LAYOUT}:done"),
        ]
    }

    /// The command client (for tests and diagnostics).
    pub fn client(&self) -> &Client {
        &self.inner.client
    }

    /// How many channels this node is subscribed to.
    pub fn subscribed_channels(&self) -> usize {
        self.inner.subs.channels().len()
    }

    /// Closes both connections.
    pub async fn quit(&self) {
        let _ = self.inner.client.quit().await;
        let _ = self.inner.subs.subscriber.quit().await;
    }
}

/// The version of the key layout, part of every key name (`…:f2`,
/// `…:f2:done`). The first layout (keys `…:lease`, `…:state`, `…:result`,
/// channel `…:done`) had none; a later incompatible layout takes a new
/// name, so nodes of two layouts never read each other's keys (see the
/// crate docs on rolling upgrades).
pub const LAYOUT: &str = "f2";

impl fmt::Debug for RedisBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RedisBackend")
            .field("prefix", &self.inner.prefix)
            .field("timeout", &self.inner.timeout)
            .finish_non_exhaustive()
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let subscriber = self.subs.subscriber.clone();
            let t = self.timeout;
            handle.spawn(async move {
                let _ = tokio::time::timeout(t, client.quit()).await;
                let _ = tokio::time::timeout(t, subscriber.quit()).await;
            });
        }
    }
}

/// Classifies a failed (S)SUBSCRIBE. After a slot moved, fred's
/// subscriber can give up on `SSUBSCRIBE` with "Too many failed write
/// attempts." (its redirects and reconnects used up the attempts): no
/// subscription was made, which is unavailable, not a protocol error
/// (a follower polls instead). Anything else as for every command.
fn subscribe_error(e: fred::error::Error) -> BackendError {
    if e.details().starts_with("Too many failed write attempts") {
        BackendError::unavailable(format!("redis subscription not made: {}", e.details()))
    } else {
        classify(e)
    }
}

impl Backend for RedisBackend {
    /// While the connection attempts fail (Redis down at start, or since),
    /// every flight is refused before its first call is built:
    /// *unavailable*, nothing sent.
    fn unreachable(&self) -> Option<BackendError> {
        self.inner.link.refuse(&self.inner.client)
    }

    fn acquire<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Acquired> {
        Box::pin(async move {
            let args = vec![
                text(token.as_str()),
                ms(terms.lease),
                text(if terms.allow_takeover { "1" } else { "0" }),
                ms(terms.record_ttl()),
            ];
            let v = self.eval(ACQUIRE, self.keys(flight).to_vec(), args).await?;
            parse_acquire(&v)
        })
    }

    fn heartbeat<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        terms: &'a LeaseTerms,
    ) -> BackendFuture<'a, Renewal> {
        Box::pin(async move {
            let args = vec![
                text(token.as_str()),
                text(&generation.to_string()),
                ms(terms.lease),
                ms(terms.record_ttl()),
            ];
            let v = self
                .eval(HEARTBEAT, self.keys(flight).to_vec(), args)
                .await?;
            answer(
                "HEARTBEAT",
                &v,
                &[("RENEWED", Renewal::Renewed), ("LOST", Renewal::Lost)],
            )
        })
    }

    fn commit<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        args: &'a CommitArgs,
    ) -> BackendFuture<'a, Committed> {
        Box::pin(async move {
            let argv = vec![
                text(token.as_str()),
                text(&generation.to_string()),
                bytes(&args.payload),
                ms(args.ttl),
                text(if args.payload.len() <= args.inline_below {
                    "1"
                } else {
                    "0"
                }),
            ];
            let v = self.eval(COMMIT, self.keys(flight).to_vec(), argv).await?;
            answer(
                "COMMIT",
                &v,
                &[
                    ("COMMITTED", Committed::Committed),
                    ("FENCED", Committed::Fenced),
                ],
            )
        })
    }

    fn abandon<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        generation: u64,
        args: &'a AbandonArgs,
    ) -> BackendFuture<'a, Released> {
        Box::pin(async move {
            let argv = vec![
                text(token.as_str()),
                text(&generation.to_string()),
                Value::Bytes(args.failure.clone().unwrap_or_default()),
                Value::Integer(i64::try_from(args.failure_ttl.as_millis()).unwrap_or(i64::MAX)),
            ];
            let v = self.eval(ABANDON, self.keys(flight).to_vec(), argv).await?;
            released("ABANDON", &v)
        })
    }

    fn release<'a>(
        &'a self,
        flight: &'a FlightId,
        token: &'a OwnerToken,
        state_ttl: Duration,
    ) -> BackendFuture<'a, Released> {
        Box::pin(async move {
            let argv = vec![text(token.as_str()), ms(state_ttl)];
            let v = self.eval(RELEASE, self.keys(flight).to_vec(), argv).await?;
            released("RELEASE", &v)
        })
    }

    fn invalidate<'a>(
        &'a self,
        flight: &'a FlightId,
        state_ttl: Duration,
    ) -> BackendFuture<'a, u64> {
        Box::pin(async move {
            let v = self
                .eval(INVALIDATE, self.keys(flight).to_vec(), vec![ms(state_ttl)])
                .await?;
            gen(&v).ok_or_else(|| bad_reply("INVALIDATE", &v))
        })
    }

    fn subscribe<'a>(&'a self, flight: &'a FlightId) -> BackendFuture<'a, Subscription> {
        Box::pin(async move {
            let subs = &self.inner.subs;
            let [_, channel] = self.keys(flight);
            let serial = subs.serial(&channel).await;
            let (rx, new) = {
                let mut channels = subs.channels();
                match channels.get_mut(&channel) {
                    Some(ch) => {
                        ch.refs += 1;
                        (ch.tx.subscribe(), false)
                    }
                    None => {
                        let (tx, rx) = broadcast::channel(16);
                        channels.insert(channel.clone(), Channel { tx, refs: 1 });
                        (rx, true)
                    }
                }
            };
            // From here the guard owns one reference, released on any error.
            let guard = SubGuard {
                subs: subs.clone(),
                channel: channel.clone(),
            };
            if new {
                if !subs.subscriber.is_connected() {
                    // fred would queue the SUBSCRIBE until a reconnect.
                    return Err(self.inner.link.not_connected());
                }
                let res = tokio::time::timeout(subs.timeout, subs.subscribe(channel))
                    .await
                    .map_err(|_| timed_out("SUBSCRIBE", subs.timeout))?;
                res.map_err(subscribe_error)?;
            }
            drop(serial);
            Ok(Subscription::new(rx, guard))
        })
    }
}
