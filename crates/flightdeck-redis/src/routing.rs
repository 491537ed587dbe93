//! Cluster routing: what a slot migration looks like to us, and how
//! many redirects and attempts fred gets.

use std::time::Duration;

use flightdeck_distributed::backend::BackendError;

use crate::classify::classify;

/// Whether Redis Cluster refused a command because its slot is moving:
/// `TRYAGAIN` (the keys are split between the two nodes), or `ASK` /
/// `MOVED`, which fred reports as "Too many redirections." since we let it
/// follow none (see [`NO_REDIRECTS`]). The command did not run.
pub(crate) fn slot_in_migration(e: &fred::error::Error) -> bool {
    e.details().starts_with("TRYAGAIN")
        || (matches!(e.kind(), fred::error::ErrorKind::Routing)
            && e.details().starts_with("Too many redirections"))
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

/// Redirects fred may follow for the command client in a cluster: none.
///
/// fred 10.1 follows `ASK` wrongly (fred 10.1.0 is the newest release).
/// `process_ask` (src/router/commands.rs) sets the command's hash slot but
/// not its `cluster_node`, so the command is routed by the cached slot map,
/// that is back to the old owner, which answers `ASK` again, until the
/// redirections run out. And the `ASKING` it sends each time
/// (`send_asking_with_policy`, src/router/utils.rs) is written on the
/// shared connection to the target and its reply read straight off the
/// socket (`read_skip_pubsub`), ahead of the replies still owed to
/// commands in flight on that connection. With requests in flight we saw
/// `Max attempts reached.` from that function, `channel closed`, and
/// clients whose every later command timed out, after the migration too.
///
/// Following `ASK` correctly would not help our scripts anyway: the target
/// serves a multi-key command in an importing slot only when it has every
/// key (`getNodeByQuery` answers `TRYAGAIN` otherwise), and the channel in
/// `KEYS` is never a stored key. So every redirect comes back to us as an
/// error and the call is retried within its deadline; for `MOVED` fred
/// has refreshed its slot map first, so the retry goes to the new owner.
pub(crate) const NO_REDIRECTS: u32 = 0;

/// fred attempts per command in a cluster. One attempt would be enough
/// elsewhere (after a dropped connection the outcome is unknown and the
/// layer retries with the same token), but in a cluster fred may write a
/// command again after it re-syncs its slot map or reconnects a node, and
/// the subscriber follows `MOVED` for `SSUBSCRIBE` (our scripts follow no
/// redirect, see [`NO_REDIRECTS`]). A replay after a reconnect is safe:
/// every script is idempotent for the same (token, generation), and
/// INVALIDATE at worst starts one more generation.
pub(crate) const CLUSTER_ATTEMPTS: u32 = 4;

/// The pause before retrying a script whose slot is being migrated.
pub(crate) const MIGRATION_PAUSE: Duration = Duration::from_millis(20);
