//! fred errors → the three classes the L2 layer acts on.
//!
//! fred maps most server replies to `ErrorKind::Unknown` (only `WRONGTYPE`,
//! auth refusals and cluster redirects get their own kinds), so those are
//! classified by the reply's first word.
//!
//! ```
//! use flightdeck_distributed::BackendErrorKind;
//! use flightdeck_redis::classify::classify;
//! use fred::error::{Error, ErrorKind};
//!
//! let lua = Error::new(ErrorKind::Unknown, "ERR user_script:1: boom");
//! assert_eq!(classify(lua).kind(), BackendErrorKind::Protocol);
//! let timeout = Error::new(ErrorKind::Timeout, "Request timed out.");
//! assert_eq!(classify(timeout).kind(), BackendErrorKind::OutcomeUnknown);
//! ```

use flightdeck_distributed::BackendError;
use fred::error::{Error, ErrorKind};

/// Server replies that mean "try later", not "your call is wrong".
const TRANSIENT: [&str; 8] = [
    "LOADING",
    // A primary that lost its replicas under `min-replicas-to-write`.
    "NOREPLICAS",
    "BUSY",
    "READONLY",
    "MASTERDOWN",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "NOSCRIPT",
];

/// Classifies a fred error (the full table, with the test of each row,
/// is `docs/redis-errors.md`):
/// - the command may have been sent (timeout, IO on the connection): outcome
///   unknown;
/// - nothing was sent or Redis cannot serve now (canceled while
///   disconnected, routing, cluster, backpressure, LOADING, READONLY, ...):
///   unavailable;
/// - anything else (Lua errors, CROSSSLOT, WRONGTYPE, parse errors, bad
///   config): protocol.
pub fn classify(e: Error) -> BackendError {
    let first_word = e.details().split_whitespace().next().unwrap_or("");
    // fred's own "no connection to send this on" messages come as Unknown
    // too: "Failed to route command." while the connection is down.
    let unknown_transient = TRANSIENT.contains(&first_word)
        || e.details().contains("channel closed")
        || e.details().starts_with("Failed to route command");
    // A connection that was refused never carried the command.
    let never_sent = *e.kind() == ErrorKind::IO
        && (e.details().contains("Connection refused") || e.details().contains("os error 111"));
    match e.kind() {
        ErrorKind::IO if never_sent => BackendError::unavailable(e),
        ErrorKind::Timeout | ErrorKind::IO => BackendError::outcome_unknown(e),
        ErrorKind::Canceled
        | ErrorKind::Routing
        | ErrorKind::Cluster
        | ErrorKind::Sentinel
        | ErrorKind::Backpressure => BackendError::unavailable(e),
        ErrorKind::Unknown if unknown_transient => BackendError::unavailable(e),
        _ => BackendError::protocol(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flightdeck_distributed::BackendErrorKind as K;

    #[test]
    fn classes() {
        let cases = [
            (ErrorKind::Timeout, "Request timed out.", K::OutcomeUnknown),
            (ErrorKind::IO, "Connection closed.", K::OutcomeUnknown),
            (
                ErrorKind::Canceled,
                "Connection closed unexpectedly.",
                K::Unavailable,
            ),
            (
                ErrorKind::Unknown,
                "LOADING Redis is loading",
                K::Unavailable,
            ),
            (
                ErrorKind::Unknown,
                "READONLY You can't write",
                K::Unavailable,
            ),
            (
                ErrorKind::Unknown,
                "NOSCRIPT No matching script.",
                K::Unavailable,
            ),
            (ErrorKind::Unknown, "channel closed", K::Unavailable),
            (
                ErrorKind::Unknown,
                "NOREPLICAS Not enough good replicas to write.",
                K::Unavailable,
            ),
            (
                ErrorKind::Unknown,
                "Failed to route command.",
                K::Unavailable,
            ),
            (ErrorKind::Unknown, "ERR user_script:1: boom", K::Protocol),
            (ErrorKind::Unknown, "CROSSSLOT Keys in request", K::Protocol),
            (
                ErrorKind::InvalidArgument,
                "WRONGTYPE Operation",
                K::Protocol,
            ),
            (ErrorKind::Parse, "Invalid integer string.", K::Protocol),
            (ErrorKind::Cluster, "MOVED 1 x", K::Unavailable),
            (ErrorKind::Cluster, "ASK 1 x", K::Unavailable),
            (
                ErrorKind::Backpressure,
                "Max in-flight commands reached.",
                K::Unavailable,
            ),
            (
                ErrorKind::Unknown,
                "BUSY Redis is busy running a script",
                K::Unavailable,
            ),
            (
                ErrorKind::Unknown,
                "MASTERDOWN Link with MASTER is down",
                K::Unavailable,
            ),
            (
                ErrorKind::Cluster,
                "CLUSTERDOWN The cluster is down",
                K::Unavailable,
            ),
            (
                ErrorKind::Unknown,
                "TRYAGAIN Multiple keys request",
                K::Unavailable,
            ),
            (ErrorKind::Routing, "Too many redirections.", K::Unavailable),
            (
                ErrorKind::Cluster,
                "Invalid or missing cluster state.",
                K::Unavailable,
            ),
            (
                ErrorKind::IO,
                "Connection refused (os error 111)",
                K::Unavailable,
            ),
            (
                ErrorKind::IO,
                "Connection reset by peer (os error 104)",
                K::OutcomeUnknown,
            ),
        ];
        for (kind, details, class) in cases {
            assert_eq!(
                classify(Error::new(kind, details)).kind(),
                class,
                "{details}"
            );
        }
    }
}
