//! Errors of a request itself: the client's mistake, answered with 400.

use std::error::Error as StdError;
use std::fmt;

use super::BoxError;

/// The request body could not be read while computing the flight key (the
/// client went away, a malformed chunk, ...). Carries the body's error as its
/// source; the message does not repeat it, so it is safe to send to clients.
#[derive(Debug)]
pub struct RequestBodyError {
    source: BoxError,
}

impl RequestBodyError {
    /// Wraps the body's error.
    pub fn new(source: impl Into<BoxError>) -> Self {
        Self {
            source: source.into(),
        }
    }
}

impl fmt::Display for RequestBodyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("failed to read the request body")
    }
}

impl StdError for RequestBodyError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}

/// A request header has a value the layer cannot use (e.g. a malformed
/// `grpc-timeout`): the client's mistake, answered with 400 /
/// `INVALID_ARGUMENT`. Layers with their own error type put this one in its
/// `source()` chain so the one mapping applies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidHeader {
    name: String,
    problem: &'static str,
}

impl InvalidHeader {
    /// The header `name` is unusable because of `problem`.
    pub fn new(name: impl Into<String>, problem: &'static str) -> Self {
        Self {
            name: name.into(),
            problem,
        }
    }

    /// The header's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// What is wrong with it.
    pub fn problem(&self) -> &'static str {
        self.problem
    }
}

impl fmt::Display for InvalidHeader {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {} header: {}", self.name, self.problem)
    }
}

impl StdError for InvalidHeader {}
