//! Errors of key extraction.
//!
//! Request-time errors are core types, so that every HTTP and gRPC adapter
//! of flightdeck maps them the same way (`ErrorClass`):
//! [`RequestBodyError`] (400 / `INVALID_ARGUMENT`) and
//! [`IdempotencyConflict`] (422 / `FAILED_PRECONDITION`). Configuration
//! mistakes are reported once, when an extractor is built, as
//! [`KeyConfigError`].
//!
//! ```
//! use flightdeck_core::{BoxError, ErrorClass};
//! use flightdeck_key::error::IdempotencyConflict;
//!
//! // What a `KeyLayer` returns when an Idempotency-Key is reused with
//! // another payload, and how flightdeck's adapters answer it.
//! let err: BoxError = IdempotencyConflict::new(None).into();
//! assert!(err.is::<IdempotencyConflict>());
//! assert_eq!(ErrorClass::of(&*err).http_status(), 422);
//! assert_eq!(err.to_string(), "idempotency key reused with a different request");
//! ```

use std::fmt;

pub use flightdeck_core::error::{IdempotencyConflict, RequestBodyError};

/// An extractor was configured with an invalid value (a bad stage name,
/// route pattern or header name). Names the first problem found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyConfigError {
    message: String,
}

impl KeyConfigError {
    #[cfg_attr(not(feature = "http"), allow(dead_code))]
    pub(crate) fn new(what: &str, value: &str, problem: impl fmt::Display) -> Self {
        // Escaped and truncated: configuration may come from a file.
        let value: String = value
            .chars()
            .take(80)
            .collect::<String>()
            .escape_debug()
            .to_string();
        Self {
            message: format!("invalid {what} \"{value}\": {problem}"),
        }
    }
}

impl fmt::Display for KeyConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for KeyConfigError {}
