//! What the L2 benches share (`benches/l2.rs`, `benches/l2_instructions.rs`):
//! the layer over a real Redis set up the same way, its trivial work, fresh
//! keys, and the floor (raw fred running a trivial script by `EVALSHA`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flightdeck_core::error::BoxError;
use flightdeck_core::{FlightKey, Shareable, StageName};
use flightdeck_distributed::{
    DistributedFlights, DistributedPolicy, Execute, PostcardCodec, Propagate, Role,
};
use flightdeck_redis::{RedisBackend, RedisConfig};
use fred::prelude::*;
use tokio::sync::Notify;

/// The layer the benches measure: the Redis backend, results as postcard.
pub type Flights = DistributedFlights<RedisBackend, PostcardCodec<String>>;

/// The floor's script.
pub const FLOOR_SCRIPT: &str = "return 1";

/// Trivial work, work that yields once (pending at its first poll, as
/// real work is), or work that waits to be let go (the follower row).
#[derive(Clone, Debug, Default)]
pub struct Work {
    /// Notified when the work starts (`.0`); the work ends once `.1` is.
    pub gate: Option<Arc<(Notify, Notify)>>,
    /// Yields to the runtime once before it completes.
    pub pending: bool,
}

impl Execute<()> for Work {
    type Shared = String;
    type Output = String;

    async fn execute(self, _req: (), _role: Role) -> Result<Shareable<String, String>, BoxError> {
        if let Some(gate) = &self.gate {
            gate.0.notify_one();
            gate.1.notified().await;
        }
        if self.pending {
            tokio::task::yield_now().await;
        }
        Ok(Shareable::Shared("v".to_owned()))
    }
}

/// The benches' policy.
pub fn policy() -> DistributedPolicy {
    DistributedPolicy::new()
        .lease(Duration::from_secs(10))
        .heartbeat(Duration::from_secs(2))
        .call_timeout(Duration::from_secs(1))
        .poll_interval(Duration::from_millis(50))
        .wait_timeout(Duration::from_secs(10))
        .replay_ttl(Duration::from_secs(300))
}

static KEYS: AtomicU64 = AtomicU64::new(0);

/// A key no flight of this process had.
pub fn fresh_key() -> FlightKey {
    let n = KEYS.fetch_add(1, Ordering::Relaxed);
    FlightKey::from_bytes(
        StageName::new("l2bench").expect("valid stage"),
        n.to_le_bytes(),
    )
}

/// A backend connected to the server at `url`.
pub async fn connect(url: &str) -> RedisBackend {
    RedisBackend::connect(RedisConfig::new(url))
        .await
        .expect("connect")
}

/// A node of the layer on `backend`.
pub fn node(backend: RedisBackend) -> Flights {
    DistributedFlights::new(backend, policy(), PostcardCodec::new()).expect("valid policy")
}

/// The floor's client: raw fred on the server at `url`, on a connection
/// of its own, set up as the backend sets up its clients (one attempt per
/// command, the backend's default 1 s command timeout, the same
/// unresponsive-connection check), so that the floor pays what fred
/// makes the backend pay per command.
pub async fn floor_client(url: &str) -> Client {
    let config = Config::from_url(url).expect("a valid redis URL");
    let timeout = Duration::from_secs(1);
    let client = Builder::from_config(config)
        .with_connection_config(|c| {
            c.max_command_attempts = 1;
            c.unresponsive.max_timeout = Some(timeout * 2);
            c.unresponsive.interval = timeout / 2;
        })
        .with_performance_config(|p| p.default_command_timeout = timeout)
        .build()
        .expect("a fred client");
    client.init().await.expect("the floor's client connects");
    client
}

/// Loads the floor's script on `client`: its SHA.
pub async fn load_floor(client: &Client) -> String {
    client.script_load(FLOOR_SCRIPT).await.expect("SCRIPT LOAD")
}

/// The floor: one trivial EVALSHA on `client`.
pub async fn evalsha(client: &Client, sha: &str) {
    let _: i64 = client
        .evalsha(sha, vec!["l2bench:floor"], Vec::<String>::new())
        .await
        .expect("EVALSHA");
}

/// A flight of `key` with trivial work: its value shared.
pub async fn flight(flights: &Flights, key: &FlightKey) {
    flight_of(flights, key, Work::default()).await;
}

/// A flight of `key` with `work`: its value shared.
pub async fn flight_of(flights: &Flights, key: &FlightKey, work: Work) {
    let out = flights.run(key, (), work, &Propagate).await;
    assert!(matches!(out, Ok(Shareable::Shared(_))), "{out:?}");
}

/// An owner flight on a fresh key, its background commit included.
pub async fn owner(flights: &Flights) {
    flight(flights, &fresh_key()).await;
    flights.idle().await;
}

/// [`owner`], with work that is pending at its first poll (it yields once,
/// so the owner's heartbeat timer is armed, as for real work).
pub async fn owner_pending(flights: &Flights) {
    let work = Work {
        pending: true,
        ..Work::default()
    };
    flight_of(flights, &fresh_key(), work).await;
    flights.idle().await;
}
