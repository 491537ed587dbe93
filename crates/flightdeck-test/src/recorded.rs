//! The test binary's `metrics` recorder: one per binary (installed by the
//! first call), keeping every value, since tests run in parallel and share
//! it (metrics-util's debugging recorder resets what a snapshot reads).
//! Series are picked by name and `stage` label (`""`: series without one).
//!
//! A run that needs its own recorder (a simulation, one per run on its
//! thread) makes a [`Recorded`] and installs it with
//! `metrics::set_default_local_recorder`; the same readers are its
//! methods.
//!
//! ```
//! use flightdeck_test::recorded;
//!
//! recorded::install();
//! metrics::counter!("singleflight_hit_total", "stage" => "doc").increment(2);
//! metrics::gauge!("singleflight_active_flights", "stage" => "doc").set(3.0);
//! assert_eq!(recorded::counter("singleflight_hit_total", "doc"), 2);
//! assert_eq!(recorded::gauge("singleflight_active_flights", "doc"), Some(3.0));
//! ```

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use flightdeck_core::metric;
use metrics::{Key, KeyName, Metadata, SharedString, Unit};

/// A recorder that keeps every value (a snapshot resets nothing).
#[derive(Default)]
pub struct Recorded {
    counters: Mutex<HashMap<Key, Arc<AtomicU64>>>,
    gauges: Mutex<HashMap<Key, Arc<AtomicU64>>>,
    histograms: Mutex<HashMap<Key, Arc<Samples>>>,
}

/// A histogram's sample count.
#[derive(Default)]
struct Samples(AtomicU64);

impl metrics::HistogramFn for Samples {
    fn record(&self, _value: f64) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

fn handle<T: Default>(map: &Mutex<HashMap<Key, Arc<T>>>, key: &Key) -> Arc<T> {
    map.lock().unwrap().entry(key.clone()).or_default().clone()
}

impl metrics::Recorder for Recorded {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> metrics::Counter {
        metrics::Counter::from_arc(handle(&self.counters, key))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> metrics::Gauge {
        metrics::Gauge::from_arc(handle(&self.gauges, key))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> metrics::Histogram {
        metrics::Histogram::from_arc(handle(&self.histograms, key))
    }
}

fn recorded() -> &'static Recorded {
    static R: OnceLock<&'static Recorded> = OnceLock::new();
    R.get_or_init(|| {
        let rec: &'static Recorded = Box::leak(Box::default());
        metrics::set_global_recorder(rec)
            .expect("the only recorder in this test binary (installed by `recorded::install`)");
        rec
    })
}

/// Installs the binary's recorder (once); call before building a layer
/// (a layer resolves its metric handles when it is built).
pub fn install() {
    let _ = recorded();
}

/// Whether `key` is `name` with `stage` (and, if given, `label = value`).
fn matches(key: &Key, name: &str, stage: &str, extra: Option<(&str, &str)>) -> bool {
    let label = |k: &str| key.labels().find(|l| l.key() == k).map(|l| l.value());
    key.name() == name
        && label(metric::LABEL_STAGE).unwrap_or("") == stage
        && extra.is_none_or(|(k, v)| label(k) == Some(v))
}

/// Whether `key` carries `shard` as its shard label (`None`: no shard
/// label at all, the whole store's series).
fn on_shard(key: &Key, shard: Option<&str>) -> bool {
    key.labels()
        .find(|l| l.key() == metric::LABEL_SHARD)
        .map(|l| l.value())
        == shard
}

fn sum<T>(
    map: &Mutex<HashMap<Key, Arc<T>>>,
    pick: impl Fn(&Key) -> bool,
    value: impl Fn(&T) -> u64,
) -> u64 {
    map.lock()
        .unwrap()
        .iter()
        .filter(|(k, _)| pick(k))
        .map(|(_, v)| value(v))
        .sum()
}

impl std::fmt::Debug for Recorded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Recorded")
            .field("counters", &self.counters.lock().unwrap().len())
            .field("gauges", &self.gauges.lock().unwrap().len())
            .field("histograms", &self.histograms.lock().unwrap().len())
            .finish()
    }
}

impl Recorded {
    /// A recorder with nothing recorded.
    pub fn new() -> Self {
        Self::default()
    }

