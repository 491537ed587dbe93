//! Where a request's own deadline comes from, and where ours goes.

use std::time::Duration;

use crate::deadline::Deadline;
use crate::parse::InvalidTimeout;

/// Reads a request's inbound deadline and attaches the computed
/// [`Deadline`] to it. Implement it for your own request type to carry
/// deadlines through a non-HTTP stack.
pub trait Inbound<Req> {
    /// The timeout the caller asked for, if any.
    fn inbound(&self, req: &Req) -> Result<Option<Duration>, InvalidTimeout>;

    /// A deadline already attached by an outer layer, if any.
    fn existing(&self, _req: &Req) -> Option<Deadline> {
        None
    }

    /// Makes `deadline` visible to the inner service.
    fn attach(&self, _req: &mut Req, _deadline: Deadline) {}
}

/// For any request type: no inbound deadline, nothing attached (the inner
/// call is still bounded by the execution slice).
#[derive(Debug, Clone, Copy, Default)]
pub struct NoInbound;

impl<Req> Inbound<Req> for NoInbound {
    fn inbound(&self, _req: &Req) -> Result<Option<Duration>, InvalidTimeout> {
        Ok(None)
    }
}

#[cfg(feature = "http")]
pub use self::http_headers::FromHeaders;

#[cfg(feature = "http")]
mod http_headers {
    use super::*;
    use crate::parse::{parse_grpc_timeout, parse_timeout};
    use flightdeck_core::Received;
    use http::header::HeaderName;

    /// For `http::Request`s: reads `grpc-timeout` (gRPC wire format) and
    /// `x-request-timeout` (or another header), takes the smaller, and
    /// attaches the [`Deadline`] to the request's extensions (where an outer
    /// `Deadline` is also honoured). The timeout counts from when the
    /// request's head was read: from a [`Received`]
    /// in its extensions (the key layer puts one there when it waited for
    /// the body), else from now.
    ///
    /// A malformed header (or one given twice: "more than one value") is an
    /// [`InvalidTimeout`] error by default, or is ignored with
    /// [`ignore_invalid`](Self::ignore_invalid).
    #[derive(Debug, Clone)]
    pub struct FromHeaders {
        header: HeaderName,
        ignore_invalid: bool,
    }

    /// Named once: a `&str` would be parsed into a header name on every
    /// request.
    const GRPC_TIMEOUT: HeaderName = HeaderName::from_static("grpc-timeout");

    impl Default for FromHeaders {
        fn default() -> Self {
            Self {
                header: HeaderName::from_static("x-request-timeout"),
                ignore_invalid: false,
            }
        }
    }

    impl FromHeaders {
        /// `grpc-timeout` and `x-request-timeout`; malformed values rejected.
        pub fn new() -> Self {
            Self::default()
        }

        /// Reads this header instead of `x-request-timeout`.
        pub fn header(mut self, name: HeaderName) -> Self {
            self.header = name;
            self
        }

        /// Treats malformed values as absent instead of rejecting the
        /// request.
        pub fn ignore_invalid(mut self, ignore: bool) -> Self {
            self.ignore_invalid = ignore;
            self
        }

        fn read<B>(&self, req: &http::Request<B>) -> Result<Option<Duration>, InvalidTimeout> {
            let mut best: Option<Duration> = None;
            if let Some(v) = only(req.headers(), &GRPC_TIMEOUT)? {
                best = Some(parse_grpc_timeout(v.as_bytes())?);
            }
            if let Some(v) = only(req.headers(), &self.header)? {
                let s = v
                    .to_str()
                    .map_err(|_| InvalidTimeout::new(self.header.as_str(), "not ASCII"))?;
                let d = parse_timeout(self.header.as_str(), s)?;
                best = Some(best.map_or(d, |b| b.min(d)));
            }
            Ok(best)
        }
    }

    /// The one value of `name`, if any. Given twice it is as malformed as
    /// its values joined by a comma (HTTP makes them the same field):
    /// neither is picked in silence.
    fn only<'a>(
        headers: &'a http::HeaderMap,
        name: &HeaderName,
    ) -> Result<Option<&'a http::HeaderValue>, InvalidTimeout> {
        let mut values = headers.get_all(name).iter();
        let first = values.next();
        if values.next().is_some() {
            return Err(InvalidTimeout::new(name.as_str(), "more than one value"));
        }
        Ok(first)
    }

    impl<B> Inbound<http::Request<B>> for FromHeaders {
        fn inbound(&self, req: &http::Request<B>) -> Result<Option<Duration>, InvalidTimeout> {
            match self.read(req) {
                Err(_) if self.ignore_invalid => Ok(None),
                // Counted from the head's arrival when a layer waited for
                // the body (see `Received`).
                Ok(Some(d)) => Ok(Some(match req.extensions().get::<Received>() {
                    Some(received) => received.left_of(d),
                    None => d,
                })),
                other => other,
            }
        }

        fn existing(&self, req: &http::Request<B>) -> Option<Deadline> {
            req.extensions().get::<Deadline>().copied()
        }

        fn attach(&self, req: &mut http::Request<B>, deadline: Deadline) {
            req.extensions_mut().insert(deadline);
        }
    }
}
