//! `bulkhead.degraded-rate-limit`: while a stage is degraded (its breaker
//! open), real executions start at most at that rate; beyond it callers get
//! `RateLimited` (429 / `RESOURCE_EXHAUSTED`), counted with reason
//! `degraded_rate`. A healthy stage is not rate limited. Paused time (the
//! rate limiter runs on tokio's clock); the backend is in memory, since no
//! backend call is made while the breaker is open.

#![cfg(feature = "yaml")]

mod common;

use std::time::Duration;

use common::*;
use flightdeck::breaker::Outcome;
use flightdeck::bulkhead::metric::BULKHEAD_REJECTED_TOTAL;
use flightdeck::bulkhead::RateLimited;
use flightdeck::core::error::{find, ErrorClass};
use flightdeck::SingleFlightConfig;
use flightdeck_test::MemoryBackend;
use tower::{Layer, ServiceExt};

const STAGE: &str = r#"
single-flight:
  stages:
    degraded-rate:
      backend: redis
      lease-timeout: 3s
      heartbeat-interval: 1s
      wait-timeout: 3s
      bulkhead:
        limit: 64
        degraded-limit: 16
        degraded-rate-limit: 3
      breaker:
        consecutive-failures: 1
        wait-in-open: 1h
        jitter: 0
"#;

#[tokio::test(start_paused = true)]
async fn while_degraded_executions_start_at_most_at_the_degraded_rate() {
    let st = "degraded-rate";
    metrics_on();
    let layer = builder(st)
        .backend("redis", MemoryBackend::new())
        .config(SingleFlightConfig::from_yaml(STAGE).unwrap())
        .build()
        .unwrap();
    let handle = layer.stage(st).unwrap();
    let work = Work::default();
    let svc = layer.layer(work.service(Duration::ZERO));

    // Healthy: no rate limit.
    for i in 0..10 {
        svc.clone().oneshot(format!("healthy-{i}")).await.unwrap();
    }
    assert_eq!(work.calls(), 10);

    // The breaker opens (a coordination failure): the stage is degraded.
    handle
        .breaker()
        .try_acquire()
        .unwrap()
        .record(Outcome::Failure);
    assert!(handle.is_degraded());
    assert_eq!(handle.bulkhead().limit(), 16);

    // A burst of 3, then rejected until the rate allows more.
    for i in 0..3 {
        let v = svc.clone().oneshot(format!("open-{i}")).await.unwrap();
        assert_eq!(v, format!("done:open-{i}"), "local fallback");
    }
    let err = svc.clone().oneshot("open-3".to_owned()).await.unwrap_err();
    assert!(find::<RateLimited>(&*err).is_some(), "{err}");
    assert_eq!(ErrorClass::of(&*err), ErrorClass::TooManyRequests);
    assert_eq!(work.calls(), 13, "the rejected call did not run");
    assert_eq!(
        counter_with(BULKHEAD_REJECTED_TOTAL, st, "reason", "degraded_rate"),
        1
    );

    // 3 permits per second: one more every 333 ms.
    tokio::time::advance(Duration::from_millis(340)).await;
    svc.clone().oneshot("open-4".to_owned()).await.unwrap();
    assert!(svc.clone().oneshot("open-5".to_owned()).await.is_err());
    assert_eq!(work.calls(), 14);

    // Back to healthy: the rate limit no longer applies.
    handle.breaker().reset();
    assert!(!handle.is_degraded());
    for i in 0..10 {
        svc.clone().oneshot(format!("back-{i}")).await.unwrap();
    }
    assert_eq!(work.calls(), 24);
    assert_eq!(
        counter_with(BULKHEAD_REJECTED_TOTAL, st, "reason", "degraded_rate"),
        2
    );
}
