//! Parsing inbound timeout headers, without panicking on any input.

use std::fmt;
use std::time::Duration;

/// An inbound timeout header could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidTimeout {
    // The core error, so that the HTTP/gRPC adapters answer 400 /
    // INVALID_ARGUMENT (it is this error's source).
    inner: flightdeck_core::error::InvalidHeader,
}

impl InvalidTimeout {
    pub(crate) fn new(header: impl Into<String>, problem: &'static str) -> Self {
        Self {
            inner: flightdeck_core::error::InvalidHeader::new(header, problem),
        }
    }

    /// The header's name.
    pub fn header(&self) -> &str {
        self.inner.name()
    }

    /// What is wrong with it.
    pub fn problem(&self) -> &'static str {
        self.inner.problem()
    }
}

impl fmt::Display for InvalidTimeout {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.inner, f)
    }
}

impl std::error::Error for InvalidTimeout {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.inner)
    }
}

/// Parses a `grpc-timeout` value: 1 to 8 ASCII digits and a unit, `H`
/// (hours), `M` (minutes), `S`, `m` (milliseconds), `u` (microseconds) or
/// `n` (nanoseconds), as in the gRPC over HTTP/2 spec.
///
/// ```
/// use std::time::Duration;
/// use flightdeck_budget::parse_grpc_timeout;
///
/// assert_eq!(parse_grpc_timeout(b"250m"), Ok(Duration::from_millis(250)));
/// assert_eq!(parse_grpc_timeout(b"2H"), Ok(Duration::from_secs(7200)));
/// assert!(parse_grpc_timeout(b"123456789S").is_err()); // more than 8 digits
/// ```
pub fn parse_grpc_timeout(value: &[u8]) -> Result<Duration, InvalidTimeout> {
    let bad = |problem| InvalidTimeout::new("grpc-timeout", problem);
    let Some((&unit, digits)) = value.split_last() else {
        return Err(bad("empty value"));
    };
    if digits.is_empty() {
        return Err(bad("no digits before the unit"));
    }
    if digits.len() > 8 {
        return Err(bad("more than 8 digits"));
    }
    let unit: fn(u64) -> Duration = match unit {
        b'H' => |n| Duration::from_secs(n * 3600),
        b'M' => |n| Duration::from_secs(n * 60),
        b'S' => Duration::from_secs,
        b'm' => Duration::from_millis,
        b'u' => Duration::from_micros,
        b'n' => Duration::from_nanos,
        b'0'..=b'9' => return Err(bad("missing unit (H, M, S, m, u or n)")),
        _ => return Err(bad("unknown unit (expected H, M, S, m, u or n)")),
    };
    // At most 8 digits, so the hours case cannot overflow.
    let n = digits_value(digits).ok_or_else(|| bad("not a number"))?;
    Ok(unit(n))
}

/// Parses an `x-request-timeout`-style value: an integer with an optional
/// unit, `ms` when none is given; units `ns`, `us`, `ms`, `s`, `m`, `h`.
/// At most 12 digits.
///
/// ```
/// use std::time::Duration;
/// use flightdeck_budget::parse_timeout;
///
/// assert_eq!(parse_timeout("x-request-timeout", "1500"), Ok(Duration::from_millis(1500)));
/// assert_eq!(parse_timeout("x-request-timeout", "3s"), Ok(Duration::from_secs(3)));
/// assert!(parse_timeout("x-request-timeout", "soon").is_err());
/// ```
pub fn parse_timeout(header: &str, value: &str) -> Result<Duration, InvalidTimeout> {
    let bad = |problem| InvalidTimeout::new(header, problem);
    let value = value.trim();
    if value.is_empty() {
        return Err(bad("empty value"));
    }
    let split = value
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(value.len());
    let (digits, unit) = value.split_at(split);
    if digits.is_empty() {
        return Err(bad("not a number"));
    }
    if digits.len() > 12 {
        return Err(bad("more than 12 digits"));
    }
    let n = digits_value(digits.as_bytes()).ok_or_else(|| bad("not a number"))?;
    let d = match unit.trim() {
        "" | "ms" => Duration::from_millis(n),
        "ns" => Duration::from_nanos(n),
        "us" => Duration::from_micros(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60).ok_or_else(|| bad("too large"))?),
        "h" => Duration::from_secs(n.checked_mul(3600).ok_or_else(|| bad("too large"))?),
        _ => return Err(bad("unknown unit (expected ns, us, ms, s, m or h)")),
    };
    Ok(d)
}

fn digits_value(digits: &[u8]) -> Option<u64> {
    let mut n: u64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return None;
        }
        n = n.checked_mul(10)?.checked_add(u64::from(b - b'0'))?;
    }
    Some(n)
}
