//! [`Connection`]: whether a backend has a connection to send calls on.

use std::fmt;
use std::sync::Arc;

use tokio::sync::watch;

/// What [`Backend::connection`](crate::Backend::connection) returns.
pub type ConnectionWatch = watch::Receiver<Connection>;

/// Whether a backend can send calls now, as its
/// [`connection`](crate::Backend::connection) watch publishes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Connection {
    /// Calls can be sent (or the backend does not tell).
    Connected,
    /// No connection yet, or none any more: why, for logs ("redis not
    /// connected yet (connecting)").
    NotConnected(Arc<str>),
}

impl Connection {
    /// A watch that says [`Connection::Connected`] for good: what a
    /// backend that does not tell its connection state answers.
    pub fn always_connected() -> ConnectionWatch {
        watch::channel(Connection::Connected).1
    }

    /// Whether calls can be sent.
    pub fn is_connected(&self) -> bool {
        matches!(self, Connection::Connected)
    }
}

impl fmt::Display for Connection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Connection::Connected => f.write_str("connected"),
            Connection::NotConnected(why) => f.write_str(why),
        }
    }
}
