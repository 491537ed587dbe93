use std::error::Error as StdError;
use std::fmt;
use std::time::Duration;

use crate::key::StageName;

use super::*;

#[derive(Debug)]
struct Mine;
impl fmt::Display for Mine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("mine")
    }
}
impl StdError for Mine {}

#[test]
fn coordination_errors_are_unavailable() {
    let p = ProtocolError::with_source("bad reply", Mine);
    assert_eq!(ErrorClass::of(&p).http_status(), 503);
    assert!(find::<Mine>(&p).is_some());
    assert_eq!(p.to_string(), "coordination protocol error: bad reply");
    let u = OutcomeUnknown::new(Mine);
    assert_eq!(ErrorClass::of(&u).grpc_code(), 14);
    let l = LeaseLost::new(None, 3);
    assert_eq!(l.to_string(), "lease lost (generation 3)");
    assert_eq!(ErrorClass::of(&l), ErrorClass::Unavailable);
}

#[test]
fn find_walks_shared_errors() {
    let shared: BoxError = Box::new(SharedError::new(Mine));
    assert!(find::<Mine>(&*shared).is_some());
    assert_eq!(shared.to_string(), "mine");
    assert_eq!(ErrorClass::of(&*shared), ErrorClass::Internal);
}

#[test]
fn classes_map_to_statuses() {
    let open: BoxError = Box::new(SharedError::new(CircuitOpen::new("redis")));
    assert_eq!(ErrorClass::of(&*open), ErrorClass::Unavailable);
    assert_eq!(ErrorClass::of(&*open).http_status(), 503);
    assert_eq!(ErrorClass::of(&*open).grpc_code(), 14);
    let t = WaitTimeout::new(None, Duration::from_secs(1));
    assert_eq!(ErrorClass::of(&t).http_status(), 504);
    let full = BulkheadFull::new(None);
    assert_eq!(ErrorClass::of(&full).http_status(), 429);
    assert_eq!(ErrorClass::of(&full).grpc_code(), 8);
    assert_eq!(ErrorClass::of(&TooManyWaiters::new(None, 3)).grpc_code(), 8);
    let conflict = IdempotencyConflict::new(None);
    assert_eq!(ErrorClass::of(&conflict).http_status(), 422);
    assert_eq!(ErrorClass::of(&conflict).grpc_code(), 9);
    let body = RequestBodyError::new(Mine);
    assert_eq!(ErrorClass::of(&body).http_status(), 400);
    assert_eq!(ErrorClass::of(&body).grpc_code(), 3);
    assert!(find::<Mine>(&body).is_some());
}

#[test]
fn messages_are_lowercase_and_name_the_stage() {
    let s = StageName::new("score").unwrap();
    assert_eq!(
        TooManyFlights::new(Some(s.clone()), 4).to_string(),
        "too many flights (limit 4) (stage score)"
    );
    assert_eq!(
        WorkPanicked::new(Some(s)).to_string(),
        "work panicked (stage score)"
    );
    assert_eq!(
        CircuitOpen::new("redis").to_string(),
        "circuit open (breaker redis)"
    );
}

#[test]
fn a_remote_failure_answers_with_the_owners_class() {
    let busy: BoxError = Box::new(SharedError::new(RemoteFailure::new(
        ErrorClass::TooManyRequests,
        "bulkhead full",
    )));
    assert_eq!(ErrorClass::of(&*busy).http_status(), 429);
    assert_eq!(ErrorClass::of(&*busy).grpc_code(), 8);
    let down = RemoteFailure::new(ErrorClass::Unavailable, "db down");
    assert_eq!(ErrorClass::of(&down).http_status(), 503);
    assert_eq!(down.to_string(), "the owner's work failed: db down");
}

#[test]
fn class_names_round_trip() {
    for class in ErrorClass::ALL {
        assert_eq!(ErrorClass::from_name(class.name()), Some(class));
    }
    let mut names: Vec<_> = ErrorClass::ALL.iter().map(|c| c.name()).collect();
    names.dedup();
    assert_eq!(names.len(), ErrorClass::ALL.len(), "names are distinct");
    assert_eq!(ErrorClass::from_name("Internal"), None, "names are exact");
}
