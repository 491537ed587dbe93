//! Which HTTP and gRPC answers a stale result may stand in for.

use http::StatusCode;

use super::SharedResponse;
use crate::error::BoxError;
use crate::stale::{ErrorFailures, Failures};

/// `stale-if-error` for HTTP and gRPC: a response with status 5xx or 429,
/// a gRPC status (`grpc-status` in the trailers or, for a trailers-only
/// answer, the headers) of `DEADLINE_EXCEEDED` (4), `RESOURCE_EXHAUSTED`
/// (8) or `UNAVAILABLE` (14), and the errors [`ErrorFailures`] names.
///
/// ```
/// use bytes::Bytes;
/// use flightdeck_core::http::{HttpFailures, SharedResponse};
/// use flightdeck_core::stale::Failures;
/// use http::{HeaderMap, StatusCode};
///
/// let down = SharedResponse::new(StatusCode::SERVICE_UNAVAILABLE, HeaderMap::new(), Bytes::new(), None);
/// let ok = SharedResponse::new(StatusCode::OK, HeaderMap::new(), Bytes::new(), None);
/// assert!(HttpFailures.failed(Ok(&down)));
/// assert!(!HttpFailures.failed(Ok(&ok)));
/// ```
#[derive(Clone, Copy, Debug, Default)]
pub struct HttpFailures;

impl HttpFailures {
    /// Whether the response is a failure a stale result may answer for.
    pub fn response_failed(res: &SharedResponse) -> bool {
        let status = res.status();
        if status.is_server_error() || status == StatusCode::TOO_MANY_REQUESTS {
            return true;
        }
        let grpc = res
            .trailers()
            .and_then(|t| t.get("grpc-status"))
            .or_else(|| res.headers().get("grpc-status"));
        matches!(grpc.map(|v| v.as_bytes()), Some(b"4" | b"8" | b"14"))
    }
}

impl Failures<SharedResponse> for HttpFailures {
    fn failed(&self, outcome: Result<&SharedResponse, &BoxError>) -> bool {
        match outcome {
            Ok(res) => Self::response_failed(res),
            Err(err) => ErrorFailures::error_failed(err),
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http::{HeaderMap, HeaderValue};

    use super::*;

    fn response(status: u16, grpc: Option<&'static str>, in_trailers: bool) -> SharedResponse {
        let mut meta = HeaderMap::new();
        if let Some(code) = grpc {
            meta.insert("grpc-status", HeaderValue::from_static(code));
        }
        let status = StatusCode::from_u16(status).unwrap();
        if in_trailers {
            SharedResponse::new(status, HeaderMap::new(), Bytes::new(), Some(meta))
        } else {
            SharedResponse::new(status, meta, Bytes::new(), None)
        }
    }

    #[test]
    fn status_and_grpc_codes() {
        for (status, grpc, trailers, failed) in [
            (200, None, false, false),
            (404, None, false, false),
            (429, None, false, true),
            (500, None, false, true),
            (503, None, false, true),
            (200, Some("0"), true, false),
            (200, Some("5"), true, false),
            (200, Some("14"), true, true),
            (200, Some("4"), false, true),
            (200, Some("8"), true, true),
        ] {
            let res = response(status, grpc, trailers);
            assert_eq!(HttpFailures.failed(Ok(&res)), failed, "{status} {grpc:?}");
        }
    }
}
