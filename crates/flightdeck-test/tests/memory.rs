//! The memory backend passes the conformance suite, under paused time.

use std::sync::Arc;
use std::time::Duration;

use flightdeck_distributed::backend::{Acquired, Backend};
use flightdeck_distributed::OwnerToken;
use flightdeck_test::{conformance, MemoryBackend};

#[tokio::test(start_paused = true)]
async fn memory_backend_conforms() {
    conformance::run_all(Arc::new(MemoryBackend::new())).await;
}

#[tokio::test(start_paused = true)]
async fn faults_and_counters() {
    let b = MemoryBackend::new();
    let f = conformance::fresh_flight();
    let t = OwnerToken::random();
    b.set_unavailable(true);
    let e = b
        .acquire(&f, &t, &conformance::terms(true))
        .await
        .unwrap_err();
    assert_eq!(
        e.kind(),
        flightdeck_distributed::BackendErrorKind::Unavailable
    );
    b.set_unavailable(false);
    assert!(matches!(
        b.acquire(&f, &t, &conformance::terms(true)).await.unwrap(),
        Acquired::Owner { .. }
    ));
    assert_eq!(b.calls().acquire, 2);
    {
        let _s1 = b.subscribe(&f).await.unwrap();
        let _s2 = b.subscribe(&f).await.unwrap();
        assert_eq!(b.subscribers(&f), 2);
    }
    assert_eq!(b.subscribers(&f), 0);
    b.set_fail_commits(true);
    let e = b
        .commit(&f, &t, 1, &conformance::commit_args(b"x", 10))
        .await
        .unwrap_err();
    assert_eq!(
        e.kind(),
        flightdeck_distributed::BackendErrorKind::OutcomeUnknown
    );
    tokio::time::sleep(Duration::from_millis(1)).await;
}
