//! `grpc-timeout` and `x-request-timeout` values from any client: the
//! duration they spell, or a typed error; never a panic, never another
//! duration. Checked against a plain reading of the two formats.
#![no_main]

use std::time::Duration;

use flightdeck_budget::{parse_grpc_timeout, parse_timeout};
use libfuzzer_sys::fuzz_target;

/// gRPC: 1 to 8 ASCII digits, then one of `H M S m u n`.
fn grpc(value: &[u8]) -> Option<Duration> {
    let (unit, digits) = value.split_last()?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    Some(match unit {
        b'H' => Duration::from_secs(n * 3600),
        b'M' => Duration::from_secs(n * 60),
        b'S' => Duration::from_secs(n),
        b'm' => Duration::from_millis(n),
        b'u' => Duration::from_micros(n),
        b'n' => Duration::from_nanos(n),
        _ => return None,
    })
}

/// `x-request-timeout`: up to 12 digits, then an optional unit (ms by
/// default), whitespace around either allowed.
fn plain(value: &str) -> Option<Duration> {
    let value = value.trim();
    let digits: String = value.chars().take_while(char::is_ascii_digit).collect();
    if digits.is_empty() || digits.len() > 12 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match value[digits.len()..].trim() {
        "" | "ms" => Duration::from_millis(n),
        "ns" => Duration::from_nanos(n),
        "us" => Duration::from_micros(n),
        "s" => Duration::from_secs(n),
        "m" => Duration::from_secs(n.checked_mul(60)?),
        "h" => Duration::from_secs(n.checked_mul(3600)?),
        _ => return None,
    })
}

fuzz_target!(|data: &[u8]| {
    assert_eq!(parse_grpc_timeout(data).ok(), grpc(data), "grpc-timeout {data:?}");
    if let Ok(text) = std::str::from_utf8(data) {
        let parsed = parse_timeout("x-request-timeout", text);
        assert_eq!(parsed.as_ref().ok().copied(), plain(text), "x-request-timeout {text:?}");
        if let Err(e) = parsed {
            assert_eq!(e.header(), "x-request-timeout");
            assert!(!e.problem().is_empty());
        }
    }
});
