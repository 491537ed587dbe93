//! Counters a test binary records: one `metrics` debugging recorder per
//! test binary (installed by the first call), read as running totals, since
//! tests run in parallel and a snapshot resets the recorder's counters.
//!
//! ```
//! use flightdeck_testkit::counters;
//!
//! counters::install();
//! metrics::counter!("singleflight_hit_total", "stage" => "doc").increment(2);
//! assert_eq!(counters::counter("singleflight_hit_total", "doc"), 2);
//! ```

use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

use flightdeck_core::metric;
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};

/// Installs the binary's recorder (once); call before building a layer
/// (a layer resolves its metric handles when it is built).
pub fn install() {
    snapshotter();
}

fn snapshotter() -> &'static Snapshotter {
    static S: OnceLock<Snapshotter> = OnceLock::new();
    S.get_or_init(|| {
        let rec = DebuggingRecorder::new();
        let snap = rec.snapshotter();
        rec.install()
            .expect("the only recorder in this test binary (installed by `counters::install`)");
        snap
    })
}

/// The value of a counter for one stage (0 if never incremented).
pub fn counter(name: &str, stage: &str) -> u64 {
    counter_where(name, stage, None)
}

/// The value of a counter for one stage, summed over its other labels, or
/// only where `label` has the given value (0 if never incremented).
pub fn counter_where(name: &str, stage: &str, label: Option<(&str, &str)>) -> u64 {
    // A snapshot resets the recorder's counters, and tests run in parallel:
    // fold every snapshot into one running total.
    type Labels = Vec<(String, String)>;
    static TOTALS: OnceLock<Mutex<HashMap<(String, Labels), u64>>> = OnceLock::new();
    let mut totals = TOTALS.get_or_init(Default::default).lock().unwrap();
    for (k, _, _, v) in snapshotter().snapshot().into_vec() {
        let DebugValue::Counter(c) = v else { continue };
        let labels = k
            .key()
            .labels()
            .map(|l| (l.key().to_owned(), l.value().to_owned()))
            .collect();
        *totals
            .entry((k.key().name().to_owned(), labels))
            .or_default() += c;
    }
    let has = |labels: &Labels, (key, value): (&str, &str)| {
        labels.iter().any(|(k, v)| k == key && v == value)
    };
    totals
        .iter()
        .filter(|((n, labels), _)| {
            n == name
                && (has(labels, (metric::LABEL_STAGE, stage))
                    || (stage.is_empty() && !labels.iter().any(|(k, _)| k == metric::LABEL_STAGE)))
                && label.is_none_or(|l| has(labels, l))
        })
        .map(|(_, v)| *v)
        .sum()
}
