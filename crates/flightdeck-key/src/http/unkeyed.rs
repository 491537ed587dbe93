//! Requests the key rules give no key: counted, and logged once per method
//! and path, so that a rule that never matches (a typo'd path) shows on the
//! first request instead of as a merge ratio of zero.
//!
//! The log is bounded: the first [`LOGGED`] distinct method and path pairs
//! get a line each, then one line says that further ones are only counted
//! (in `singleflight_unkeyed_total{reason}`, whose labels are the fixed
//! reasons, never a path).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use flightdeck_core::metric::{Handles, UNKEYED_TOTAL};
use http::request::Parts;
use http::Method;
use metrics::{Counter, Key, Label, Level, Metadata};

use crate::extract::Reason;

/// Distinct method and path pairs logged, at most.
pub(crate) const LOGGED: usize = 64;

/// Paths are logged (and remembered) up to this many bytes.
const SHOWN_PATH: usize = 256;

/// `singleflight_unkeyed_total`, one counter per reason, registered once
/// per recorder: the `counter!` macro built the key (its label, its hash)
/// and asked the recorder for it on every unkeyed request, which on an app
/// whose routes the rules mostly do not name is most requests.
static COUNTERS: Handles<[Counter; Reason::ALL.len()]> = Handles::new();

static METADATA: Metadata<'static> =
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()));

/// The unkeyed requests of one extractor: what was logged, and the rules
/// to compare a path with.
#[derive(Debug)]
pub(crate) struct Unkeyed {
    seen: Mutex<Seen>,
    full: AtomicBool,
    /// The rules, as `METHOD /pattern` (HTTP) or `/pkg.Service/Method`
    /// (gRPC): the closest one is named in the log line.
    rules: Vec<String>,
}

impl Unkeyed {
    pub(crate) fn new(rules: Vec<String>) -> Self {
        Self {
            seen: Mutex::new(Seen::default()),
            full: AtomicBool::new(false),
            rules,
        }
    }

    /// Counts a request that gets no key, and logs it if its method and
    /// path are new (and the log is not full).
    pub(crate) fn record(&self, parts: &Parts, reason: Reason) {
        COUNTERS.with(
            |recorder| {
                Reason::ALL.map(|each| {
                    let labels = vec![Label::new("reason", each.as_str())];
                    recorder.register_counter(&Key::from_parts(UNKEYED_TOTAL, labels), &METADATA)
                })
            },
            |counters| match counters.get(reason.index()) {
                Some(counter) => counter.increment(1),
                // A reason missing from `ALL` is still counted.
                None => metrics::counter!(UNKEYED_TOTAL, "reason" => reason.as_str()).increment(1),
            },
        );
        if self.full.load(Ordering::Relaxed) {
            return;
        }
        let path = shown(parts.uri.path());
        let log = {
            let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
            if seen.has(&parts.method, path) {
                Log::Nothing
            } else if seen.count < LOGGED {
                seen.add(&parts.method, path);
                Log::This
            } else if self.full.swap(true, Ordering::Relaxed) {
                Log::Nothing
            } else {
                Log::Full
            }
        };
        match log {
            Log::Nothing => {}
            Log::Full => tracing::info!(
                "more requests are not coalesced on other methods and paths: from now on \
                 they are only counted (singleflight_unkeyed_total{{reason}})"
            ),
            Log::This => {
                let closest = self.closest(&parts.method, path);
                tracing::info!(
                    method = %parts.method,
                    path,
                    reason = reason.as_str(),
                    "request not coalesced: {}{} (logged once per method and path)",
                    why(reason, &parts.method),
                    closest.map_or_else(String::new, |r| format!("; closest rule: {r}")),
                );
            }
        }
    }

    /// The rule most like the request's method and path, for the reasons
    /// where none matched.
    fn closest(&self, method: &Method, path: &str) -> Option<&str> {
        let asked = format!("{method} {path}");
        self.rules
            .iter()
            .map(|rule| {
                // gRPC rules are paths alone.
                let against = if rule.starts_with('/') { path } else { &asked };
                (strsim::normalized_levenshtein(against, rule), rule)
            })
            .filter(|(score, _)| *score >= 0.7)
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, rule)| rule.as_str())
    }
}

