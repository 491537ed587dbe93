//! Errors of coordination across nodes (the breaker, the backend, the
//! lease).

use std::error::Error as StdError;
use std::fmt;
use std::sync::Arc;

use super::BoxError;
use crate::key::StageName;

/// A circuit breaker is open and rejected the call without running it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CircuitOpen {
    name: Arc<str>,
}

impl CircuitOpen {
    /// Creates the error for the named breaker.
    pub fn new(name: impl Into<Arc<str>>) -> Self {
        Self { name: name.into() }
    }

    /// The breaker's name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl fmt::Display for CircuitOpen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "circuit open (breaker {})", self.name)
    }
}

impl StdError for CircuitOpen {}

/// A time budget ran out before or during a phase.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadlineExceeded {
    phase: &'static str,
}

impl DeadlineExceeded {
    /// Creates the error for the named phase (`"coordination"`,
    /// `"execution"`, `"result"`, `"request"`).
    pub const fn new(phase: &'static str) -> Self {
        Self { phase }
    }

    /// The phase that ran out of time.
    pub fn phase(&self) -> &'static str {
        self.phase
    }
}

impl fmt::Display for DeadlineExceeded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "deadline exceeded ({})", self.phase)
    }
}

impl StdError for DeadlineExceeded {}

/// The coordination layer (e.g. Redis) could not be reached before the work
/// was acquired. Carries the underlying error as its source.
#[derive(Debug)]
pub struct CoordinationUnavailable {
    source: BoxError,
}

impl CoordinationUnavailable {
    /// Wraps the underlying error.
    pub fn new(source: impl Into<BoxError>) -> Self {
        Self {
            source: source.into(),
        }
    }
}

impl fmt::Display for CoordinationUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "coordination unavailable: {}", self.source)
    }
}

impl StdError for CoordinationUnavailable {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}

/// The coordination layer answered something this version does not
/// understand: an unknown script action, a malformed reply, a stored result
/// with an unknown version or codec, bytes that do not decode. Distinct from
/// [`CoordinationUnavailable`] so that a fallback can also raise an alert.
#[derive(Debug)]
pub struct ProtocolError {
    message: String,
    source: Option<BoxError>,
}

impl ProtocolError {
    /// A protocol error described by `message` (no raw keys or payloads).
    pub fn new(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            source: None,
        }
    }

    /// A protocol error caused by `source`.
    pub fn with_source(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// What was wrong.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "coordination protocol error: {}", self.message)
    }
}

impl StdError for ProtocolError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn StdError + 'static))
    }
}

/// A write to the coordination layer may or may not have happened (the
/// connection dropped or the call timed out after it was sent). Retry only
/// with the same owner token, which the scripts treat idempotently.
#[derive(Debug)]
pub struct OutcomeUnknown {
    source: BoxError,
}

impl OutcomeUnknown {
    /// Wraps the underlying error.
    pub fn new(source: impl Into<BoxError>) -> Self {
        Self {
            source: source.into(),
        }
    }
}

impl fmt::Display for OutcomeUnknown {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "coordination outcome unknown: {}", self.source)
    }
}

impl StdError for OutcomeUnknown {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}

/// The owner lost its lease while the work ran (another node may own the
/// flight now) and the stage cancels work on lease loss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseLost {
    stage: Option<StageName>,
    generation: u64,
}

impl LeaseLost {
    /// Creates the error for the generation that was lost.
    pub fn new(stage: Option<StageName>, generation: u64) -> Self {
        Self { stage, generation }
    }

    /// The generation (fencing token) that was lost.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

impl fmt::Display for LeaseLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "lease lost (generation {})", self.generation)?;
        if let Some(s) = &self.stage {
            write!(f, " (stage {s})")?;
        }
        Ok(())
    }
}

impl StdError for LeaseLost {}

/// The owner of a flight on another node died (its lease expired without a
/// result) and the stage does not allow takeover: followers stop waiting.
/// The flight stays blocked until the backend forgets it; the next grant
/// after that gets a fresh, larger generation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OwnerGone {
    stage: Option<StageName>,
    generation: u64,
}

impl OwnerGone {
    /// Creates the error for the dead owner's generation.
    pub fn new(stage: Option<StageName>, generation: u64) -> Self {
        Self { stage, generation }
    }

    /// The dead owner's generation.
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

impl fmt::Display for OwnerGone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the flight's owner died without a result (generation {}) and takeover is not allowed",
            self.generation
        )?;
        if let Some(s) = &self.stage {
            write!(f, " (stage {s})")?;
        }
        Ok(())
    }
}

impl StdError for OwnerGone {}
