//! The metrics recorder of one run (installed on the run's thread), read
//! back for the checks: gauges back to zero, executions by path.

use std::sync::atomic::Ordering;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use metrics_util::registry::{AtomicStorage, Registry};

/// Keeps every value it is given (a snapshot resets nothing).
pub(crate) struct Kept(Registry<Key, AtomicStorage>);

impl Kept {
    pub(crate) fn new() -> Self {
        Self(Registry::atomic())
    }

    /// The sum of a gauge's series.
    pub(crate) fn gauge(&self, name: &str) -> f64 {
        self.0
            .get_gauge_handles()
            .into_iter()
            .filter(|(k, _)| k.name() == name)
            .map(|(_, g)| f64::from_bits(g.load(Ordering::SeqCst)))
            .sum()
    }

    /// The sum of a counter's series whose `label` is `value` (any, if
    /// `None`).
    pub(crate) fn counter(&self, name: &str, label: Option<(&str, &str)>) -> u64 {
        self.0
            .get_counter_handles()
            .into_iter()
            .filter(|(k, _)| {
                k.name() == name
                    && label.is_none_or(|(l, v)| k.labels().any(|x| x.key() == l && x.value() == v))
            })
            .map(|(_, c)| c.load(Ordering::SeqCst))
            .sum()
    }
}

impl Recorder for Kept {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.0
            .get_or_create_counter(key, |c| Counter::from_arc(c.clone()))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.0
            .get_or_create_gauge(key, |g| Gauge::from_arc(g.clone()))
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.0
            .get_or_create_histogram(key, |h| Histogram::from_arc(h.clone()))
    }
}