    /// The value of a counter, summed over every series of `name` (any
    /// stage), or only those where `label` has the given value.
    pub fn counter_total(&self, name: &str, label: Option<(&str, &str)>) -> u64 {
        sum(
            &self.counters,
            |k| k.name() == name && label.is_none_or(|(l, v)| has(k, l, v)),
            |v| v.load(Ordering::SeqCst),
        )
    }

    /// The sum of every series of a gauge (any stage; 0 if none).
    pub fn gauge_total(&self, name: &str) -> f64 {
        self.gauges
            .lock()
            .unwrap()
            .iter()
            .filter(|(k, _)| k.name() == name)
            .map(|(_, v)| f64::from_bits(v.load(Ordering::SeqCst)))
            .sum()
    }

    /// A gauge of one stage (`None`: never registered).
    pub fn gauge(&self, name: &str, stage: &str) -> Option<f64> {
        self.gauge_where(|k| matches(k, name, stage, None))
    }

    fn counter_where(&self, name: &str, stage: &str, label: Option<(&str, &str)>) -> u64 {
        sum(
            &self.counters,
            |k| matches(k, name, stage, label),
            |v| v.load(Ordering::SeqCst),
        )
    }

    fn gauge_where(&self, pick: impl Fn(&Key) -> bool) -> Option<f64> {
        self.gauges
            .lock()
            .unwrap()
            .iter()
            .find(|(k, _)| pick(k))
            .map(|(_, v)| f64::from_bits(v.load(Ordering::SeqCst)))
    }

    fn samples_where(&self, pick: impl Fn(&Key) -> bool) -> usize {
        sum(&self.histograms, pick, |v| v.0.load(Ordering::SeqCst)) as usize
    }
}

/// Whether `key` has `label = value`.
fn has(key: &Key, label: &str, value: &str) -> bool {
    key.labels().any(|l| l.key() == label && l.value() == value)
}

fn gauge_where(pick: impl Fn(&Key) -> bool) -> Option<f64> {
    recorded().gauge_where(pick)
}

/// The value of a counter for one stage, summed over its other labels (0
/// if never incremented).
pub fn counter(name: &str, stage: &str) -> u64 {
    counter_where(name, stage, None)
}

/// The value of a counter for one stage, summed over its other labels, or
/// only where `label` has the given value (0 if never incremented).
pub fn counter_where(name: &str, stage: &str, label: Option<(&str, &str)>) -> u64 {
    recorded().counter_where(name, stage, label)
}

/// A gauge of one stage (`None`: never registered).
pub fn gauge(name: &str, stage: &str) -> Option<f64> {
    gauge_where(|k| matches(k, name, stage, None))
}

/// A gauge with `label = value`, whatever its stage (the breaker's carry
/// `breaker`, not `stage`).
pub fn gauge_by(name: &str, label: &str, value: &str) -> Option<f64> {
    gauge_where(|k| k.name() == name && has(k, label, value))
}

/// A gauge of one stage on one shard (`None` shard: the series without a
/// shard label).
pub fn gauge_shard(name: &str, stage: &str, shard: Option<&str>) -> Option<f64> {
    gauge_where(|k| matches(k, name, stage, None) && on_shard(k, shard))
}

/// Samples recorded in a histogram of one stage.
pub fn samples(name: &str, stage: &str) -> usize {
    samples_where(|k| matches(k, name, stage, None))
}

/// Samples recorded in a histogram of one stage on one shard.
pub fn samples_shard(name: &str, stage: &str, shard: Option<&str>) -> usize {
    samples_where(|k| matches(k, name, stage, None) && on_shard(k, shard))
}

fn samples_where(pick: impl Fn(&Key) -> bool) -> usize {
    recorded().samples_where(pick)
}

/// Whether the recorder has a handle for `name` of `stage` (a counter at 0
/// and a histogram without samples count: they are exported).
pub fn registered(name: &str, stage: &str) -> bool {
    let r = recorded();
    let pick = |k: &Key| matches(k, name, stage, None);
    r.counters.lock().unwrap().keys().any(pick)
        || r.gauges.lock().unwrap().keys().any(pick)
        || r.histograms.lock().unwrap().keys().any(pick)
}
