//! Testing your service with flightdeck in front of it (feature `testing`).
//!
//! - [`MemoryBackend`]: a coordination backend in memory, with the
//!   semantics of the Redis one, for HYBRID and DISTRIBUTED_ONLY stages in a
//!   unit test (clones share one store, like two clients of one Redis: two
//!   layers built on clones of it behave like two nodes).
//! - [`handler_request`] builds a request the way your handler receives it
//!   behind the layer (its body wrapped in a [`FlightBody`]), to test the
//!   handler on its own.
//! - [`body_bytes`] and [`body_text`] read a response body.
//!
//! Every clock of flightdeck is tokio's, so `#[tokio::test(start_paused =
//! true)]` (tokio's `test-util` feature) runs lease timeouts, waits and
//! breaker delays without waiting for them.
//!
//! ```
//! use std::sync::atomic::{AtomicUsize, Ordering};
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! use axum::{routing::get, Router};
//! use flightdeck::testing::body_text;
//! use flightdeck::{HttpKeyExtractor, Mode, SingleFlightLayer, StageConfig};
//! use http::Request;
//! use tower::ServiceExt;
//!
//! # #[tokio::main(flavor = "current_thread", start_paused = true)]
//! # async fn main() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let runs = Arc::new(AtomicUsize::new(0));
//! let counter = runs.clone();
//! let keys = HttpKeyExtractor::builder().default_stage("report").build()?;
//! let flights = SingleFlightLayer::builder()
//!     .keys(keys)
//!     .stage("report", StageConfig::new().mode(Mode::LocalOnly))
//!     .build()?;
//! let app = Router::new()
//!     .route("/report", get(move || async move {
//!         counter.fetch_add(1, Ordering::SeqCst);
//!         tokio::time::sleep(Duration::from_secs(2)).await; // the expensive call
//!         "the report"
//!     }))
//!     .layer(flights);
//!
//! let mut calls = tokio::task::JoinSet::new();
//! for _ in 0..50 {
//!     let req = Request::get("/report").body(axum::body::Body::empty())?;
//!     calls.spawn(app.clone().oneshot(req));
//! }
//! while let Some(resp) = calls.join_next().await {
//!     assert_eq!(body_text(resp??).await?, "the report");
//! }
//! assert_eq!(runs.load(Ordering::SeqCst), 1);
//! # Ok(())
//! # }
//! ```

use bytes::Bytes;
use flightdeck_core::BoxError;
use http_body::Body;
use http_body_util::BodyExt;

pub use flightdeck_core::http::FlightBody;
pub use flightdeck_test::{CallCounts, MemoryBackend};

/// `req` as a handler behind the layer receives it: the same head, the body
/// wrapped in a [`FlightBody`] (which is what the handler's request type
/// names: `Request<FlightBody<Body>>`).
pub fn handler_request<B>(req: http::Request<B>) -> http::Request<FlightBody<B>> {
    req.map(FlightBody::inner)
}

/// Reads a whole response body.
pub async fn body_bytes<B>(resp: http::Response<B>) -> Result<Bytes, BoxError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    Ok(resp
        .into_body()
        .collect()
        .await
        .map_err(Into::into)?
        .to_bytes())
}

/// Reads a whole response body as text (lossy UTF-8).
pub async fn body_text<B>(resp: http::Response<B>) -> Result<String, BoxError>
where
    B: Body,
    B::Error: Into<BoxError>,
{
    let bytes = body_bytes(resp).await?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}
