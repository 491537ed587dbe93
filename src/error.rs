//! Errors of the facade that are not in `flightdeck-core`.
//!
//! ```
//! use flightdeck::error::UnknownStage;
//! use flightdeck::StageName;
//!
//! let err = UnknownStage::new(StageName::new("reprt").unwrap());
//! assert_eq!(err.to_string(), "no policy for stage reprt");
//! ```

use std::fmt;

use flightdeck_core::StageName;

use crate::mode::Mode;

/// A request's key names a stage the layer has no policy for. A
/// programming error (the key extractor and the configuration disagree),
/// reported as 500 / `INTERNAL`, never silently bypassed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownStage {
    stage: StageName,
}

impl UnknownStage {
    /// Creates the error.
    pub fn new(stage: StageName) -> Self {
        Self { stage }
    }

    /// The stage the key named.
    pub fn stage(&self) -> &StageName {
        &self.stage
    }
}

impl fmt::Display for UnknownStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "no policy for stage {}", self.stage)
    }
}

impl std::error::Error for UnknownStage {}

/// A mode switch that cannot be made: the stage has no backend for a
/// distributed mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModeError {
    stage: StageName,
    mode: Mode,
}

impl ModeError {
    pub(crate) fn new(stage: StageName, mode: Mode) -> Self {
        Self { stage, mode }
    }

    /// The mode that was asked for.
    pub fn mode(&self) -> Mode {
        self.mode
    }
}

impl fmt::Display for ModeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "stage {} has no backend: mode {} is not available",
            self.stage, self.mode
        )
    }
}

impl std::error::Error for ModeError {}
