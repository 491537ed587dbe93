//! What is wrong with a configuration, named by stage and field.

use std::borrow::Cow;
use std::fmt;

/// A configuration that cannot be used. Names the stage and the field, as
/// the configuration file spells them.
///
/// ```
/// # #[cfg(feature = "toml")] {
/// use flightdeck::SingleFlightConfig;
///
/// let err = SingleFlightConfig::from_toml(
///     "[single-flight.stages.score]\nlease-timeout = \"30 parsecs\"\n",
/// )
/// .unwrap_err();
/// assert_eq!(err.stage(), Some("score"));
/// assert_eq!(err.field(), Some("lease-timeout"));
/// assert!(err.to_string().contains("unknown unit"), "{err}");
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// The document does not parse at all (its syntax; the message comes
    /// from the parser and names the line).
    Parse {
        /// `toml` or `yaml`.
        format: &'static str,
        /// The parser's message.
        message: String,
    },
    /// A value is missing, of the wrong type, out of range, or contradicts
    /// another (or a key is unknown).
    Invalid {
        /// The stage, when the error is about one.
        stage: Option<String>,
        /// The field, as spelled in the configuration file
        /// (`lease-timeout`, `breaker.half-open-probes`).
        field: Cow<'static, str>,
        /// What is wrong with it.
        message: String,
    },
}

/// Stage names in messages are cut to this many characters (a name that is
/// not a valid stage name may be any length).
const SHOWN_STAGE: usize = 64;

impl ConfigError {
    pub(crate) fn invalid(
        stage: Option<&str>,
        field: impl Into<Cow<'static, str>>,
        message: impl Into<String>,
    ) -> Self {
        Self::Invalid {
            stage: stage.map(str::to_owned),
            field: field.into(),
            message: message.into(),
        }
    }

    /// The stage the error is about, if any.
    pub fn stage(&self) -> Option<&str> {
        match self {
            Self::Invalid { stage, .. } => stage.as_deref(),
            Self::Parse { .. } => None,
        }
    }

    /// The field the error is about, if known.
    pub fn field(&self) -> Option<&str> {
        match self {
            Self::Invalid { field, .. } => Some(field),
            Self::Parse { .. } => None,
        }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Parse { format, message } => write!(f, "invalid {format} config: {message}"),
            Self::Invalid {
                stage: Some(stage),
                field,
                message,
            } => {
                let shown: String = stage.chars().take(SHOWN_STAGE).collect();
                let cut = if shown.len() < stage.len() { "…" } else { "" };
                write!(f, "stage {:?}: {field}: {message}", format!("{shown}{cut}"))
            }
            Self::Invalid {
                stage: None,
                field,
                message,
            } => write!(f, "{field}: {message}"),
        }
    }
}

impl std::error::Error for ConfigError {}
