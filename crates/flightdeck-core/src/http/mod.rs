//! HTTP adapters: share buffered responses, and turn flightdeck errors into
//! HTTP or gRPC responses.
//!
//! [`HttpShare`] buffers a response's status, headers, body bytes **and
//! trailers** (gRPC puts `grpc-status` in trailers) up to a cap, so it can be
//! replayed to every waiter. Responses that look like streams
//! (`text/event-stream`, no known length) or grow over the cap are not
//! shared: the leader gets its response intact (the bytes already read are
//! put back in front of the rest of the stream), waiters run the service
//! themselves.
//!
//! # What is shared, and what is not
//!
//! Coalescing hands the response computed for one caller (the *leader*) to
//! other callers with the same key. HTTP shared caches have long known
//! which responses must never be handed to someone else, and [`HttpShare`]
//! follows the same rules, decided from the leader's response head before
//! anything is buffered, handed out or stored. By default a response is
//! **not shared** when it has:
//!
//! - **`Set-Cookie`** (reason [`Unshareable::SetCookie`](crate::Unshareable::SetCookie)): a cookie is
//!   usually minted for one visitor; sharing it shares their session.
//! - **`Cache-Control` with `private`, `no-store` or `no-cache`** (reason
//!   [`Unshareable::CacheControl`](crate::Unshareable::CacheControl)): the origin said the response is for
//!   one caller, must not be kept, or must not be reused unasked.
//! - **`Vary: *`** (reason [`Unshareable::VaryStar`](crate::Unshareable::VaryStar)): it depends on
//!   something no other request can be shown to match.
//!
//! An unshared response goes to its leader untouched; every other caller
//! runs its own request, and nothing is stored in the backend.
//!
//! **`Vary: h1, h2`** makes a response shareable with some callers only:
//! the shared form records digests of the leader's values of `h1` and
//! `h2` (see [`normalized_values`] for how values compare; only digests,
//! so no request header, a credential perhaps, is ever stored) and
//! [`Serves::serves`](crate::Serves::serves) hands it only to requests with
//! the same values. The recorded values are stored with the result, so a
//! replay on another node applies the same rule.
//!
//! Each rule can be relaxed per [`HttpShare`], with its risk documented on
//! the setting: [`SetCookie::Strip`] (share, but no other caller gets the
//! leader's cookies), [`SetCookie::Share`] (share the cookies too) and
//! [`CacheControl::Ignore`].
//!
//! # Who gets the leader's cookies under `SetCookie::Strip`
//!
//! The shared form ([`SharedResponse`]) keeps the leader's `Set-Cookie`
//! values apart from its headers. [`Share::restore`](crate::Share::restore) (every waiter, every
//! replay, [`SharedResponse::to_response`]) never includes them; result
//! codecs never see them, so they are never stored. Only
//! [`Share::restore_leader`](crate::Share::restore_leader) ([`SharedResponse::to_leader_response`]) puts
//! them back, for the one caller whose request produced the response. A
//! copy kept for later callers (a stage's stale copy) is made by
//! [`SharedResponse::without_leader_cookies`]: it never restores them, not
//! even for the leader of a later flight it answers.
//!
//! ```
//! use bytes::Bytes;
//! use flightdeck_core::http::{HttpShare, SetCookie};
//! use flightdeck_core::{Share, Shareable, Unshareable};
//! use http_body_util::Full;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let with_cookie = || {
//!     http::Response::builder()
//!         .header("set-cookie", "sid=8f14e45f; HttpOnly")
//!         .body(Full::new(Bytes::from_static(b"hello")))
//!         .unwrap()
//! };
//! // By default: not shared, the leader keeps its response.
//! let share = HttpShare::new();
//! match share.share(with_cookie()).await.unwrap() {
//!     Shareable::Unshared(resp, reason) => {
//!         assert_eq!(reason, Unshareable::SetCookie);
//!         assert_eq!(resp.headers()["set-cookie"], "sid=8f14e45f; HttpOnly");
//!     }
//!     Shareable::Shared(_) => unreachable!(),
//! }
//! // Opted in: shared without the cookie, except for the leader.
//! let share = HttpShare::new().set_cookie(SetCookie::Strip);
//! let Shareable::Shared(shared) = share.share(with_cookie()).await.unwrap() else {
//!     unreachable!()
//! };
//! let waiter: http::Response<_> = Share::<http::Response<Full<Bytes>>>::restore(&share, &shared);
//! assert!(waiter.headers().get("set-cookie").is_none());
//! let leader: http::Response<_> =
//!     Share::<http::Response<Full<Bytes>>>::restore_leader(&share, &shared);
//! assert_eq!(leader.headers()["set-cookie"], "sid=8f14e45f; HttpOnly");
//! # }
//! ```
//!
//! # Errors as responses
//!
//! [`ErrorResponseLayer`] maps the `BoxError`s of flightdeck's layers to
//! responses (503, 429, 504, …, or a trailers-only gRPC response with the
//! matching `grpc-status`), so a stack can be mounted where the error type
//! must be `Infallible` (axum's `Router::layer`), and tonic clients see real
//! statuses instead of stream resets.
//!
//! ```
//! use flightdeck_core::http::{ErrorResponseLayer, FlightBody};
//! use flightdeck_core::error::{BoxError, CircuitOpen};
//! use http_body_util::Full;
//! use bytes::Bytes;
//! use tower_layer::Layer;
//! use tower_service::Service;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! # #[derive(Clone)] struct AlwaysOpen;
//! # impl Service<http::Request<()>> for AlwaysOpen {
//! #     type Response = http::Response<Full<Bytes>>;
//! #     type Error = BoxError;
//! #     type Future = std::future::Ready<Result<Self::Response, BoxError>>;
//! #     fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), BoxError>> { std::task::Poll::Ready(Ok(())) }
//! #     fn call(&mut self, _: http::Request<()>) -> Self::Future { std::future::ready(Err(CircuitOpen::new("redis").into())) }
//! # }
//! let mut svc = ErrorResponseLayer::new().layer(AlwaysOpen);
//! let resp = svc.call(http::Request::new(())).await.unwrap();
//! assert_eq!(resp.status(), 503);
//! # }
//! ```

mod body;
mod error_response;
mod failures;
mod policy;
mod present;
mod response;
mod share;
#[cfg(test)]
mod tests;
mod vary;

pub use self::body::FlightBody;
pub use self::error_response::{
    error_response, ErrorResponse, ErrorResponseFuture, ErrorResponseLayer,
};
pub use self::failures::HttpFailures;
pub use self::policy::{CacheControl, SetCookie};
pub use self::present::Present;
pub use self::response::{SharedResponse, VaryMismatch};
pub use self::share::{HttpShare, DEFAULT_MAX_BODY};
pub use self::vary::{
    normalized_values, push_header_values, push_values, LeaderHeaders, VaryValues,
};
