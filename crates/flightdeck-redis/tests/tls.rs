//! The Redis backend over TLS (feature `tls`: fred's `enable-rustls-ring`).
//! The test makes its own CA and server certificate with rcgen, starts
//! `redis-server --port 0 --tls-port PORT` through the harness, and
//! connects with `rediss://` trusting only that CA.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use flightdeck_core::error::BoxError;
use flightdeck_core::{CloneShare, FlightKey, StageName};
use flightdeck_distributed::{
    BackendErrorKind, DistributedFlightLayer, DistributedPolicy, PostcardCodec,
};
use flightdeck_harness::RedisServer;
use flightdeck_redis::{RedisBackend, RedisConfig};
use flightdeck_test::conformance;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
use tokio::time::timeout;
use tower::{service_fn, Layer, ServiceExt};

async fn within<T>(secs: u64, what: &str, fut: impl Future<Output = T>) -> T {
    timeout(Duration::from_secs(secs), fut)
        .await
        .unwrap_or_else(|_| panic!("{what}: not done within {secs} s"))
}

/// A CA, and a server certificate it signed for 127.0.0.1 and localhost,
/// written as PEM files into `dir`. Returns (ca PEM, paths of cert, key, ca).
fn certificates(dir: &std::path::Path) -> (String, [std::path::PathBuf; 3]) {
    let ca_key = KeyPair::generate().unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "flightdeck test CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();

    let server_key = KeyPair::generate().unwrap();
    let mut params =
        CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()]).unwrap();
    params
        .distinguished_name
        .push(DnType::CommonName, "flightdeck test redis");
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let server = params.signed_by(&server_key, &issuer).unwrap();

    std::fs::create_dir_all(dir).unwrap();
    let paths = [
        dir.join("redis.crt"),
        dir.join("redis.key"),
        dir.join("ca.crt"),
    ];
    std::fs::write(&paths[0], server.pem()).unwrap();
    std::fs::write(&paths[1], server_key.serialize_pem()).unwrap();
    std::fs::write(&paths[2], ca.pem()).unwrap();
    (ca.pem(), paths)
}

/// Issue 7: TLS only (`--port 0`), a certificate made by the test. The
/// backend connects with the test CA, passes the conformance suite and
/// runs flights; without the CA (system roots only) it fails to connect,
/// with a typed error, within its deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_a_certificate_made_by_the_test() {
    let dir = std::env::temp_dir().join(format!("flightdeck-tls-{}", std::process::id()));
    let (ca_pem, [cert, key, ca]) = certificates(&dir);
    let redis = RedisServer::start_tls(&cert, &key, &ca).unwrap();
    let config = || {
        RedisConfig::new(redis.tls_url())
            .command_timeout(Duration::from_millis(500))
            .connect_timeout(Duration::from_secs(2))
    };

    let untrusted = within(
        15,
        "connect without the CA",
        RedisBackend::connect(config()),
    )
    .await
    .expect_err("the test CA is not a system root");
    assert_eq!(
        untrusted.kind(),
        BackendErrorKind::Unavailable,
        "{untrusted}"
    );

    let bad_pem = config().tls_root_certificates("not a pem").unwrap_err();
    assert!(bad_pem.to_string().contains("CERTIFICATE"), "{bad_pem}");

    let trusted = || config().tls_root_certificates(&ca_pem).unwrap();
    let b = within(15, "connect with the CA", RedisBackend::connect(trusted()))
        .await
        .unwrap();
    within(
        60,
        "conformance over TLS",
        conformance::run_all(Arc::new(b)),
    )
    .await;

    let calls = Arc::new(AtomicUsize::new(0));
    let mut nodes = Vec::new();
    for _ in 0..2 {
        let b = within(15, "connect node", RedisBackend::connect(trusted()))
            .await
            .unwrap();
        let calls = calls.clone();
        let layer = DistributedFlightLayer::new(
            b,
            DistributedPolicy::new()
                .lease(Duration::from_millis(1500))
                .heartbeat(Duration::from_millis(400))
                .poll_interval(Duration::from_millis(100))
                .call_timeout(Duration::from_millis(500)),
            CloneShare::<String>::new(),
            PostcardCodec::<String>::new(),
            |req: &String| Some(FlightKey::from_bytes(StageName::new("tls").unwrap(), req)),
        )
        .unwrap();
        nodes.push(layer.layer(service_fn(move |req: String| {
            let calls = calls.clone();
            async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(100)).await;
                Ok::<_, BoxError>(format!("v:{req}"))
            }
        })));
    }
    let mut tasks = Vec::new();
    for node in &nodes {
        for _ in 0..10 {
            tasks.push(tokio::spawn(node.clone().oneshot("k".to_owned())));
        }
    }
    for t in tasks {
        assert_eq!(within(15, "request", t).await.unwrap().unwrap(), "v:k");
    }
    assert_eq!(calls.load(Ordering::SeqCst), 1, "one execution over TLS");
    drop(redis);
    let _ = std::fs::remove_dir_all(&dir);
}
