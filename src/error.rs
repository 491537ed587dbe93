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
