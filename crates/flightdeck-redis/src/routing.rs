//! Which node serves a flight, and what a cluster's redirects mean to us.
//!
//! In a cluster every flight's keys share one hash slot (the hash tag), and
//! each call goes to the client of the primary that serves that slot in
//! our own slot map ([`Cluster`]). The per-node clients are plain
//! (centralized) fred clients, so they follow no redirect: a `MOVED` or
//! `ASK` reply comes back to us as an error.
//!
//! - `MOVED`: the slot has a new owner. We refresh our map (asking the node
//!   the redirect names first) and send the call again, within its
//!   deadline.
//! - `ASK` and `TRYAGAIN`: the slot is being migrated, and the script
//!   cannot run where it was sent (a one-key script, once its record
//!   moved; INVALIDATE and READ, whose invalidation key may be elsewhere,
//!   as long as the slot moves). The target serves a multi-key command in
//!   an importing slot only when it has every key (`getNodeByQuery`
//!   answers `TRYAGAIN` otherwise); `ASK` is not followed. The call is sent again
//!   after [`MIGRATION_PAUSE`] within its deadline; past it, it is
//!   *unavailable* (the script did not run).
//!
//! fred's own cluster client is not used: it keeps one connection state
//! for the whole cluster (a primary that is down makes it refuse every
//! command, see `docs/redis-errors.md`), and it follows `ASK` wrongly
//! (fred 10.1.0: `process_ask` in src/router/commands.rs sets the command's
//! hash slot but not its `cluster_node`, so the command goes back to the
//! old owner until the redirections run out, and the `ASKING` of
//! `send_asking_with_policy`, src/router/utils.rs, is read straight off a
//! shared socket ahead of replies owed to commands in flight on it).

use std::sync::Arc;
use std::time::Duration;

use flightdeck_distributed::backend::{BackendError, Shard};
use fred::interfaces::ClientLike;

use crate::classify::classify;
use crate::cluster::Cluster;
use crate::node::Node;

/// The servers behind a backend.
pub(crate) enum Topology {
    /// One server (standalone, or the primary sentinels name).
    Single(Arc<Node>),
    /// A Redis Cluster: a node per primary.
    Cluster(Arc<Cluster>),
}

impl Topology {
    /// The node to send a call for `slot` on, or why there is none
    /// (unavailable: nothing can be sent). A node whose connection was
    /// just lost (see `Link::lost`: fred still says it is connected) is
    /// waited for until `deadline`, and refused once a reconnection
    /// attempt fails. Otherwise one server leaves the rest to fred
    /// (`fail_fast`). A cluster refuses at once when the slot's primary
    /// fails to connect; a primary whose connection is being made (a new
    /// primary after a failover or a reshard, or one reconnecting whose
    /// attempt has not failed yet) is waited for until `deadline`.
    pub(crate) async fn route_within(
        &self,
        slot: u16,
        deadline: tokio::time::Instant,
    ) -> Result<Arc<Node>, BackendError> {
        let node = self.node_for(slot)?;
        if node.link.is_lost() && !node.link.back_within(deadline).await {
            return Err(not_connected(&node));
        }
        if let Self::Single(_) = self {
            return Ok(node);
        }
        if node.client.is_connected() {
            return Ok(node);
        }
        if node.link.is_failing() {
            return Err(not_connected(&node));
        }
        match tokio::time::timeout_at(deadline, node.client.wait_for_connect()).await {
            Ok(Ok(())) => Ok(node),
            _ => Err(not_connected(&node)),
        }
    }

    /// The node serving `slot` (the one server, or the slot's primary),
    /// whatever its connection.
    fn node_for(&self, slot: u16) -> Result<Arc<Node>, BackendError> {
        match self {
            Self::Single(node) => Ok(node.clone()),
            Self::Cluster(cluster) => cluster.node_for(slot),
        }
    }

