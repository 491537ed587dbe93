//! Randomised stress on a multi-thread runtime: many callers on a few keys,
//! with random policies (cancel or finish abandoned work, TTLs, bounds),
//! work that is ready at once, yields, sleeps, fails or panics, and callers
//! that are aborted at random. After each round nothing may hang, the
//! running count, the map and the active-flights gauge are back to 0, and
//! the whole `max_flights` is free again: that many flights on new keys are
//! all admitted at once, and one more is turned away.
//!
//! `FLIGHTDECK_STRESS_ROUNDS` (default 40) and `FLIGHTDECK_STRESS_SEED`
//! (printed on failure) replay or lengthen a run.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flightdeck_core::error::TooManyFlights;
use flightdeck_core::{FlightKey, StageName};
use flightdeck_local::{FlightPolicy, LocalFlightLayer, OnAbandon};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tower::{service_fn, Layer, ServiceExt};

/// xorshift64: enough randomness for a schedule, and replayable.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn gauges(s: &Snapshotter) -> Vec<(String, f64)> {
    s.snapshot()
        .into_vec()
        .into_iter()
        .filter_map(|(k, _, _, v)| match v {
            DebugValue::Gauge(g) => Some((k.key().name().to_owned(), g.into_inner())),
            _ => None,
        })
        .collect()
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn random_schedules_leave_nothing_behind() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    recorder
        .install()
        .expect("the only recorder in this test binary");
    let seed = env("FLIGHTDECK_STRESS_SEED", 0x9E37_79B9_7F4A_7C15) | 1;
    // Each work draws from this, in whatever order the threads run it.
    static WORK_SEED: AtomicU64 = AtomicU64::new(1);
    // Work on keys from `GATED` on waits for a permit (the bound's check).
    const GATED: u64 = 1 << 32;
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    for round in 0..env("FLIGHTDECK_STRESS_ROUNDS", 40) {
        let ctx = format!("seed {seed}, round {round}");
        let mut rng = Rng(seed ^ (round + 1).wrapping_mul(0x2545_F491_4F6C_DD1D) | 1);
        let limit = if rng.below(2) == 0 {
            1 + rng.below(6) as usize
        } else {
            8 + rng.below(120) as usize
        };
        let policy = FlightPolicy::new()
            .wait_timeout(Some(Duration::from_millis(5 + rng.below(20))))
            .flight_ttl(Duration::from_millis(3 + rng.below(20)))
            .replay_ttl(Duration::from_millis(rng.below(3) * 5))
            .on_abandon(if rng.below(2) == 0 {
                OnAbandon::Cancel
            } else {
                OnAbandon::Finish
            })
            .max_waiters(2 + rng.below(50) as usize)
            .max_flights(limit);
        let keys = if rng.below(2) == 0 { 4 } else { 64 };
        let layer = LocalFlightLayer::with_key(policy, |q: &u64| {
            Some(FlightKey::from_bytes(
                StageName::new("stress").unwrap(),
                q.to_le_bytes(),
            ))
        });
        let gate_ = Arc::clone(&gate);
        let svc = layer.layer(service_fn(move |q: u64| {
            let mut r = Rng(WORK_SEED.fetch_add(0x9E37, Ordering::Relaxed) | 1);
            let gate = Arc::clone(&gate_);
            async move {
                if q >= GATED {
                    gate.acquire().await.unwrap().forget();
                    return Ok(q);
                }
                match r.below(6) {
                    0 => {}
                    1 => tokio::task::yield_now().await,
                    _ => tokio::time::sleep(Duration::from_millis(r.below(30))).await,
                }
                match r.below(10) {
                    0 => panic!("boom"),
                    1 => Err(std::io::Error::other("err")),
                    _ => Ok(q),
                }
            }
        }));
        let rt = runtime();
        rt.block_on(async {
            let mut callers = Vec::new();
            for _ in 0..400 {
                let svc = svc.clone();
                let (key, delay) = (rng.below(keys), rng.below(40));
                let caller = tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(delay)).await;
                    tokio::time::timeout(Duration::from_secs(5), svc.oneshot(key)).await
                });
                if rng.below(4) == 0 {
                    let (abort, after) = (caller.abort_handle(), rng.below(30));
                    tokio::spawn(async move {
                        tokio::time::sleep(Duration::from_millis(after)).await;
                        abort.abort();
                    });
                }
                callers.push(caller);
            }
            for caller in callers {
                if let Ok(Err(_elapsed)) = caller.await {
                    panic!("{ctx}: a caller hung");
                }
            }
            // Detached work finishes and replay windows end.
            tokio::time::sleep(Duration::from_millis(200)).await;
        });
        drop(rt);
        assert_eq!(layer.running_flights(), 0, "{ctx}: running flights");
        assert_eq!(layer.map_entries(), 0, "{ctx}: map entries");
        for (name, value) in gauges(&snapshotter) {
            assert_eq!(value, 0.0, "{ctx}: gauge {name}");
        }
        let rt = runtime();
        rt.block_on(async {
            let base = GATED + round * 1000;
            // Every held caller is admitted, and one more refused, within
            // one poll of this task: the callers' wait timeouts (5 to 25
            // ms, which with `Cancel` end their flights) cannot run out
            // between the first admission and the check, however slowly a
            // loaded machine schedules tasks.
            let mut held: Vec<_> = (0..limit as u64)
                .map(|i| Box::pin(svc.clone().oneshot(base + i)))
                .collect();
            let mut extra = Box::pin(svc.clone().oneshot(base + 999));
            let (admitted, refused) = std::future::poll_fn(|cx| {
                for h in &mut held {
                    assert!(
                        h.as_mut().poll(cx).is_pending(),
                        "{ctx}: a held flight ended"
                    );
                }
                let admitted = layer.running_flights();
                std::task::Poll::Ready((admitted, extra.as_mut().poll(cx)))
            })
            .await;
            assert_eq!(admitted, limit, "{ctx}: admitted of the bound");
            match refused {
                std::task::Poll::Ready(Err(e)) => {
                    assert!(e.is::<TooManyFlights>(), "{ctx}: {e}");
                }
                other => panic!("{ctx}: one over the bound not refused at once: {other:?}"),
            }
            let held: Vec<_> = held.into_iter().map(tokio::spawn).collect();
            gate.add_permits(limit);
            for h in held {
                // Leaders may have timed out waiting; their work goes on.
                let _ = h.await.unwrap();
            }
            for _ in 0..5000 {
                if layer.running_flights() == 0 {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
        });
        drop(rt);
        assert_eq!(
            layer.running_flights(),
            0,
            "{ctx}: running after the bound's check"
        );
    }
}
