//! The four modes of a stage and what a follower does when
//! its wait fails (the "follower wait" row of the failure table).

use std::fmt;
use std::str::FromStr;

/// How a stage coalesces, switchable at run time through a
/// [`StageHandle`](crate::StageHandle) (the kill switch).
///
/// ```
/// use flightdeck::Mode;
///
/// assert_eq!("hybrid".parse::<Mode>().unwrap(), Mode::Hybrid);
/// assert_eq!("DISTRIBUTED_ONLY".parse::<Mode>().unwrap(), Mode::DistributedOnly);
/// assert!("sometimes".parse::<Mode>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(try_from = "String"))]
pub enum Mode {
    /// Coalesce across nodes only. When the coordination layer is down (or
    /// its breaker open) requests fail fast with a 503 / `UNAVAILABLE`:
    /// for work that must never run twice (payments, stock).
    DistributedOnly,
    /// Coalesce inside this process only; never talk to the backend.
    LocalOnly,
    /// Coalesce across nodes, and fall back to this process alone when the
    /// coordination layer fails before a flight was acquired (counted and
    /// logged). For work where a duplicate costs money but an outage costs
    /// more (AI inference, reports).
    #[default]
    Hybrid,
    /// No coalescing at all: every request runs the inner service.
    Bypass,
}

impl Mode {
    /// The kebab-case name used in configuration files and logs.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::DistributedOnly => "distributed-only",
            Self::LocalOnly => "local-only",
            Self::Hybrid => "hybrid",
            Self::Bypass => "bypass",
        }
    }

    /// True for the modes that talk to a backend.
    pub const fn is_distributed(self) -> bool {
        matches!(self, Self::DistributedOnly | Self::Hybrid)
    }

    pub(crate) const fn to_u8(self) -> u8 {
        match self {
            Self::DistributedOnly => 0,
            Self::LocalOnly => 1,
            Self::Hybrid => 2,
            Self::Bypass => 3,
        }
    }

    pub(crate) const fn from_u8(v: u8) -> Self {
        match v {
            0 => Self::DistributedOnly,
            1 => Self::LocalOnly,
            3 => Self::Bypass,
            _ => Self::Hybrid,
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A [`Mode`] or [`OnWaitFailure`] name that is not one of the known ones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownMode {
    value: String,
    expected: &'static str,
}

impl fmt::Display for UnknownMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown value {:?} (expected {})",
            self.value, self.expected
        )
    }
}

impl std::error::Error for UnknownMode {}

fn normalize(s: &str) -> String {
    s.trim().to_ascii_lowercase().replace('_', "-")
}

impl FromStr for Mode {
    type Err = UnknownMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match normalize(s).as_str() {
            "distributed-only" => Ok(Self::DistributedOnly),
            "local-only" => Ok(Self::LocalOnly),
            "hybrid" => Ok(Self::Hybrid),
            "bypass" => Ok(Self::Bypass),
            _ => Err(UnknownMode {
                value: s.to_owned(),
                expected: "distributed-only, local-only, hybrid or bypass",
            }),
        }
    }
}

impl TryFrom<String> for Mode {
    type Error = UnknownMode;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

/// What a follower does when waiting for another node's result fails
/// (notification lost, polls failing, Redis gone while following, the wait
/// deadline passed).
///
/// The L2 layer never runs the work while another node may hold the lease:
/// it keeps polling until the wait timeout and takes the flight over when
/// the owner's lease expires without a commit (if the stage allows
/// takeover). This policy decides what the caller gets when that wait
/// still ends without a result.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
#[cfg_attr(feature = "serde", derive(serde::Deserialize))]
#[cfg_attr(feature = "serde", serde(try_from = "String"))]
pub enum OnWaitFailure {
    /// Return the wait error as is (`WaitTimeout`: 504 /
    /// `DEADLINE_EXCEEDED`).
    #[default]
    Wait,
    /// Answer "in progress" (`InProgress`: 202 / `UNAVAILABLE`, retry
    /// later).
    InProgress,
    /// Fail as unavailable (`CoordinationUnavailable`: 503 /
    /// `UNAVAILABLE`).
    Fail,
    /// Run the work locally after all (explicit opt-in for low-risk stages;
    /// HYBRID only, rejected by validation for DISTRIBUTED_ONLY). Another
    /// node may be running it too.
    Local,
}

impl OnWaitFailure {
    /// The kebab-case name used in configuration files and metrics.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Wait => "wait",
            Self::InProgress => "in-progress",
            Self::Fail => "fail",
            Self::Local => "local",
        }
    }
}

impl fmt::Display for OnWaitFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for OnWaitFailure {
    type Err = UnknownMode;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match normalize(s).as_str() {
            "wait" => Ok(Self::Wait),
            "in-progress" => Ok(Self::InProgress),
            "fail" => Ok(Self::Fail),
            "local" => Ok(Self::Local),
            _ => Err(UnknownMode {
                value: s.to_owned(),
                expected: "wait, in-progress, fail or local",
            }),
        }
    }
}

impl TryFrom<String> for OnWaitFailure {
    type Error = UnknownMode;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}
