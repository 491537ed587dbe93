//! "Did you mean …?" for names a user typed: stage names, backend names and
//! configuration keys, compared with `strsim`'s Jaro-Winkler similarity.

/// How similar two names must be to suggest one for the other (clap
/// suggests from 0.7 of plain Jaro; Jaro-Winkler scores prefixes higher).
const THRESHOLD: f64 = 0.8;

/// The candidate closest to `typed`, if one is close enough to be the name
/// meant. Case and `_` for `-` do not count (`wait_timeout` is
/// `wait-timeout`), and a typed name that is the start of a candidate's
/// (`lease` of `lease-timeout`) is compared with that start.
pub(crate) fn closest<'a>(
    typed: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let norm = |s: &str| s.to_ascii_lowercase().replace('_', "-");
    let typed_norm = norm(typed);
    let segments = typed_norm.split('-').count();
    candidates
        .into_iter()
        .filter(|c| *c != typed)
        .map(|c| {
            let n = norm(c);
            let whole = strsim::jaro_winkler(&typed_norm, &n);
            // The candidate cut to as many `-` segments as the typed name.
            let head: Vec<&str> = n.split('-').take(segments).collect();
            let head = strsim::jaro_winkler(&typed_norm, &head.join("-")) * 0.95;
            (whole.max(head), c)
        })
        .filter(|(score, _)| *score >= THRESHOLD)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, c)| c)
}

/// `; did you mean "x"?`, or nothing.
pub(crate) fn did_you_mean<'a>(
    typed: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> String {
    closest(typed, candidates).map_or_else(String::new, |c| format!("; did you mean {c:?}?"))
}

/// The key serde's message for an unknown key names (`unknown field
/// `leese`, expected one of …`).
#[cfg(any(feature = "toml", feature = "yaml"))]
fn unknown_key(message: &str) -> Option<&str> {
    let start = message.find("unknown field `")? + "unknown field `".len();
    let typed = &message[start..];
    Some(&typed[..typed.find('`')?])
}

/// serde's message for an unknown key (`unknown field `leese`, expected
/// one of `mode`, …`), with the closest expected key suggested.
#[cfg(any(feature = "toml", feature = "yaml"))]
pub(crate) fn unknown_field(message: &str) -> Option<String> {
    let typed = unknown_key(message)?;
    let expected = &message[message.find("expected")?..];
    let names = expected.split('`').skip(1).step_by(2);
    closest(typed, names).map(|c| format!("; did you mean `{c}`?"))
}

/// serde's message for an unknown key that an earlier version read: the
/// key that replaced it and why, so that a file that still has one is
/// refused naming the new key (never dropped silently).
#[cfg(any(feature = "toml", feature = "yaml"))]
pub(crate) fn retired(message: &str) -> Option<(&'static str, &'static str)> {
    const RETIRED: [(&str, &str, &str); 2] = [
        (
            "result-ttl",
            "replay-ttl",
            "`result-ttl` is gone: how long a result is replayed to new requests is \
             `replay-ttl`, the same in every mode (default 0s; callers already waiting get \
             the result anyway)",
        ),
        (
            "local-replay-ttl",
            "replay-ttl",
            "`local-replay-ttl` is gone: how long a result is replayed to new requests is \
             `replay-ttl`, the same in every mode (default 0s)",
        ),
    ];
    let typed = unknown_key(message)?;
    RETIRED
        .iter()
        .find(|(old, _, _)| *old == typed)
        .map(|(_, new, why)| (*new, *why))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_names_are_suggested_and_far_ones_are_not() {
        let keys = [
            "mode",
            "backend",
            "lease-timeout",
            "wait-timeout",
            "replay-ttl",
        ];
        assert_eq!(closest("lease-timout", keys), Some("lease-timeout"));
        assert_eq!(closest("leese", keys), Some("lease-timeout"));
        assert_eq!(closest("wait_timeout", keys), Some("wait-timeout"));
        assert_eq!(closest("Mode", keys), Some("mode"));
        assert_eq!(closest("color", keys), None);
        assert_eq!(closest("scroe", ["score", "search"]), Some("score"));
        assert_eq!(closest("score", ["score"]), None, "not itself");
        assert_eq!(closest("x", []), None);
    }

    #[cfg(any(feature = "toml", feature = "yaml"))]
    #[test]
    fn serdes_unknown_field_message_gets_a_suggestion() {
        let msg = "unknown field `leese`, expected one of `mode`, `lease-timeout`";
        assert_eq!(
            unknown_field(msg).as_deref(),
            Some("; did you mean `lease-timeout`?")
        );
        let msg = "unknown field `zzz`, expected `mode` or `backend`";
        assert_eq!(unknown_field(msg), None);
        assert_eq!(unknown_field("invalid type: string"), None);
    }
}