/// The path, cut to [`SHOWN_PATH`] bytes (on a character boundary).
fn shown(path: &str) -> &str {
    if path.len() <= SHOWN_PATH {
        return path;
    }
    let mut end = SHOWN_PATH;
    while !path.is_char_boundary(end) {
        end -= 1;
    }
    &path[..end]
}

/// The method and path pairs logged. By method, then path, so that a pair
/// seen before is found by the request's own `&str` (an app's unkeyed
/// routes, `/health` or `/metrics`, come back on every scrape): only a new
/// pair allocates. Hashed with foldhash: the maps hold 64 pairs at most,
/// so a flood of chosen paths cannot grow them, and SipHash (the default)
/// cost more than the rest of the lookup.
#[derive(Debug, Default)]
struct Seen {
    paths: HashMap<Method, HashSet<Box<str>, Hasher>, Hasher>,
    count: usize,
}

type Hasher = foldhash::fast::RandomState;

impl Seen {
    fn has(&self, method: &Method, path: &str) -> bool {
        self.paths
            .get(method)
            .is_some_and(|paths| paths.contains(path))
    }

    fn add(&mut self, method: &Method, path: &str) {
        if self
            .paths
            .entry(method.clone())
            .or_default()
            .insert(path.into())
        {
            self.count += 1;
        }
    }
}

/// What a request calls for in the log.
enum Log {
    Nothing,
    /// Its method and path are new.
    This,
    /// The log just filled up.
    Full,
}

/// Why, in words.
fn why(reason: Reason, method: &Method) -> String {
    match reason {
        Reason::NoStage => {
            "no route rule matches, and no stage header or default stage places it".into()
        }
        Reason::Method => format!(
            "no route rule matches, and {method} coalesces only through one \
             (or an Idempotency-Key)"
        ),
        Reason::UnknownStage => {
            "the stage header names a stage that is not allowed, or is given twice".into()
        }
        Reason::UnhashedBody => "it has a body, and no body hashing is set for it".into(),
        Reason::BodyTooLarge => "its body is larger than the cap".into(),
        Reason::Trailers => "its body ends with trailers".into(),
        Reason::NoScope => "the scope rule found no scope on it".into(),
        Reason::BadIdempotencyKey => "its Idempotency-Key is empty or repeated".into(),
        Reason::NotGrpc => "it is not a gRPC call".into(),
        Reason::NotAllowlisted => "its gRPC method is not on the allowlist".into(),
        Reason::Declined => "the key rules declined it".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parts(method: Method, path: &str) -> Parts {
        http::Request::builder()
            .method(method)
            .uri(path)
            .body(())
            .unwrap()
            .into_parts()
            .0
    }

    #[test]
    fn each_method_and_path_is_remembered_once_and_the_memory_is_bounded() {
        let u = Unkeyed::new(vec!["POST /v1/score".into()]);
        u.record(&parts(Method::POST, "/v1/scores"), Reason::Method);
        u.record(&parts(Method::POST, "/v1/scores"), Reason::Method);
        u.record(&parts(Method::GET, "/v1/scores"), Reason::NoStage);
        assert_eq!(u.seen.lock().unwrap().count, 2);
        for i in 0..LOGGED * 2 {
            u.record(&parts(Method::GET, &format!("/items/{i}")), Reason::NoStage);
        }
        assert_eq!(u.seen.lock().unwrap().count, LOGGED);
        assert!(u.full.load(Ordering::Relaxed));
    }

    #[test]
    fn every_reason_has_its_counter() {
        for (i, reason) in Reason::ALL.into_iter().enumerate() {
            assert_eq!(reason.index(), i, "{reason}");
        }
    }

    #[test]
    fn the_closest_rule_is_named() {
        let u = Unkeyed::new(vec!["POST /v1/score".into(), "GET /v1/report/{id}".into()]);
        assert_eq!(
            u.closest(&Method::POST, "/v1/scores"),
            Some("POST /v1/score")
        );
        assert_eq!(u.closest(&Method::GET, "/metrics"), None);
        let grpc = Unkeyed::new(vec!["/pkg.Scorer/Score".into()]);
        assert_eq!(
            grpc.closest(&Method::POST, "/pkg.Scorer/Scores"),
            Some("/pkg.Scorer/Score")
        );
    }

    #[test]
    fn long_paths_are_cut_on_a_character_boundary() {
        let long = "/é".repeat(200);
        let cut = shown(&long);
        assert!(cut.len() <= SHOWN_PATH);
        assert!(long.starts_with(cut));
    }
}
