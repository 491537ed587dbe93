//! Errors of the facade that are not in `flightdeck-core`.
//!
//! ```
//! use flightdeck::error::UnknownStage;
//! use flightdeck::StageName;
//!
//! let err = UnknownStage::new(StageName::new("reprt").unwrap());
//! assert_eq!(
//!     err.to_string(),
//!     "no policy for stage \"reprt\": the key rules name it, the configuration does not"
//! );
//! ```

use std::fmt;

use flightdeck_core::StageName;

pub use flightdeck_core::error::UnknownStage;

use crate::mode::Mode;

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

/// A key given to a stage's handle that belongs to another stage
/// ([`StageHandle::invalidate`](crate::StageHandle::invalidate)): the
/// handle reaches only its own stage's copies, so it refuses, naming both,
/// rather than purging nothing of that key's here in silence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WrongStage {
    stage: StageName,
    key_stage: StageName,
}

impl WrongStage {
    pub(crate) fn new(stage: StageName, key_stage: StageName) -> Self {
        Self { stage, key_stage }
    }

    /// The stage of the handle.
    pub fn stage(&self) -> &StageName {
        &self.stage
    }

    /// The stage the key belongs to.
    pub fn key_stage(&self) -> &StageName {
        &self.key_stage
    }
}

impl fmt::Display for WrongStage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a key of stage {} given to the handle of stage {}: purge it through its own \
             stage's handle (or the layer's invalidate_request)",
            self.key_stage, self.stage
        )
    }
}

impl std::error::Error for WrongStage {}