    /// The node to send a call for `slot` on now, without waiting for a
    /// connection being made: unavailable when the node's connection is
    /// lost or not made yet. For `WAIT`, which counts the replicas that
    /// acknowledged the writes of the connection it runs on: sent on a new
    /// one (after a loss, fred may reach another server: Sentinel's new
    /// primary; in a cluster, a new primary), it would count replicas
    /// that never got the commit. With the node, how many times its
    /// connection was lost so far ([`Link::losses`]): a call whose answer
    /// comes after another loss may have gone on the new connection.
    ///
    /// [`Link::losses`]: crate::node::Link::losses
    pub(crate) fn route_now(&self, slot: u16) -> Result<(Arc<Node>, u64), BackendError> {
        let node = self.node_for(slot)?;
        // Counted before `lost` is read: a loss counted later is one the
        // caller's second look sees.
        let losses = node.link.losses();
        if node.link.is_lost() || !node.client.is_connected() {
            return Err(not_connected(&node));
        }
        Ok((node, losses))
    }

    /// The shard serving `slot` (see [`Backend::shard`](flightdeck_distributed::Backend::shard)).
    pub(crate) fn shard(&self, slot: u16) -> Shard {
        match self {
            Self::Single(_) => Shard::WHOLE,
            Self::Cluster(cluster) => cluster
                .primary_of(slot)
                .map_or_else(|| Shard::new(crate::cluster::UNMAPPED), Shard::new),
        }
    }

    /// Every node.
    pub(crate) fn nodes(&self) -> Vec<Arc<Node>> {
        match self {
            Self::Single(node) => vec![node.clone()],
            Self::Cluster(cluster) => cluster.nodes(),
        }
    }
}

/// Unavailable: `node` has no connection to send on (naming the
/// primary in a cluster).
pub(crate) fn not_connected(node: &Node) -> BackendError {
    if node.sharded {
        BackendError::unavailable(format!(
            "{} (cluster primary {})",
            node.link.why_not_connected(),
            node.addr
        ))
    } else {
        node.link.not_connected()
    }
}

/// The node a `MOVED` reply names (`MOVED <slot> <host:port>`).
pub(crate) fn moved_to(e: &fred::error::Error) -> Option<&str> {
    let mut words = e.details().split_whitespace();
    (words.next() == Some("MOVED"))
        .then(|| words.nth(1))
        .flatten()
}

/// Whether Redis Cluster refused a command because its slot is moving:
/// `TRYAGAIN` (the keys are split between the two nodes) or `ASK`. The
/// command did not run.
pub(crate) fn slot_in_migration(e: &fred::error::Error) -> bool {
    let first = e.details().split_whitespace().next().unwrap_or("");
    matches!(first, "TRYAGAIN" | "ASK" | "MOVED")
}

/// Classifies an error, naming a slot migration that outlasted the call's
/// deadline (unavailable: the script did not run).
pub(crate) fn migrating(e: fred::error::Error) -> BackendError {
    if slot_in_migration(&e) {
        BackendError::unavailable(format!(
            "redis cluster slot being migrated until the call's deadline (last answer: {})",
            e.details()
        ))
    } else {
        classify(e)
    }
}

/// The pause before retrying a script whose slot is being migrated.
pub(crate) const MIGRATION_PAUSE: Duration = Duration::from_millis(20);

#[cfg(test)]
mod tests {
    use super::*;
    use fred::error::{Error, ErrorKind};

    #[test]
    fn redirects_are_read() {
        let moved = Error::new(ErrorKind::Cluster, "MOVED 3999 127.0.0.1:6381");
        assert_eq!(moved_to(&moved), Some("127.0.0.1:6381"));
        assert!(slot_in_migration(&moved));
        let ask = Error::new(ErrorKind::Cluster, "ASK 3999 127.0.0.1:6381");
        assert_eq!(moved_to(&ask), None);
        assert!(slot_in_migration(&ask));
        let again = Error::new(ErrorKind::Unknown, "TRYAGAIN Multiple keys request");
        assert!(slot_in_migration(&again));
        assert!(!slot_in_migration(&Error::new(ErrorKind::Unknown, "ERR x")));
        assert_eq!(
            migrating(again).kind(),
            flightdeck_distributed::BackendErrorKind::Unavailable
        );
    }
}
