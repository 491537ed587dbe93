//! Durations as configuration files write them (`"500ms"`, `"1m30s"`),
//! read by `humantime`, with our messages on top: errors say "missing
//! unit" or "unknown unit" as the configuration docs do, and a duration is
//! one word (`"5 s"` is refused: every example writes `"5s"`, and a space
//! is more likely a typo than a style).

use std::fmt;
use std::time::Duration;

/// Why a configured duration does not parse.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum DurationError {
    /// Nothing, or only spaces.
    Empty,
    /// A number without its unit (`"30"`).
    MissingUnit,
    /// A unit humantime does not know (`"30 parsecs"`).
    UnknownUnit(String),
    /// Spaces inside (`"5 s"`).
    Spaces,
    /// Anything else humantime refuses (a sign, a stray character, a
    /// number too large).
    Invalid(humantime::DurationError),
}

impl fmt::Display for DurationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: &str = "ms, s, m, h, d, w, and humantime's longer names";
        match self {
            Self::Empty => f.write_str("empty duration"),
            Self::MissingUnit => write!(f, "missing unit ({UNITS}): write e.g. \"30s\""),
            Self::UnknownUnit(unit) => write!(f, "unknown unit {unit:?} ({UNITS})"),
            Self::Spaces => f.write_str("a duration is one word without spaces, e.g. \"1m30s\""),
            Self::Invalid(e) => write!(f, "invalid duration: {e}"),
        }
    }
}

impl std::error::Error for DurationError {}

/// Parses a duration such as `500ms`, `30s`, `10m`, `1h`, `2d`, `1w` or
/// `1m30s` (humantime's units: also `1.5s`, `2days`, `1month` = 30.44
/// days, `1y` = 365.25 days); a bare `0` is zero.
pub(crate) fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let d = humantime::parse_duration(text).map_err(|e| match e {
        humantime::DurationError::Empty => DurationError::Empty,
        humantime::DurationError::UnknownUnit { unit, .. } if unit.is_empty() => {
            DurationError::MissingUnit
        }
        humantime::DurationError::UnknownUnit { unit, .. } => DurationError::UnknownUnit(unit),
        other => DurationError::Invalid(other),
    })?;
    if text.trim().contains(char::is_whitespace) {
        return Err(DurationError::Spaces);
    }
    Ok(d)
}

#[cfg(feature = "serde")]
pub(super) mod required {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        super::parse_duration(&s).map_err(serde::de::Error::custom)
    }
}

#[cfg(feature = "serde")]
pub(super) mod opt_duration {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        let s = Option::<String>::deserialize(d)?;
        s.map(|s| super::parse_duration(&s).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_forms_parse() {
        for (text, d) in [
            ("0", Duration::ZERO),
            ("250ms", Duration::from_millis(250)),
            ("30s", Duration::from_secs(30)),
            ("10m", Duration::from_secs(600)),
            ("1h", Duration::from_secs(3600)),
            ("2d", Duration::from_secs(2 * 86_400)),
            ("1m30s", Duration::from_secs(90)),
            ("1w", Duration::from_secs(7 * 86_400)),
            ("1.5s", Duration::from_millis(1500)),
            ("2days", Duration::from_secs(2 * 86_400)),
        ] {
            assert_eq!(parse_duration(text), Ok(d), "{text}");
        }
    }

    #[test]
    fn mistakes_are_named() {
        assert_eq!(parse_duration("30"), Err(DurationError::MissingUnit));
        assert_eq!(
            parse_duration("30parsecs"),
            Err(DurationError::UnknownUnit("parsecs".into()))
        );
        assert_eq!(
            parse_duration("30 parsecs"),
            Err(DurationError::UnknownUnit("parsecs".into()))
        );
        assert_eq!(parse_duration("5 s"), Err(DurationError::Spaces));
        assert_eq!(parse_duration(""), Err(DurationError::Empty));
        assert!(matches!(
            parse_duration("-1s"),
            Err(DurationError::Invalid(_))
        ));
        assert!(matches!(
            parse_duration("99999999999999999999s"),
            Err(DurationError::Invalid(_))
        ));
        assert!(parse_duration("30")
            .unwrap_err()
            .to_string()
            .contains("missing unit"));
        assert!(parse_duration("3x")
            .unwrap_err()
            .to_string()
            .contains("unknown unit"));
    }
}
