//! Per-stage policy: [`StageConfig`], loadable from TOML and YAML (a
//! `single-flight:` section with one table per stage), with defaults, and
//! validated with errors that name the stage and the field.
//!
//! ```
//! # #[cfg(feature = "yaml")] {
//! use std::time::Duration;
//! use flightdeck::{Mode, SingleFlightConfig};
//!
//! let cfg = SingleFlightConfig::from_yaml(r#"
//! single-flight:
//!   stages:
//!     interview-score:
//!       backend: main
//!       lease-timeout: 30s
//!       heartbeat-interval: 5s
//!       wait-timeout: 35s
//!       replay-ttl: 0s
//!     resume-question:
//!       mode: local-only
//! "#).unwrap();
//! let score = &cfg.stages["interview-score"];
//! assert_eq!(score.mode, Mode::Hybrid);
//! assert_eq!(score.heartbeat_interval, Duration::from_secs(5));
//!
//! let err = SingleFlightConfig::from_yaml(r#"
//! single-flight:
//!   stages:
//!     final-report:
//!       backend: main
//!       lease-timeout: 30s
//!       heartbeat-interval: 15s
//! "#).unwrap_err();
//! assert_eq!(err.stage(), Some("final-report"));
//! assert_eq!(err.field(), Some("heartbeat-interval"));
//! # }
//! ```

#[cfg(feature = "serde")]
mod duration;
mod error;
mod settings;
mod stage;
mod suggest;

use std::collections::BTreeMap;

pub use self::error::ConfigError;
#[cfg(feature = "http")]
pub(crate) use self::settings::SCOPE_SECRET_ENV;
pub use self::settings::{BreakerSettings, BulkheadSettings, KeySettings, SharingSettings};
pub use self::stage::StageConfig;
#[cfg(feature = "http")]
pub(crate) use self::suggest::closest;
pub(crate) use self::suggest::did_you_mean;

/// The `single-flight:` section: one [`StageConfig`] per stage name, and
/// the deployment's [`KeySettings`].
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(
    feature = "serde",
    serde(default, rename_all = "kebab-case", deny_unknown_fields)
)]
#[non_exhaustive]
pub struct SingleFlightConfig {
    /// The stages, by name.
    #[cfg_attr(feature = "serde", serde(deserialize_with = "unique_stages"))]
    pub stages: BTreeMap<String, StageConfig>,
    /// What of the HTTP key the deployment decides.
    pub keys: KeySettings,
}

/// The stages of a document, each name once: a stage given twice (YAML
/// lets a mapping repeat a key) is refused, naming it, rather than the
/// later table replacing the earlier in silence.
#[cfg(feature = "serde")]
fn unique_stages<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, StageConfig>, D::Error> {
    struct Stages;

    impl<'de> serde::de::Visitor<'de> for Stages {
        type Value = BTreeMap<String, StageConfig>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a map")
        }

        fn visit_map<A: serde::de::MapAccess<'de>>(
            self,
            mut map: A,
        ) -> Result<Self::Value, A::Error> {
            let mut stages = BTreeMap::new();
            while let Some(name) = map.next_key::<String>()? {
                if stages.contains_key(&name) {
                    return Err(serde::de::Error::custom(format_args!(
                        "stage {name:?} is given twice"
                    )));
                }
                let stage = map.next_value()?;
                stages.insert(name, stage);
            }
            Ok(stages)
        }
    }

    d.deserialize_map(Stages)
}

/// Which stages of a document have a `mode` key: read beside the
/// document itself, since a `StageConfig` cannot tell a mode left at its
/// default from one written out.
#[cfg(any(feature = "toml", feature = "yaml"))]
#[derive(serde::Deserialize)]
struct GivenModes {
    #[serde(rename = "single-flight", default)]
    single_flight: GivenStages,
}

#[cfg(any(feature = "toml", feature = "yaml"))]
#[derive(serde::Deserialize, Default)]
struct GivenStages {
    #[serde(default)]
    stages: BTreeMap<String, GivenMode>,
}

#[cfg(any(feature = "toml", feature = "yaml"))]
#[derive(serde::Deserialize)]
struct GivenMode {
    mode: Option<serde::de::IgnoredAny>,
}

