//! How a backend call failed.

use std::fmt;

use flightdeck_core::error::{BoxError, CircuitOpen};

/// The three ways a backend call can fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BackendErrorKind {
    /// The backend could not be reached; nothing happened.
    Unavailable,
    /// The backend answered something we do not understand, or refused the
    /// call for a reason retrying will not fix.
    Protocol,
    /// The call may or may not have taken effect (timeout or connection
    /// loss after sending). Retry with the same token.
    OutcomeUnknown,
}

impl BackendErrorKind {
    /// A short label for metrics (`unavailable`, `protocol`,
    /// `outcome_unknown`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Unavailable => "unavailable",
            Self::Protocol => "protocol",
            Self::OutcomeUnknown => "outcome_unknown",
        }
    }
}

/// A failed backend call, classified.
#[derive(Debug)]
pub struct BackendError {
    kind: BackendErrorKind,
    rejected: bool,
    source: Source,
}

/// What caused it: any error, boxed; or an open circuit, kept unboxed (the
/// degraded path refuses every request this way, and mostly drops the
/// refusal: a HYBRID stage runs the request here).
#[derive(Debug)]
enum Source {
    Boxed(BoxError),
    Circuit(CircuitOpen),
}

impl BackendError {
    /// A classified error.
    pub fn new(kind: BackendErrorKind, source: impl Into<BoxError>) -> Self {
        Self {
            kind,
            rejected: false,
            source: Source::Boxed(source.into()),
        }
    }

    /// A local guard (a circuit breaker) refused the call: nothing was
    /// sent. Unavailable, and told apart (see [`is_rejected`](Self::is_rejected)).
    /// `source` is the guard's own error, one of `flightdeck_core`'s (a
    /// `CircuitOpen`): [`into_core`](Self::into_core) hands it on as it is.
    pub fn rejected(source: impl Into<BoxError>) -> Self {
        Self {
            kind: BackendErrorKind::Unavailable,
            rejected: true,
            source: Source::Boxed(source.into()),
        }
    }

    /// A circuit breaker refused the call: [`rejected`](Self::rejected)
    /// with the breaker's `CircuitOpen`, which is boxed only if the
    /// refusal is handed on ([`into_core`](Self::into_core)).
    pub fn circuit_open(open: CircuitOpen) -> Self {
        Self {
            kind: BackendErrorKind::Unavailable,
            rejected: true,
            source: Source::Circuit(open),
        }
    }

    /// Whether a local guard refused the call before it was sent.
    pub fn is_rejected(&self) -> bool {
        self.rejected
    }

    /// Whether a circuit breaker refused the call before it was sent (a
    /// [`rejected`](Self::rejected) call whose guard's error is a
    /// `CircuitOpen`): the breaker judges the backend failing. Any other
    /// guard's refusal says nothing of the backend.
    #[inline]
    pub fn is_circuit_open(&self) -> bool {
        self.rejected
            && match &self.source {
                Source::Circuit(_) => true,
                Source::Boxed(e) => e.is::<CircuitOpen>(),
            }
    }

    /// The backend could not be reached.
    pub fn unavailable(source: impl Into<BoxError>) -> Self {
        Self::new(BackendErrorKind::Unavailable, source)
    }

    /// The backend's answer made no sense.
    pub fn protocol(source: impl Into<BoxError>) -> Self {
        Self::new(BackendErrorKind::Protocol, source)
    }

    /// The call may have happened.
    pub fn outcome_unknown(source: impl Into<BoxError>) -> Self {
        Self::new(BackendErrorKind::OutcomeUnknown, source)
    }

    /// The class of the failure.
    pub fn kind(&self) -> BackendErrorKind {
        self.kind
    }

    /// Converts into the matching flightdeck-core error
    /// ([`CoordinationUnavailable`](flightdeck_core::error::CoordinationUnavailable),
    /// [`ProtocolError`](flightdeck_core::error::ProtocolError) or
    /// [`OutcomeUnknown`](flightdeck_core::error::OutcomeUnknown)), keeping
    /// this error as the source.
    pub fn into_core(self) -> BoxError {
        use flightdeck_core::error::{CoordinationUnavailable, OutcomeUnknown, ProtocolError};
        // A local guard's refusal is already a core error (a breaker's
        // `CircuitOpen`; see `rejected`): no wrapper, no second allocation
        // on the degraded path.
        if self.rejected {
            return match self.source {
                Source::Boxed(e) => e,
                Source::Circuit(open) => Box::new(open),
            };
        }
        match self.kind {
            BackendErrorKind::Unavailable => Box::new(CoordinationUnavailable::new(self)),
            BackendErrorKind::Protocol => {
                Box::new(ProtocolError::with_source("backend reply", self))
            }
            BackendErrorKind::OutcomeUnknown => Box::new(OutcomeUnknown::new(self)),
        }
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            BackendErrorKind::Unavailable => "backend unavailable",
            BackendErrorKind::Protocol => "backend protocol error",
            BackendErrorKind::OutcomeUnknown => "backend outcome unknown",
        };
        match &self.source {
            Source::Boxed(e) => write!(f, "{what}: {e}"),
            Source::Circuit(open) => write!(f, "{what}: {open}"),
        }
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(match &self.source {
            Source::Boxed(e) => &**e,
            Source::Circuit(open) => open,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_convert_to_core_types() {
        use flightdeck_core::error::{
            find, CoordinationUnavailable, OutcomeUnknown, ProtocolError,
        };
        let e = BackendError::unavailable("refused").into_core();
        assert!(e.is::<CoordinationUnavailable>());
        assert!(find::<BackendError>(&*e).is_some());
        assert!(BackendError::protocol("x")
            .into_core()
            .is::<ProtocolError>());
        assert!(BackendError::outcome_unknown("x")
            .into_core()
            .is::<OutcomeUnknown>());
        let open = BackendError::circuit_open(CircuitOpen::new("b"));
        assert!(open.is_rejected() && open.is_circuit_open());
        let boxed = BackendError::rejected(CircuitOpen::new("b"));
        assert!(boxed.is_circuit_open());
        let quota = BackendError::rejected("over quota");
        assert!(quota.is_rejected() && !quota.is_circuit_open());
        assert!(!BackendError::unavailable("down").is_circuit_open());
        assert_eq!(open.kind(), BackendErrorKind::Unavailable);
        assert!(open.to_string().contains("circuit"), "{open}");
        assert!(open.into_core().is::<CircuitOpen>(), "handed on as it is");
    }
}
