//! `DistributedFlights::admit` asks the backend's breaker once, with the
//! request borrowed: a refused flight is its fallback's verdict at once,
//! with nothing sent to the backend; an admitted one is launched as a
//! flight of its own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use flightdeck_breaker::{Breaker, BreakerConfig};
use flightdeck_core::{BoxError, FlightKey, Shareable, StageName};
use flightdeck_distributed::{
    Answered, BackendError, DistributedFlights, DistributedPolicy, Execute, FailureClass, Fallback,
    GuardedBackend, PostcardCodec, Propagate, Role, Verdict, WaitEnded,
};
use flightdeck_test::MemoryBackend;

/// Upper-cases the request, and says in which role it ran.
struct Upper(&'static Mutex<Vec<Role>>);

impl Execute<String> for Upper {
    type Shared = String;
    type Output = String;
    async fn execute(self, req: String, role: Role) -> Result<Shareable<String, String>, BoxError> {
        self.0.lock().unwrap().push(role);
        Ok(Shareable::Shared(req.to_uppercase()))
    }
}

/// Runs a refused flight here, and counts what it was asked.
#[derive(Default)]
struct RunHere {
    asked: AtomicUsize,
    seen: Mutex<Vec<(FailureClass, String)>>,
}

impl Fallback<String> for RunHere {
    fn before_acquire(&self, class: FailureClass, _error: BackendError, req: &String) -> Verdict {
        self.asked.fetch_add(1, Ordering::Relaxed);
        self.seen.lock().unwrap().push((class, req.clone()));
        Verdict::RunHere
    }

    fn while_following(&self, _: FailureClass, error: BoxError, _: &String) -> Option<BoxError> {
        Some(error)
    }

    fn wait_ended(&self, _: WaitEnded, error: BoxError, _: &String) -> Verdict {
        Verdict::Fail(error)
    }
}

fn flights(
    breaker: &Breaker,
) -> (
    MemoryBackend,
    DistributedFlights<GuardedBackend<MemoryBackend>, PostcardCodec<String>>,
) {
    let mem = MemoryBackend::new();
    let flights = DistributedFlights::new(
        GuardedBackend::new(mem.clone(), breaker.clone()),
        DistributedPolicy::new()
            .lease(Duration::from_secs(3))
            .heartbeat(Duration::from_secs(1)),
        PostcardCodec::<String>::new(),
    )
    .unwrap();
    (mem, flights)
}

fn key() -> FlightKey {
    FlightKey::from_bytes(StageName::new("admit").unwrap(), "hi")
}

#[tokio::test(start_paused = true)]
async fn a_refused_flight_is_the_fallbacks_verdict_with_nothing_sent() {
    let breaker = Breaker::new("admit", BreakerConfig::default()).unwrap();
    let (mem, flights) = flights(&breaker);
    breaker.force_open();
    let req = "hi".to_owned();

    let fallback = RunHere::default();
    let verdict = flights.admit(&key(), &req, &fallback).unwrap_err();
    assert!(matches!(verdict, Verdict::RunHere));
    assert_eq!(fallback.asked.load(Ordering::Relaxed), 1, "asked once");
    assert_eq!(
        *fallback.seen.lock().unwrap(),
        [(FailureClass::CircuitOpen, "hi".to_owned())],
        "with the request, borrowed"
    );
    // A fallback that fails fast fails with the breaker's refusal.
    let verdict = flights.admit(&key(), &req, &Propagate).unwrap_err();
    let Verdict::Fail(error) = verdict else {
        panic!("Propagate fails a refused flight");
    };
    assert!(error.to_string().contains("open"), "{error}");
    assert_eq!(mem.calls().acquire, 0, "nothing sent to the backend");
}

#[tokio::test(start_paused = true)]
async fn an_admitted_flight_is_launched_as_the_keys_owner() {
    static ROLES: Mutex<Vec<Role>> = Mutex::new(Vec::new());
    let breaker = Breaker::new("admit", BreakerConfig::default()).unwrap();
    let (mem, flights) = flights(&breaker);
    let req = "hi".to_owned();

    let fallback = RunHere::default();
    let admitted = flights.admit(&key(), &req, &fallback).expect("closed");
    let (out, answered) = flights
        .launch(admitted, key(), req, Upper(&ROLES), fallback, None)
        .await
        .unwrap();
    assert!(matches!(out, Shareable::Shared(v) if v == "HI"));
    assert_eq!(answered, Answered::Ran);
    assert!(matches!(ROLES.lock().unwrap()[..], [Role::Owner(_)]));
    assert_eq!(mem.calls().acquire, 1);

    // The owner's commit went on in the background.
    flights.idle().await;
    assert_eq!(mem.calls().commit, 1, "committed as the owner");
}