#[cfg(any(feature = "toml", feature = "yaml"))]
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Document {
    #[serde(rename = "single-flight")]
    single_flight: SingleFlightConfig,
}

impl SingleFlightConfig {
    /// An empty configuration.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds (or replaces) a stage.
    pub fn stage(mut self, name: impl Into<String>, cfg: StageConfig) -> Self {
        self.stages.insert(name.into(), cfg);
        self
    }

    /// Checks every stage (see [`StageConfig::validate`]).
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (name, stage) in &self.stages {
            if flightdeck_core::StageName::new(name).is_err() {
                return Err(ConfigError::invalid(
                    Some(name),
                    "stage",
                    "is not a valid stage name",
                ));
            }
            stage.validate(name)?;
        }
        Ok(())
    }

    /// Parses a TOML document with a `[single-flight.stages.NAME]` table per
    /// stage, then validates it. Errors name the stage and the field.
    #[cfg(feature = "toml")]
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let de = toml::Deserializer::parse(text).map_err(|e| ConfigError::Parse {
            format: "toml",
            message: e.to_string(),
        })?;
        let mut cfg = Self::from_document(serde_path_to_error::deserialize(de), "toml")?;
        if let Ok(modes) = toml::from_str::<GivenModes>(text) {
            cfg.mark_given_modes(&modes);
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parses a YAML document with a `single-flight: stages: NAME:` mapping
    /// per stage, then validates it. Errors name the stage and the field.
    #[cfg(feature = "yaml")]
    pub fn from_yaml(text: &str) -> Result<Self, ConfigError> {
        let de = serde_norway::Deserializer::from_str(text);
        let mut cfg = Self::from_document(serde_path_to_error::deserialize(de), "yaml")?;
        if let Ok(modes) = serde_norway::from_str::<GivenModes>(text) {
            cfg.mark_given_modes(&modes);
        }
        cfg.validate()?;
        Ok(cfg)
    }

    /// Marks the stages whose table has a `mode` key as having chosen it
    /// (see [`StageConfig::new`]).
    #[cfg(any(feature = "toml", feature = "yaml"))]
    fn mark_given_modes(&mut self, given: &GivenModes) {
        for (name, stage) in &mut self.stages {
            if given
                .single_flight
                .stages
                .get(name)
                .is_some_and(|s| s.mode.is_some())
            {
                stage.mode_given();
            }
        }
    }

    /// A deserialized document (validated by the caller); a field that
    /// does not parse is named by its path.
    #[cfg(any(feature = "toml", feature = "yaml"))]
    fn from_document<E: std::fmt::Display>(
        doc: Result<Document, serde_path_to_error::Error<E>>,
        format: &'static str,
    ) -> Result<Self, ConfigError> {
        let doc = doc.map_err(|e| {
            let path: Vec<String> = e
                .path()
                .iter()
                .filter_map(|seg| match seg {
                    serde_path_to_error::Segment::Map { key } => Some(key.clone()),
                    serde_path_to_error::Segment::Seq { index } => Some(index.to_string()),
                    _ => None,
                })
                .collect();
            let mut message = e.inner().to_string();
            if let Some(hint) = suggest::unknown_field(&message) {
                message.push_str(&hint);
            }
            if let (Some((new, why)), [top, stages, stage, ..]) =
                (suggest::retired(&message), path.as_slice())
            {
                if top == "single-flight" && stages == "stages" {
                    return ConfigError::invalid(Some(stage), new, why);
                }
            }
            match path.as_slice() {
                [top, stages, stage, field @ ..]
                    if top == "single-flight" && stages == "stages" =>
                {
                    let field = if field.is_empty() {
                        "stage".to_owned()
                    } else {
                        field.join(".")
                    };
                    ConfigError::invalid(Some(stage), field, message)
                }
                [] => ConfigError::Parse { format, message },
                [top, rest @ ..] if top == "single-flight" && !rest.is_empty() => {
                    ConfigError::invalid(None, rest.join("."), message)
                }
                path => ConfigError::invalid(None, path.join("."), message),
            }
        })?;
        Ok(doc.single_flight)
    }
}
